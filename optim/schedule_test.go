package optim

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

func testMegatronConfig(style string) MegatronConfig {
	return MegatronConfig{
		LR: 1e-4, MinLR: 1e-6, WarmupInit: 1e-7, WarmupIters: 3, DecayIters: 10, DecayStyle: style,
		StartWD: 0, EndWD: 0.1, WDIncrStyle: WDCosine, TrainIters: 12, GlobalBatchSize: 16,
	}
}

// lrSequence runs GRPO steps whose logical rollouts expand into the given
// physical row counts and returns the lr read before each scheduler step.
func lrSequence(t *testing.T, s Schedule, logical int, physical []int) []float64 {
	t.Helper()
	var lrs []float64
	for _, rows := range physical {
		lrs = append(lrs, s.LR())
		s.Step(StepSamples(rows, logical))
	}
	return lrs
}

// TestSchedulerCountsLogicalRollouts is spec §7.2: 16 logical rollouts per
// GRPO step (= train_global_batch_size) give the same lr sequence whether they
// expand to 32 or to 57 physical rows, and the same as the single-trace run;
// stepping by physical rows (the legacy gbs) would not.
func TestSchedulerCountsLogicalRollouts(t *testing.T) {
	const steps = 14
	same := func(n int) []int {
		r := make([]int, steps)
		for i := range r {
			r[i] = n
		}
		return r
	}
	rng := rand.New(rand.NewPCG(1, 2))
	varied := make([]int, steps)
	for i := range varied {
		varied[i] = 16 + rng.IntN(60)
	}
	for _, style := range []string{DecayConstant, DecayLinear, DecayCosine, DecayInverseSquareRoot} {
		t.Run(style, func(t *testing.T) {
			newSched := func() Schedule {
				s, err := NewMegatron(testMegatronConfig(style))
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			want := lrSequence(t, newSched(), 0, same(16)) // legacy, one row per rollout
			for _, rows := range [][]int{same(32), same(57), varied} {
				if diff := cmp.Diff(want, lrSequence(t, newSched(), 16, rows)); diff != "" {
					t.Errorf("16 logical rollouts as %v physical rows: lr (-want +got):\n%s", rows[:3], diff)
				}
			}
			if style != DecayConstant {
				if got := lrSequence(t, newSched(), 0, same(57)); cmp.Equal(want, got) {
					t.Errorf("stepping by 57 physical rows gave the logical lr sequence; the test cannot tell them apart")
				}
			}
			// One scheduler iteration per GRPO step: after the warmup's 3
			// iterations the lr peaks, at Samples = 3·16.
			s := newSched()
			lrSequence(t, s, 16, same(57)[:3])
			if got := s.State(); got != (ScheduleState{Samples: 48, Steps: 3}) {
				t.Errorf("state after 3 steps = %+v", got)
			}
			if s.LR() != 1e-4 {
				t.Errorf("lr at the end of warmup = %v, want 1e-4", s.LR())
			}
		})
	}
}

func TestStepSamples(t *testing.T) {
	for _, c := range []struct{ phys, logical, want int }{{32, 16, 16}, {57, 16, 16}, {16, 0, 16}, {64, 0, 64}} {
		if got := StepSamples(c.phys, c.logical); got != int64(c.want) {
			t.Errorf("StepSamples(%d, %d) = %d, want %d", c.phys, c.logical, got, c.want)
		}
	}
}

// TestScheduleRestore: a schedule restored from State continues exactly as
// the uninterrupted one, for random interruption points.
func TestScheduleRestore(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	mk := []func() Schedule{
		func() Schedule { s, _ := NewMegatron(testMegatronConfig(DecayCosine)); return s },
		func() Schedule {
			s, _ := NewSequential(SequentialConfig{LR: 1e-3, WeightDecay: 0.1, Milestones: []int64{4},
				Phases: []Phase{{Kind: PhaseLinear, StartFactor: 0.1, EndFactor: 1, TotalIters: 4}, {Kind: PhaseConstant, Factor: 0.5, TotalIters: 3}}})
			return s
		},
	}
	for i, f := range mk {
		for trial := 0; trial < 20; trial++ {
			a := f()
			cut := rng.IntN(20)
			var want, got []float64
			for k := 0; k < 20; k++ {
				want = append(want, a.LR(), a.WeightDecay())
				a.Step(16)
			}
			b := f()
			for k := 0; k < cut; k++ {
				got = append(got, b.LR(), b.WeightDecay())
				b.Step(16)
			}
			c := f()
			if err := c.Restore(b.State()); err != nil {
				t.Fatal(err)
			}
			for k := cut; k < 20; k++ {
				got = append(got, c.LR(), c.WeightDecay())
				c.Step(16)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("schedule %d cut at %d: (-want +got)\n%s", i, cut, diff)
			}
		}
	}
}

func TestMegatronConfigErrors(t *testing.T) {
	frac := 1.5
	cases := []struct {
		name  string
		edit  func(*MegatronConfig)
		field string
	}{
		{"gbs", func(c *MegatronConfig) { c.GlobalBatchSize = 0 }, "train_global_batch_size"},
		{"min_lr", func(c *MegatronConfig) { c.MinLR = -1 }, "min_lr"},
		{"lr<min", func(c *MegatronConfig) { c.LR = 1e-9 }, "lr"},
		{"init>lr", func(c *MegatronConfig) { c.WarmupInit = 1 }, "lr_warmup_init"},
		{"style", func(c *MegatronConfig) { c.DecayStyle = "WSD" }, "lr_decay_style"},
		{"wdstyle", func(c *MegatronConfig) { c.WDIncrStyle = "exp" }, "weight_decay_incr_style"},
		{"end<start", func(c *MegatronConfig) { c.StartWD = 0.5 }, "end_weight_decay"},
		{"const wd", func(c *MegatronConfig) { c.WDIncrStyle = WDConstant }, "end_weight_decay"},
		{"decay", func(c *MegatronConfig) { c.DecayIters = 0; c.TrainIters = 0 }, "lr_decay_iters"},
		{"fraction", func(c *MegatronConfig) { c.WarmupFraction = &frac }, "lr_warmup_fraction"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testMegatronConfig(DecayLinear)
			c.edit(&cfg)
			_, err := NewMegatron(cfg)
			// The field itself, not a longer name containing it
			// ("lr" is in "lr_warmup_init").
			if err == nil || !strings.Contains(err.Error(), ": "+c.field+":") && !strings.Contains(err.Error(), ": "+c.field+" (") {
				t.Fatalf("err = %v, want one naming %s", err, c.field)
			}
		})
	}
	cfg := testMegatronConfig(DecayLinear)
	cfg.WarmupIters = 50
	s, err := NewMegatron(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Notes()) != 1 || s.WarmupSamples() != float64(s.DecaySamples()-1) {
		t.Errorf("warmup not capped: notes %q, warmup %v, decay %d", s.Notes(), s.WarmupSamples(), s.DecaySamples())
	}
}

func TestSequentialConfigErrors(t *testing.T) {
	lin := Phase{Kind: PhaseLinear, StartFactor: 0.5, EndFactor: 1, TotalIters: 3}
	cases := []struct {
		name  string
		cfg   SequentialConfig
		field string
	}{
		{"milestones count", SequentialConfig{LR: 1, Phases: []Phase{lin, lin}}, "milestones"},
		{"milestones order", SequentialConfig{LR: 1, Phases: []Phase{lin, lin, lin}, Milestones: []int64{5, 5}}, "milestones[1]"},
		{"start factor", SequentialConfig{LR: 1, Phases: []Phase{{Kind: PhaseLinear, StartFactor: 0, EndFactor: 1, TotalIters: 1}}}, "start_factor"},
		{"factor", SequentialConfig{LR: 1, Phases: []Phase{{Kind: PhaseConstant, Factor: 2}}}, "factor"},
		{"kind", SequentialConfig{LR: 1, Phases: []Phase{{Kind: "CosineAnnealingLR"}}}, "CosineAnnealingLR"},
		{"lr", SequentialConfig{LR: -1}, "lr"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewSequential(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("err = %v, want one naming %s", err, c.field)
			}
		})
	}
}

// TestAdamWNonFinite: the guard skips (counting, touching nothing) or aborts,
// naming the group; a finite step afterwards proceeds with step counter 1.
func TestAdamWNonFinite(t *testing.T) {
	for _, policy := range []NonFinite{SkipNonFinite, AbortNonFinite} {
		for _, bad := range []float32{float32(math.Inf(1)), float32(math.NaN()), float32(math.Inf(-1))} {
			be := cpu.New(1)
			const n = 40
			param, grad := allocF32(t, be, n), allocF32(t, be, n)
			p0 := make([]float32, n)
			g := make([]float32, n)
			for i := range p0 {
				p0[i] = float32(i) * 0.1
				g[i] = 0.5
			}
			be.UploadF32(param, p0)
			g[25] = bad
			be.UploadF32(grad, g)
			o, err := New(be, param, grad, []Group{{0, 10, true}, {10, 10, false}, {20, 20, true}}, Config{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, MaxGradNorm: 1, NonFinite: policy})
			if err != nil {
				t.Fatal(err)
			}
			res, err := o.Step(1e-2, 0.1)
			if policy == AbortNonFinite {
				if !errors.Is(err, ErrNonFiniteGrad) || !strings.Contains(err.Error(), "group 2 (elements [20, 40))") {
					t.Fatalf("abort: err = %v", err)
				}
			} else if err != nil || !res.Skipped {
				t.Fatalf("skip: res %+v err %v", res, err)
			}
			wantSkipped := int64(0)
			if policy == SkipNonFinite {
				wantSkipped = 1
			}
			if got := o.State(); got != (State{Step: 0, Skipped: wantSkipped}) {
				t.Errorf("state = %+v", got)
			}
			got := make([]float32, n)
			be.DownloadF32(got, param)
			if diff := cmp.Diff(p0, got); diff != "" {
				t.Errorf("params changed on a non-finite step (-want +got):\n%s", diff)
			}
			m, v := o.Moments()
			for _, b := range []kernels.Buf{m, v} {
				be.DownloadF32(got, b)
				for i, x := range got {
					if x != 0 {
						t.Fatalf("moment[%d] = %v after a skipped step", i, x)
					}
				}
			}
			g[25] = 0.5
			be.UploadF32(grad, g)
			res, err = o.Step(1e-2, 0.1)
			if err != nil || res.Skipped || res.Step != 1 {
				t.Fatalf("finite step: %+v %v", res, err)
			}
			o.Close()
			be.Close()
		}
	}
}

// TestAdamWNonFiniteWeights: an update that overflows float32 (lr 3e38,
// or weight decay with lr 1e38) is reported under either policy, naming
// the first group whose weights it made non-finite; finite gradients and a
// sane lr report nothing. The gradient guard alone let such weights be
// saved (issue 26, item 3).
func TestAdamWNonFiniteWeights(t *testing.T) {
	for _, policy := range []NonFinite{SkipNonFinite, AbortNonFinite} {
		for _, tc := range []struct {
			lr, wd    float64
			wantGroup int // -1: none
		}{{1e-2, 0.1, -1}, {3e38, 0, 0}, {1e38, 1e3, 0}} {
			be := cpu.New(1)
			const n = 40
			param, grad := allocF32(t, be, n), allocF32(t, be, n)
			p0, g := make([]float32, n), make([]float32, n)
			for i := range p0 {
				p0[i], g[i] = float32(i)*0.1+1, 0.5
			}
			be.UploadF32(param, p0)
			be.UploadF32(grad, g)
			o, err := New(be, param, grad, []Group{{0, 10, true}, {10, 10, false}, {20, 20, true}}, Config{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, MaxGradNorm: 1, NonFinite: policy})
			if err != nil {
				t.Fatal(err)
			}
			_, err = o.Step(tc.lr, tc.wd)
			var we *WeightsError
			switch {
			case tc.wantGroup < 0 && err != nil:
				t.Errorf("policy %d, lr %g: %v", policy, tc.lr, err)
			case tc.wantGroup >= 0 && (!errors.As(err, &we) || !errors.Is(err, ErrNonFiniteWeights) || we.Group != tc.wantGroup || we.Step != 1):
				t.Errorf("policy %d, lr %g, wd %g: %v, want a WeightsError for group %d at step 1", policy, tc.lr, tc.wd, err, tc.wantGroup)
			}
			o.Close()
			be.Close()
		}
	}
}

// TestAdamWGroups: elements outside every group are untouched; a group
// without Decay gets no weight decay even with zero gradient; the pre-clip
// norm covers only the groups.
func TestAdamWGroups(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	const n = 30
	param, grad := allocF32(t, be, n), allocF32(t, be, n)
	p0 := make([]float32, n)
	for i := range p0 {
		p0[i] = 1
	}
	be.UploadF32(param, p0)
	g := make([]float32, n)
	for i := 20; i < 25; i++ {
		g[i] = 3 // ‖g‖ over the groups = sqrt(5·9)
	}
	g[27] = 100 // outside every group
	be.UploadF32(grad, g)
	o, err := New(be, param, grad, []Group{{0, 10, true}, {10, 10, false}, {20, 5, true}}, Config{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, MaxGradNorm: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	res, err := o.Step(0.1, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if want := math.Sqrt(45); math.Abs(res.GradNorm-want) > 1e-12 {
		t.Errorf("grad norm = %v, want %v", res.GradNorm, want)
	}
	if want := 1 / (math.Sqrt(45) + 1e-6); math.Abs(res.ClipScale-want) > 1e-15 {
		t.Errorf("clip scale = %v, want %v", res.ClipScale, want)
	}
	got := make([]float32, n)
	be.DownloadF32(got, param)
	for i, x := range got {
		var want float32
		switch {
		case i < 10: // decay only: p·(1 − lr·wd), zero gradient leaves no Adam step
			want = float32(1 - 0.1*0.5)
		case i < 20, i >= 25:
			want = 1
		default: // decay then p − lr·m̂/(sqrt(v̂)+eps) ≈ p − lr
			want = float32(1-0.1*0.5) - 0.1
		}
		if math.Abs(float64(x-want)) > 1e-6 {
			t.Errorf("param[%d] = %v, want %v", i, x, want)
		}
	}
}

func TestNewErrors(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	p, g := allocF32(t, be, 10), allocF32(t, be, 10)
	g9 := allocF32(t, be, 9)
	ok := Config{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}
	cases := []struct {
		name   string
		grad   kernels.Buf
		groups []Group
		cfg    Config
		want   string
	}{
		{"length", g9, []Group{{0, 9, true}}, ok, "grad 9"},
		{"none", g, nil, ok, "no parameter groups"},
		{"overlap", g, []Group{{0, 6, true}, {5, 5, false}}, ok, "group 1 [5, 10)"},
		{"outside", g, []Group{{5, 6, true}}, ok, "group 0 [5, 11)"},
		{"beta1", g, []Group{{0, 10, true}}, Config{Beta1: 1, Beta2: 0.9}, "adam_beta1"},
		{"beta2", g, []Group{{0, 10, true}}, Config{Beta1: 0.9, Beta2: -1}, "adam_beta2"},
		{"eps", g, []Group{{0, 10, true}}, Config{Beta1: 0.9, Beta2: 0.9, Eps: math.NaN()}, "adam_eps"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(be, p, c.grad, c.groups, c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q", err, c.want)
			}
		})
	}
}

// TestAdamWResumeBitExact: stopping after k steps, saving params, moments and
// State, and continuing in a fresh optimizer gives bit-identical parameters
// and moments to the uninterrupted run.
func TestAdamWResumeBitExact(t *testing.T) {
	const n, steps = 300, 12
	rng := rand.New(rand.NewPCG(5, 6))
	p0 := make([]float32, n)
	for i := range p0 {
		p0[i] = float32(rng.NormFloat64())
	}
	grads := make([][]float32, steps)
	for k := range grads {
		grads[k] = make([]float32, n)
		for i := range grads[k] {
			grads[k][i] = float32(rng.NormFloat64() * 2)
		}
	}
	groups := []Group{{0, 100, true}, {100, 50, false}, {150, 150, true}}
	cfg := Config{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, MaxGradNorm: 1}
	run := func(be *cpu.Backend, param, grad kernels.Buf, o *AdamW, s Schedule, from, to int) {
		for k := from; k < to; k++ {
			be.UploadF32(grad, grads[k])
			if _, err := o.Step(s.LR(), s.WeightDecay()); err != nil {
				t.Fatal(err)
			}
			s.Step(16)
		}
	}
	snapshot := func(be *cpu.Backend, param kernels.Buf, o *AdamW) []float32 {
		out := make([]float32, 3*n)
		be.DownloadF32(out[:n], param)
		be.DownloadF32(out[n:], o.MomentArena())
		return out
	}
	newSched := func() Schedule { s, _ := NewMegatron(testMegatronConfig(DecayCosine)); return s }
	be := cpu.New(2)
	defer be.Close()
	param, grad := allocF32(t, be, n), allocF32(t, be, n)
	be.UploadF32(param, p0)
	o, _ := New(be, param, grad, groups, cfg)
	s := newSched()
	run(be, param, grad, o, s, 0, steps)
	want := snapshot(be, param, o)
	for _, cut := range []int{1, 5, 11} {
		be.UploadF32(param, p0)
		o1, _ := New(be, param, grad, groups, cfg)
		s1 := newSched()
		run(be, param, grad, o1, s1, 0, cut)
		saved, st, sst := snapshot(be, param, o1), o1.State(), s1.State()
		o1.Close()
		be.UploadF32(param, make([]float32, n)) // clobber
		o2, _ := New(be, param, grad, groups, cfg)
		be.UploadF32(param, saved[:n])
		be.UploadF32(o2.MomentArena(), saved[n:])
		if err := o2.SetState(st); err != nil {
			t.Fatal(err)
		}
		s2 := newSched()
		if err := s2.Restore(sst); err != nil {
			t.Fatal(err)
		}
		run(be, param, grad, o2, s2, cut, steps)
		got := snapshot(be, param, o2)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("cut %d: element %d = %v, uninterrupted %v", cut, i, got[i], want[i])
			}
		}
		o2.Close()
	}
}
