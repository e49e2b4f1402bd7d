package model

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// mtpTestConfig is a golden variant's config trained as its golden says.
func mtpTestConfig(t testing.TB, variant string) Config {
	t.Helper()
	cfg, err := LoadConfig(filepath.Join("testdata", variant, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := openGoldenShape(variant)
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err = cfg.WithMTP(g); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// openGoldenShape reads a golden's MTP training shape.
func openGoldenShape(variant string) (MTPTraining, error) {
	shapes := map[string]MTPTraining{
		"mtp_rep_det": {2, true, true}, "mtp_rep": {2, true, false},
		"mtp_sep_det": {2, false, true}, "mtp_sep": {2, false, false}, "mtp_e3": {3, true, false},
	}
	s, ok := shapes[variant]
	if !ok {
		return s, fmt.Errorf("no MTP shape for %s", variant)
	}
	return s, nil
}

// randomDMTP draws each depth's gradients for a micro-batch.
func randomDMTP(r *rand.Rand, D, T int) [][]float32 {
	out := make([][]float32, D)
	for d := range out {
		out[d] = make([]float32, T)
		for i := range out[d] {
			if r.IntN(3) > 0 {
				out[d][i] = float32(r.NormFloat64()) / 8
			}
		}
	}
	return out
}

// TestMTPShardedMatchesWhole: ranks of a fully sharded MTP model (1 to 3,
// resharding after the forward or not, fp32 and bf16, recomputing or not)
// give each micro-batch the whole model's main and depth log-probabilities
// bit for bit and, summed over ranks, its gradients within the
// reassociation of their sums, empty micro-batches included; the sharded
// export of the weights, mtp.* included, is byte-identical to the whole
// model's.
func TestMTPShardedMatchesWhole(t *testing.T) {
	type tc struct {
		variant string
		prec    kernels.DType
		re      bool
		reshard bool
	}
	cases := []tc{{"mtp_rep_det", kernels.F32, false, true}, {"mtp_rep", kernels.F32, true, false}, {"mtp_sep", kernels.F32, false, true},
		{"mtp_sep_det", kernels.BF16, true, true}, {"mtp_e3", kernels.F32, false, false}, {"mtp_rep", kernels.BF16, false, true}}
	for _, c := range cases {
		for _, world := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("%s/%s/recompute=%v/reshard=%v/W=%d", c.variant, c.prec, c.re, c.reshard, world), func(t *testing.T) {
				checkMTPSharded(t, mtpTestConfig(t, c.variant), Options{MaxTokens: 24, MaxSeqs: 8, Recompute: c.re, Precision: c.prec}, world, c.reshard)
			})
		}
	}
}

func checkMTPSharded(t *testing.T, cfg Config, opt Options, world int, reshard bool) {
	r := rand.New(rand.NewPCG(uint64(world), 9))
	D := cfg.MTP.Depths
	perRank := make([][]testMB, world)
	dmtp := make([][][][]float32, world)
	for i := range perRank {
		perRank[i] = randomMBs(r, cfg, 3, opt.MaxTokens)
		for _, mb := range perRank[i] {
			dmtp[i] = append(dmtp[i], randomDMTP(r, D, len(mb.tokens)))
		}
	}
	cb := cpu.New(1)
	defer cb.Close()
	whole, err := New(cb, cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	whole.InitRandom(5)
	type out struct {
		lp  []float32
		mtp [][]float32
	}
	want := make([][]out, world)
	for rk, mbs := range perRank {
		for i, mb := range mbs {
			lp, _, mtp, err := whole.ForwardMTP(mb.tokens, mb.cu, 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			o := out{lp: append([]float32(nil), lp...)}
			for _, x := range mtp {
				o.mtp = append(o.mtp, append([]float32(nil), x...))
			}
			want[rk] = append(want[rk], o)
			if err := whole.BackwardMTP(mb.dlp, dmtp[rk][i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	wantG := make([]float32, whole.Table().Total)
	cb.DownloadF32(wantG, whole.Grads())
	dir := t.TempDir()
	if err := whole.SaveHF(filepath.Join(dir, "whole")); err != nil {
		t.Fatal(err)
	}
	onRanks(t, world, func(rk int, b kernels.Backend, c collective.Comm) error {
		m, err := NewSharded(b, cfg, opt, ShardOptions{Comm: c, ReshardAfterForward: reshard})
		if err != nil {
			return err
		}
		defer m.Close()
		m.InitRandom(5)
		for i, mb := range perRank[rk] {
			lp, _, mtp, err := m.ForwardMTP(mb.tokens, mb.cu, 1, nil)
			if err != nil {
				return err
			}
			w := want[rk][i]
			for j := range lp {
				if lp[j] != w.lp[j] {
					return fmt.Errorf("micro-batch %d: logprob[%d] = %g, the whole model's %g", i, j, lp[j], w.lp[j])
				}
			}
			for d := range mtp {
				for j := range mtp[d] {
					if mtp[d][j] != w.mtp[d][j] {
						return fmt.Errorf("micro-batch %d: depth %d logprob[%d] = %g, the whole model's %g", i, d+1, j, mtp[d][j], w.mtp[d][j])
					}
				}
			}
			if err := m.BackwardMTP(mb.dlp, dmtp[rk][i]); err != nil {
				return err
			}
		}
		grads := make([]float32, m.Grads().N)
		b.DownloadF32(grads, m.Grads())
		if err := b.Sync(); err != nil {
			return err
		}
		tab := m.Table()
		for i, p := range tab.Params {
			lo, hi, at := m.Owned(i)
			for k := lo; k < hi; k++ {
				got, want := float64(grads[at+k-lo]), float64(wantG[p.Offset+k])
				if d := math.Abs(got - want); d > shardGradAtol+shardGradRtol*math.Abs(want) || math.IsNaN(got) {
					return fmt.Errorf("gradient of %s[%d] = %g, the whole model's %g", p.Name, k, got, want)
				}
			}
		}
		return m.SaveHF(filepath.Join(dir, "sharded"))
	})
	a, _ := os.ReadFile(filepath.Join(dir, "whole", "model.safetensors"))
	b, _ := os.ReadFile(filepath.Join(dir, "sharded", "model.safetensors"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Errorf("the sharded export (%d bytes) differs from the whole model's (%d bytes)", len(b), len(a))
	}
}

// TestMTPWeights: the MTP blocks' parameters have the Hub's names
// (Megatron-Bridge's flattened mtp.layers.{j·P+b}.*), one block per depth
// or one repeated; a saved model keeps them and config.json's MTP keys;
// the same checkpoint loads into the model without MTP (its mtp.* tensors
// skipped, as transformers skips them) with the main weights unchanged.
func TestMTPWeights(t *testing.T) {
	for _, v := range []string{"mtp_rep", "mtp_sep"} {
		t.Run(v, func(t *testing.T) {
			cfg := mtpTestConfig(t, v)
			var names []string
			for _, p := range NewParamTable(cfg).Params {
				if strings.HasPrefix(p.Name, "mtp.") && !strings.Contains(p.Name, ".experts.") {
					names = append(names, p.Name)
				}
			}
			var want []string
			nb := cfg.MTPBlocks()
			for j := range nb {
				a, e := fmt.Sprintf("mtp.layers.%d.", 2*j), fmt.Sprintf("mtp.layers.%d.", 2*j+1)
				want = append(want, a+"enorm.weight", a+"hnorm.weight", a+"eh_proj.weight", a+"norm.weight", a+"mixer.q_proj.weight", a+"mixer.k_proj.weight", a+"mixer.v_proj.weight", a+"mixer.o_proj.weight")
				want = append(want, e+"norm.weight", e+"mixer.gate.weight", e+"mixer.gate.e_score_correction_bias", e+"mixer.fc1_latent_proj.weight",
					e+"mixer.fc2_latent_proj.weight", e+"mixer.shared_experts.up_proj.weight", e+"mixer.shared_experts.down_proj.weight", e+"final_layernorm.weight")
			}
			if strings.Join(names, "\n") != strings.Join(want, "\n") {
				t.Fatalf("MTP parameters:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
			}
			b := cpu.New(1)
			defer b.Close()
			m, err := New(b, cfg, Options{MaxTokens: 16})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.LoadHF(filepath.Join("testdata", v)); err != nil {
				t.Fatal(err)
			}
			for i, p := range m.Table().Params {
				if p.Router && strings.HasPrefix(p.Name, "mtp.") {
					t.Errorf("%s is marked a router that freeze_moe_router freezes (param %d)", p.Name, i)
				}
			}
			dir := t.TempDir()
			if err := m.SaveHF(dir); err != nil {
				t.Fatal(err)
			}
			saved, err := LoadConfig(filepath.Join(dir, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			if saved.MTP.Blocks != cfg.MTP.Blocks || Pattern(saved.MTP.Pattern) != Pattern(cfg.MTP.Pattern) {
				t.Errorf("saved config.json: MTP %+v, want %+v", saved.MTP, cfg.MTP)
			}
			plain, err := New(b, saved, Options{MaxTokens: 16})
			if err != nil {
				t.Fatal(err)
			}
			defer plain.Close()
			if err := plain.LoadHF(dir); err != nil {
				t.Fatal(err)
			}
			full := m.ParamsHost()
			got := plain.ParamsHost()
			for _, p := range plain.Table().Params {
				q, _ := m.Table().Lookup(p.Name)
				for k := range p.N {
					if got[p.Offset+k] != full[q.Offset+k] {
						t.Fatalf("%s[%d]: %g without MTP, %g with", p.Name, k, got[p.Offset+k], full[q.Offset+k])
					}
				}
			}
			if _, ok := plain.Table().Lookup("mtp.layers.0.eh_proj.weight"); ok {
				t.Error("the model without MTP holds mtp.* parameters")
			}
		})
	}
}

// TestMTPConfig: the MTP keys of config.json are read in both spellings,
// written back unchanged, and WithMTP refuses what the checkpoint lacks,
// naming it.
func TestMTPConfig(t *testing.T) {
	base, err := os.ReadFile("testdata/mtp_rep/config.json")
	if err != nil {
		t.Fatal(err)
	}
	patch := func(from, to string) []byte {
		if !bytes.Contains(base, []byte(from)) {
			t.Fatalf("config has no %q", from)
		}
		return bytes.Replace(base, []byte(from), []byte(to), 1)
	}
	list := patch(`"mtp_hybrid_override_pattern": "*E"`, `"mtp_layers_block_type": ["attention", "moe"]`)
	c, err := ParseConfig(list, "list.json")
	if err != nil {
		t.Fatal(err)
	}
	if Pattern(c.MTP.Pattern) != "*E" || c.MTP.Blocks != 1 || !c.MTP.RepeatedDefault || c.MTP.ScaleDefault != 0.3 {
		t.Errorf("mtp_layers_block_type: %+v", c.MTP)
	}
	out, err := c.JSON("float32")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte(`"mtp_layers_block_type": ["attention","moe"]`)) || !bytes.Contains(out, []byte(`"num_nextn_predict_layers": 1`)) {
		t.Errorf("JSON lost the MTP keys:\n%s", out)
	}
	for _, x := range []struct{ from, to, want string }{
		{`"mtp_hybrid_override_pattern": "*E"`, `"mtp_hybrid_override_pattern": "*X"`, "field mtp_hybrid_override_pattern"},
		{`"mtp_hybrid_override_pattern": "*E"`, `"mtp_hybrid_override_pattern": "*E", "mtp_layers_block_type": ["moe"]`, "disagree"},
		{`"num_nextn_predict_layers": 1`, `"num_nextn_predict_layers": -1`, "field num_nextn_predict_layers"},
	} {
		if _, err := ParseConfig(patch(x.from, x.to), "c.json"); err == nil || !strings.Contains(err.Error(), x.want) {
			t.Errorf("%s: %v, want an error containing %q", x.to, err, x.want)
		}
	}
	cfg, err := ParseConfig(base, "c.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		name string
		cfg  Config
		t    MTPTraining
		want string
	}{
		{"separate blocks from one", cfg, MTPTraining{Depths: 2}, "needs a block per depth; config.json's num_nextn_predict_layers is 1"},
		{"no MTP layers", func() Config { c := cfg; c.MTP.Blocks = 0; return c }(), MTPTraining{Depths: 1, Repeated: true}, "states no MTP layers"},
		{"too deep", cfg, MTPTraining{Depths: MaxMTPDepths + 1, Repeated: true}, "expected an integer in [0, 64]"},
		{"a kind the backbone lacks", func() Config { c := cfg; c.MTP.Pattern = []LayerKind{LayerMLP}; return c }(), MTPTraining{Depths: 1, Repeated: true}, "a kind the main layers"},
		{"repeated over two blocks", func() Config { c := cfg; c.MTP.Blocks = 2; return c }(), MTPTraining{Depths: 3, Repeated: true}, "training one of 2 blocks"},
	} {
		if _, err := x.cfg.WithMTP(x.t); err == nil || !strings.Contains(err.Error(), x.want) {
			t.Errorf("%s: %v, want an error containing %q", x.name, err, x.want)
		}
	}
	q, err := LoadConfig("testdata/qwen3_tied/config.json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.WithMTP(MTPTraining{Depths: 1}); err == nil || !strings.Contains(err.Error(), "has no multi-token prediction layers") {
		t.Errorf("qwen3 with MTP: %v", err)
	}
	if c, err := cfg.WithMTP(MTPTraining{}); err != nil || c.MTPBlocks() != 0 || len(NewParamTable(c).Params) != len(NewParamTable(cfg).Params) {
		t.Errorf("WithMTP(0): %v, %d blocks", err, c.MTPBlocks())
	}
}
