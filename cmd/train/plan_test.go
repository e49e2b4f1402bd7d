package main

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
)

// TestPlanWithinTenPercentOfPeakRSS: on the CPU at a small shape, the
// memory plan of a bench run is within 10% of the peak resident memory the
// same run measures (bench reports both).
func TestPlanWithinTenPercentOfPeakRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a bench step of 16k tokens")
	}
	for _, shape := range [][]string{{"--rows", "8", "--seq", "2048"}, {"--rows", "2", "--seq", "1024", "--recompute"}} {
		cmd := trainCommand(append([]string{"bench", "--backend", "cpu", "--threads", "2", "--model", "../../model/testdata/qwen3_untied/config.json", "--steps", "1"}, shape...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("bench %v: %v\n%s", shape, err, errb.String())
		}
		var r struct {
			Plan float64 `json:"plan_mib"`
			RSS  float64 `json:"peak_rss_mib"`
		}
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("bench output %q: %v", out.String(), err)
		}
		ratio := r.RSS / r.Plan
		t.Logf("bench %v: plan %.1f MiB, peak RSS %.1f MiB (%.3f)", shape, r.Plan, r.RSS, ratio)
		if math.Abs(ratio-1) > 0.10 || r.RSS == 0 {
			t.Errorf("bench %v: plan %.1f MiB, peak RSS %.1f MiB: more than 10%% apart", shape, r.Plan, r.RSS)
		}
	}
}
