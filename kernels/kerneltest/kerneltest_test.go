package kerneltest

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// TestCPUAgainstCPU runs the suite with a second CPU backend (3 threads
// against the reference's 2) as the backend under test: the CI check that
// the suite itself runs and that the CPU backend is thread-count invariant.
// The reduced shapes keep it quick (the full set adds long sequences, for
// devices).
func TestCPUAgainstCPU(t *testing.T) {
	RunOptions(t, func() kernels.Backend { return cpu.New(3) }, Options{Reduced: true})
}

// TestCompare checks the comparison the suite rests on.
func TestCompare(t *testing.T) {
	nan := float32(0)
	nan = nan / nan
	for _, c := range []struct {
		name      string
		want, got []float32
		tol       Tol
		ok        bool
	}{
		{"equal", []float32{1, -2, 0}, []float32{1, -2, 0}, TolExact, true},
		{"within rtol", []float32{100}, []float32{100.001}, Tol{Atol: 0, Rtol: 1e-5}, true},
		{"beyond rtol", []float32{100}, []float32{100.01}, Tol{Atol: 0, Rtol: 1e-5}, false},
		{"within atol at zero", []float32{0}, []float32{1e-7}, Tol{Atol: 1e-6, Rtol: 0}, true},
		{"nan got", []float32{1}, []float32{nan}, Tol{Atol: 1, Rtol: 1}, false},
		{"nan both", []float32{nan}, []float32{nan}, TolExact, true},
		{"length", []float32{1}, []float32{1, 2}, TolExact, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			msg := Compare(c.want, c.got, c.tol)
			if (msg == "") != c.ok {
				t.Errorf("Compare(%v, %v, %+v) = %q, want ok=%v", c.want, c.got, c.tol, msg, c.ok)
			}
		})
	}
}

// broken wraps a CPU backend with one deliberately wrong op.
type broken struct {
	*cpu.Backend
	which string
}

func (b broken) Scale(x kernels.Buf, s float32) {
	if b.which == "scale" {
		s *= 1.0001
	}
	b.Backend.Scale(x, s)
}

func (b broken) Accumulate(dst, src kernels.Buf, N int) {
	if b.which == "accumulate" {
		b.Backend.Copy(dst, src) // = instead of +=
		return
	}
	b.Backend.Accumulate(dst, src, N)
}

func (b broken) RMSNorm(out, rstd, inp, weight kernels.Buf, N, C int, eps float32) {
	if b.which == "rmsnorm" {
		eps *= 100
	}
	b.Backend.RMSNorm(out, rstd, inp, weight, N, C, eps)
}

// Attention with bf16 operands whose queries are 1% too large (a softmax
// temperature off by 1%): the bf16 tolerances must still catch that.
func (b broken) Attention(out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	if b.which == "attention_bf16" && q.DType == kernels.BF16 {
		w, _ := b.Alloc(kernels.F32, q.N)
		q2, _ := b.Alloc(kernels.BF16, q.N)
		defer b.Free(w)
		defer b.Free(q2)
		b.Convert(w, q)
		b.Backend.Scale(w, 1.01)
		b.Convert(q2, w)
		q = q2
	}
	b.Backend.Attention(out, lse, q, k, v, seqs, NH, NKV, HD)
}

// TestBrokenBackendHelper is run as a subprocess by TestSuiteCatchesBrokenBackends.
func TestBrokenBackendHelper(t *testing.T) {
	which := os.Getenv("KERNELTEST_BROKEN")
	if which == "" {
		t.Skip("run by TestSuiteCatchesBrokenBackends")
	}
	RunOptions(t, func() kernels.Backend { return broken{cpu.New(1), which} }, Options{Reduced: true})
}

// TestSuiteCatchesBrokenBackends shows that the suite fails a backend with
// one wrong op, naming that op.
func TestSuiteCatchesBrokenBackends(t *testing.T) {
	for _, c := range []struct{ which, wantIn string }{
		{"scale", "Scale N="},
		{"accumulate", "Accumulate N="},
		{"rmsnorm", "RMSNorm out"},
		{"attention_bf16", "Attention bf16 → bf16 out"},
	} {
		t.Run(c.which, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenBackendHelper$", "-test.count=1")
			cmd.Env = append(os.Environ(), "KERNELTEST_BROKEN="+c.which)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a backend with a broken %s:\n%s", c.which, out)
			}
			if !strings.Contains(string(out), c.wantIn) {
				t.Errorf("the failure does not name %q:\n%s", c.wantIn, out)
			}
		})
	}
}
