package optim

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// TestClipSets: groups in clip set 1 are clipped by their own norm and left
// out of the main one (Megatron's separate grad_norm_group): one optimizer
// over both sets updates every element exactly as two optimizers, one per
// set, do; GradNorm is set 0's, and each set's norm and factor are reported.
func TestClipSets(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	const n = 60
	r := rand.New(rand.NewPCG(3, 4))
	p0, g0 := make([]float32, n), make([]float32, n)
	for i := range p0 {
		p0[i] = float32(r.NormFloat64())
		g0[i] = float32(r.NormFloat64()) * 3
	}
	for i := 40; i < n; i++ {
		g0[i] *= 20 // the separate set's norm is far larger
	}
	alloc := func(x []float32) kernels.Buf {
		b, err := be.Alloc(kernels.F32, len(x))
		if err != nil {
			t.Fatal(err)
		}
		be.UploadF32(b, x)
		return b
	}
	cfg := Config{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, MaxGradNorm: 1}
	groups := []Group{{0, 20, true}, {20, 20, false}, {40, 10, true}, {50, 10, false}}
	both := cfg
	both.ClipSet = []int{0, 0, 1, 1}
	pa, ga := alloc(p0), alloc(g0)
	oa, err := New(be, pa, ga, groups, both)
	if err != nil {
		t.Fatal(err)
	}
	ra, err := oa.Step(1e-2, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	// Each set alone.
	want := make([]float32, n)
	var norms [2]float64
	for k, part := range [][2]int{{0, 40}, {40, 60}} {
		lo, hi := part[0], part[1]
		p, g := alloc(p0[lo:hi]), alloc(g0[lo:hi])
		var gs []Group
		for _, x := range groups {
			if x.Off >= lo && x.Off < hi {
				gs = append(gs, Group{x.Off - lo, x.N, x.Decay})
			}
		}
		o, err := New(be, p, g, gs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		res, err := o.Step(1e-2, 0.1)
		if err != nil {
			t.Fatal(err)
		}
		norms[k] = res.GradNorm
		be.DownloadF32(want[lo:hi], p)
	}
	got := make([]float32, n)
	be.DownloadF32(got, pa)
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("element %d: %g with clip sets, %g with an optimizer per set", i, got[i], want[i])
		}
	}
	if ra.GradNorm != norms[0] || len(ra.SetNorms) != 2 || ra.SetNorms[1] != norms[1] {
		t.Errorf("norms %v, %v; want %v", ra.GradNorm, ra.SetNorms, norms)
	}
	if !(ra.SetScales[1] < ra.SetScales[0]) || math.Abs(ra.SetScales[1]-1/(norms[1]+1e-6)) > 1e-12 {
		t.Errorf("clip factors %v for norms %v", ra.SetScales, norms)
	}
	if _, err := New(be, pa, ga, groups, Config{Beta1: 0.9, Beta2: 0.9, ClipSet: []int{0, 2, 0, 0}}); err == nil {
		t.Error("clip set 2: no error")
	}
	if _, err := New(be, pa, ga, groups, Config{Beta1: 0.9, Beta2: 0.9, ClipSet: []int{0}}); err == nil {
		t.Error("one clip set for four groups: no error")
	}
}
