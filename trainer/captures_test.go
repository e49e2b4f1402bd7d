package trainer

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/gym"
)

// builtinRolloutIDs are the rollout ids of steps first..last of the small
// built-in job (trainArgs: three task groups of four).
func builtinRolloutIDs(first, last int) []string {
	var ids []string
	for s := first; s <= last; s++ {
		for p := 0; p < 3; p++ {
			for g := 0; g < 4; g++ {
				ids = append(ids, fmt.Sprintf("step%06d-%d-%d", s, p, g))
			}
		}
	}
	sort.Strings(ids)
	return ids
}

// captureFiles lists the capture-store files (".tokens." in the name) under
// dir, relative to it.
func captureFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.Contains(d.Name(), ".tokens.") {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkCaptureDir requires dir to be the NeMo Gym capture store of steps
// 1..steps: an entries file, an intents file and a state document per
// rollout and nothing else, each rollout's snapshot complete with entries.
func checkCaptureDir(t *testing.T, dir string, steps int) {
	t.Helper()
	want := builtinRolloutIDs(1, steps)
	r, err := gym.NewReader(dir)
	if err != nil {
		t.Fatalf("no capture store in %s: %v", dir, err)
	}
	ids, err := r.RolloutIDs()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, ids); d != "" {
		t.Fatalf("rollouts captured in %s (-want +got)\n%s", dir, d)
	}
	if n := len(captureFiles(t, dir)); n != 3*len(want) {
		t.Errorf("%s holds %d capture files, want 3 (entries, intents, state) for each of %d rollouts", dir, n, len(want))
	}
	for _, id := range want {
		snap, err := r.Snapshot(id)
		if err != nil {
			t.Fatalf("%s: rollout %s: %v", dir, id, err)
		}
		if snap.Incomplete || len(snap.Entries) == 0 {
			t.Fatalf("%s: rollout %s: incomplete=%v, %d entries, want a complete capture", dir, id, snap.Incomplete, len(snap.Entries))
		}
	}
}

// TestBuiltinCapturesStayInMemory: the built-in job wrote every capture it
// recorded into <out>/captures (57,600 files, 229 MB in make run) although
// it only reads them back itself. By default it now writes none anywhere;
// --save-captures writes them to <out>/captures and an explicit
// env.nemo_gym.token_id_capture.dir writes them there, as a NeMo Gym
// capture store; all three runs train bit for bit alike, and config.yaml
// says where the captures were.
func TestBuiltinCapturesStayInMemory(t *testing.T) {
	const steps = 4
	root := t.TempDir()
	mem, save, recipe := filepath.Join(root, "memory"), filepath.Join(root, "save"), filepath.Join(root, "recipe")
	recipeCaps := filepath.Join(root, "recipe-captures")
	// A capture directory outside --out must exist (train creates none there).
	if err := os.Mkdir(recipeCaps, 0o755); err != nil {
		t.Fatal(err)
	}
	mustTrain(t, trainArgs(mem, steps)...)
	mustTrain(t, trainArgs(save, steps, "--save-captures")...)
	mustTrain(t, trainArgs(recipe, steps, "--set", "env.nemo_gym.token_id_capture.dir="+recipeCaps)...)

	if _, err := os.Stat(filepath.Join(mem, "captures")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the default built-in run made %s (%v), want no captures directory", filepath.Join(mem, "captures"), err)
	}
	if fs := captureFiles(t, root); len(fs) != 2*3*len(builtinRolloutIDs(1, steps)) {
		t.Errorf("%d capture files under the three runs, want those of the two that asked for them", len(fs))
	}
	if fs := captureFiles(t, mem); len(fs) > 0 {
		t.Errorf("the default built-in run wrote %d capture files, e.g. %s", len(fs), fs[0])
	}
	checkCaptureDir(t, filepath.Join(save, "captures"), steps)
	checkCaptureDir(t, recipeCaps, steps)
	if _, err := os.Stat(filepath.Join(recipe, "captures")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("with an explicit capture dir the run also made %s (%v)", filepath.Join(recipe, "captures"), err)
	}

	for _, out := range []string{save, recipe} {
		sameMetrics(t, metricsNoTimes(t, mem), metricsNoTimes(t, out))
		for _, f := range []string{checkpoint.ModelFile, "optimizer.safetensors"} {
			if !bytes.Equal(checkpointBytes(t, mem, steps, f), checkpointBytes(t, out, steps, f)) {
				t.Errorf("%s of the run with captures on disk (%s) differs from the one with captures in memory", f, out)
			}
		}
	}

	for _, tc := range []struct {
		out  string
		want []string
	}{
		{mem, []string{"# captures: kept in memory", "--save-captures writes them to " + filepath.Join(mem, "captures"), `dir: ""`}},
		{save, []string{"# captures: written to " + filepath.Join(save, "captures"), "dir: " + filepath.Join(save, "captures")}},
		{recipe, []string{"# captures: written to " + recipeCaps, "dir: " + recipeCaps}},
	} {
		b, err := os.ReadFile(filepath.Join(tc.out, configFileName))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s lacks %q:\n%s", filepath.Join(tc.out, configFileName), w, b)
			}
		}
	}
}

// TestBuiltinMemoryStoreHoldsOneStep: the in-memory store of a step holds
// that step's captures only, so memory does not grow over a long run: the
// source the trainer finalizes step 2 against has step 2's rollouts and
// nothing of step 1's.
func TestBuiltinMemoryStoreHoldsOneStep(t *testing.T) {
	out := t.TempDir()
	tr, err := newTrainer(t, trainArgs(out, 2)...)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for step := 1; step <= 2; step++ {
		recs, src, err := tr.source.next(step)
		if err != nil {
			t.Fatal(err)
		}
		r, ok := src.(*gym.Reader)
		if !ok {
			t.Fatalf("step %d: the built-in source is a %T, want a *gym.Reader", step, src)
		}
		ids, err := r.RolloutIDs()
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(builtinRolloutIDs(step, step), ids); d != "" {
			t.Errorf("step %d: rollouts in the capture store (-want +got)\n%s", step, d)
		}
		if len(recs) != len(ids) || r.Dir() != "" {
			t.Errorf("step %d: %d records for %d captured rollouts, store dir %q (want in memory)", step, len(recs), len(ids), r.Dir())
		}
		fin, err := gym.Finalize(recs[0], src, tr.builder)
		if err != nil || fin.Masked {
			t.Fatalf("step %d: %s does not finalize from memory: %v %+v", step, ids[0], err, fin)
		}
	}
	if fs := captureFiles(t, out); len(fs) > 0 {
		t.Errorf("the in-memory store wrote %v", fs)
	}
}

// TestSaveCapturesIsForTheBuiltinJob: --save-captures with --rollouts is a
// usage error (those captures are NeMo Gym's, read from --captures).
func TestSaveCapturesIsForTheBuiltinJob(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	args := append([]string{"--out", filepath.Join(dir, "out"), "--steps", "1", "--rollouts", recs, "--captures", caps, "--save-captures"}, externalSets...)
	var stderr bytes.Buffer
	if code := run(args, &bytes.Buffer{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "--save-captures is for the built-in job") {
		t.Fatalf("--save-captures with --rollouts: exit %d, %q; want 2 naming the flag", code, stderr.String())
	}
}
