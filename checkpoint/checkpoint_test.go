package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

// bitsEqual compares float32 slices by bit pattern (NaN payloads, −0).
var bitsEqual = cmp.Comparer(func(a, b []float32) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
})

// specials are float32 bit patterns a lossy path would change.
var specials = []float32{
	float32(math.Copysign(0, -1)), math.Float32frombits(0x7fc00001), math.Float32frombits(0xffa00000),
	float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(1), math.MaxFloat32, math.SmallestNonzeroFloat32,
}

func randF32(rng *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(rng.NormFloat64())
	}
	for i := 0; i < len(specials) && i < n; i++ {
		out[rng.IntN(n)] = specials[i]
	}
	return out
}

func tensorF32(name string, shape []int, v []float32) Tensor {
	return Tensor{Spec: safetensors.Spec{Name: name, DType: safetensors.F32, Shape: shape}, F32: v}
}

// testState is a deterministic function of (step, n): the crash test
// recomputes it to check what it loads. n scales the tensors.
func testState(step int64, n int) *State {
	rng := rand.New(rand.NewPCG(uint64(step), 99))
	c := 8
	v := max(n/c, 1)
	bf := make([]byte, 2*v)
	for i := range bf {
		bf[i] = byte(rng.Uint32())
	}
	model := []Tensor{
		tensorF32("model.embed_tokens.weight", []int{v, c}, randF32(rng, v*c)),
		tensorF32("model.norm.weight", []int{c}, randF32(rng, c)),
		tensorF32("model.layers.0.self_attn.q_proj.weight", []int{c, c}, randF32(rng, c*c)),
		tensorF32("scalar", []int{}, randF32(rng, 1)),
		tensorF32("empty", []int{0, c}, []float32{}),
		{Spec: safetensors.Spec{Name: "lm_head.weight", DType: safetensors.BF16, Shape: []int{v}}, Raw: bf},
	}
	total := v*c + c + c*c + 1
	pcg := rand.NewPCG(uint64(step)*7, 3)
	for range step {
		pcg.Uint64()
	}
	rngState, _ := pcg.MarshalBinary()
	cha := rand.NewChaCha8([32]byte{byte(step)})
	chaState, _ := cha.MarshalBinary()
	return &State{
		Model:       model,
		ModelConfig: []byte(fmt.Sprintf("{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"hidden_size\": %d,\n  \"rope_theta\": 1000000.0,\n  \"torch_dtype\": \"float32\"\n}\n", c)),
		Optimizer: []Tensor{
			tensorF32("exp_avg", []int{total}, randF32(rng, total)),
			tensorF32("exp_avg_sq", []int{total}, randF32(rng, total)),
		},
		Trainer: TrainerState{
			FormatVersion:    FormatVersion,
			Step:             step,
			ConsumedRollouts: step * 16,
			Optimizer:        json.RawMessage(fmt.Sprintf(`{"step":%d,"skipped":1}`, step)),
			Scheduler:        json.RawMessage(fmt.Sprintf(`{"samples":%d,"steps":%d}`, step*16, step)),
			RNG:              map[string][]byte{"sampler": rngState, "shuffle": chaState, "empty": {}},
			RolloutCursor:    json.RawMessage(fmt.Sprintf(`{"file":"rollouts.jsonl","offset":%d,"rollout_id":"r-%d"}`, step*1234, step)),
			Config:           json.RawMessage(`{"grpo":{"num_prompts_per_step":4},"policy":{"lr":1e-06}}`),
		},
	}
}

func mustSave(t testing.TB, dir string, st *State, opt SaveOptions) string {
	t.Helper()
	p, err := Save(dir, st, opt)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRoundTrip(t *testing.T) {
	for _, compress := range []bool{false, true} {
		for _, n := range []int{8, 1000, 70000} {
			t.Run(fmt.Sprintf("zstd=%v/n=%d", compress, n), func(t *testing.T) {
				dir := t.TempDir()
				want := testState(7, n)
				p := mustSave(t, dir, want, SaveOptions{CompressOptimizer: compress})
				if filepath.Base(p) != "step_7" {
					t.Errorf("path = %s", p)
				}
				got, err := Load(p, LoadOptions{ExpectConfig: want.ModelConfig})
				if err != nil {
					t.Fatal(err)
				}
				// Load returns tensors in name order.
				sortTensors(want.Model)
				sortTensors(want.Optimizer)
				if diff := cmp.Diff(want, got, bitsEqual); diff != "" {
					t.Errorf("load(save(state)) (-want +got):\n%s", diff)
				}
				optName := OptimizerFile
				if compress {
					optName = OptimizerZstdFile
				}
				for _, f := range []string{ModelFile, ConfigFile, optName, TrainerStateFile, ManifestFile, DoneFile} {
					if _, err := os.Stat(filepath.Join(p, f)); err != nil {
						t.Errorf("missing %s: %v", f, err)
					}
				}
			})
		}
	}
}

func sortTensors(ts []Tensor) {
	for i := range ts {
		for j := i + 1; j < len(ts); j++ {
			if ts[j].Name < ts[i].Name {
				ts[i], ts[j] = ts[j], ts[i]
			}
		}
	}
}

// TestRoundTripRandom: random tensor tables, RNG states and JSON values.
func TestRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	dir := t.TempDir()
	for trial := 0; trial < 25; trial++ {
		st := &State{ModelConfig: []byte(`{"hidden_size": 4}`)}
		for i := range 1 + rng.IntN(5) {
			shape := []int{rng.IntN(5), 1 + rng.IntN(4)}
			n := shape[0] * shape[1]
			st.Model = append(st.Model, tensorF32(fmt.Sprintf("t%02d", i), shape, randF32(rng, max(n, 1))[:n]))
		}
		n := 1 + rng.IntN(500)
		st.Optimizer = []Tensor{tensorF32("exp_avg", []int{n}, randF32(rng, n)), tensorF32("exp_avg_sq", []int{n}, randF32(rng, n))}
		st.Trainer = TrainerState{FormatVersion: FormatVersion, Step: int64(trial), ConsumedRollouts: rng.Int64N(1 << 40), RNG: map[string][]byte{}}
		for i := range rng.IntN(4) {
			b := make([]byte, rng.IntN(40))
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			st.Trainer.RNG[fmt.Sprintf("s%d", i)] = b
		}
		if rng.IntN(2) == 0 {
			st.Trainer.RolloutCursor = json.RawMessage(fmt.Sprintf(`{"offset":%d,"x":[1,2.5e-300,"\u00e9"]}`, rng.Int64()))
		}
		p := mustSave(t, dir, st, SaveOptions{CompressOptimizer: rng.IntN(2) == 0, KeepTopK: 2})
		got, err := Load(p, LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sortTensors(st.Model)
		if diff := cmp.Diff(st, got, bitsEqual); diff != "" {
			t.Fatalf("trial %d (-want +got):\n%s", trial, diff)
		}
	}
}

// TestRetentionCrashMidDelete stops retention's deletion of the oldest
// checkpoint after its first file, as a crash would: the error is
// returned, and every step_N directory left still loads, the deleted
// step's half-removed files being out of sight under a .trash- name that
// the next save clears.
func TestRetentionCrashMidDelete(t *testing.T) {
	dir := t.TempDir()
	for step := int64(1); step <= 3; step++ {
		mustSave(t, dir, testState(step, 64), SaveOptions{KeepTopK: 3})
	}
	crash := errors.New("crashed mid-delete")
	removeAll = func(p string) error {
		if err := os.Remove(filepath.Join(p, ModelFile)); err != nil {
			return err
		}
		return crash
	}
	_, err := Save(dir, testState(4, 64), SaveOptions{KeepTopK: 3})
	removeAll = os.RemoveAll
	if !errors.Is(err, crash) {
		t.Fatalf("save whose retention crashed: %v, want %v", err, crash)
	}
	steps, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, e := range steps {
		got = append(got, e.Step)
		if _, err := Load(e.Path, LoadOptions{}); err != nil {
			t.Errorf("%s after a crash mid-delete: %v", filepath.Base(e.Path), err)
		}
	}
	if diff := cmp.Diff([]int64{4, 3, 2}, got); diff != "" {
		t.Errorf("steps after a crash mid-delete (-want +got):\n%s", diff)
	}
	mustSave(t, dir, testState(5, 64), SaveOptions{KeepTopK: 3})
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), trashPrefix) {
			t.Errorf("the next save left %s", e.Name())
		}
	}
}

func TestRetentionAndLatest(t *testing.T) {
	dir := t.TempDir()
	for step := int64(1); step <= 6; step++ {
		mustSave(t, dir, testState(step, 64), SaveOptions{KeepTopK: 3})
	}
	// A stray leftover of a crashed save, and unrelated names, are ignored.
	os.Mkdir(filepath.Join(dir, ".tmp-step_9-abc"), 0o755)
	os.Mkdir(filepath.Join(dir, "step_007"), 0o755)
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644)
	ents, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var steps []int64
	for _, e := range ents {
		steps = append(steps, e.Step)
	}
	if diff := cmp.Diff([]int64{6, 5, 4}, steps); diff != "" {
		t.Errorf("kept steps (-want +got):\n%s", diff)
	}
	p, err := Latest(dir, LoadOptions{})
	if err != nil || filepath.Base(p) != "step_6" {
		t.Fatalf("Latest = %s, %v", p, err)
	}
	// The next save clears the leftover.
	mustSave(t, dir, testState(7, 64), SaveOptions{KeepTopK: 3})
	if _, err := os.Stat(filepath.Join(dir, ".tmp-step_9-abc")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leftover temp dir not removed: %v", err)
	}
	// Saving a step again replaces it.
	st := testState(7, 64)
	st.Trainer.ConsumedRollouts = 999
	mustSave(t, dir, st, SaveOptions{KeepTopK: 3})
	res, err := LoadLatest(dir, LoadOptions{})
	if err != nil || res.State.Trainer.ConsumedRollouts != 999 {
		t.Fatalf("replaced step 7: %v, %+v", err, res.State)
	}
}

// TestRefusal: what a loader must refuse, and fallback only when asked.
func TestRefusal(t *testing.T) {
	cases := []struct {
		name string
		harm func(t *testing.T, p string)
		want string // in the error
		is   error
	}{
		{"no DONE", func(t *testing.T, p string) { must(t, os.Remove(filepath.Join(p, DoneFile))) }, "DONE marker missing", ErrIncomplete},
		{"DONE of another manifest", func(t *testing.T, p string) {
			must(t, os.WriteFile(filepath.Join(p, DoneFile), []byte("sha256:"+strings.Repeat("0", 64)+"\n"), 0o644))
		}, "DONE holds", ErrCorrupt},
		{"missing file", func(t *testing.T, p string) { must(t, os.Remove(filepath.Join(p, ConfigFile))) }, "lists config.json, which is missing", ErrCorrupt},
		{"extra file", func(t *testing.T, p string) {
			must(t, os.WriteFile(filepath.Join(p, "generation_config.json"), []byte("{}"), 0o644))
		}, "generation_config.json is not in manifest.json", ErrCorrupt},
		{"no manifest", func(t *testing.T, p string) { must(t, os.Remove(filepath.Join(p, ManifestFile))) }, "manifest.json missing", ErrCorrupt},
		{"file swapped in from another step", func(t *testing.T, p string) {
			other := mustSave(t, t.TempDir(), testState(5, 64), SaveOptions{})
			b, err := os.ReadFile(filepath.Join(other, ModelFile))
			must(t, err)
			must(t, os.WriteFile(filepath.Join(p, ModelFile), b, 0o644))
		}, "model.safetensors: sha256", ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			mustSave(t, dir, testState(1, 64), SaveOptions{})
			p := mustSave(t, dir, testState(2, 64), SaveOptions{})
			c.harm(t, p)
			_, err := Load(p, LoadOptions{})
			if err == nil || !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "step_2") {
				t.Fatalf("Load: err = %v; want %v naming step_2 and %q", err, c.is, c.want)
			}
			if _, err := LoadLatest(dir, LoadOptions{}); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("LoadLatest without fallback: err = %v, want a refusal naming %q", err, c.want)
			}
			res, err := LoadLatest(dir, LoadOptions{Fallback: true})
			if err != nil || filepath.Base(res.Path) != "step_1" || len(res.Skipped) != 1 || res.State.Trainer.Step != 1 {
				t.Fatalf("LoadLatest with fallback: %v, path %s, skipped %v", err, res.Path, res.Skipped)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestCorruption flips one byte at many positions of every file, and
// truncates every file: each is refused with an error naming the file, and
// nothing panics.
func TestCorruption(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, compress := range []bool{false, true} {
		dir := t.TempDir()
		p := mustSave(t, dir, testState(3, 512), SaveOptions{CompressOptimizer: compress})
		ents, err := os.ReadDir(p)
		must(t, err)
		tried := 0
		for _, e := range ents {
			name := e.Name()
			path := filepath.Join(p, name)
			orig, err := os.ReadFile(path)
			must(t, err)
			positions := []int{0, len(orig) / 2, len(orig) - 1}
			for range 12 {
				positions = append(positions, rng.IntN(len(orig)))
			}
			check := func(what string, b []byte) {
				t.Helper()
				must(t, os.WriteFile(path, b, 0o644))
				tried++
				for _, f := range []struct {
					op  string
					run func() error
				}{
					{"Load", func() error { _, err := Load(p, LoadOptions{}); return err }},
					{"Verify", func() error { _, err := Verify(p); return err }},
				} {
					err := f.run()
					if err == nil {
						t.Errorf("zstd=%v %s %s: %s succeeded", compress, name, what, f.op)
					} else if !strings.Contains(err.Error(), name) && !(name == DoneFile && strings.Contains(err.Error(), "DONE")) {
						t.Errorf("zstd=%v %s %s: %s error does not name the file: %v", compress, name, what, f.op, err)
					}
				}
				must(t, os.WriteFile(path, orig, 0o644))
			}
			for _, pos := range positions {
				b := append([]byte(nil), orig...)
				b[pos] ^= byte(1 << rng.IntN(8))
				check(fmt.Sprintf("byte %d flipped", pos), b)
			}
			for _, n := range []int{0, 1, len(orig) / 2, len(orig) - 1} {
				check(fmt.Sprintf("truncated to %d bytes", n), orig[:n])
			}
		}
		if _, err := Load(p, LoadOptions{}); err != nil {
			t.Fatalf("restored checkpoint does not load: %v", err)
		}
		if man, err := Verify(p); err != nil || len(man.Files) != len(ents)-2 { // all but manifest.json and DONE
			t.Fatalf("restored checkpoint: Verify = %d files, %v; want %d files, nil", len(man.Files), err, len(ents)-2)
		}
		if tried < 6*15 {
			t.Fatalf("only %d corruptions tried", tried)
		}
	}
}

func TestConfigMismatch(t *testing.T) {
	dir := t.TempDir()
	st := testState(1, 64)
	p := mustSave(t, dir, st, SaveOptions{})
	cur := []byte(`{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 16, "rope_theta": 1e6, "torch_dtype": "bfloat16", "num_hidden_layers": 2}`)
	_, err := Load(p, LoadOptions{ExpectConfig: cur})
	if !errors.Is(err, ErrConfigMismatch) {
		t.Fatalf("err = %v, want ErrConfigMismatch", err)
	}
	for _, want := range []string{"hidden_size: checkpoint 8, model 16", "num_hidden_layers: checkpoint (absent), model 2", "config.json"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "rope_theta") || strings.Contains(err.Error(), "torch_dtype") {
		t.Errorf("error names equal or ignored fields: %v", err)
	}
	// Fallback never hides a config mismatch.
	if _, err := LoadLatest(dir, LoadOptions{Fallback: true, ExpectConfig: cur}); !errors.Is(err, ErrConfigMismatch) {
		t.Errorf("LoadLatest with fallback: err = %v, want ErrConfigMismatch", err)
	}
}

func TestDiffConfig(t *testing.T) {
	cases := []struct {
		name   string
		a, b   string
		ignore []string
		want   []FieldDiff
	}{
		{"equal", `{"a":1,"b":[1,2]}`, `{"b":[1,2.0],"a":1.0}`, nil, nil},
		{"value", `{"a":1}`, `{"a":2}`, nil, []FieldDiff{{"a", "1", "2"}}},
		{"nested", `{"rope_scaling":{"type":"yarn","factor":4}}`, `{"rope_scaling":{"type":"yarn","factor":2}}`, nil, []FieldDiff{{"rope_scaling.factor", "4", "2"}}},
		{"absent", `{"a":1}`, `{"b":1}`, nil, []FieldDiff{{"a", "1", "(absent)"}, {"b", "(absent)", "1"}}},
		{"ignored", `{"a":1,"torch_dtype":"float32"}`, `{"a":1,"torch_dtype":"bfloat16"}`, DefaultIgnoredConfigFields, nil},
		{"not ignored", `{"torch_dtype":"float32"}`, `{"torch_dtype":"bfloat16"}`, []string{}, []FieldDiff{{"torch_dtype", `"float32"`, `"bfloat16"`}}},
		{"type", `{"a":"1"}`, `{"a":1}`, nil, []FieldDiff{{"a", `"1"`, "1"}}},
		{"list length", `{"a":[1]}`, `{"a":[1,1]}`, nil, []FieldDiff{{"a", "[1]", "[1,1]"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := DiffConfig([]byte(c.a), []byte(c.b), c.ignore)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	for _, bad := range []string{``, `[1]`, `null`, `{"a":1} x`, `{"a":`} {
		if _, err := DiffConfig([]byte(bad), []byte(`{}`), nil); err == nil {
			t.Errorf("DiffConfig(%q) accepted", bad)
		}
	}
}

// TestPrepareThenPublish: a prepared checkpoint is invisible to Latest
// until Publish; a process that dies in between leaves a temporary
// directory the next save removes; Discard removes it at once.
func TestPrepareThenPublish(t *testing.T) {
	dir := t.TempDir()
	mustSave(t, dir, testState(1, 64), SaveOptions{})
	p, err := Prepare(dir, testState(2, 64), SaveOptions{})
	must(t, err)
	if got, err := Latest(dir, LoadOptions{}); err != nil || filepath.Base(got) != StepDir(1) {
		t.Fatalf("Latest with step 2 prepared = %s, %v; want step_1", got, err)
	}
	path, err := p.Publish()
	must(t, err)
	if got, err := Latest(dir, LoadOptions{}); err != nil || got != path || filepath.Base(got) != StepDir(2) {
		t.Fatalf("Latest after Publish = %s, %v; want %s", got, err, path)
	}
	if _, err := p.Publish(); err == nil {
		t.Error("a second Publish succeeded")
	}
	// Prepared and abandoned (the process was killed): the next save
	// removes it, and it never counted as a checkpoint.
	if _, err := Prepare(dir, testState(3, 64), SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := Latest(dir, LoadOptions{}); filepath.Base(got) != StepDir(2) {
		t.Fatalf("an unpublished step 3 is visible: %s", got)
	}
	mustSave(t, dir, testState(4, 64), SaveOptions{})
	d, err := Prepare(dir, testState(5, 64), SaveOptions{})
	must(t, err)
	d.Discard()
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{StepDir(1), StepDir(2), StepDir(4)}; fmt.Sprint(names) != fmt.Sprint(want) {
		t.Errorf("directory holds %v, want %v (no temporary directory left)", names, want)
	}
}
