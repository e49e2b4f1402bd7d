//go:build cgo

package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
)

// TestRunRowsLedger: --ledger times one more step launch by launch and
// prints it beside the roofline's prediction, per part and per op (on the
// metering device, whose launches take no time: measured 0 beside each
// prediction); the JSON line still comes. A backend without a launch
// ledger is refused before anything runs.
func TestRunRowsLedger(t *testing.T) {
	cfg := tiny(t)
	be, err := cuda.OpenMeter(cuda.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.(interface{ Close() error }).Close()
	var out, errb bytes.Buffer
	env := Env{Backend: be, Rank: 0, Size: 1, Stdout: &out, Stderr: &errb}
	rows := Rows{Common: Common{Model: cfg, ModelName: tinyModel, Steps: 1, Seed: 1, LR: 1e-3, Eps: 1e-8, BF16: true}, Rows: 2, Seq: 16, Ledger: true}
	if err := RunRows(env, rows); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	text := errb.String()
	i := strings.Index(text, cuda.CompareHeader)
	if i < 0 {
		t.Fatalf("--ledger printed no %q table:\n%s", cuda.CompareHeader, text)
	}
	for _, w := range []string{"| layer GEMMs (cuBLAS) |", "| attention (own) |", "| **step** |", "| AttentionBackward |", "| TokenLogprob |", "predicted step "} {
		if !strings.Contains(text[i:], w) {
			t.Errorf("the table lacks %q:\n%s", w, text[i:])
		}
	}
	var r Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || r.Steps != 1 {
		t.Errorf("JSON line %q: %v", out.String(), err)
	}

	c := cpu.New(1)
	defer c.Close()
	out.Reset()
	err = RunRows(Env{Backend: c, Rank: 0, Size: 1, Stdout: &out, Stderr: &errb}, rows)
	if err == nil || !strings.Contains(err.Error(), "--ledger") || out.Len() != 0 {
		t.Errorf("--ledger on the CPU: %v, output %q; want a refusal naming --ledger and no result", err, out.String())
	}
}
