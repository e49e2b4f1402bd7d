package loop

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// publish writes step's directory under p with a model file of content
// model and a config, copying from src (may be "").
func publish(t *testing.T, p *Publisher, step int64, model, src string) (Done, string) {
	t.Helper()
	pd, err := p.Begin(step)
	if err != nil {
		t.Fatal(err)
	}
	f, err := pd.Create(ModelFile)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // in pieces, as a model streams its tensors
		if _, err := f.Write([]byte(model)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pd.WriteFile(ConfigFile, []byte(`{"model_type": "qwen3"}`)); err != nil {
		t.Fatal(err)
	}
	if src != "" {
		if _, err := pd.CopyFrom(src); err != nil {
			t.Fatal(err)
		}
	}
	d, path, err := pd.Publish("bfloat16")
	if err != nil {
		t.Fatal(err)
	}
	return d, path
}

func steps(t *testing.T, root string) []string {
	t.Helper()
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestPublishedDirectory: a published directory holds the files written and
// copied, every one listed in DONE with its size and the sha256 of its
// bytes, and Verify agrees; the tokenizer files the source directory lacks
// are not invented, and what is not in CopyFiles is not copied.
func TestPublishedDirectory(t *testing.T) {
	src := t.TempDir()
	for name, body := range map[string]string{
		"tokenizer.json": `{"model": {}}`, "tokenizer_config.json": `{}`, "generation_config.json": `{"eos_token_id": 2}`,
		"optimizer.safetensors": "no", "model.safetensors": "the initial weights", "README.md": "no",
	} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(t.TempDir(), "w")
	p, have, err := OpenPublisher(root, 2)
	if err != nil || len(have) != 0 {
		t.Fatalf("OpenPublisher: %v, %v", have, err)
	}
	d, path := publish(t, p, 0, "weights-0", src)
	if path != WeightsDir(root, 0) {
		t.Errorf("published at %s, want %s", path, WeightsDir(root, 0))
	}
	var names []string
	for _, f := range d.Files {
		names = append(names, f.Name)
		b, err := os.ReadFile(filepath.Join(path, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(b)) != f.Size || sum(b) != f.SHA256 {
			t.Errorf("%s: DONE says %d bytes sha256 %s; the file has %d bytes sha256 %s", f.Name, f.Size, f.SHA256, len(b), sum(b))
		}
	}
	want := []string{ConfigFile, "generation_config.json", ModelFile, "tokenizer.json", "tokenizer_config.json"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(append([]string{DoneFile}, want...), steps(t, path)); diff != "" {
		t.Errorf("directory (-want +got):\n%s", diff)
	}
	m, _ := d.File(ModelFile)
	if m.SHA256 != sum([]byte("weights-0weights-0weights-0")) {
		t.Errorf("model sha256 %s, want the hash of the bytes written", m.SHA256)
	}
	got, err := Verify(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(d, got); diff != "" {
		t.Errorf("Verify (-published +read):\n%s", diff)
	}
	if d.Step != 0 || d.DType != "bfloat16" || d.Bytes() != int64(len("weights-0"))*3+int64(len(`{"model_type": "qwen3"}`))+int64(len(`{"model": {}}`))+2+int64(len(`{"eos_token_id": 2}`)) {
		t.Errorf("DONE %+v (bytes %d)", d, d.Bytes())
	}
	// A damaged file fails Verify, naming it.
	if err := os.WriteFile(filepath.Join(path, ModelFile), []byte("weights-X"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(path); err == nil || !strings.Contains(err.Error(), ModelFile) {
		t.Errorf("Verify of a changed model file: %v, want an error naming it", err)
	}
}

// TestRetention: only the keep newest directories at or below the step just
// published remain; a directory above it (left by a run before its resume)
// stays until that step is published again, which replaces it.
func TestRetention(t *testing.T) {
	root := t.TempDir()
	p, _, err := OpenPublisher(root, 2)
	if err != nil {
		t.Fatal(err)
	}
	for s := int64(0); s <= 6; s++ {
		publish(t, p, s, fmt.Sprint("w", s), "")
	}
	if diff := cmp.Diff([]string{"step_5", "step_6"}, steps(t, root)); diff != "" {
		t.Fatalf("after steps 0..6 (-want +got):\n%s", diff)
	}
	// A resumed run redoes step 4 and on: step_5 and step_6 stay.
	p, have, err := OpenPublisher(root, 2)
	if err != nil || !slices.Equal(have, []int64{6, 5}) {
		t.Fatalf("reopen: %v, %v", have, err)
	}
	publish(t, p, 4, "w4-again", "")
	if diff := cmp.Diff([]string{"step_4", "step_5", "step_6"}, steps(t, root)); diff != "" {
		t.Fatalf("after the resumed run's step 4 (-want +got):\n%s", diff)
	}
	d, _ := publish(t, p, 5, "w5-again", "")
	if diff := cmp.Diff([]string{"step_4", "step_5", "step_6"}, steps(t, root)); diff != "" {
		t.Fatalf("after the resumed run's step 5 (-want +got):\n%s", diff)
	}
	got, err := Verify(WeightsDir(root, 5))
	if err != nil || got.Files[1].SHA256 != d.Files[1].SHA256 || d.Files[1].SHA256 != sum([]byte("w5-againw5-againw5-again")) {
		t.Errorf("step_5 was not replaced by the redone step: %v, %+v", err, got)
	}
	publish(t, p, 6, "w6-again", "")
	if diff := cmp.Diff([]string{"step_5", "step_6"}, steps(t, root)); diff != "" {
		t.Fatalf("after the resumed run's step 6 (-want +got):\n%s", diff)
	}
	if _, _, err := OpenPublisher(root, 0); err == nil {
		t.Error("keep 0 was accepted: the newest directory would be deleted as it is published")
	}
}

// TestInterruptedPublication: what a crash leaves (a temporary directory, a
// trash directory) is never a complete step for a reader, and the next
// publisher removes it; a step directory without DONE is no crash's and is
// refused, untouched.
func TestInterruptedPublication(t *testing.T) {
	root := t.TempDir()
	p, _, err := OpenPublisher(root, 3)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, p, 1, "w1", "")
	pd, err := p.Begin(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := pd.WriteFile(ModelFile, []byte("half")); err != nil {
		t.Fatal(err)
	}
	if _, err := WaitDone(root, 2, 0, time.Millisecond, nil); err == nil {
		t.Error("a directory being written was found complete")
	}
	// A step directory without DONE is no publication's (another
	// program's checkpoint): refused, and nothing is removed.
	foreign := filepath.Join(root, "step_3", "policy", "weights.pt")
	if err := os.MkdirAll(filepath.Dir(foreign), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(foreign, []byte("someone's checkpoint"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, ".trash-step_1-abc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenPublisher(root, 3); err == nil || !strings.Contains(err.Error(), "holds step_3, which tracegrpo did not publish") {
		t.Fatalf("a foreign step_3: %v", err)
	}
	if b, err := os.ReadFile(foreign); err != nil || string(b) != "someone's checkpoint" {
		t.Fatalf("the foreign step_3 was touched: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(root, ".trash-step_1-abc")); err != nil {
		t.Fatalf("the refused open removed a leftover: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(root, "step_3")); err != nil {
		t.Fatal(err)
	}
	_, have, err := OpenPublisher(root, 3)
	if err != nil || !slices.Equal(have, []int64{1}) {
		t.Fatalf("reopen: %v, %v", have, err)
	}
	if diff := cmp.Diff([]string{"step_1"}, steps(t, root)); diff != "" {
		t.Errorf("leftovers not removed (-want +got):\n%s", diff)
	}
	// A pending directory with no model file is not published.
	pd, _ = p.Begin(4)
	if _, _, err := pd.Publish("bfloat16"); err == nil || !strings.Contains(err.Error(), ModelFile) {
		t.Errorf("publishing without %s: %v", ModelFile, err)
	}
	if _, err := os.Stat(WeightsDir(root, 4)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("step_4 exists after a failed publication: %v", err)
	}
}

// TestWaitDone: a reader waiting for a step sees it once published, gives
// up at its timeout naming the file, and stops when told.
func TestWaitDone(t *testing.T) {
	root := t.TempDir()
	p, _, err := OpenPublisher(root, 2)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		publish(t, p, 3, "w3", "")
	}()
	d, err := WaitDone(root, 3, time.Minute, time.Millisecond, nil)
	if err != nil || d.Step != 3 {
		t.Fatalf("WaitDone: %+v, %v", d, err)
	}
	if _, err := WaitDone(root, 4, 0, time.Millisecond, nil); err == nil || !strings.Contains(err.Error(), filepath.Join("step_4", DoneFile)) {
		t.Errorf("no step_4: %v, want an error naming step_4/DONE", err)
	}
	stop := make(chan struct{})
	close(stop)
	if _, err := WaitDone(root, 4, time.Minute, time.Millisecond, stop); !errors.Is(err, ErrStopped) {
		t.Errorf("stopped: %v, want ErrStopped", err)
	}
}

// TestReadDoneRefuses: DONE files that are not this format, name another
// step or list no weights are refused, naming the file.
func TestReadDoneRefuses(t *testing.T) {
	good := `{"format": "tracegrpo-weights", "version": 1, "step": 2, "dtype": "bfloat16", "files": [{"name": "model.safetensors", "size": 3, "sha256": "` + strings.Repeat("a", 64) + `"}]}`
	for _, c := range []struct{ name, body, want string }{
		{"good", good, ""},
		{"another step", strings.Replace(good, `"step": 2`, `"step": 3`, 1), "the directory is step_2"},
		{"another format", strings.Replace(good, `tracegrpo-weights`, `x`, 1), "format"},
		{"newer version", strings.Replace(good, `"version": 1`, `"version": 2`, 1), "version 2"},
		{"no weights", strings.Replace(good, `model.safetensors`, `config.json`, 1), "lists no model.safetensors"},
		{"bad hash", strings.Replace(good, strings.Repeat("a", 64), "abc", 1), "bad entry"},
		{"path in a name", strings.Replace(good, `"size": 3`, `"size": 3}, {"name": "../x", "size": 1, "sha256": "`+strings.Repeat("b", 64)+`"`, 1), "bad entry"},
		{"unknown field", strings.Replace(good, `"dtype"`, `"extra": 1, "dtype"`, 1), "unknown field"},
		{"not JSON", "DONE", "invalid"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "step_2")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, DoneFile), []byte(c.body), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadDone(dir)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), dir)):
				t.Errorf("err = %v, want one naming %s and saying %q", err, dir, c.want)
			}
		})
	}
}

// TestParseMeta: a sidecar's two fields are read type-exactly; anything
// else names the file and the field.
func TestParseMeta(t *testing.T) {
	h := strings.Repeat("0123456789abcdef", 4)
	for _, c := range []struct {
		name, body string
		want       Meta
		err        string
	}{
		{"good", `{"policy_step": 4, "weights_sha256": "` + h + `"}`, Meta{4, h}, ""},
		{"extra fields kept out", `{"generator": "gym_vllm_loop", "policy_step": 0, "weights_sha256": "` + h + `", "vllm": "0.11.2"}`, Meta{0, h}, ""},
		{"no step", `{"weights_sha256": "` + h + `"}`, Meta{}, "policy_step: missing"},
		{"no hash", `{"policy_step": 1}`, Meta{}, "weights_sha256: missing"},
		{"negative step", `{"policy_step": -1, "weights_sha256": "` + h + `"}`, Meta{}, "non-negative integer"},
		{"fractional step", `{"policy_step": 1.0, "weights_sha256": "` + h + `"}`, Meta{}, "non-negative integer"},
		{"string step", `{"policy_step": "1", "weights_sha256": "` + h + `"}`, Meta{}, "non-negative integer"},
		{"upper-case hash", `{"policy_step": 1, "weights_sha256": "` + strings.ToUpper(h) + `"}`, Meta{}, "64 lowercase hex"},
		{"short hash", `{"policy_step": 1, "weights_sha256": "abc"}`, Meta{}, "64 lowercase hex"},
		{"hash not a string", `{"policy_step": 1, "weights_sha256": 5}`, Meta{}, "64 lowercase hex"},
		{"null", `null`, Meta{}, "want a JSON object"},
		{"array", `[1]`, Meta{}, "want a JSON object"},
		{"trailing", `{"policy_step": 1, "weights_sha256": "` + h + `"} {}`, Meta{}, "data after"},
		{"step twice", `{"policy_step": 3, "weights_sha256": "` + h + `", "policy_step": 4}`, Meta{}, "policy_step: given twice"},
		{"hash twice", `{"weights_sha256": "` + strings.Repeat("0", 64) + `", "policy_step": 4, "weights_sha256": "` + h + `"}`, Meta{}, "weights_sha256: given twice"},
		{"nested repeats are the generator's", `{"policy_step": 4, "weights_sha256": "` + h + `", "gen": {"a": 1, "a": 2}}`, Meta{4, h}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseMeta([]byte(c.body), "R/step_5.meta.json")
			if c.err == "" {
				if err != nil || got != c.want {
					t.Errorf("ParseMeta = %+v, %v; want %+v", got, err, c.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "R/step_5.meta.json") {
				t.Errorf("err = %v, want one naming the file and saying %q", err, c.err)
			}
		})
	}
}

// TestCheckMeta: only the weights of the step before, with the hash the
// trainer published, pass; each refusal names the file and both values.
func TestCheckMeta(t *testing.T) {
	a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
	for _, c := range []struct {
		name string
		m    Meta
		want string
		err  []string
	}{
		{"current", Meta{4, a}, a, nil},
		{"hash unknown", Meta{4, b}, "", nil},
		{"stale", Meta{3, a}, a, []string{"policy_step is 3", "step 5", "step 4"}},
		{"future", Meta{5, a}, a, []string{"policy_step is 5"}},
		{"other weights", Meta{4, b}, a, []string{"weights_sha256 is " + b, "sha256 " + a, "step_4"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := CheckMeta("R/step_5.meta.json", c.m, 5, c.want)
			if c.err == nil {
				if err != nil {
					t.Errorf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range append(c.err, "R/step_5.meta.json") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, lacks %q", err, w)
				}
			}
		})
	}
}

// TestWriteStep: a step is its records and its sidecar, both whole, with
// nothing else left in the directory; NextStep resumes after the highest.
func TestWriteStep(t *testing.T) {
	dir := t.TempDir()
	if n, err := NextStep(dir); err != nil || n != 1 {
		t.Fatalf("NextStep of an empty directory: %d, %v", n, err)
	}
	m := Meta{PolicyStep: 2, WeightsSHA256: strings.Repeat("c", 64)}
	if err := WriteStep(dir, 3, []byte("{\"a\": 1}\n"), &m); err != nil {
		t.Fatal(err)
	}
	if err := WriteStep(dir, 1, []byte("{}\n"), nil); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"step_1.jsonl", "step_3.jsonl", "step_3.meta.json"}, steps(t, dir)); diff != "" {
		t.Errorf("directory (-want +got):\n%s", diff)
	}
	got, err := ReadMeta(MetaFile(dir, 3))
	if err != nil || got != m {
		t.Errorf("ReadMeta = %+v, %v; want %+v", got, err, m)
	}
	if _, err := ReadMeta(MetaFile(dir, 1)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a step without a sidecar: %v, want os.ErrNotExist", err)
	}
	if n, err := NextStep(dir); err != nil || n != 4 {
		t.Errorf("NextStep = %d, %v; want 4", n, err)
	}
}

// FuzzParseMeta: ParseMeta never panics, and what it accepts round-trips.
func FuzzParseMeta(f *testing.F) {
	f.Add([]byte(`{"policy_step": 4, "weights_sha256": "` + strings.Repeat("a", 64) + `"}`))
	f.Add([]byte(`{"policy_step": 1e2}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMeta(b, "f")
		if err != nil {
			return
		}
		again, err := ParseMeta([]byte(fmt.Sprintf(`{"policy_step": %d, "weights_sha256": %q}`, m.PolicyStep, m.WeightsSHA256)), "f")
		if err != nil || again != m {
			t.Errorf("round trip of %+v: %+v, %v", m, again, err)
		}
	})
}

func writeFile(t *testing.T, path, body string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
}
