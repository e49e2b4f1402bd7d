package gym

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// DecodeTrainingTraces decodes a training_traces v1 envelope type-exactly
// and validates it: unknown fields are rejected at every level, integers
// (schema_version, token ids, loss-mask bits, span bounds) must be JSON
// integers (a boolean or 1.0 is not one), logprobs are JSON numbers, and
// every §2.5 invariant must hold. Errors are *EnvelopeError (or wrap
// ErrInvalidEnvelope) and name the trace, field and position.
func DecodeTrainingTraces(raw []byte) (*TrainingTraceBatch, error) {
	b := &TrainingTraceBatch{SchemaVersion: EnvelopeSchemaVersion}
	s := &scanner{data: raw}
	fail := func(trace int, field string, pos int, err error) error {
		var ee *EnvelopeError
		if errors.As(err, &ee) {
			return err
		}
		msg := err.Error()
		var fe *FieldError
		if errors.As(err, &fe) {
			msg = fe.Msg
			if fe.Field != "" {
				field = fe.Field
				pos = fe.Index
			}
		}
		tid := ""
		if trace >= 0 && trace < len(b.Traces) {
			tid = b.Traces[trace].TraceID
		}
		return &EnvelopeError{RolloutID: b.RolloutID, Trace: trace, TraceID: tid, Field: field, Pos: pos, Msg: msg}
	}
	seen := map[string]bool{}
	var haveRollout, haveBuilder, haveTraces bool
	err := s.object(func(key string) error {
		if seen[key] {
			return fail(-1, key, -1, errors.New("duplicate key"))
		}
		seen[key] = true
		switch key {
		case "schema_version":
			v, err := s.readInt(math.MinInt64, math.MaxInt64)
			if err != nil {
				return fail(-1, key, -1, err)
			}
			if v != EnvelopeSchemaVersion {
				return fail(-1, key, -1, fmt.Errorf("expected %d, found %d", EnvelopeSchemaVersion, v))
			}
		case "rollout_id":
			v, err := s.readString()
			if err != nil {
				return fail(-1, key, -1, err)
			}
			b.RolloutID, haveRollout = v, true
		case "builder":
			v, err := s.readString()
			if err != nil {
				return fail(-1, key, -1, err)
			}
			b.Builder, haveBuilder = v, true
		case "traces":
			haveTraces = true
			return s.array(func(i int) error {
				b.Traces = append(b.Traces, TrainingTrace{})
				if err := decodeTrace(s, &b.Traces[i]); err != nil {
					return fail(i, "", -1, err)
				}
				return nil
			})
		default:
			return fail(-1, key, -1, errors.New("unknown field (extra fields are forbidden)"))
		}
		return nil
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		return nil, fail(-1, "", -1, err)
	}
	for _, req := range []struct {
		ok   bool
		name string
	}{{haveRollout, "rollout_id"}, {haveBuilder, "builder"}, {haveTraces, "traces"}} {
		if !req.ok {
			return nil, fail(-1, req.name, -1, errors.New("required field is missing"))
		}
	}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	return b, nil
}

func decodeTrace(s *scanner, tr *TrainingTrace) error {
	seen := map[string]bool{}
	err := s.object(func(key string) error {
		if seen[key] {
			return &FieldError{Field: key, Index: -1, Msg: "duplicate key"}
		}
		seen[key] = true
		var err error
		switch key {
		case "trace_id":
			tr.TraceID, err = s.readString()
		case "model_call_ids":
			tr.ModelCallIDs = []string{}
			err = s.array(func(i int) error {
				v, err := s.readString()
				if err != nil {
					return fieldErr(key, i, err)
				}
				tr.ModelCallIDs = append(tr.ModelCallIDs, v)
				return nil
			})
		case "token_ids":
			tr.TokenIDs, err = readTokenArray(s, key)
		case "generation_logprobs":
			tr.GenerationLogprobs, err = readFloatArray(s, key)
		case "loss_mask":
			tr.LossMask = make([]int8, 0, 64)
			err = s.array(func(i int) error {
				v, err := s.readInt(math.MinInt64, math.MaxInt64)
				if err != nil {
					return fieldErr(key, i, err)
				}
				if v != 0 && v != 1 {
					return &FieldError{Field: key, Index: i, Msg: fmt.Sprintf("must be 0 or 1, found %d", v)}
				}
				tr.LossMask = append(tr.LossMask, int8(v))
				return nil
			})
		case "sampled_spans":
			tr.SampledSpans = []SampledSpan{}
			err = s.array(func(i int) error {
				var sp SampledSpan
				if err := decodeSpan(s, &sp); err != nil {
					var fe *FieldError
					if errors.As(err, &fe) {
						return &FieldError{Field: fmt.Sprintf("sampled_spans[%d].%s", i, fe.Field), Index: -1, Msg: fe.Msg}
					}
					return &FieldError{Field: fmt.Sprintf("sampled_spans[%d]", i), Index: -1, Msg: err.Error()}
				}
				tr.SampledSpans = append(tr.SampledSpans, sp)
				return nil
			})
		default:
			return &FieldError{Field: key, Index: -1, Msg: "unknown field (extra fields are forbidden)"}
		}
		if err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				return err
			}
			return fieldErr(key, -1, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, f := range []struct {
		ok   bool
		name string
	}{{seen["trace_id"], "trace_id"}, {seen["model_call_ids"], "model_call_ids"}, {seen["token_ids"], "token_ids"},
		{seen["generation_logprobs"], "generation_logprobs"}, {seen["loss_mask"], "loss_mask"}, {seen["sampled_spans"], "sampled_spans"}} {
		if !f.ok {
			return &FieldError{Field: f.name, Index: -1, Msg: "required field is missing"}
		}
	}
	return nil
}

func decodeSpan(s *scanner, sp *SampledSpan) error {
	seen := map[string]bool{}
	err := s.object(func(key string) error {
		if seen[key] {
			return &FieldError{Field: key, Index: -1, Msg: "duplicate key"}
		}
		seen[key] = true
		var err error
		switch key {
		case "model_call_id":
			sp.ModelCallID, err = s.readString()
		case "start":
			var v int64
			v, err = s.readInt(math.MinInt32, math.MaxInt32)
			sp.Start = int(v)
		case "end":
			var v int64
			v, err = s.readInt(math.MinInt32, math.MaxInt32)
			sp.End = int(v)
		default:
			return &FieldError{Field: key, Index: -1, Msg: "unknown field (extra fields are forbidden)"}
		}
		if err != nil {
			return fieldErr(key, -1, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range []string{"model_call_id", "start", "end"} {
		if !seen[k] {
			return &FieldError{Field: k, Index: -1, Msg: "required field is missing"}
		}
	}
	return nil
}

// UnmarshalJSON is DecodeTrainingTraces.
func (b *TrainingTraceBatch) UnmarshalJSON(raw []byte) error {
	d, err := DecodeTrainingTraces(raw)
	if err != nil {
		return err
	}
	*b = *d
	return nil
}

// MarshalJSON writes the envelope as Gym does (logprobs always as floats).
// It does not validate; call Validate first for untrusted values.
func (b TrainingTraceBatch) MarshalJSON() ([]byte, error) { return b.AppendJSON(nil), nil }

// jsonSizeHint is a capacity estimate for AppendJSON's output.
func (b *TrainingTraceBatch) jsonSizeHint() int {
	n := 128 + len(b.RolloutID)
	for i := range b.Traces {
		tr := &b.Traces[i]
		n += 160 + len(tr.TraceID) + 7*len(tr.TokenIDs) + 2*len(tr.LossMask)
		for _, c := range tr.ModelCallIDs {
			n += len(c) + 3
		}
		for _, lp := range tr.GenerationLogprobs {
			if lp == 0 {
				n += 4
			} else {
				n += 24
			}
		}
		n += len(tr.SampledSpans) * 64
	}
	return n
}

// AppendJSON appends the envelope's JSON encoding.
func (b *TrainingTraceBatch) AppendJSON(dst []byte) []byte {
	if dst == nil {
		dst = make([]byte, 0, b.jsonSizeHint())
	}
	dst = append(dst, `{"schema_version":`...)
	dst = strconv.AppendInt(dst, int64(b.SchemaVersion), 10)
	dst = append(dst, `,"rollout_id":`...)
	dst = appendJSONString(dst, b.RolloutID)
	dst = append(dst, `,"builder":`...)
	dst = appendJSONString(dst, b.Builder)
	dst = append(dst, `,"traces":[`...)
	for i := range b.Traces {
		if i > 0 {
			dst = append(dst, ',')
		}
		tr := &b.Traces[i]
		dst = append(dst, `{"trace_id":`...)
		dst = appendJSONString(dst, tr.TraceID)
		dst = append(dst, `,"model_call_ids":[`...)
		for j, c := range tr.ModelCallIDs {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, c)
		}
		dst = append(dst, `],"token_ids":`...)
		dst = appendTokens(dst, tr.TokenIDs)
		dst = append(dst, `,"generation_logprobs":[`...)
		for j, f := range tr.GenerationLogprobs {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = appendPyFloat(dst, f)
		}
		dst = append(dst, `],"loss_mask":[`...)
		for j, m := range tr.LossMask {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(m), 10)
		}
		dst = append(dst, `],"sampled_spans":[`...)
		for j, sp := range tr.SampledSpans {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"model_call_id":`...)
			dst = appendJSONString(dst, sp.ModelCallID)
			dst = append(dst, `,"start":`...)
			dst = strconv.AppendInt(dst, int64(sp.Start), 10)
			dst = append(dst, `,"end":`...)
			dst = strconv.AppendInt(dst, int64(sp.End), 10)
			dst = append(dst, '}')
		}
		dst = append(dst, "]}"...)
	}
	return append(dst, "]}"...)
}
