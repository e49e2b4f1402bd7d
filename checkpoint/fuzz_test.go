package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// seedCheckpoint saves a small checkpoint and returns its path.
func seedCheckpoint(f *testing.F, compress bool) string {
	f.Helper()
	p, err := Save(f.TempDir(), testState(4, 8), SaveOptions{CompressOptimizer: compress})
	if err != nil {
		f.Fatal(err)
	}
	return p
}

func FuzzParseManifest(f *testing.F) {
	b, err := os.ReadFile(filepath.Join(seedCheckpoint(f, false), ManifestFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"format":"tracegrpo-checkpoint","version":1,"step":1,"files":[]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseManifest(b)
		if err != nil {
			return
		}
		// What parses re-encodes and parses to the same manifest.
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := ParseManifest(again)
		if err != nil {
			t.Fatalf("re-encoded manifest refused: %v", err)
		}
		if len(m2.Files) != len(m.Files) || m2.Step != m.Step {
			t.Fatalf("round trip changed the manifest: %+v vs %+v", m, m2)
		}
	})
}

func FuzzParseTrainerState(f *testing.F) {
	b, err := os.ReadFile(filepath.Join(seedCheckpoint(f, false), TrainerStateFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"format_version":1,"step":0,"rng":null,"optimizer":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ts, err := ParseTrainerState(b)
		if err != nil {
			return
		}
		enc, err := encodeTrainerState(&ts)
		if err != nil {
			t.Fatalf("parsed state does not encode: %v", err)
		}
		ts2, err := ParseTrainerState(enc)
		if err != nil {
			t.Fatalf("re-encoded state refused: %v", err)
		}
		if string(ts2.RolloutCursor) != string(ts.RolloutCursor) || ts2.Step != ts.Step || len(ts2.RNG) != len(ts.RNG) {
			t.Fatalf("round trip changed the state")
		}
	})
}

// FuzzLoadRehashed replaces one file of a checkpoint with fuzzed bytes and
// rewrites the manifest and DONE to match, so the bytes get past the hash
// check and reach the safetensors, zstd and JSON parsers. Load must refuse
// or succeed, never panic.
func FuzzLoadRehashed(f *testing.F) {
	src := seedCheckpoint(f, true)
	files := []string{ModelFile, ConfigFile, OptimizerZstdFile, TrainerStateFile}
	orig := map[string][]byte{}
	for i, name := range files {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			f.Fatal(err)
		}
		orig[name] = b
		f.Add(uint8(i), b)
	}
	mb, err := os.ReadFile(filepath.Join(src, ManifestFile))
	if err != nil {
		f.Fatal(err)
	}
	man0, err := ParseManifest(mb)
	if err != nil {
		f.Fatal(err)
	}
	// One directory per worker, rewritten per input: the file system is
	// the slow part of an execution.
	dir := filepath.Join(f.TempDir(), "step_4")
	if err := os.Mkdir(dir, 0o755); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		target := files[int(which)%len(files)]
		man := man0
		man.Files = append([]FileEntry(nil), man0.Files...)
		for i, e := range man.Files {
			b := orig[e.Name]
			if e.Name == target {
				b = data
				sum := sha256.Sum256(b)
				man.Files[i].Size, man.Files[i].SHA256 = int64(len(b)), hex.EncodeToString(sum[:])
			}
			if err := os.WriteFile(filepath.Join(dir, e.Name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		mb, _ := json.Marshal(man)
		if err := os.WriteFile(filepath.Join(dir, ManifestFile), mb, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, DoneFile), doneContent(mb), 0o644); err != nil {
			t.Fatal(err)
		}
		Load(dir, LoadOptions{ExpectConfig: []byte(`{"architectures":["Qwen3ForCausalLM"],"hidden_size":8,"rope_theta":1e6}`)})
	})
}
