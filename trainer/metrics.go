package trainer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/internal/inputfile"
)

// Metrics is one line of metrics.jsonl: everything a user needs to see
// what a step trained on and how. Counts are exact denominators, so a reader
// can recompute any mean. Timings are wall-clock seconds.
type Metrics struct {
	Step       int `json:"step"`
	RewardMean Num `json:"reward_mean"`
	RewardStd  Num `json:"reward_std"`
	Loss       Num `json:"loss"`
	GradNorm   Num `json:"grad_norm"`
	LR         Num `json:"lr"`

	LogicalRollouts        int `json:"logical_rollouts"`
	PhysicalRows           int `json:"physical_rows"`
	PaddingRows            int `json:"padding_rows"`
	OverlongTraces         int `json:"overlong_traces"`
	InvalidRollouts        int `json:"invalid_rollouts"`
	MaskedRollouts         int `json:"masked_rollouts"`
	Traces                 int `json:"traces"`
	EligibleTokens         int `json:"eligible_tokens"`
	NonzeroAdvantageTokens int `json:"nonzero_advantage_tokens"`

	ClipFractionLow  Num  `json:"clip_fraction_low"`
	ClipFractionHigh Num  `json:"clip_fraction_high"`
	RatioMin         Num  `json:"ratio_min"`
	RatioMean        Num  `json:"ratio_mean"`
	RatioMax         Num  `json:"ratio_max"`
	KL               Num  `json:"kl"`
	Entropy          Num  `json:"entropy"`
	TokenMultProbErr Num  `json:"token_mult_prob_error"`
	GenKLError       Num  `json:"gen_kl_error"`
	SkippedUpdate    bool `json:"skipped_update,omitempty"`
	// RouterAuxLoss is a sparse model's load-balancing loss (transformers'
	// load_balancing_loss_func, unweighted), the token-weighted mean over
	// the step's micro-batches; absent for a dense model.
	RouterAuxLoss *Num `json:"router_aux_loss,omitempty"`
	// ExpertLoadMaxViolation is, for a model whose routers have selection
	// biases (Nemotron-H), the step's most unbalanced router: max over
	// routers of max_e count_e / mean − 1, from the tokens routed to each
	// expert by the step's training passes on every rank (the MaxVio of
	// the aux-loss-free balancing paper, arXiv 2408.15664, that Megatron's
	// update cites); absent otherwise.
	ExpertLoadMaxViolation *Num `json:"expert_load_max_violation,omitempty"`
	// MTPLoss is each multi-token prediction depth's mean cross-entropy
	// over its targets (depth k: every eligible token k+1 or more places
	// into its trace), the step's; absent without MTP. The objective adds
	// mtp_loss_scaling_factor / mtp_num_layers times each (not in loss).
	MTPLoss []Num `json:"mtp_loss,omitempty"`
	// MTPGradNorm is the MTP blocks' gradient norm before clipping, with
	// mtp_detach_heads (they are clipped by it, and grad_norm leaves them
	// out, as Megatron's separate grad_norm_group does).
	MTPGradNorm *Num `json:"mtp_grad_norm,omitempty"`

	// PrevLogprobMaxDiff is max |lp − lp_old| over eligible tokens: the
	// training forward against the no-gradient forward of the same weights.
	// It is 0 for a deterministic forward; anything else is a bug.
	PrevLogprobMaxDiff Num `json:"prev_logprob_max_diff"`
	// FilterMaskedTokens counts the eligible tokens whose current
	// log-probability is −inf under policy.generation's top-k/top-p filter
	// (the filter of training no longer keeps the sampled token): masked
	// to log-probability 0 with no gradient, as NeMo RL does.
	FilterMaskedTokens int `json:"filter_masked_tokens,omitempty"`
	// TrainTokens counts the tokens of the rows that ran (valid rows).
	TrainTokens int `json:"train_tokens"`
	// ComputedTokens counts the tokens the model ran per training pass:
	// TrainTokens with policy.shared_prefix=off, each shared prefix once
	// with auto. PrefixReuse is TrainTokens / ComputedTokens.
	ComputedTokens int `json:"computed_tokens"`
	PrefixReuse    Num `json:"prefix_reuse"`

	MaskReasons map[string]int `json:"mask_reasons,omitempty"`

	// Per logical rollout, over the valid ones (those that vote): the mean
	// |advantage|, its extremes, and the share of task groups in which every
	// valid member got the same reward (no learning signal).
	AdvantageAbsMean Num `json:"advantage_abs_mean"`
	AdvantageMin     Num `json:"advantage_min"`
	AdvantageMax     Num `json:"advantage_max"`
	ZeroSignalGroups Num `json:"zero_signal_group_fraction"`
	TracesPerRollout Num `json:"traces_per_rollout"`

	TokensPerS Num        `json:"tokens_per_s"`
	TimeS      Num        `json:"time_s"`
	Phases     PhaseTimes `json:"phase_s"`

	// A fully sharded run's collectives this step, on one rank (every
	// rank runs the same): the bytes of the flats it all-gathered and of
	// the fp32 gradients it reduce-scattered, as the collectives moved
	// them (model.CommStats). Absent when unsharded.
	CommGatherBytes        int64 `json:"comm_gather_bytes,omitempty"`
	CommReduceScatterBytes int64 `json:"comm_reduce_scatter_bytes,omitempty"`

	// WeightsBytes is the size of the weights directory published for the
	// generator after the step (--weights-out; phase_s.export its time).
	WeightsBytes int64 `json:"weights_bytes,omitempty"`
}

// PhaseTimes breaks a step's wall time down by phase.
type PhaseTimes struct {
	// Wait is the time spent waiting for the step's rollouts file to
	// appear (a --rollouts directory); Rollout the time reading them (or,
	// built in, sampling them).
	Wait       Num `json:"wait"`
	Rollout    Num `json:"rollout"`
	Finalize   Num `json:"finalize"`
	Logprob    Num `json:"logprob"`
	Train      Num `json:"train"`
	Optimizer  Num `json:"optimizer"`
	Checkpoint Num `json:"checkpoint"`
	// Export is the time publishing the weights for the generator
	// (--weights-out).
	Export Num `json:"export,omitempty"`
}

// Num is a metric value. JSON has no NaN or infinity, so non-finite values
// (a step whose loss overflowed) are written as the strings "NaN", "+Inf"
// and "-Inf" and read back as such.
type Num float64

func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	switch {
	case math.IsNaN(f):
		return []byte(`"NaN"`), nil
	case math.IsInf(f, 1):
		return []byte(`"+Inf"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-Inf"`), nil
	}
	return json.Marshal(f)
}

func (n *Num) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `"NaN"`:
		*n = Num(math.NaN())
	case `"+Inf"`:
		*n = Num(math.Inf(1))
	case `"-Inf"`:
		*n = Num(math.Inf(-1))
	default:
		var f float64
		if err := json.Unmarshal(b, &f); err != nil {
			return err
		}
		*n = Num(f)
	}
	return nil
}

// ReadMetrics reads a metrics.jsonl file, naming the line of any bad
// record. A last line that has no newline and does not parse is what a
// crash mid-write leaves: it is skipped, and torn says which line it was
// and why ("" when there is none).
func ReadMetrics(path string) (ms []Metrics, torn string, err error) {
	data, err := inputfile.ReadFile(path, inputfile.Metrics)
	if err != nil {
		return nil, "", err
	}
	return DecodeMetrics(data, path)
}

// DecodeMetrics decodes metrics.jsonl content; see ReadMetrics.
func DecodeMetrics(data []byte, name string) (ms []Metrics, torn string, err error) {
	for line := 1; len(data) > 0; line++ {
		text, rest, complete := bytes.Cut(data, []byte{'\n'})
		data = rest
		if len(bytes.TrimSpace(text)) == 0 {
			continue
		}
		var m Metrics
		if err := json.Unmarshal(text, &m); err != nil {
			if !complete {
				return ms, fmt.Sprintf("%s:%d (a torn last line, %d bytes without a newline: %v)", name, line, len(text), err), nil
			}
			return nil, "", fmt.Errorf("%s:%d: %w", name, line, err)
		}
		ms = append(ms, m)
	}
	return ms, "", nil
}
