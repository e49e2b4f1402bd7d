package model

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// shardGradTol bounds a sharded gradient's difference from one model's:
// the ranks' gradients are summed over ranks (in rank order) and then over
// micro-batches, where one model accumulates every micro-batch in its
// kernels, so each sum is reassociated: float32 sums of a few terms differ
// by a few ulps of the largest partial sum (~1e-7 relative), and the test
// models' gradient elements are at most ~1, so 1e-6 + 1e-5 relative bounds
// reassociation, while a dropped rank, a wrong shard or a doubled group
// moves a gradient by its own size.
const (
	shardGradAtol = 1e-6
	shardGradRtol = 1e-5
)

// microBatch is one packed micro-batch of a test rank.
type testMB struct {
	tokens, cu []int32
	dlp        []float32
}

// randomMBs returns n micro-batches of random rows (some of them empty).
func randomMBs(r *rand.Rand, cfg Config, n, maxTokens int) []testMB {
	out := make([]testMB, n)
	for i := range out {
		if r.IntN(4) == 0 {
			out[i] = testMB{cu: []int32{0}}
			continue
		}
		mb := testMB{cu: []int32{0}}
		for len(mb.tokens) < maxTokens-2 && r.IntN(3) > 0 || len(mb.tokens) == 0 {
			l := 2 + r.IntN(min(10, maxTokens-len(mb.tokens)-1))
			for range l {
				mb.tokens = append(mb.tokens, int32(r.IntN(cfg.VocabSize)))
			}
			mb.cu = append(mb.cu, int32(len(mb.tokens)))
		}
		mb.dlp = make([]float32, len(mb.tokens))
		for j := range mb.dlp {
			mb.dlp[j] = float32(r.NormFloat64()) / 16
		}
		out[i] = mb
	}
	return out
}

// onRanks runs body on n goroutine ranks over collective.Local, each with
// its own CPU backend, and fails on any rank's error.
func onRanks(t *testing.T, n int, body func(r int, b kernels.Backend, c collective.Comm) error) {
	t.Helper()
	mems := make([]kernels.Backend, n)
	for i := range mems {
		b := cpu.New(1)
		defer b.Close()
		mems[i] = b
	}
	comms := collective.Local(mems)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[r] = body(r, mems[r], comms[r]); errs[r] != nil {
				comms[r].Abort(1)
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// TestShardedMatchesWhole: a model sharded over 1, 2, 3 and 4 ranks (none
// of which divides every flat: the padding is exercised) computes the same
// log-probabilities as one whole model, bit for bit; its shard gradients
// are the whole model's summed over every rank's micro-batches (within
// shardGradTol; bit for bit on one rank of an untied model: a tied
// embedding's two gradients per micro-batch are summed per micro-batch
// first), with ranks running different
// numbers of tokens and empty micro-batches; InitRandom gives each rank
// exactly its part of the whole model's weights; and the sharded HF export
// is byte-identical to the whole model's. For fp32 and bf16, with and
// without recomputation and resharding after forward. Sparse models too:
// their routers and experts sharded with their layers' groups, the
// load-balancing loss in the gradients and equal per micro-batch, and a
// checkpoint in transformers v5's fused expert layout read by ranges.
// Nemotron-H models too (nh_*: Mamba, attention, MLP and sparse blocks).
func TestShardedMatchesWhole(t *testing.T) {
	type tc struct {
		variant string
		prec    kernels.DType
		re      bool
		reshard bool
	}
	var cases []tc
	for _, v := range []string{"qwen3_tied", "qwen2_untied", "llama_untied", "llama_tied"} {
		cases = append(cases, tc{v, kernels.F32, false, true})
	}
	cases = append(cases, tc{"qwen3_untied", kernels.F32, true, false}, tc{"qwen3_untied", kernels.BF16, false, true},
		tc{"qwen3_tied", kernels.BF16, true, true}, tc{"qwen2_untied", kernels.BF16, false, false})
	cases = append(cases, tc{"odd", kernels.F32, false, true}, tc{"odd", kernels.BF16, true, false})
	// Qwen3-MoE: the router and experts are a layer's parameters like any
	// other (interleaved dense and sparse layers in moe_k8_interleaved).
	cases = append(cases, tc{"moe_k2_norm", kernels.F32, false, true}, tc{"moe_k8_interleaved", kernels.F32, true, false},
		tc{"moe_k1", kernels.BF16, false, true})
	// Sparse layers: the router and every expert are sharded with their
	// layer's group (dense layers interleaved in moe_k8_interleaved).
	cases = append(cases, tc{"moe_k8_interleaved", kernels.F32, false, true}, tc{"moe_k2_norm", kernels.BF16, true, false},
		tc{"moe_k2_nonorm_v5", kernels.F32, true, true})
	// Nemotron-H: every block kind's parameters (Mamba's conv, A_log, D,
	// dt_bias and gated norm in the vector flats; the sigmoid routers and
	// their selection biases; the latent projections) sharded with their
	// block's group.
	cases = append(cases, tc{"nh_blocks", kernels.F32, false, true}, tc{"nh_groups", kernels.BF16, true, false},
		tc{"nh_latent", kernels.F32, true, true}, tc{"nh_bf16", kernels.BF16, false, true})
	for _, c := range cases {
		for _, world := range []int{1, 2, 3, 4} {
			name := fmt.Sprintf("%s/%s/recompute=%v/reshard=%v/W=%d", c.variant, c.prec, c.re, c.reshard, world)
			t.Run(name, func(t *testing.T) {
				cfg := oddConfig(t)
				if c.variant != "odd" {
					cfg = testConfig(t, c.variant)
				}
				opt := Options{MaxTokens: 24, MaxSeqs: 8, Recompute: c.re, Precision: c.prec}
				checkSharded(t, cfg, opt, world, c.reshard)
			})
		}
	}
}

func checkSharded(t *testing.T, cfg Config, opt Options, world int, reshard bool) {
	r := rand.New(rand.NewPCG(uint64(world), 7))
	perRank := make([][]testMB, world)
	nmb := 2 + r.IntN(2)
	for i := range perRank {
		perRank[i] = randomMBs(r, cfg, nmb, opt.MaxTokens)
	}
	// The whole model runs every rank's micro-batches.
	cb := cpu.New(1)
	defer cb.Close()
	whole, err := New(cb, cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	whole.InitRandom(11)
	// A sparse model's load-balancing loss is in the differentiated loss.
	const auxWeight = 0.25
	whole.SetRouterLossWeight(auxWeight)
	wantLP := make([][][]float32, world)
	wantAux := make([][]float64, world)
	for rk, mbs := range perRank {
		for _, mb := range mbs {
			lp, _, err := whole.Forward(mb.tokens, mb.cu, 1)
			if err != nil {
				t.Fatal(err)
			}
			wantLP[rk] = append(wantLP[rk], append([]float32(nil), lp...))
			aux, _ := whole.RouterLoss()
			wantAux[rk] = append(wantAux[rk], aux)
			if err := whole.Backward(mb.dlp); err != nil {
				t.Fatal(err)
			}
		}
	}
	wantW, wantG := whole.ParamsHost(), make([]float32, whole.Table().Total)
	cb.DownloadF32(wantG, whole.Grads())
	dir := t.TempDir()
	if err := whole.SaveHF(filepath.Join(dir, "whole")); err != nil {
		t.Fatal(err)
	}
	var fused []float32
	fusedDir := filepath.Join("testdata", "moe_k2_nonorm_v5")
	if v5, err := LoadConfig(filepath.Join(fusedDir, "config.json")); err == nil && reflect.DeepEqual(v5, cfg) {
		if err := whole.LoadHF(fusedDir); err != nil {
			t.Fatal(err)
		}
		fused = whole.ParamsHost()
	}
	padded := false
	onRanks(t, world, func(rk int, b kernels.Backend, c collective.Comm) error {
		m, err := NewSharded(b, cfg, opt, ShardOptions{Comm: c, ReshardAfterForward: reshard})
		if err != nil {
			return err
		}
		defer m.Close()
		m.InitRandom(11)
		m.SetRouterLossWeight(auxWeight)
		tab, sh := m.Table(), m.Sharding()
		host := m.ParamsHost()
		for i, p := range tab.Params {
			lo, hi, at := m.Owned(i)
			for k := lo; k < hi; k++ {
				if host[at+k-lo] != wantW[p.Offset+k] {
					return fmt.Errorf("InitRandom: %s[%d] = %g, the whole model has %g", p.Name, k, host[at+k-lo], wantW[p.Offset+k])
				}
			}
		}
		for g := range tab.Groups {
			for f := range NumFlats {
				if sh.Padded(g, f) > tab.Groups[g].FlatN[f] && rk == 0 {
					padded = true
				}
			}
		}
		for i, mb := range perRank[rk] {
			lp, _, err := m.Forward(mb.tokens, mb.cu, 1)
			if err != nil {
				return err
			}
			for j := range lp {
				if lp[j] != wantLP[rk][i][j] {
					return fmt.Errorf("micro-batch %d: logprob[%d] = %g, the whole model's %g", i, j, lp[j], wantLP[rk][i][j])
				}
			}
			if aux, _ := m.RouterLoss(); aux != wantAux[rk][i] {
				return fmt.Errorf("micro-batch %d: router loss %g, the whole model's %g", i, aux, wantAux[rk][i])
			}
			if err := m.Backward(mb.dlp); err != nil {
				return err
			}
		}
		grads := make([]float32, m.Grads().N)
		b.DownloadF32(grads, m.Grads())
		if err := b.Sync(); err != nil {
			return err
		}
		worst := 0.0
		for i, p := range tab.Params {
			lo, hi, at := m.Owned(i)
			for k := lo; k < hi; k++ {
				got, want := float64(grads[at+k-lo]), float64(wantG[p.Offset+k])
				d := math.Abs(got - want)
				if world == 1 && !cfg.TieWordEmbeddings && d != 0 || d > shardGradAtol+shardGradRtol*math.Abs(want) || math.IsNaN(got) {
					return fmt.Errorf("gradient of %s[%d] = %g, the whole model's %g", p.Name, k, got, want)
				}
				worst = max(worst, d)
			}
		}
		// Padding stays zero.
		for _, x := range shardPadding(m) {
			if grads[x] != 0 || host[x] != 0 {
				return fmt.Errorf("padding element %d of the shard: weight %g gradient %g", x, host[x], grads[x])
			}
		}
		if err := m.SaveHF(filepath.Join(dir, "sharded")); err != nil {
			return err
		}
		// LoadHF of the whole model's export gives each rank its part.
		m2, err := NewSharded(b, cfg, opt, ShardOptions{Comm: c, ReshardAfterForward: reshard})
		if err != nil {
			return err
		}
		defer m2.Close()
		if err := m2.LoadHF(filepath.Join(dir, "whole")); err != nil {
			return err
		}
		for k, x := range m2.ParamsHost() {
			if x != host[k] {
				return fmt.Errorf("LoadHF: shard element %d = %g, InitRandom gave %g", k, x, host[k])
			}
		}
		// A sparse checkpoint in transformers v5's fused layout: each rank
		// reads its ranges of the fused expert tensors.
		if fused != nil {
			if err := m2.LoadHF(fusedDir); err != nil {
				return err
			}
			got := m2.ParamsHost()
			for i, p := range tab.Params {
				lo, hi, at := m2.Owned(i)
				for k := lo; k < hi; k++ {
					if got[at+k-lo] != fused[p.Offset+k] {
						return fmt.Errorf("LoadHF of the fused layout: %s[%d] = %g, the whole model loaded %g", p.Name, k, got[at+k-lo], fused[p.Offset+k])
					}
				}
			}
		}
		return nil
	})
	if world > 1 && !padded && cfg.VocabSize == oddVocab {
		t.Errorf("no flat of the odd model needed padding at %d ranks", world)
	}
	a, _ := os.ReadFile(filepath.Join(dir, "whole", "model.safetensors"))
	b, _ := os.ReadFile(filepath.Join(dir, "sharded", "model.safetensors"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Errorf("the sharded export (%d bytes) differs from the whole model's (%d bytes)", len(b), len(a))
	}
}

// shardPadding lists the shard arena's padding elements on this rank.
func shardPadding(m *Model) []int {
	tab, sh := m.Table(), m.Sharding()
	held := make([]bool, sh.Total)
	for i := range tab.Params {
		lo, hi, at := m.Owned(i)
		for k := at; k < at+hi-lo; k++ {
			held[k] = true
		}
	}
	var out []int
	for k, h := range held {
		if !h {
			out = append(out, k)
		}
	}
	return out
}

// oddVocab is oddConfig's vocabulary: a prime, so no world size above 1
// divides the embedding's flat.
const oddVocab = 509

// oddConfig is a Qwen2 model (q/k/v biases) whose every size is odd or
// prime, so that no world size from 2 to 4 divides its flats: padding and
// masking are exercised everywhere.
func oddConfig(t testing.TB) Config {
	t.Helper()
	cfg, err := ParseConfig([]byte(fmt.Sprintf(`{"model_type":"qwen2","hidden_size":24,"intermediate_size":37,"num_hidden_layers":3,
		"num_attention_heads":3,"num_key_value_heads":1,"head_dim":8,"vocab_size":%d,"rms_norm_eps":1e-6,
		"max_position_embeddings":64,"tie_word_embeddings":false,"rope_theta":10000,"use_sliding_window":false}`, oddVocab)), "odd.json")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestShardedPlanAndReference: PlanSharded and PlanShardedReference are
// exactly the bytes NewSharded and its NewReference allocate on every rank;
// the model-state part (weights, gradients) falls as 1/W; a sharded
// reference forwards as the whole model's reference does (bit for bit)
// after the policy's weights moved on; and a gathered copy holds the
// policy's current weights exactly.
func TestShardedPlanAndReference(t *testing.T) {
	for _, v := range []string{"qwen3_untied", "llama_tied", "moe_k8_interleaved"} {
		for _, prec := range []kernels.DType{kernels.F32, kernels.BF16} {
			for _, world := range []int{1, 3} {
				t.Run(fmt.Sprintf("%s/%s/W=%d", v, prec, world), func(t *testing.T) {
					cfg := testConfig(t, v)
					opt := Options{MaxTokens: 20, MaxSeqs: 4, Precision: prec}
					checkShardedPlanAndReference(t, cfg, opt, world)
				})
			}
		}
	}
}

func checkShardedPlanAndReference(t *testing.T, cfg Config, opt Options, world int) {
	tokens := []int32{5, 9, 2, 7, 1, 3, 3, 8, 4, 6, 0, 11}
	cu := []int32{0, 5, 12}
	cb := cpu.New(1)
	defer cb.Close()
	whole, err := New(cb, cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	whole.InitRandom(5)
	wref, err := NewReference(whole)
	if err != nil {
		t.Fatal(err)
	}
	defer wref.Close()
	wantRef, _, err := wref.Forward(tokens, cu, 0.7)
	if err != nil {
		t.Fatal(err)
	}
	wantRef = append([]float32(nil), wantRef...)
	moved := whole.ParamsHost()
	for i := range moved {
		moved[i] *= 1.5
	}
	for _, reshard := range []bool{true, false} {
		plan, err := PlanSharded(cfg, opt, world, reshard)
		if err != nil {
			t.Fatal(err)
		}
		rplan, err := PlanShardedReference(cfg, opt, world)
		if err != nil {
			t.Fatal(err)
		}
		whole1, _ := PlanModel(cfg, opt)
		if world > 1 && plan.Weights+plan.Grads > (whole1.Weights+whole1.Grads)/int64(world)+int64(8*4*2*len(NewParamTable(cfg).Groups)*2) {
			t.Errorf("W=%d: shard weights and gradients %d bytes, whole %d: want about 1/W", world, plan.Weights+plan.Grads, whole1.Weights+whole1.Grads)
		}
		onRanks(t, world, func(rk int, b kernels.Backend, c collective.Comm) error {
			cnt := newCounting(b, 0)
			m, err := NewSharded(cnt, cfg, opt, ShardOptions{Comm: c, ReshardAfterForward: reshard})
			if err != nil {
				return err
			}
			defer m.Close()
			if cnt.bytes != plan.Total() || m.Footprint() != plan {
				return fmt.Errorf("reshard=%v: plan %+v (%d bytes), model reports %+v, allocated %d", reshard, plan, plan.Total(), m.Footprint(), cnt.bytes)
			}
			m.InitRandom(5)
			before := cnt.bytes
			ref, err := NewReference(m)
			if err != nil {
				return err
			}
			defer ref.Close()
			if got := cnt.bytes - before; got != rplan.Total() || ref.Footprint().Weights+ref.Footprint().WeightsBF16 != rplan.Total() {
				return fmt.Errorf("reference: plan %+v, allocated %d", rplan, got)
			}
			// The policy moves on: its shard of the moved weights.
			host := m.ParamsHost()
			for i, p := range m.Table().Params {
				if lo, hi, at := m.Owned(i); hi > lo {
					copy(host[at:at+hi-lo], moved[p.Offset+lo:p.Offset+hi])
				}
			}
			if err := m.SetParamsHost(host); err != nil {
				return err
			}
			if _, _, err := m.Forward(tokens, cu, 0.7); err != nil { // fills the shared slots with the policy's groups
				return err
			}
			got, _, err := ref.Forward(tokens, cu, 0.7)
			if err != nil {
				return err
			}
			for j := range got {
				if got[j] != wantRef[j] {
					return fmt.Errorf("reshard=%v: reference logprob[%d] = %g, the whole model's reference %g", reshard, j, got[j], wantRef[j])
				}
			}
			cp, err := NewGatheredCopy(m)
			if err != nil {
				return err
			}
			defer cp.Close()
			if err := cp.GatherFrom(m); err != nil {
				return err
			}
			full := cp.ParamsHost()
			for i := range full {
				if full[i] != moved[i] {
					return fmt.Errorf("gathered copy: element %d = %g, the policy's %g", i, full[i], moved[i])
				}
			}
			return nil
		})
	}
}
