package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/trainer"
)

const tinyModel = "../model/testdata/qwen3_untied/config.json"

func tiny(t *testing.T) model.Config {
	t.Helper()
	cfg, err := model.LoadConfig(tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestParseTreeSpec(t *testing.T) {
	for _, c := range []struct {
		in   string
		want treeSpec
	}{
		{"8,2,4", treeSpec{root: 8, levels: [][2]int{{2, 4}}}},
		{" 3, 1 ,5,2,7", treeSpec{root: 3, levels: [][2]int{{1, 5}, {2, 7}}}},
	} {
		got, err := parseTreeSpec(c.in)
		if err != nil {
			t.Errorf("parseTreeSpec(%q): %v", c.in, err)
			continue
		}
		if d := cmp.Diff(c.want, got, cmp.AllowUnexported(treeSpec{})); d != "" {
			t.Errorf("parseTreeSpec(%q) (-want +got):\n%s", c.in, d)
		}
	}
	for _, in := range []string{"", "8", "8,2", "8,2,4,3", "8,0,4", "8,2,x", "-1,2,4", "8,2,1048577"} {
		if _, err := parseTreeSpec(in); !errors.Is(err, trainer.ErrUsage) {
			t.Errorf("parseTreeSpec(%q): %v, want a usage error", in, err)
		}
	}
}

// TestTreeRows: a tree spec's rows are its root-to-leaf paths, and every
// segment below the root carries loss in exactly one row (its first
// trace's), the root in none.
func TestTreeRows(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for range 50 {
		sp := treeSpec{root: 1 + r.IntN(5)}
		for range 1 + r.IntN(3) {
			sp.levels = append(sp.levels, [2]int{1 + r.IntN(3), 1 + r.IntN(4)})
		}
		b := sp.rows(97, r)
		traces, length, owned, nodes := 1, sp.root, 0, 1
		for _, l := range sp.levels {
			traces *= l[0]
			nodes *= l[0]
			length += l[1]
			owned += nodes * l[1]
		}
		if len(b.Rows) != traces {
			t.Fatalf("%+v: %d rows, want %d traces", sp, len(b.Rows), traces)
		}
		loss := 0
		for i, row := range b.Rows {
			if len(row.TokenIDs) != length || len(row.TokenMask) != length {
				t.Fatalf("%+v: row %d has %d tokens (%d mask), want %d", sp, i, len(row.TokenIDs), len(row.TokenMask), length)
			}
			for p, m := range row.TokenMask {
				if m != 0 && p < sp.root {
					t.Fatalf("%+v: row %d: the prompt's token %d carries loss", sp, i, p)
				}
				loss += int(m)
			}
			if i > 0 && !equalPrefix(b.Rows[0].TokenIDs, row.TokenIDs, sp.root) {
				t.Fatalf("%+v: row %d does not share the prompt", sp, i)
			}
		}
		if loss != owned {
			t.Fatalf("%+v: %d loss tokens over the rows, want %d (every generated segment once)", sp, loss, owned)
		}
	}
}

func equalPrefix(a, b []int32, n int) bool {
	for i := range n {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func run(t *testing.T, f func(Env) error) (stdout, stderr string) {
	t.Helper()
	be := cpu.New(1)
	defer be.Close()
	var out, errb bytes.Buffer
	if err := f(Env{Backend: be, Threads: be.Threads(), Rank: 0, Size: 1, Stdout: &out, Stderr: &errb}); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	return out.String(), errb.String()
}

// TestRunTreeModesAgree: the traces packed as tries compute the logprobs
// that the traces packed one by one do (same weights, same loss
// positions, same updates), over fewer tokens.
func TestRunTreeModesAgree(t *testing.T) {
	spec := "8,3,4,2,3"
	out, _ := run(t, func(env Env) error {
		return RunTree(env, Tree{Common: Common{Model: tiny(t), ModelName: tinyModel, Steps: 2, Seed: 3, LR: 1e-3, Eps: 1e-8},
			Spec: spec, Modes: []string{"off", "auto"}})
	})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d JSON lines, want 3 (off, auto, the ratio):\n%s", len(lines), out)
	}
	var off, auto TreeResult
	for i, r := range []*TreeResult{&off, &auto} {
		if err := json.Unmarshal([]byte(lines[i]), r); err != nil {
			t.Fatal(err)
		}
	}
	// 6 traces of 8+4+3 tokens; the trie holds the prompt once, 3 children
	// of 4 and 6 of 3; loss on 3·4 + 6·3 tokens.
	if off.Traces != 6 || off.TraceTokens != 90 || off.ComputedTokens != 90 || auto.ComputedTokens != 8+12+18 {
		t.Errorf("traces %d, trace tokens %d, computed off %d auto %d: want 6, 90, 90, 38", off.Traces, off.TraceTokens, off.ComputedTokens, auto.ComputedTokens)
	}
	if off.LossTokens != 30 || auto.LossTokens != 30 || off.HeadRows != 30 || auto.HeadRows != 30 {
		t.Errorf("loss tokens off %d auto %d, LM head rows off %d auto %d: want 30 each", off.LossTokens, auto.LossTokens, off.HeadRows, auto.HeadRows)
	}
	if want := 90.0 / 38; math.Abs(auto.PrefixReuse-want) > 1e-12 || off.PrefixReuse != 1 {
		t.Errorf("prefix reuse off %g auto %g, want 1 and %g", off.PrefixReuse, auto.PrefixReuse, want)
	}
	if d := math.Abs(off.MeanLogp - auto.MeanLogp); d > 1e-5 || off.MeanLogp == 0 {
		t.Errorf("mean logprob of the last step: off %.9g, auto %.9g (differ by %.3g)", off.MeanLogp, auto.MeanLogp, d)
	}
	if off.Mode != "off" || auto.Mode != "auto" || auto.Tree != spec || auto.Params == 0 || auto.PlanMiB <= 0 {
		t.Errorf("lines off %+v, auto %+v", off, auto)
	}
}

// TestRunRowsProfile: a profiled run counts the ops every step calls, and
// its JSON line describes the run.
func TestRunRowsProfile(t *testing.T) {
	cfg := tiny(t)
	out, errs := run(t, func(env Env) error {
		return RunRows(env, Rows{Common: Common{Model: cfg, ModelName: tinyModel, Steps: 2, Seed: 1, LR: 1e-3, Eps: 1e-8, BF16: true},
			Rows: 2, Seq: 16, Profile: true})
	})
	var r Result
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	tab := model.NewParamTable(cfg)
	if r.Params != tab.Total || r.Rows != 2 || r.Seq != 16 || r.Steps != 2 || r.Ranks != 1 || r.Precision != "float32" || r.WeightsFrom != "random" {
		t.Errorf("JSON line %+v: want %d params, 2 rows of 16, 2 steps, 1 rank, float32, random weights", r, tab.Total)
	}
	if r.FinalLogp >= 0 || r.FinalLogp < -20 {
		t.Errorf("mean logprob %g: not a log-probability of a 512-token vocabulary", r.FinalLogp)
	}
	if !strings.Contains(errs, "the cpu backend computes in fp32") {
		t.Errorf("no note that bfloat16 runs in fp32 on the CPU:\n%s", errs)
	}
	calls := map[string]int{}
	for _, l := range strings.Split(errs, "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && strings.HasSuffix(f[4], "%") {
			n, err := strconv.Atoi(f[1])
			if err == nil {
				calls[f[0]] = n
			}
		}
	}
	// Two layers; one forward, backward and update per step.
	for op, min := range map[string]int{"Embedding": 1, "EmbeddingBackward": 1, "Attention": 2, "AttentionBackward": 2, "TokenLogprob": 1,
		"TokenLogprobBackward": 1, "Matmul": 8, "MatmulBackward": 8} {
		if calls[op] < min {
			t.Errorf("--profile: %s called %d times a step, want at least %d:\n%s", op, calls[op], min, errs)
		}
	}
}

// TestTreeSpecCapsTheProduct (issue 34): a --tree whose traces or trace
// tokens (the product of its fields: every trace holds its whole path) pass
// the caps is refused before anything is built, naming both counts and
// both caps, however the product is reached (a wide level, a deep binary
// tree whose count no int64 holds); a tree at the caps is accepted.
func TestTreeSpecCapsTheProduct(t *testing.T) {
	deep := "1" + strings.Repeat(",2,1", 500)
	for _, c := range []struct {
		spec string
		want []string // "" when accepted
	}{
		{"1,65536,255", nil}, // 65536 traces of 256 tokens: both at the caps
		{"255,256,1,256,1", []string{"65536 traces", "16842752 trace tokens"}}, // 257 tokens a trace
		{"1,65537,1", []string{"65537 traces", "131074 trace tokens"}},
		{"1,65536,256", []string{"65536 traces", "16842752 trace tokens"}},
		{"1,1048576,1048576", []string{"1048576 traces", "1099512676352 trace tokens"}},
		{deep, []string{"3.27e+150 traces", "1.64e+153 trace tokens", "(2001 bytes)"}},
	} {
		_, err := parseTreeSpec(c.spec)
		switch {
		case c.want == nil && err != nil:
			t.Errorf("--tree %s at the caps: %v", c.spec, err)
		case c.want != nil:
			if !errors.Is(err, trainer.ErrUsage) {
				t.Errorf("--tree %.40s: %v, want a usage error", c.spec, err)
				continue
			}
			for _, w := range append(c.want, "at most 65536 traces and 16777216 trace tokens") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("--tree %.40s: %v\nwant it to say %q", c.spec, err, w)
				}
			}
		}
	}
}

// TestTreeDefaultBudgetIsOneMicroBatch (issue 34): without --mb-tokens,
// auto packs the whole trie in one micro-batch, as --help says, also for a
// tree of many short traces under one prompt, whose LM-head rows outnumber
// its computed tokens (1,2000,1 used 32 micro-batches).
func TestTreeDefaultBudgetIsOneMicroBatch(t *testing.T) {
	for _, spec := range []string{"1,2000,1", "3,40,1,5,1", "8,3,4,2,3", "1,1,1", "16,64,2"} {
		out, _ := run(t, func(env Env) error {
			return RunTree(env, Tree{Common: Common{Model: tiny(t), ModelName: tinyModel, Steps: 1, Seed: 5, LR: 1e-3, Eps: 1e-8},
				Spec: spec, Modes: []string{"auto"}})
		})
		var r TreeResult
		if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &r); err != nil {
			t.Fatal(err)
		}
		if r.MicroBatches != 1 {
			t.Errorf("--tree %s: %d micro-batches of %d tokens (%d computed, %d loss tokens), want 1", spec, r.MicroBatches, r.MicroTokens, r.ComputedTokens, r.LossTokens)
		}
	}
}

func TestMedianMin(t *testing.T) {
	for _, c := range []struct {
		times   []float64
		med, lo float64
	}{
		{[]float64{3}, 3, 3},
		{[]float64{5, 1, 3}, 3, 1},
		{[]float64{4, 1, 3, 2}, 2.5, 1},
		{[]float64{9, 9, 1, 1}, 5, 1},
	} {
		in := slices.Clone(c.times)
		med, lo := medianMin(in)
		if med != c.med || lo != c.lo {
			t.Errorf("medianMin(%v) = %v, %v; want %v, %v", c.times, med, lo, c.med, c.lo)
		}
		if !slices.Equal(in, c.times) {
			t.Errorf("medianMin(%v) reordered its input to %v", c.times, in)
		}
	}
}
