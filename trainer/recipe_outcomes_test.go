package trainer

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/config"
)

// The outcome of every GRPO config of the committed NeMo RL corpus, as a
// new user would try it: the spec §9 block (config/testdata/
// multitrace_override.yaml) over the recipe, plus the guards spec §8 asks
// for that the block does not set (grpo.overlong_filtering=false), checked
// as train config --check checks it without a model. The table
// trainer/testdata/recipe_outcomes.tsv is the expected outcome of each, and
// its last lines the counts; when a capability lands (or a key's class
// changes), rerun with -update and review the diff:
//
//	go test ./trainer -run TestNeMoRLRecipeOutcomes -update
var updateOutcomes = flag.Bool("update", false, "rewrite trainer/testdata/recipe_outcomes.tsv from this run")

const outcomesFile = "testdata/recipe_outcomes.tsv"

// section9Block is how the outcomes apply the spec §9 block and §8 guards.
var (
	section9Files     = []string{"../config/testdata/multitrace_override.yaml"}
	section9Overrides = []string{"++grpo.overlong_filtering=false"}
)

// recipeOutcome is one row of the table.
type recipeOutcome struct {
	Outcome   string // loads, refused or wrong
	Refused   string // the refused keys, sorted, comma-separated ("-": none)
	Undecided string // MoE-only keys left undecided without the model ("-": none)
}

func outcomeOf(path string) recipeOutcome {
	ld, err := config.LoadSources(config.Sources{Files: append([]string{path}, section9Files...), Overrides: section9Overrides})
	if err != nil {
		return recipeOutcome{"wrong", oneLine(err), "-"}
	}
	o := recipeOutcome{Outcome: "loads", Refused: "-", Undecided: "-"}
	var und []string
	for _, r := range append(ld.Undecided(), UndecidedExpertBias(&ld.Config)...) {
		und = append(und, r.Key)
	}
	if len(und) > 0 {
		o.Undecided = strings.Join(sortedUnique(und), ",")
	}
	err = Check(ld, 0)
	if err == nil {
		return o
	}
	refused, other := config.SplitRefusals(err)
	if len(other) > 0 {
		return recipeOutcome{"wrong", oneLine(errors.Join(other...)), "-"}
	}
	var keys []string
	for _, r := range refused {
		keys = append(keys, r.RefusedKey())
	}
	o.Outcome, o.Refused = "refused", strings.Join(sortedUnique(keys), ",")
	return o
}

func sortedUnique(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, k := range s {
		if i == 0 || k != s[i-1] {
			out = append(out, k)
		}
	}
	return out
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

// outcomeCounts are the table's summary lines: the loads and refusals of
// all configs and of examples/nemo_gym's, and the keys refused most often.
func outcomeCounts(rows map[string]recipeOutcome) []string {
	type tally struct{ loads, refused, wrong, undecided int }
	var all, gym tally
	byKey := map[string]int{}
	for p, o := range rows {
		for _, t := range []*tally{&all, &gym} {
			if t == &gym && !strings.HasPrefix(p, "examples/nemo_gym/") {
				continue
			}
			switch o.Outcome {
			case "loads":
				t.loads++
				if o.Undecided != "-" {
					t.undecided++
				}
			case "refused":
				t.refused++
			default:
				t.wrong++
			}
		}
		if o.Outcome == "refused" {
			for _, k := range strings.Split(o.Refused, ",") {
				byKey[k]++
			}
		}
	}
	line := func(name string, t tally, n int) string {
		return fmt.Sprintf("# counts: %s: %d configs: %d load (%d of them name MoE-only keys, decided by the model), %d refused, %d fail wrongly", name, n, t.loads, t.undecided, t.refused, t.wrong)
	}
	ngym := 0
	for p := range rows {
		if strings.HasPrefix(p, "examples/nemo_gym/") {
			ngym++
		}
	}
	out := []string{line("all GRPO configs", all, len(rows)), line("examples/nemo_gym", gym, ngym)}
	var keys []string
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return byKey[keys[i]] > byKey[keys[j]] || byKey[keys[i]] == byKey[keys[j]] && keys[i] < keys[j]
	})
	for i, k := range keys {
		if i == 10 {
			break
		}
		out = append(out, fmt.Sprintf("# refused most often: %d %s", byKey[k], k))
	}
	return out
}

// TestNeMoRLRecipeOutcomes: every GRPO config of the corpus has the outcome
// trainer/testdata/recipe_outcomes.tsv records (loads, or refused naming
// these keys), none fails wrongly, and the counts are the table's.
func TestNeMoRLRecipeOutcomes(t *testing.T) {
	dir := "../config/testdata/nemo-rl"
	recipes, commit := manifestRecipes(t, dir)
	got := map[string]recipeOutcome{}
	for _, rel := range recipes {
		got[rel] = outcomeOf(filepath.Join(dir, rel))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# The outcome of each GRPO config of config/testdata/nemo-rl (NVIDIA-NeMo/RL %s) under the spec §9 block\n", commit)
	fmt.Fprintf(&b, "# (config/testdata/multitrace_override.yaml) and the §8 guards (%s), as train config --check gives it\n", strings.Join(section9Overrides, " "))
	b.WriteString("# without a model. Written by go test ./trainer -run TestNeMoRLRecipeOutcomes -update; review its diff.\n")
	b.WriteString("# columns: recipe, outcome (loads, refused, wrong), refused keys, MoE-only keys a model with experts would refuse\n")
	for _, rel := range recipes {
		o := got[rel]
		fmt.Fprintf(&b, "%s\t%s\t%s\t%s\n", rel, o.Outcome, o.Refused, o.Undecided)
	}
	for _, l := range outcomeCounts(got) {
		b.WriteString(l + "\n")
	}
	if *updateOutcomes {
		if err := os.WriteFile(outcomesFile, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", outcomesFile)
	}
	data, err := os.ReadFile(outcomesFile)
	if err != nil {
		t.Fatalf("%v (go test ./trainer -run TestNeMoRLRecipeOutcomes -update writes it)", err)
	}
	want := map[string]recipeOutcome{}
	var wantCounts []string
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "# counts: "); ok {
			wantCounts = append(wantCounts, "# counts: "+rest)
		}
		if rest, ok := strings.CutPrefix(line, "# refused most often: "); ok {
			wantCounts = append(wantCounts, "# refused most often: "+rest)
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			t.Fatalf("%s: %q: want 4 columns", outcomesFile, line)
		}
		want[f[0]] = recipeOutcome{f[1], f[2], f[3]}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("recipe outcomes (-%s +now); if the change is meant, rerun with -update:\n%s", outcomesFile, d)
	}
	if d := cmp.Diff(wantCounts, outcomeCounts(got)); d != "" {
		t.Errorf("counts (-%s +now):\n%s", outcomesFile, d)
	}
	for p, o := range got {
		if o.Outcome == "wrong" {
			t.Errorf("%s fails wrongly: %s", p, o.Refused)
		}
	}
	for _, l := range outcomeCounts(got) {
		t.Log(l)
	}
}
