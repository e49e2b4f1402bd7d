package kerneltest

import (
	"math"
	"os"
	"os/exec"
	"slices"
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

// RouterTopK breaking ties towards the higher expert id: where two tied
// experts straddle the k-th place, the other one is chosen.
func (b broken) RouterTopK(probs, weights, experts, logits kernels.Buf, T, E int, r kernels.Router) {
	if b.which != "router_ties" {
		b.Backend.RouterTopK(probs, weights, experts, logits, T, E, r)
		return
	}
	// Reversing the expert axis turns "lower id first" into "higher id first".
	z, rev := b.F32(logits), make([]float32, T*E)
	for t := 0; t < T; t++ {
		for e := 0; e < E; e++ {
			rev[t*E+e] = z[t*E+E-1-e]
		}
	}
	tmp, _ := b.Alloc(kernels.F32, T*E)
	defer b.Free(tmp)
	b.UploadF32(tmp, rev)
	b.Backend.RouterTopK(probs, weights, experts, tmp, T, E, r)
	p := b.F32(probs)
	for t := 0; t < T; t++ {
		slices.Reverse(p[t*E : (t+1)*E])
	}
	for i, e := range b.I32(experts) {
		b.I32(experts)[i] = int32(E-1) - e
	}
}

// ExpertRoute that is not stable: the last assignment of an expert first.
func (b broken) ExpertRoute(offsets, order, slot, experts kernels.Buf, T, K, E int) {
	b.Backend.ExpertRoute(offsets, order, slot, experts, T, K, E)
	if b.which != "route_unstable" {
		return
	}
	off, ord, sl := b.I32(offsets), b.I32(order), b.I32(slot)
	for e := 0; e < E; e++ {
		seg := ord[off[e]:off[e+1]]
		slices.Reverse(seg)
		for k, i := range seg {
			sl[i] = off[e] + int32(k)
		}
	}
}

// GroupedMatmulBackward that clears the weight gradient of an expert
// without rows (it must be left untouched: += of nothing).
func (b broken) GroupedMatmulBackward(dinp, dweight, dout, inp, weight, offsets kernels.Buf, N, C, OC, E int) {
	b.Backend.GroupedMatmulBackward(dinp, dweight, dout, inp, weight, offsets, N, C, OC, E)
	if b.which != "grouped_empty" || dweight.N == 0 {
		return
	}
	off := b.I32(offsets)
	for e := 0; e < E; e++ {
		if off[e] == off[e+1] {
			b.Fill(dweight.Slice(e*OC*C, OC*C), 0)
		}
	}
}

// roots returns tree as a forest of its segments, each a root: a backend
// that hands no state across branch points.
func (b broken) roots(tree kernels.Tree) kernels.Tree {
	offs := b.I32(tree.Offs)
	parent, ends := make([]int32, tree.NS), make([]int32, tree.NS)
	for s := range parent {
		parent[s], ends[s] = -1, offs[s+1]
	}
	pb, _ := b.Alloc(kernels.I32, tree.NS)
	eb, _ := b.Alloc(kernels.I32, tree.NS)
	b.UploadI32(pb, parent)
	b.UploadI32(eb, ends)
	tree.Parent, tree.Ends = pb, eb
	tree.MaxCtx = tree.MaxLen
	return tree
}

// SSMScan that ignores the tree (every segment from a zero state), or the
// time_step_limit clamp.
func (b broken) SSMScan(y, final, xbc, dtRaw, dtBias, aLog, d kernels.Buf, tree kernels.Tree, T int, s kernels.Scan) {
	switch b.which {
	case "ssm_roots":
		r := b.roots(tree)
		defer b.Free(r.Parent)
		defer b.Free(r.Ends)
		tree = r
	case "ssm_clamp":
		s.DtMin, s.DtMax = 0, float32(math.Inf(1))
	}
	b.Backend.SSMScan(y, final, xbc, dtRaw, dtBias, aLog, d, tree, T, s)
}

// Conv1D whose window does not cross branch points.
func (b broken) Conv1D(out, inp, weight, bias kernels.Buf, tree kernels.Tree, T, CD, KW int) {
	if b.which == "conv_roots" {
		r := b.roots(tree)
		defer b.Free(r.Parent)
		defer b.Free(r.Ends)
		tree = r
	}
	b.Backend.Conv1D(out, inp, weight, bias, tree, T, CD, KW)
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
		{"router_ties", "RouterTopK experts"},
		{"route_unstable", "ExpertRoute order"},
		{"grouped_empty", "GroupedMatmulBackward dweight"},
		{"ssm_roots", "SSMScan y NS="},
		{"ssm_clamp", "SSMScan y"},
		{"conv_roots", "Conv1D out NS="},
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
