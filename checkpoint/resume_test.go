package checkpoint

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/optim"
)

// toyRun is a miniature training loop with every piece of state a real run
// checkpoints: a parameter arena, AdamW moments and counters, a schedule, an
// RNG that draws the "gradients", and a rollout cursor.
type toyRun struct {
	be          *cpu.Backend
	param, grad kernels.Buf
	opt         *optim.AdamW
	sched       optim.Schedule
	pcg         *rand.PCG
	cursor      int64
	step        int64
}

var toyGroups = []optim.Group{{Off: 0, N: 60, Decay: true}, {Off: 60, N: 12, Decay: false}, {Off: 72, N: 48, Decay: true}}

const toyN = 120

func newToyRun(t *testing.T) *toyRun {
	t.Helper()
	r := &toyRun{be: cpu.New(1), pcg: rand.NewPCG(42, 43)}
	var err error
	if r.param, err = r.be.Alloc(kernels.F32, toyN); err != nil {
		t.Fatal(err)
	}
	if r.grad, err = r.be.Alloc(kernels.F32, toyN); err != nil {
		t.Fatal(err)
	}
	p := make([]float32, toyN)
	for i := range p {
		p[i] = float32(math.Sin(float64(i)))
	}
	r.be.UploadF32(r.param, p)
	if r.opt, err = optim.New(r.be, r.param, r.grad, toyGroups, optim.Config{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, MaxGradNorm: 1}); err != nil {
		t.Fatal(err)
	}
	if r.sched, err = optim.NewMegatron(optim.MegatronConfig{LR: 1e-2, MinLR: 1e-3, WarmupInit: 1e-4, WarmupIters: 2, DecayIters: 10,
		DecayStyle: optim.DecayCosine, StartWD: 0, EndWD: 0.1, WDIncrStyle: optim.WDLinear, TrainIters: 12, GlobalBatchSize: 4}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *toyRun) train(t *testing.T, steps int) {
	t.Helper()
	rng := rand.New(r.pcg)
	g := make([]float32, toyN)
	for range steps {
		for i := range g {
			g[i] = float32(rng.NormFloat64()) * float32(1+r.cursor%3)
		}
		r.be.UploadF32(r.grad, g)
		if _, err := r.opt.Step(r.sched.LR(), r.sched.WeightDecay()); err != nil {
			t.Fatal(err)
		}
		r.sched.Step(optim.StepSamples(9, 4)) // 4 logical rollouts as 9 rows
		r.cursor += 4
		r.step++
	}
}

func (r *toyRun) state(t *testing.T) *State {
	t.Helper()
	p := make([]float32, toyN)
	r.be.DownloadF32(p, r.param)
	mom := make([]float32, 2*toyN)
	r.be.DownloadF32(mom, r.opt.MomentArena())
	ob, _ := json.Marshal(r.opt.State())
	sb, _ := json.Marshal(r.sched.State())
	rb, err := r.pcg.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return &State{
		Model:       []Tensor{{Spec: safetensors.Spec{Name: "w", DType: safetensors.F32, Shape: []int{toyN}}, F32: p}},
		ModelConfig: []byte(`{"hidden_size": 4}`),
		Optimizer: []Tensor{
			{Spec: safetensors.Spec{Name: "exp_avg", DType: safetensors.F32, Shape: []int{toyN}}, F32: mom[:toyN]},
			{Spec: safetensors.Spec{Name: "exp_avg_sq", DType: safetensors.F32, Shape: []int{toyN}}, F32: mom[toyN:]},
		},
		Trainer: TrainerState{Step: r.step, ConsumedRollouts: r.cursor, Optimizer: ob, Scheduler: sb,
			RNG: map[string][]byte{"grads": rb}, RolloutCursor: json.RawMessage(fmt.Sprintf(`{"index":%d}`, r.cursor))},
	}
}

func (r *toyRun) restore(t *testing.T, st *State) {
	t.Helper()
	byName := map[string][]float32{}
	for _, x := range append(append([]Tensor(nil), st.Model...), st.Optimizer...) {
		byName[x.Name] = x.F32
	}
	r.be.UploadF32(r.param, byName["w"])
	m, v := r.opt.Moments()
	r.be.UploadF32(m, byName["exp_avg"])
	r.be.UploadF32(v, byName["exp_avg_sq"])
	var os optim.State
	var ss optim.ScheduleState
	var cur struct{ Index int64 }
	for _, e := range []error{json.Unmarshal(st.Trainer.Optimizer, &os), json.Unmarshal(st.Trainer.Scheduler, &ss),
		json.Unmarshal(st.Trainer.RolloutCursor, &cur), r.opt.SetState(os), r.sched.Restore(ss), r.pcg.UnmarshalBinary(st.Trainer.RNG["grads"])} {
		if e != nil {
			t.Fatal(e)
		}
	}
	r.cursor, r.step = cur.Index, st.Trainer.Step
}

// TestResumeBitExact: a run saved after k steps, loaded into a fresh process
// state and continued, ends bit-identical to the run that never stopped, for
// every k; and the checkpoint of the final state equals the uninterrupted one.
func TestResumeBitExact(t *testing.T) {
	const total = 12
	ref := newToyRun(t)
	ref.train(t, total)
	want := ref.state(t)
	for _, k := range []int{1, 3, 7, 11} {
		dir := t.TempDir()
		a := newToyRun(t)
		a.train(t, k)
		if _, err := Save(dir, a.state(t), SaveOptions{CompressOptimizer: k%2 == 1}); err != nil {
			t.Fatal(err)
		}
		res, err := LoadLatest(dir, LoadOptions{ExpectConfig: []byte(`{"hidden_size": 4}`)})
		if err != nil {
			t.Fatal(err)
		}
		b := newToyRun(t)
		b.restore(t, res.State)
		b.train(t, total-k)
		got := b.state(t)
		got.Trainer.FormatVersion = want.Trainer.FormatVersion
		if d := diffStates(want, got); d != "" {
			t.Errorf("resumed at step %d: %s", k, d)
		}
	}
}

func diffStates(a, b *State) string {
	ta := append(append([]Tensor(nil), a.Model...), a.Optimizer...)
	tb := append(append([]Tensor(nil), b.Model...), b.Optimizer...)
	for i := range ta {
		for j := range ta[i].F32 {
			if math.Float32bits(ta[i].F32[j]) != math.Float32bits(tb[i].F32[j]) {
				return fmt.Sprintf("%s[%d] = %v, uninterrupted %v", ta[i].Name, j, tb[i].F32[j], ta[i].F32[j])
			}
		}
	}
	ja, _ := json.Marshal(a.Trainer)
	jb, _ := json.Marshal(b.Trainer)
	if string(ja) != string(jb) {
		return fmt.Sprintf("trainer state %s, uninterrupted %s", jb, ja)
	}
	return ""
}
