package gym

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"sync"
)

// TerminalMetrics is _ng_token_capture.terminal_attribution.
type TerminalMetrics struct {
	Method string `json:"method"`
	CallID string `json:"call_id"`
	Reason string `json:"reason"`
	Chain  string `json:"chain"`
}

// CaptureMetrics is the _ng_token_capture object Finalize writes on the
// record (spec §2.3). Error and Reason are set exactly when the rollout is
// masked by this package.
type CaptureMetrics struct {
	Builder                  string           `json:"builder,omitempty"`
	NCalls                   int              `json:"n_calls"`
	Chains                   int              `json:"chains"`
	Roots                    int              `json:"roots"`
	Traces                   int              `json:"traces"`
	QuarantinedCalls         int              `json:"quarantined_calls"`
	QuarantinedFraction      float64          `json:"quarantined_fraction"`
	DeliveredFraction        float64          `json:"delivered_fraction"`
	GeneratedTokensCaptured  int              `json:"generated_tokens_captured"`
	GeneratedTokensDelivered int              `json:"generated_tokens_delivered"`
	ParentLinkFailures       map[string]int   `json:"parent_link_failures"`
	UnresolvedParentCalls    int              `json:"unresolved_parent_calls"`
	UnresolvedRetries        int              `json:"unresolved_retries"`
	EmptyGenerationCalls     int              `json:"empty_generation_calls"`
	TerminalAttribution      *TerminalMetrics `json:"terminal_attribution,omitempty"`
	CaptureIncomplete        bool             `json:"capture_incomplete"`
	Error                    string           `json:"error,omitempty"`
	Reason                   string           `json:"reason,omitempty"`
}

// AppendJSON appends the metrics as Gym's finalizer writes them: counts as
// JSON integers, the fractions as Python floats (1.0, never 1), booleans,
// and parent_link_failures with sorted keys. Go's encoding/json would
// write a float 1 as 1, which a type-exact reader of Gym's records takes
// for an int.
func (m *CaptureMetrics) AppendJSON(dst []byte) []byte {
	dst = append(dst, '{')
	field := func(k string) {
		if len(dst) > 0 && dst[len(dst)-1] != '{' {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, k)
		dst = append(dst, ':')
	}
	str := func(k, v string) {
		field(k)
		dst = appendJSONString(dst, v)
	}
	num := func(k string, v int) {
		field(k)
		dst = strconv.AppendInt(dst, int64(v), 10)
	}
	if m.Builder != "" {
		str("builder", m.Builder)
	}
	num("n_calls", m.NCalls)
	num("chains", m.Chains)
	num("roots", m.Roots)
	num("traces", m.Traces)
	num("quarantined_calls", m.QuarantinedCalls)
	field("quarantined_fraction")
	dst = appendPyFloat(dst, m.QuarantinedFraction)
	field("delivered_fraction")
	dst = appendPyFloat(dst, m.DeliveredFraction)
	num("generated_tokens_captured", m.GeneratedTokensCaptured)
	num("generated_tokens_delivered", m.GeneratedTokensDelivered)
	field("parent_link_failures")
	keys := make([]string, 0, len(m.ParentLinkFailures))
	for k := range m.ParentLinkFailures {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	dst = append(dst, '{')
	for _, k := range keys {
		num(k, m.ParentLinkFailures[k])
	}
	dst = append(dst, '}')
	num("unresolved_parent_calls", m.UnresolvedParentCalls)
	num("unresolved_retries", m.UnresolvedRetries)
	num("empty_generation_calls", m.EmptyGenerationCalls)
	if t := m.TerminalAttribution; t != nil {
		field("terminal_attribution")
		dst = append(dst, '{')
		str("method", t.Method)
		str("call_id", t.CallID)
		str("reason", t.Reason)
		str("chain", t.Chain)
		dst = append(dst, '}')
	}
	field("capture_incomplete")
	dst = strconv.AppendBool(dst, m.CaptureIncomplete)
	if m.Error != "" {
		str("error", m.Error)
	}
	if m.Reason != "" {
		str("reason", m.Reason)
	}
	return append(dst, '}')
}

// MarshalJSON is AppendJSON.
func (m *CaptureMetrics) MarshalJSON() ([]byte, error) { return m.AppendJSON(nil), nil }

// Finalized is the outcome of finalizing one rollout record.
type Finalized struct {
	RolloutID string
	// Envelope is the delivered envelope (built, or validated when the
	// record already carried one); nil when masked.
	Envelope *TrainingTraceBatch
	Masked   bool
	Reason   string // a Reason* code when masked
	// Prebuilt is set when the record already carried training_traces.
	Prebuilt   bool
	Metrics    CaptureMetrics
	SnapshotID string
	Version    int
}

// BuildTrainingTraces runs terminal attribution, the named builder and the
// projection over one snapshot. A refusal is a *MaskError; any other error
// is a programmer error (an unknown builder).
func BuildTrainingTraces(snap *Snapshot, builder string, w TerminalWitnesses) (*TrainingTraceBatch, CaptureMetrics, error) {
	m := CaptureMetrics{Builder: builder, NCalls: len(snap.Entries), CaptureIncomplete: snap.Incomplete,
		ParentLinkFailures: map[string]int{}}
	if builder != BuilderPrefixMerging && builder != BuilderPerRequest {
		return nil, m, fmt.Errorf("gym: unknown builder %q; known: [%s %s]", builder, BuilderPerRequest, BuilderPrefixMerging)
	}
	if snap.Incomplete {
		return nil, m, maskf(ReasonCaptureIncomplete, "capture of rollout %s is incomplete (a call was lost or is still in flight)", snap.RolloutID)
	}
	if len(snap.Entries) == 0 {
		return nil, m, maskf(ReasonNothingRecorded, "nothing recorded for rollout %s", snap.RolloutID)
	}
	models := map[string]bool{}
	for i := range snap.Entries {
		models[snap.Entries[i].Model] = true
	}
	if len(models) > 1 {
		names := make([]string, 0, len(models))
		for k := range models {
			names = append(names, fmt.Sprintf("%q", k))
		}
		sort.Strings(names)
		return nil, m, maskf(ReasonMixedModels, "captured calls of rollout %s come from different policy models %v", snap.RolloutID, names)
	}
	versions := map[int]bool{}
	for i := range snap.Entries {
		versions[snap.Entries[i].SchemaVersion] = true
	}
	if len(versions) > 1 {
		return nil, m, maskf(ReasonUnsupportedSchema, "the capture of rollout %s mixes TokenEntry schema_version %d and %d lines; no NeMo Gym reader reads both, so its calls cannot be chained by one rule",
			snap.RolloutID, TokenEntrySchemaV1, TokenEntrySchemaVersion)
	}
	if versions[TokenEntrySchemaV1] {
		env, err := buildV1(snap, builder, &m)
		return env, m, err
	}
	att := ResolveTerminal(snap.Entries, w)
	m.TerminalAttribution = &TerminalMetrics{Method: att.Method, CallID: att.CallID, Reason: att.Reason}
	switch {
	case att.DeclaredMiss:
		return nil, m, maskf(ReasonTerminalUnavailable, "declared terminal response %q matches no single captured call (%s)",
			w.DeclaredResponseID, att.Reason)
	case att.Crash:
		return nil, m, maskf(ReasonTerminalUnavailable, "Gym's terminal attribution raises on this record's response (%s)", att.Reason)
	case att.Disagreement:
		return nil, m, maskf(ReasonTerminalDisagreement, "the terminal witnesses name different calls (%s)", att.Reason)
	}
	out, err := Build(builder, snap.Entries, att.CallID)
	if err != nil {
		return nil, m, err
	}
	n := &out.Notes
	m.Chains, m.Roots = n.Chains, n.Roots
	m.QuarantinedCalls = len(out.Quarantined)
	m.QuarantinedFraction = math.Round(float64(len(out.Quarantined))/float64(len(snap.Entries))*1e4) / 1e4
	m.DeliveredFraction = n.DeliveredFraction
	m.GeneratedTokensCaptured, m.GeneratedTokensDelivered = n.GeneratedTokensCaptured, n.GeneratedTokensDelivered
	for k, v := range n.ParentLinkFailures {
		m.ParentLinkFailures[k] = v
	}
	m.UnresolvedParentCalls = len(n.UnresolvedParentCalls)
	m.UnresolvedRetries = len(n.UnresolvedRetries)
	m.EmptyGenerationCalls = len(n.EmptyGenerationCalls)
	m.TerminalAttribution.Chain = n.TerminalChain
	env, err := ProjectTrainingTraces(snap.RolloutID, out)
	if err != nil {
		return nil, m, err
	}
	m.Traces = len(env.Traces)
	return env, m, nil
}

// Finalize completes one rollout record (spec §2.3, §2.7, §8): it derives
// the capture key, reads the snapshot from src, builds with the named
// builder and writes the result on rec: training_traces on success, or
// mask_sample: true with _ng_token_capture.error/reason and no
// training_traces when masked; _ng_token_capture holds the build metrics in
// both cases. response, reward and every other field are left unchanged.
//
// Errors (not masks): a missing or malformed correlation key; an attached
// training_traces that violates the wire contract or names another rollout;
// a capture written with another TokenEntry schema version; an unreadable
// store. A zero-call capture is masked (an inert rollout).
func Finalize(rec *Record, src Source, builder string) (*Finalized, error) {
	return finalize(rec, src, builder, false)
}

// Refinalize is Finalize that always rebuilds from src, as Gym's finalizer
// does: an attached training_traces is replaced on success and removed when
// the rebuild is masked (a stale envelope never survives a mask).
func Refinalize(rec *Record, src Source, builder string) (*Finalized, error) {
	return finalize(rec, src, builder, true)
}

// Retirable reports whether the consumed snapshot may be retired (dropped)
// after a durable hand-off: only a successful build from a snapshot is.
func (f *Finalized) Retirable() bool { return !f.Masked && !f.Prebuilt && f.SnapshotID != "" }

func finalize(rec *Record, src Source, builder string, rebuild bool) (*Finalized, error) {
	rid, err := RolloutIDFromRecord(rec)
	if err != nil {
		return nil, fmt.Errorf("gym: %w", err)
	}
	res := &Finalized{RolloutID: rid}
	upstreamMask, err := rec.MaskSample()
	if err != nil {
		return nil, fmt.Errorf("gym: %w", err)
	}
	if upstreamMask && !rebuild {
		// Gym already masked this rollout; an envelope next to the mask is
		// stale and is removed.
		res.Masked, res.Reason = true, ReasonMaskedUpstream
		rec.Delete(KeyTrainingTraces)
		if raw, ok := rec.Get(KeyTokenCapture); ok {
			// Best effort: Gym's list-valued fields may not fit our counts;
			// encoding/json fills every field it can.
			var prior CaptureMetrics
			_ = json.Unmarshal(raw, &prior)
			res.Metrics = prior
		}
		return res, nil
	}
	var env *TrainingTraceBatch
	attached := false
	if !rebuild {
		env, attached, err = rec.TrainingTraces()
		if err != nil {
			return nil, fmt.Errorf("gym: %w", err)
		}
	}
	if attached && env.RolloutID != rid {
		return nil, fmt.Errorf("gym: %w", rec.errf(KeyTrainingTraces,
			fmt.Errorf("envelope rollout_id %q differs from the record's capture key %q", env.RolloutID, rid)))
	}
	if attached {
		res.Envelope, res.Prebuilt = env, true
		res.Metrics.Builder = env.Builder
		res.Metrics.Traces = len(env.Traces)
		return res, nil
	}
	if src == nil {
		return nil, fmt.Errorf("gym: rollout %s (%s): no capture source and no attached training_traces", rid, rec.Where())
	}
	snap, err := src.Snapshot(rid)
	var mask *MaskError
	switch {
	case err == nil:
		res.SnapshotID, res.Version = snap.SnapshotID, snap.Version
		env, res.Metrics, err = BuildTrainingTraces(snap, builder, terminalWitnesses(rec))
		if err != nil && !errors.As(err, &mask) {
			return nil, err
		}
	case errors.Is(err, ErrRetired):
		mask = maskf(ReasonCaptureRetired, "%v", err)
	default:
		// Damage to this rollout's files masks this rollout only, as Gym's
		// finalizer masks a snapshot that cannot be read.
		var dmg *CaptureDamage
		if !errors.As(err, &dmg) {
			return nil, fmt.Errorf("gym: rollout %s (%s): %w", rid, rec.Where(), err)
		}
		mask = &MaskError{Reason: dmg.Reason, Msg: dmg.Detail()}
	}
	if mask != nil {
		res.Masked, res.Reason = true, mask.Reason
		res.Metrics.Error, res.Metrics.Reason = mask.Error(), mask.Reason
		if res.Metrics.ParentLinkFailures == nil {
			res.Metrics.ParentLinkFailures = map[string]int{}
		}
		rec.Set(KeyMaskSample, json.RawMessage("true"))
		rec.Delete(KeyTrainingTraces)
	} else {
		res.Envelope = env
		rec.Set(KeyTrainingTraces, env.AppendJSON(nil))
	}
	rec.Set(KeyTokenCapture, res.Metrics.AppendJSON(nil))
	return res, nil
}

func terminalWitnesses(rec *Record) TerminalWitnesses {
	var w TerminalWitnesses
	// Malformed witness fields abstain, as in Gym (attribution never fails).
	w.ExplicitCallID, _, _ = rec.stringField(KeyTerminalCallID)
	w.DeclaredResponseID, _, _ = rec.stringField(KeyTerminalResponse)
	raw, ok := rec.Get(KeyResponse)
	if !ok {
		return w
	}
	s := &scanner{data: raw}
	if s.peek() != '{' {
		return w
	}
	var id json.RawMessage
	err := s.object(func(key string) error {
		v, err := s.readRaw()
		switch key {
		case "id":
			id = v
		case "output":
			w.ResponseOutput = v
		}
		return err
	})
	if err != nil {
		return TerminalWitnesses{ExplicitCallID: w.ExplicitCallID, DeclaredResponseID: w.DeclaredResponseID}
	}
	w.HaveResponse = true
	if id != nil {
		// Gym reads str(response.get("id") or "").
		if v, err := parsePy(id, false); err == nil {
			w.ResponseID = strOr(v)
		}
	}
	return w
}

// FinalizeBatch finalizes recs concurrently on up to jobs goroutines (jobs
// < 1 means 1) and returns the results in record order. Each record is
// finalized exactly as by Finalize (or Refinalize when rebuild is set); the
// error returned is the first one in record order. src must be safe for
// concurrent use (Reader and Writer are).
func FinalizeBatch(recs []*Record, src Source, builder string, rebuild bool, jobs int) ([]*Finalized, error) {
	if jobs < 1 {
		jobs = 1
	}
	res := make([]*Finalized, len(recs))
	errs := make([]error, len(recs))
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < jobs && w < len(recs); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				res[i], errs[i] = finalize(recs[i], src, builder, rebuild)
			}
		}()
	}
	for i := range recs {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return res, err
		}
	}
	return res, nil
}
