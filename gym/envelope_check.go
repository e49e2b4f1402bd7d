package gym

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// ErrInvalidEnvelope marks every training_traces wire-contract violation.
var ErrInvalidEnvelope = errors.New("gym: invalid training_traces envelope")

// EnvelopeError is a wire-contract violation. Trace is the trace index (-1
// for the batch), Field the JSON field, Pos the element position (-1 if none).
type EnvelopeError struct {
	RolloutID string
	Trace     int
	TraceID   string
	Field     string
	Pos       int
	Msg       string
}

func (e *EnvelopeError) Error() string {
	s := "training_traces of rollout " + strconv.Quote(e.RolloutID)
	if e.Trace >= 0 {
		s += fmt.Sprintf(", trace %d (%q)", e.Trace, e.TraceID)
	}
	if e.Field != "" {
		s += ", field " + e.Field
		if e.Pos >= 0 {
			s += fmt.Sprintf("[%d]", e.Pos)
		}
	}
	return s + ": " + e.Msg
}

func (e *EnvelopeError) Unwrap() error { return ErrInvalidEnvelope }

// Validate checks every invariant of the training_traces v1 wire contract
// (spec §2.5): schema version, builder, non-empty ids, aligned non-empty
// arrays, loss_mask[0] == 0 and binary, non-negative tokens, finite logprobs,
// unique call ids per trace, spans inside their trace and over its calls,
// non-overlapping, exactly covering the loss mask with at least one owned
// position, unique trace ids, each call owning at most one span in the whole
// envelope, and every referenced call owned somewhere.
func (b *TrainingTraceBatch) Validate() error {
	batchErr := func(field, format string, args ...any) error {
		return &EnvelopeError{RolloutID: b.RolloutID, Trace: -1, Field: field, Pos: -1, Msg: fmt.Sprintf(format, args...)}
	}
	if b.SchemaVersion != EnvelopeSchemaVersion {
		return batchErr("schema_version", "expected %d, found %d", EnvelopeSchemaVersion, b.SchemaVersion)
	}
	if b.RolloutID == "" {
		return batchErr("rollout_id", "must be a non-empty string")
	}
	if b.Builder != BuilderPrefixMerging && b.Builder != BuilderPerRequest {
		return batchErr("builder", "expected %q or %q, found %q", BuilderPrefixMerging, BuilderPerRequest, b.Builder)
	}
	if len(b.Traces) == 0 {
		return batchErr("traces", "must hold at least one trace")
	}
	traceIDs := make(map[string]int, len(b.Traces))
	owner := map[string]int{}
	for ti := range b.Traces {
		tr := &b.Traces[ti]
		terr := func(field string, pos int, format string, args ...any) error {
			return &EnvelopeError{RolloutID: b.RolloutID, Trace: ti, TraceID: tr.TraceID, Field: field, Pos: pos,
				Msg: fmt.Sprintf(format, args...)}
		}
		if tr.TraceID == "" {
			return terr("trace_id", -1, "must be a non-empty string")
		}
		if prev, dup := traceIDs[tr.TraceID]; dup {
			return terr("trace_id", -1, "duplicate trace id (also trace %d)", prev)
		}
		traceIDs[tr.TraceID] = ti
		n := len(tr.TokenIDs)
		if n == 0 {
			return terr("token_ids", -1, "must be non-empty")
		}
		if len(tr.GenerationLogprobs) != n || len(tr.LossMask) != n {
			return terr("generation_logprobs", -1, "token_ids, generation_logprobs and loss_mask lengths must match (%d, %d, %d)",
				n, len(tr.GenerationLogprobs), len(tr.LossMask))
		}
		if tr.LossMask[0] != 0 {
			return terr("loss_mask", 0, "the first position is conditioning and must be 0, found %d", tr.LossMask[0])
		}
		for i, m := range tr.LossMask {
			if m != 0 && m != 1 {
				return terr("loss_mask", i, "must be 0 or 1, found %d", m)
			}
		}
		for i, t := range tr.TokenIDs {
			if t < 0 {
				return terr("token_ids", i, "token ids must be non-negative, found %d", t)
			}
		}
		for i, lp := range tr.GenerationLogprobs {
			if math.IsNaN(lp) || math.IsInf(lp, 0) {
				return terr("generation_logprobs", i, "must be finite, found %v", lp)
			}
		}
		calls := make(map[string]bool, len(tr.ModelCallIDs))
		for i, c := range tr.ModelCallIDs {
			if calls[c] {
				return terr("model_call_ids", i, "duplicate model call id %q in one trace", c)
			}
			calls[c] = true
		}
		owned := make([]bool, n)
		for si, sp := range tr.SampledSpans {
			field := fmt.Sprintf("sampled_spans[%d]", si)
			if sp.ModelCallID == "" {
				return terr(field+".model_call_id", -1, "must be a non-empty string")
			}
			if sp.Start < 1 {
				return terr(field+".start", -1, "must be >= 1, found %d", sp.Start)
			}
			if sp.End < 2 {
				return terr(field+".end", -1, "must be >= 2, found %d", sp.End)
			}
			if !calls[sp.ModelCallID] {
				return terr(field+".model_call_id", -1, "call %q is not in this trace's model_call_ids", sp.ModelCallID)
			}
			if !(sp.Start < sp.End && sp.End <= n) {
				return terr(field, -1, "span [%d, %d) must satisfy start < end <= %d", sp.Start, sp.End, n)
			}
			for i := sp.Start; i < sp.End; i++ {
				if owned[i] {
					return terr(field, -1, "span [%d, %d) overlaps another span at position %d", sp.Start, sp.End, i)
				}
				owned[i] = true
			}
			if prev, dup := owner[sp.ModelCallID]; dup {
				return terr(field+".model_call_id", -1, "call %q already owns a span in trace %d: each sampled call has exactly one owner",
					sp.ModelCallID, prev)
			}
			owner[sp.ModelCallID] = ti
		}
		anyOwned := false
		for i, o := range owned {
			if o != (tr.LossMask[i] == 1) {
				return terr("loss_mask", i, "sampled spans must exactly cover the trainable positions (mask %d, owned %v)", tr.LossMask[i], o)
			}
			anyOwned = anyOwned || o
		}
		if !anyOwned {
			return terr("sampled_spans", -1, "a trace must own at least one position")
		}
	}
	for ti := range b.Traces {
		tr := &b.Traces[ti]
		for i, c := range tr.ModelCallIDs {
			if _, ok := owner[c]; !ok {
				return &EnvelopeError{RolloutID: b.RolloutID, Trace: ti, TraceID: tr.TraceID, Field: "model_call_ids", Pos: i,
					Msg: fmt.Sprintf("call %q is referenced but owns no span in any trace", c)}
			}
		}
	}
	return nil
}
