package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
)

// stepMetrics is one line of metrics.jsonl: everything a user needs to see
// what a step trained on and how. Counts are exact denominators, so a reader
// can recompute any mean. Timings are wall-clock seconds.
type stepMetrics struct {
	Step       int `json:"step"`
	RewardMean num `json:"reward_mean"`
	RewardStd  num `json:"reward_std"`
	Loss       num `json:"loss"`
	GradNorm   num `json:"grad_norm"`
	LR         num `json:"lr"`

	LogicalRollouts        int `json:"logical_rollouts"`
	PhysicalRows           int `json:"physical_rows"`
	PaddingRows            int `json:"padding_rows"`
	OverlongTraces         int `json:"overlong_traces"`
	InvalidRollouts        int `json:"invalid_rollouts"`
	MaskedRollouts         int `json:"masked_rollouts"`
	Traces                 int `json:"traces"`
	EligibleTokens         int `json:"eligible_tokens"`
	NonzeroAdvantageTokens int `json:"nonzero_advantage_tokens"`

	ClipFractionLow  num  `json:"clip_fraction_low"`
	ClipFractionHigh num  `json:"clip_fraction_high"`
	RatioMin         num  `json:"ratio_min"`
	RatioMean        num  `json:"ratio_mean"`
	RatioMax         num  `json:"ratio_max"`
	KL               num  `json:"kl"`
	Entropy          num  `json:"entropy"`
	TokenMultProbErr num  `json:"token_mult_prob_error"`
	GenKLError       num  `json:"gen_kl_error"`
	SkippedUpdate    bool `json:"skipped_update,omitempty"`

	// PrevLogprobMaxDiff is max |lp − lp_old| over eligible tokens: the
	// training forward against the no-gradient forward of the same weights.
	// It is 0 for a deterministic forward; anything else is a bug.
	PrevLogprobMaxDiff num `json:"prev_logprob_max_diff"`
	// TrainTokens counts the tokens of the rows that ran (valid rows).
	TrainTokens int `json:"train_tokens"`

	MaskReasons map[string]int `json:"mask_reasons,omitempty"`

	// Per logical rollout, over the valid ones (those that vote): the mean
	// |advantage|, its extremes, and the share of task groups in which every
	// valid member got the same reward (no learning signal).
	AdvantageAbsMean num `json:"advantage_abs_mean"`
	AdvantageMin     num `json:"advantage_min"`
	AdvantageMax     num `json:"advantage_max"`
	ZeroSignalGroups num `json:"zero_signal_group_fraction"`
	TracesPerRollout num `json:"traces_per_rollout"`

	TokensPerS num        `json:"tokens_per_s"`
	TimeS      num        `json:"time_s"`
	Phases     phaseTimes `json:"phase_s"`
}

// phaseTimes breaks a step's wall time down by phase.
type phaseTimes struct {
	Rollout    num `json:"rollout"`
	Finalize   num `json:"finalize"`
	Logprob    num `json:"logprob"`
	Train      num `json:"train"`
	Optimizer  num `json:"optimizer"`
	Checkpoint num `json:"checkpoint"`
}

// num is a metric value. JSON has no NaN or infinity, so non-finite values
// (a step whose loss overflowed) are written as the strings "NaN", "+Inf"
// and "-Inf" and read back as such.
type num float64

func (n num) MarshalJSON() ([]byte, error) {
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

func (n *num) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `"NaN"`:
		*n = num(math.NaN())
	case `"+Inf"`:
		*n = num(math.Inf(1))
	case `"-Inf"`:
		*n = num(math.Inf(-1))
	default:
		var f float64
		if err := json.Unmarshal(b, &f); err != nil {
			return err
		}
		*n = num(f)
	}
	return nil
}

// readMetrics reads a metrics.jsonl file, naming the line of any bad record.
func readMetrics(path string) ([]stepMetrics, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return decodeMetrics(f, path)
}

func decodeMetrics(r io.Reader, name string) ([]stepMetrics, error) {
	var out []stepMetrics
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var m stepMetrics
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}
