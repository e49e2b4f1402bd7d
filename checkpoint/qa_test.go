package checkpoint

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseManifestRefuses (QA round): every rule of a manifest is
// enforced by ParseManifest itself, on a manifest a save wrote, edited
// (a hand-made or resealed checkpoint passes the DONE check); each
// refusal says what is wrong.
func TestParseManifestRefuses(t *testing.T) {
	p := mustSave(t, t.TempDir(), testState(2, 64), SaveOptions{})
	good, err := os.ReadFile(filepath.Join(p, ManifestFile))
	must(t, err)
	if _, err := ParseManifest(good); err != nil {
		t.Fatalf("the saved manifest: %v", err)
	}
	sha := strings.Repeat("ab", 32)
	edit := func(fn func(m map[string]any, files []any) []any) []byte {
		var m map[string]any
		must(t, json.Unmarshal(good, &m))
		m["files"] = fn(m, m["files"].([]any))
		b, err := json.Marshal(m)
		must(t, err)
		return b
	}
	entry := func(name string, size int) map[string]any {
		return map[string]any{"name": name, "size": size, "sha256": sha}
	}
	sharded := func(shards ...string) func(m map[string]any, files []any) []any {
		return func(m map[string]any, files []any) []any {
			out := []any{entry(ModelFile, 10), entry(ConfigFile, 10), entry(TrainerStateFile, 10), entry(ShardIndexFile, 10)}
			for _, s := range shards {
				out = append(out, entry(s, 10))
			}
			return out
		}
	}
	if _, err := ParseManifest(edit(sharded(ShardFile(0, 2), ShardFile(1, 2)))); err != nil {
		t.Fatalf("a sharded manifest: %v", err)
	}
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"trailing data", append(append([]byte(nil), good...), []byte(` {}`)...), "trailing data"},
		{"a file listed twice", edit(func(_ map[string]any, f []any) []any { return append(f, f[1]) }), "listed twice"},
		{"a shard listed twice, the count right", edit(sharded(ShardFile(0, 2), ShardFile(1, 2), ShardFile(0, 2))), "listed twice"},
		{"negative size -1", edit(func(_ map[string]any, f []any) []any { f[0].(map[string]any)["size"] = -1; return f }), "negative (-1)"},
		{"upper-case sha256", edit(func(_ map[string]any, f []any) []any {
			e := f[0].(map[string]any)
			e["sha256"] = strings.ToUpper(e["sha256"].(string))
			return f
		}), "64 lowercase hex digits"},
		{"both optimizer files", edit(func(_ map[string]any, f []any) []any {
			z := entry(OptimizerZstdFile, 10)
			z["uncompressed_size"] = 20
			return append(f, z)
		}), "one optimizer file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := ParseManifest(c.b); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ParseManifest: %v, want an error saying %q\n%s", err, c.want, c.b)
			}
		})
	}
}

// TestParseTrainerStateRefuses (QA round): negative counters of a trainer
// state are refused, each by itself.
func TestParseTrainerStateRefuses(t *testing.T) {
	p := mustSave(t, t.TempDir(), testState(2, 64), SaveOptions{})
	good, err := os.ReadFile(filepath.Join(p, TrainerStateFile))
	must(t, err)
	if _, err := ParseTrainerState(good); err != nil {
		t.Fatalf("the saved trainer state: %v", err)
	}
	for _, k := range []string{"step", "consumed_logical_rollouts"} {
		var m map[string]any
		must(t, json.Unmarshal(good, &m))
		m[k] = -1
		b, err := json.Marshal(m)
		must(t, err)
		if _, err := ParseTrainerState(b); err == nil || !strings.Contains(err.Error(), "want >= 0") {
			t.Errorf("%s -1: %v, want a refusal", k, err)
		}
	}
}

// TestRenamedCheckpointRefused (QA round): a step directory renamed to
// another step (its files intact, DONE matching) is refused: the manifest
// names the step it was saved at.
func TestRenamedCheckpointRefused(t *testing.T) {
	dir := t.TempDir()
	p := mustSave(t, dir, testState(2, 64), SaveOptions{})
	q := filepath.Join(dir, "step_3")
	must(t, os.Rename(p, q))
	for _, f := range []struct {
		op  string
		run func() error
	}{
		{"Load", func() error { _, err := Load(q, LoadOptions{}); return err }},
		{"Verify", func() error { _, err := Verify(q); return err }},
		{"OpenTensors", func() error {
			tt, err := OpenTensors(q)
			if err == nil {
				tt.Close()
			}
			return err
		}},
	} {
		if err := f.run(); err == nil || !strings.Contains(err.Error(), "step: want 3 (the directory name), found 2") {
			t.Errorf("%s of step_2 renamed step_3: %v", f.op, err)
		}
	}
}

// TestGrownFileRefusedAtOpen (QA round): a tensor file longer than its
// manifest says is refused when the checkpoint is opened for range reads
// (OpenTensors), which reads the file no further than the manifest's size
// and hashes nothing.
func TestGrownFileRefusedAtOpen(t *testing.T) {
	p := mustSave(t, t.TempDir(), testState(2, 64), SaveOptions{})
	f, err := os.OpenFile(filepath.Join(p, ModelFile), os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, err = f.Write([]byte("appended"))
	must(t, err)
	must(t, f.Close())
	tt, err := OpenTensors(p)
	if err == nil {
		tt.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "size: manifest.json says") || !strings.Contains(err.Error(), ModelFile) {
		t.Fatalf("OpenTensors of a grown %s: %v", ModelFile, err)
	}
}

// TestRetentionSkipsIncomplete (QA round): retention keeps the newest
// keep_top_k complete checkpoints; a step directory without DONE (a save
// that crashed) is not one of them, and does not push a good one out.
func TestRetentionSkipsIncomplete(t *testing.T) {
	dir := t.TempDir()
	mustSave(t, dir, testState(1, 64), SaveOptions{KeepTopK: 2})
	mustSave(t, dir, testState(2, 64), SaveOptions{KeepTopK: 2})
	broken := filepath.Join(dir, StepDir(3))
	must(t, os.MkdirAll(broken, 0o755))
	must(t, os.WriteFile(filepath.Join(broken, ModelFile), []byte("half"), 0o644))
	mustSave(t, dir, testState(4, 64), SaveOptions{KeepTopK: 2})
	for _, s := range []int64{2, 4} {
		if _, err := Verify(filepath.Join(dir, StepDir(s))); err != nil {
			t.Errorf("step_%d after retention: %v", s, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, StepDir(1))); err == nil {
		t.Errorf("step_1 kept: retention keeps 2")
	}
}
