package config

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"testing"
)

// tolScheduleGolden: torch computes LinearLR recursively (each step multiplies
// the previous LR), tracegrpo in closed form; they differ by rounding.
const tolScheduleGolden = 1e-12

// TestTorchScheduleGolden checks the "phases" schedule against torch's own
// LinearLR/ConstantLR/SequentialLR (scripts/golden_schedule.py).
func TestTorchScheduleGolden(t *testing.T) {
	b, err := os.ReadFile("testdata/golden_schedule.json")
	if err != nil {
		t.Fatalf("%v (regenerate with: /usr/bin/python3 scripts/golden_schedule.py)", err)
	}
	var g struct {
		Meta struct {
			Script, Torch string
		} `json:"meta"`
		Cases []struct {
			Name      string          `json:"name"`
			LR        float64         `json:"lr"`
			Scheduler json.RawMessage `json:"scheduler"`
			LRs       []float64       `json:"lrs"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if g.Meta.Script != "scripts/golden_schedule.py" || g.Meta.Torch == "" {
		t.Fatalf("golden metadata %+v", g.Meta)
	}
	// The script writes 5 cases; fewer means a truncated golden, which must
	// not pass vacuously.
	if len(g.Cases) < 5 {
		t.Fatalf("golden_schedule.json holds %d cases, want >= 5", len(g.Cases))
	}
	for _, tc := range g.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			l, err := Load(nil, []string{
				fmt.Sprintf("policy.optimizer={name: torch.optim.AdamW, kwargs: {lr: %v, weight_decay: 0.0, betas: [0.9, 0.999], eps: 1.0e-8}}", tc.LR),
				"policy.scheduler=" + string(tc.Scheduler),
			})
			if err != nil {
				t.Fatal(err)
			}
			_, s, err := l.Config.Optim()
			if err != nil {
				t.Fatal(err)
			}
			bad := 0
			for k, want := range tc.LRs {
				if got := s.LR(int64(k)); math.Abs(got-want) > tolScheduleGolden*math.Abs(want) {
					bad++
					if bad <= 3 {
						t.Errorf("LR(%d) = %.17g, torch %.17g", k, got, want)
					}
				}
			}
		})
	}
}
