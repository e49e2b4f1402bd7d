package checkpoint

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWeightsOnlyCheckpoint: a checkpoint saved with no_optimizer
// (checkpointing.save_optimizer false) has no optimizer file, verifies and
// loads with no moments; one whose trainer state and manifest disagree
// (an optimizer file dropped, the manifest and DONE rewritten as a tool
// would) is refused, and so is a save whose tensors and flag disagree.
func TestWeightsOnlyCheckpoint(t *testing.T) {
	dir := t.TempDir()
	st := testState(3, 64)
	st.Optimizer, st.Trainer.NoOptimizer = nil, true
	path := mustSave(t, dir, st, SaveOptions{})
	if _, err := os.Stat(filepath.Join(path, OptimizerFile)); !os.IsNotExist(err) {
		t.Fatalf("a weights-only checkpoint has %s (%v)", OptimizerFile, err)
	}
	if _, err := Verify(path); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Trainer.NoOptimizer || len(got.Optimizer) != 0 || len(got.Model) != len(st.Model) {
		t.Errorf("loaded no_optimizer %v, %d optimizer and %d model tensors", got.Trainer.NoOptimizer, len(got.Optimizer), len(got.Model))
	}

	bad := testState(4, 64)
	bad.Trainer.NoOptimizer = true // but with tensors
	if _, err := Save(t.TempDir(), bad, SaveOptions{}); err == nil || !strings.Contains(err.Error(), "no_optimizer") {
		t.Errorf("saving moments with no_optimizer: %v", err)
	}

	// A full checkpoint whose optimizer file is dropped and whose manifest
	// and DONE are rewritten to match.
	full := mustSave(t, t.TempDir(), testState(5, 64), SaveOptions{})
	b, err := os.ReadFile(filepath.Join(full, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	var man Manifest
	if err := json.Unmarshal(b, &man); err != nil {
		t.Fatal(err)
	}
	var kept []FileEntry
	for _, f := range man.Files {
		if f.Name != OptimizerFile {
			kept = append(kept, f)
		}
	}
	man.Files = kept
	mb, _ := json.MarshalIndent(man, "", "  ")
	mb = append(mb, '\n')
	os.Remove(filepath.Join(full, OptimizerFile))
	os.WriteFile(filepath.Join(full, ManifestFile), mb, 0o644)
	os.WriteFile(filepath.Join(full, DoneFile), doneContent(mb), 0o644)
	if _, err := Load(full, LoadOptions{}); err == nil || !strings.Contains(err.Error(), "lost its Adam moments") {
		t.Errorf("a checkpoint that lost its optimizer file loaded: %v", err)
	}
}
