package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// stepMetrics is one line of metrics.jsonl: everything a user needs to see
// what a step trained on and how. Counts are exact denominators, so a reader
// can recompute any mean. Timings are wall-clock seconds.
type stepMetrics struct {
	Step       int     `json:"step"`
	RewardMean float64 `json:"reward_mean"`
	RewardStd  float64 `json:"reward_std"`
	Loss       float64 `json:"loss"`
	GradNorm   float64 `json:"grad_norm"`
	LR         float64 `json:"lr"`

	LogicalRollouts        int `json:"logical_rollouts"`
	PhysicalRows           int `json:"physical_rows"`
	PaddingRows            int `json:"padding_rows"`
	OverlongTraces         int `json:"overlong_traces"`
	InvalidRollouts        int `json:"invalid_rollouts"`
	MaskedRollouts         int `json:"masked_rollouts"`
	Traces                 int `json:"traces"`
	EligibleTokens         int `json:"eligible_tokens"`
	NonzeroAdvantageTokens int `json:"nonzero_advantage_tokens"`

	ClipFractionLow  float64 `json:"clip_fraction_low"`
	ClipFractionHigh float64 `json:"clip_fraction_high"`
	RatioMin         float64 `json:"ratio_min"`
	RatioMean        float64 `json:"ratio_mean"`
	RatioMax         float64 `json:"ratio_max"`
	KL               float64 `json:"kl"`
	Entropy          float64 `json:"entropy"`
	TokenMultProbErr float64 `json:"token_mult_prob_error"`
	GenKLError       float64 `json:"gen_kl_error"`
	SkippedUpdate    bool    `json:"skipped_update,omitempty"`

	MaskReasons map[string]int `json:"mask_reasons,omitempty"`

	TokensPerS float64    `json:"tokens_per_s"`
	TimeS      float64    `json:"time_s"`
	Phases     phaseTimes `json:"phase_s"`
}

// phaseTimes breaks a step's wall time down by phase.
type phaseTimes struct {
	Rollout    float64 `json:"rollout"`
	Finalize   float64 `json:"finalize"`
	Logprob    float64 `json:"logprob"`
	Train      float64 `json:"train"`
	Optimizer  float64 `json:"optimizer"`
	Checkpoint float64 `json:"checkpoint"`
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
