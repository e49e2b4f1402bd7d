package main

// The differential test against NeMo Gym's own code: gym/testdata/gymdiff
// holds capture stores written by Gym's real writer, rollout records, and
// what Gym's real builders, terminal attribution and projection made of
// them (scripts/gym_differential.py). This test runs `train traces` over
// the same data and compares field by field: the verdict, the mask reason,
// the envelope (trace order, ids, call ids, tokens, logprobs, masks,
// spans), the build counts and the terminal attribution. A case that
// differs must name a departure that docs/gym.md's "Departures from NeMo
// Gym" section documents; a case that agrees must not claim one.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/gym"
)

const gymDiffDir = "../../gym/testdata/gymdiff"

// minGymDiffCases is the fewest scenarios the test accepts, so a truncated
// data set fails instead of passing on little.
const minGymDiffCases = 35

type gymDiffManifest struct {
	Meta  map[string]any `json:"meta"`
	Cases []struct {
		Name      string `json:"name"`
		RolloutID string `json:"rollout_id"`
		What      string `json:"what"`
		Departure string `json:"departure"`
		Runtime   struct {
			Mkfifo  []string          `json:"mkfifo"`
			Symlink map[string]string `json:"symlink"`
		} `json:"runtime"`
	} `json:"cases"`
	BadIDs []struct {
		Case      string `json:"case"`
		Outcome   string `json:"outcome"`
		Error     string `json:"error"`
		Departure string `json:"departure"`
	} `json:"bad_ids"`
}

type gymDiffResult struct {
	Case     string `json:"case"`
	Outcome  string `json:"outcome"`
	Reason   string `json:"reason"`
	Error    string `json:"error"`
	Terminal *struct {
		CallID string `json:"call_id"`
		Method string `json:"method"`
		Reason string `json:"reason"`
	} `json:"terminal"`
	Notes *struct {
		Roots                    int            `json:"roots"`
		Chains                   int            `json:"chains"`
		GeneratedTokensCaptured  int            `json:"generated_tokens_captured"`
		GeneratedTokensDelivered int            `json:"generated_tokens_delivered"`
		DeliveredFraction        float64        `json:"delivered_fraction"`
		UnresolvedRetries        []string       `json:"unresolved_retries"`
		TerminalChain            string         `json:"terminal_chain"`
		EmptyGenerationCalls     []string       `json:"empty_generation_calls"`
		ParentLinkFailures       map[string]int `json:"parent_link_failures"`
		UnresolvedParentCalls    []string       `json:"unresolved_parent_calls"`
		Quarantined              []string       `json:"quarantined"`
	} `json:"notes"`
	TrainingTraces json.RawMessage `json:"training_traces"`
}

func readJSONL[T any](t *testing.T, path string) []T {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	for i, line := range bytes.Split(bytes.TrimSpace(b), []byte{'\n'}) {
		var v T
		if err := json.Unmarshal(line, &v); err != nil {
			t.Fatalf("%s:%d: %v", path, i+1, err)
		}
		out = append(out, v)
	}
	return out
}

// copyTree copies a directory, keeping symlinks as symlinks.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// documentedDepartures returns the departure ids of docs/gym.md's
// "Departures from NeMo Gym" table (its first column, in backquotes).
func documentedDepartures(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../../docs/gym.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Departures from NeMo Gym\n")
	if !ok {
		t.Fatal(`docs/gym.md has no "## Departures from NeMo Gym" section`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	ids := map[string]bool{}
	for _, line := range strings.Split(sec, "\n") {
		if strings.HasPrefix(line, "| `") {
			id, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
			ids[id] = true
		}
	}
	return ids
}

func runTracesOK(t *testing.T, args ...string) []*gym.Record {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(append([]string{"traces"}, args...), &stdout, &stderr); code != 0 {
		t.Fatalf("train traces %v: exit %d\n%s", args, code, stderr.String())
	}
	var recs []*gym.Record
	for _, line := range bytes.Split(bytes.TrimSpace(stdout.Bytes()), []byte{'\n'}) {
		r, err := gym.ParseRecord(line)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	return recs
}

// tgOutcome is what tracegrpo made of one record.
type tgOutcome struct {
	masked  bool
	reason  string
	env     *gym.TrainingTraceBatch
	metrics gym.CaptureMetrics
}

func outcomeOf(t *testing.T, r *gym.Record) tgOutcome {
	t.Helper()
	var o tgOutcome
	if raw, ok := r.Get(gym.KeyTokenCapture); ok {
		if err := json.Unmarshal(raw, &o.metrics); err != nil {
			t.Fatal(err)
		}
	}
	o.masked, _ = r.MaskSample()
	o.reason = o.metrics.Reason
	env, ok, err := r.TrainingTraces()
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		o.env = env
	}
	return o
}

// compareWithGym lists every field on which tracegrpo and Gym differ.
func compareWithGym(g gymDiffResult, o tgOutcome) []string {
	var diffs []string
	gymDelivered := g.Outcome == "delivered"
	if gymDelivered == o.masked || (g.Outcome != "delivered" && g.Outcome != "masked") {
		verdict := "delivered"
		if o.masked {
			verdict = "masked:" + o.reason
		}
		return []string{fmt.Sprintf("verdict: Gym %s %s (%.80s), tracegrpo %s", g.Outcome, g.Reason, g.Error, verdict)}
	}
	if o.masked {
		if g.Reason != o.reason {
			diffs = append(diffs, fmt.Sprintf("reason: Gym %s (%.80s), tracegrpo %s", g.Reason, g.Error, o.reason))
		}
	} else {
		gotEnv, err := gym.DecodeTrainingTraces(g.TrainingTraces)
		if err != nil {
			return []string{"Gym's envelope does not decode: " + err.Error()}
		}
		if d := cmp.Diff(gotEnv, o.env); d != "" {
			diffs = append(diffs, "envelope (-Gym +tracegrpo):\n"+d)
		}
		n, m := g.Notes, o.metrics
		for _, c := range []struct {
			name      string
			gym, ours any
		}{
			{"roots", n.Roots, m.Roots}, {"chains", n.Chains, m.Chains},
			{"quarantined_calls", len(n.Quarantined), m.QuarantinedCalls},
			{"generated_tokens_captured", n.GeneratedTokensCaptured, m.GeneratedTokensCaptured},
			{"generated_tokens_delivered", n.GeneratedTokensDelivered, m.GeneratedTokensDelivered},
			{"delivered_fraction", n.DeliveredFraction, m.DeliveredFraction},
			{"unresolved_retries", len(n.UnresolvedRetries), m.UnresolvedRetries},
			{"unresolved_parent_calls", len(n.UnresolvedParentCalls), m.UnresolvedParentCalls},
			{"empty_generation_calls", len(n.EmptyGenerationCalls), m.EmptyGenerationCalls},
			{"parent_link_failures", n.ParentLinkFailures, m.ParentLinkFailures},
		} {
			if !cmp.Equal(c.gym, c.ours, cmp.Comparer(func(a, b map[string]int) bool { return len(a)+len(b) == 0 || cmp.Equal(a, b) })) {
				diffs = append(diffs, fmt.Sprintf("%s: Gym %v, tracegrpo %v", c.name, c.gym, c.ours))
			}
		}
		if ta := m.TerminalAttribution; ta == nil || ta.Chain != n.TerminalChain {
			diffs = append(diffs, fmt.Sprintf("terminal chain: Gym %q, tracegrpo %+v", n.TerminalChain, ta))
		}
	}
	if g.Terminal != nil {
		ta := o.metrics.TerminalAttribution
		if ta == nil || ta.CallID != g.Terminal.CallID || ta.Method != g.Terminal.Method || ta.Reason != g.Terminal.Reason {
			diffs = append(diffs, fmt.Sprintf("terminal attribution: Gym %+v, tracegrpo %+v", *g.Terminal, ta))
		}
	}
	return diffs
}

// TestGymDifferential runs train traces over the stores Gym's own writer
// produced and compares every case with Gym's own builders (both).
func TestGymDifferential(t *testing.T) {
	var man gymDiffManifest
	b, err := os.ReadFile(filepath.Join(gymDiffDir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &man); err != nil {
		t.Fatal(err)
	}
	if man.Meta["script"] != "scripts/gym_differential.py" {
		t.Fatalf("manifest does not name its script: %v", man.Meta["script"])
	}
	if len(man.Cases) < minGymDiffCases {
		t.Fatalf("%d cases, want at least %d", len(man.Cases), minGymDiffCases)
	}
	// Gym's fingerprint.py agreed with every case of the committed golden:
	// the one Gym ran on (its sha256), and all of it.
	golden, err := os.ReadFile(filepath.Join("..", "..", "gym", "testdata", "golden_fingerprint.json"))
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(golden); man.Meta["fingerprint_golden_sha256"] != hex.EncodeToString(sum[:]) {
		t.Fatalf("golden_fingerprint.json changed since Gym's fingerprint.py checked it (manifest sha256 %v): rerun scripts/gym_differential.py", man.Meta["fingerprint_golden_sha256"])
	}
	var cases struct{ Cases []json.RawMessage }
	if err := json.Unmarshal(golden, &cases); err != nil {
		t.Fatal(err)
	}
	if a, want := man.Meta["fingerprint_golden_agreement"], fmt.Sprintf("%d/%d", len(cases.Cases), len(cases.Cases)); a != want {
		t.Fatalf("Gym's fingerprint.py agrees with golden_fingerprint.json on %v cases, want %s", a, want)
	}
	documented := documentedDepartures(t)

	tmp := t.TempDir()
	captures := filepath.Join(tmp, "captures")
	copyTree(t, filepath.Join(gymDiffDir, "captures"), captures)
	copyTree(t, filepath.Join(gymDiffDir, "outside"), filepath.Join(tmp, "outside"))
	for _, c := range man.Cases {
		for _, name := range c.Runtime.Mkfifo {
			if err := syscall.Mkfifo(filepath.Join(captures, name), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for name, target := range c.Runtime.Symlink {
			if err := os.Symlink(target, filepath.Join(captures, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	rollouts := filepath.Join(gymDiffDir, "rollouts.jsonl")

	type row struct{ agree, departure int }
	table := map[string]*row{}
	for _, builder := range []string{gym.BuilderPrefixMerging, gym.BuilderPerRequest} {
		table[builder] = &row{}
		gymRes := readJSONL[gymDiffResult](t, filepath.Join(gymDiffDir, "gym_"+builder+".jsonl"))
		ours := runTracesOK(t, "--captures", captures, "--rollouts", rollouts, "--builder", builder)
		if len(gymRes) != len(man.Cases) || len(ours) != len(man.Cases) {
			t.Fatalf("%s: %d Gym results, %d tracegrpo records, %d cases", builder, len(gymRes), len(ours), len(man.Cases))
		}
		for i, c := range man.Cases {
			if gymRes[i].Case != c.Name {
				t.Fatalf("%s: result %d is %s, want %s", builder, i, gymRes[i].Case, c.Name)
			}
			diffs := compareWithGym(gymRes[i], outcomeOf(t, ours[i]))
			switch {
			case len(diffs) == 0 && c.Departure != "":
				t.Errorf("%s/%s: agrees with Gym but is listed as departure %q (stale)", builder, c.Name, c.Departure)
			case len(diffs) == 0:
				table[builder].agree++
				t.Logf("%-15s %-32s agree", builder, c.Name)
			case c.Departure == "":
				t.Errorf("%s/%s (%s): differs from Gym with no documented departure:\n  %s", builder, c.Name, c.What, strings.Join(diffs, "\n  "))
			case !documented[c.Departure]:
				t.Errorf("%s/%s: departure %q has no row in docs/gym.md's Departures from NeMo Gym", builder, c.Name, c.Departure)
			default:
				table[builder].departure++
				t.Logf("%-15s %-32s departure %-20s %s", builder, c.Name, c.Departure, strings.Split(diffs[0], "\n")[0])
			}
		}
	}
	for _, builder := range []string{gym.BuilderPrefixMerging, gym.BuilderPerRequest} {
		r := table[builder]
		t.Logf("%s: %d cases agree with Gym, %d are documented departures", builder, r.agree, r.departure)
		if r.agree < minGymDiffCases/2 {
			t.Errorf("%s: only %d cases agree", builder, r.agree)
		}
	}

	// Records with a bad correlation key: Gym masks them; tracegrpo stops
	// with file:line (RL #4078 makes correlation errors fatal).
	bad, err := os.ReadFile(filepath.Join(gymDiffDir, "bad_ids.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(bad), []byte{'\n'})
	if len(lines) != len(man.BadIDs) || len(lines) == 0 {
		t.Fatalf("%d bad-id records, %d in the manifest", len(lines), len(man.BadIDs))
	}
	for i, line := range lines {
		bi := man.BadIDs[i]
		if bi.Outcome != "masked" || !documented[bi.Departure] {
			t.Errorf("%s: Gym %s, departure %q (documented: %v)", bi.Case, bi.Outcome, bi.Departure, documented[bi.Departure])
		}
		f := filepath.Join(tmp, "bad_ids.jsonl")
		os.WriteFile(f, append(line, '\n'), 0o644)
		var stdout, stderr bytes.Buffer
		if code := run([]string{"traces", "--captures", captures, "--rollouts", f}, &stdout, &stderr); code != 1 ||
			!strings.Contains(stderr.String(), "bad_ids.jsonl:1:") {
			t.Errorf("%s: exit %d, stderr %s; want exit 1 naming bad_ids.jsonl:1", bi.Case, code, stderr.String())
		}
	}
}

// TestGymFinalizedRecordsPassThrough: every record Gym finalized (delivered
// or masked) passes through train traces with each field byte-identical.
func TestGymFinalizedRecordsPassThrough(t *testing.T) {
	tmp := t.TempDir()
	n := 0
	for _, builder := range []string{gym.BuilderPrefixMerging, gym.BuilderPerRequest} {
		results := readJSONL[gymDiffResult](t, filepath.Join(gymDiffDir, "gym_"+builder+".jsonl"))
		b, err := os.ReadFile(filepath.Join(gymDiffDir, "gym_records_"+builder+".jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		var keep []byte
		for i, line := range bytes.Split(bytes.TrimSpace(b), []byte{'\n'}) {
			if o := results[i].Outcome; o == "delivered" || o == "masked" {
				keep = append(append(keep, line...), '\n')
			}
		}
		in := filepath.Join(tmp, builder+".jsonl")
		os.WriteFile(in, keep, 0o644)
		out := runTracesOK(t, "--captures", filepath.Join(gymDiffDir, "captures"), "--rollouts", in)
		for i, line := range bytes.Split(bytes.TrimSpace(keep), []byte{'\n'}) {
			src, err := gym.ParseRecord(line)
			if err != nil {
				t.Fatal(err)
			}
			if !cmp.Equal(src.Keys(), out[i].Keys()) {
				t.Fatalf("%s record %d: keys %v, want %v", builder, i+1, out[i].Keys(), src.Keys())
			}
			for _, k := range src.Keys() {
				a, _ := src.Get(k)
				o, _ := out[i].Get(k)
				if !bytes.Equal(a, o) {
					t.Errorf("%s record %d field %s:\n got %s\nwant %s", builder, i+1, k, o, a)
				}
			}
			n++
		}
	}
	if n < minGymDiffCases {
		t.Fatalf("only %d Gym-finalized records", n)
	}
}
