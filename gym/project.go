package gym

import (
	"fmt"
	"sort"
)

// Mask reasons: the codes of _ng_token_capture.reason on a masked rollout.
// The human-readable text goes in _ng_token_capture.error.
const (
	ReasonCaptureIncomplete   = "capture_incomplete"
	ReasonNothingRecorded     = "nothing_recorded"
	ReasonCaptureRetired      = "capture_retired"
	ReasonInvalidCapture      = "invalid_capture"
	ReasonMixedModels         = "mixed_models"
	ReasonTerminalUnavailable = "terminal_unavailable"
	// ReasonTerminalDisagreement: the terminal witnesses (explicit,
	// declared, response_id, content) name calls with different token
	// sequences, which is evidence of a defect (a stale id mapping, a
	// transcript-synthesis bug), never a tie to break.
	ReasonTerminalDisagreement = "terminal_disagreement"
	ReasonProofMismatch        = "proof_mismatch"
	ReasonUnresolvedCustody    = "unresolved_custody"
	ReasonForeignRollout       = "foreign_rollout"
	ReasonRoutedExperts        = "routed_experts"
	ReasonEmptyPrompt          = "empty_prompt"
	ReasonNoTrainableCalls     = "no_trainable_calls"
	ReasonInvalidEnvelope      = "invalid_envelope"
	ReasonMaskedUpstream       = "masked_upstream"
)

// MaskError is a build refusal: the rollout is masked (mask_sample: true,
// no envelope), never a hard error.
type MaskError struct {
	Reason string
	Msg    string
}

func (e *MaskError) Error() string { return e.Reason + ": " + e.Msg }

func maskf(reason, format string, args ...any) *MaskError {
	return &MaskError{Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// compareCallTuples orders chains by the tuple of their link call ids.
func compareCallTuples(a, b *Chain) bool {
	for i := 0; i < len(a.Links) && i < len(b.Links); i++ {
		x, y := a.Links[i].Entry.ModelCallID, b.Links[i].Entry.ModelCallID
		if x != y {
			return x < y
		}
	}
	return len(a.Links) < len(b.Links)
}

// ProjectTrainingTraces turns a build into the training_traces v1 envelope
// (spec §3.3): ownership goes to the first chain, in lexicographic order of
// the chains' call-id tuples, that contains a call; copies elsewhere are
// masked context. Every refusal is a *MaskError. The result is validated.
func ProjectTrainingTraces(rolloutID string, out *BuildOutput) (*TrainingTraceBatch, error) {
	n := &out.Notes
	if len(n.UnresolvedRetries) > 0 || len(n.UnresolvedParentCalls) > 0 {
		return nil, maskf(ReasonUnresolvedCustody,
			"all_traces requires resolved retry selection and parent custody (unresolved retries %v, unresolved parent calls %v)",
			n.UnresolvedRetries, n.UnresolvedParentCalls)
	}
	if n.TerminalChain == TerminalBroken || n.TerminalChain == TerminalNotCaptured {
		return nil, maskf(ReasonTerminalUnavailable, "the declared terminal call %q is not safely captured (%s)",
			n.TerminalCallID, n.TerminalChain)
	}
	order := make([]*Chain, len(out.Chains))
	for i := range out.Chains {
		order[i] = &out.Chains[i]
	}
	sort.SliceStable(order, func(i, j int) bool { return compareCallTuples(order[i], order[j]) })
	owned := map[string]bool{}
	batch := &TrainingTraceBatch{SchemaVersion: EnvelopeSchemaVersion, RolloutID: rolloutID, Builder: n.Builder}
	for _, ch := range order {
		size := len(ch.RootPrompt)
		for _, l := range ch.Links {
			size += len(l.Interstitial) + len(l.Entry.GenerationTokenIDs)
		}
		tr := TrainingTrace{
			TokenIDs:           make([]int32, 0, size),
			GenerationLogprobs: make([]float64, len(ch.RootPrompt), size),
			LossMask:           make([]int8, len(ch.RootPrompt), size),
			ModelCallIDs:       make([]string, 0, len(ch.Links)),
		}
		tr.TokenIDs = append(tr.TokenIDs, ch.RootPrompt...)
		for _, l := range ch.Links {
			e := l.Entry
			if len(e.GenerationLogProbs) != len(e.GenerationTokenIDs) {
				return nil, maskf(ReasonInvalidEnvelope, "log-prob/token length mismatch on %s: %d vs %d",
					e.ModelCallID, len(e.GenerationLogProbs), len(e.GenerationTokenIDs))
			}
			if e.RolloutID != rolloutID {
				return nil, maskf(ReasonForeignRollout, "captured call %s belongs to rollout %q, not %q",
					e.ModelCallID, e.RolloutID, rolloutID)
			}
			if e.RoutedExperts != nil {
				return nil, maskf(ReasonRoutedExperts, "all_traces does not yet support routed_experts (call %s)", e.ModelCallID)
			}
			tr.ModelCallIDs = append(tr.ModelCallIDs, e.ModelCallID)
			tr.TokenIDs = append(tr.TokenIDs, l.Interstitial...)
			for range l.Interstitial {
				tr.GenerationLogprobs = append(tr.GenerationLogprobs, 0)
				tr.LossMask = append(tr.LossMask, 0)
			}
			start := len(tr.TokenIDs)
			if start == 0 {
				return nil, maskf(ReasonEmptyPrompt, "sampled tokens of call %s require a nonempty conditioning prompt", e.ModelCallID)
			}
			tr.TokenIDs = append(tr.TokenIDs, e.GenerationTokenIDs...)
			owns := !owned[e.ModelCallID]
			if owns {
				tr.GenerationLogprobs = append(tr.GenerationLogprobs, e.GenerationLogProbs...)
				for range e.GenerationTokenIDs {
					tr.LossMask = append(tr.LossMask, 1)
				}
				tr.SampledSpans = append(tr.SampledSpans, SampledSpan{ModelCallID: e.ModelCallID, Start: start, End: len(tr.TokenIDs)})
				owned[e.ModelCallID] = true
			} else {
				for range e.GenerationTokenIDs {
					tr.GenerationLogprobs = append(tr.GenerationLogprobs, 0)
					tr.LossMask = append(tr.LossMask, 0)
				}
			}
		}
		if len(tr.SampledSpans) > 0 {
			tr.TraceID = rolloutID + ":" + tr.ModelCallIDs[len(tr.ModelCallIDs)-1]
			batch.Traces = append(batch.Traces, tr)
		}
	}
	if len(batch.Traces) == 0 {
		return nil, maskf(ReasonNoTrainableCalls, "the capture holds no call with generated tokens")
	}
	if err := batch.Validate(); err != nil {
		return nil, &MaskError{Reason: ReasonInvalidEnvelope, Msg: err.Error()}
	}
	return batch, nil
}
