package bench

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/model"
)

// TestRunRowsProfileHybrid: a profiled run of a Nemotron-H model times its
// Mamba-2 ops (the timed backend keeps the CPU backend's kernels.Mamba;
// without it the model refused the config), and a backend without them
// stays without.
func TestRunRowsProfileHybrid(t *testing.T) {
	cfg, err := model.LoadConfig("../model/testdata/nh_blocks/config.json")
	if err != nil {
		t.Fatal(err)
	}
	out, errs := run(t, func(env Env) error {
		return RunRows(env, Rows{Common: Common{Model: cfg, ModelName: "nh_blocks", Steps: 2, Seed: 1, LR: 1e-3, Eps: 1e-8},
			Rows: 2, Seq: 16, Profile: true})
	})
	var r Result
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	calls := map[string]int{}
	for _, l := range strings.Split(errs, "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && strings.HasSuffix(f[4], "%") {
			if n, err := strconv.Atoi(f[1]); err == nil {
				calls[f[0]] = n
			}
		}
	}
	// Two Mamba blocks (M*-EM), an MLP and a sparse block with a shared expert.
	for op, min := range map[string]int{"Conv1D": 2, "Conv1DBackward": 2, "SSMScan": 2, "SSMScanBackward": 2,
		"GatedRMSNorm": 2, "GatedRMSNormBackward": 2, "ReLU2": 3, "ReLU2Backward": 3} {
		if calls[op] < min {
			t.Errorf("--profile: %s called %d times a step, want at least %d:\n%s", op, calls[op], min, errs)
		}
	}
	b := cpu.New(1)
	defer b.Close()
	if _, ok := newTimedBackend(struct{ kernels.Backend }{b}).profiled().(kernels.Mamba); ok {
		t.Error("a timed backend without the Mamba-2 ops claims them")
	}
}
