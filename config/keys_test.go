package config

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
)

// nemorlKeys reads gen_nemorl_keys.tsv: the key paths of NeMo RL's GRPO
// schema and recipes at the recorded upstream commit, and which of them hold
// other keys.
func nemorlKeys(t *testing.T) (keys []string, isMapping map[string]bool, commit string) {
	t.Helper()
	tab := nemorlTable(t)
	isMapping = map[string]bool{}
	for _, k := range tab.paths {
		keys = append(keys, k)
		if strings.Contains(tab.keys[k].Type, "mapping") {
			isMapping[k] = true
		}
		if i := strings.LastIndex(k, "."); i > 0 {
			isMapping[k[:i]] = true
		}
	}
	return keys, isMapping, tab.fullCommit
}

// nemorlTable parses gen_nemorl_keys.tsv from the file (the loader embeds
// the same bytes), requiring a full upstream commit.
func nemorlTable(t *testing.T) *nemoRLTable {
	t.Helper()
	b, err := os.ReadFile("gen_nemorl_keys.tsv")
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != nemoRLKeysTSV {
		t.Fatal("gen_nemorl_keys.tsv differs from the embedded copy (rebuild)")
	}
	tab, err := parseNeMoRLKeys(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if len(tab.fullCommit) != 40 {
		t.Fatalf("gen_nemorl_keys.tsv records no upstream commit (found %q)", tab.fullCommit)
	}
	return tab
}

// schemaLeaf reports whether Config types key path p (list indices
// dropped), and whether as a leaf (a value or a mapping of free keys, rather
// than a struct of more keys).
func schemaLeaf(p string) (typed, leaf bool) {
	t := normSchemaType(p)
	if t == nil {
		return false, false
	}
	for t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct {
		t = t.Elem()
	}
	return true, t.Kind() != reflect.Struct
}

// TestKeyClassesCoverNeMoRL: every key of NeMo RL's GRPO schema and recipes
// (gen_nemorl_keys.tsv, with the upstream commit it records) is in exactly
// one class, as loading classifies it: the most specific rule names its
// class, a key Config types is Used or refused by a guard, and a section
// whose keys all have rules is classified by them.
func TestKeyClassesCoverNeMoRL(t *testing.T) {
	keys, isMapping, commit := nemorlKeys(t)
	t.Logf("%d keys of NVIDIA-NeMo/RL %s", len(keys), commit[:12])
	counts := map[Class]int{}
	for _, k := range keys {
		cls, r, at := Classify(k, func(p string) bool { return isMapping[p] })
		if cls == Unclassified {
			if at == k && isMapping[k] && rulesBeneath(k) {
				continue // a section whose keys have rules
			}
			t.Errorf("%s: in no class (add a rule to keyRules in keys.go)", k)
			continue
		}
		if typed, _ := schemaLeaf(at); !typed && (cls == Used || r != nil && r.Guard) {
			t.Errorf("%s: rule %q says %v, but Config has no such field", k, r.Key, cls)
		}
		counts[cls]++
	}
	t.Logf("%d used, %d ignored, %d refused", counts[Used], counts[Ignored], counts[Refused])
}

// TestKeyRulesAreConsistent: the table's own invariants.
func TestKeyRulesAreConsistent(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range keyRules {
		if seen[r.Key] {
			t.Errorf("%s: two rules", r.Key)
		}
		seen[r.Key] = true
		typed, leaf := schemaLeaf(r.Key)
		switch r.Class {
		case Used:
			if !typed || !leaf {
				t.Errorf("%s: Used, but Config has no field for it", r.Key)
			}
			if r.Why != "" || r.Neutral != nil || r.Example != "" {
				t.Errorf("%s: a Used rule has no reason, neutral values or example", r.Key)
			}
		case Refused:
			if r.Why == "" || r.Example == "" {
				t.Errorf("%s: a Refused rule needs a reason and an example value to refuse", r.Key)
			}
			if r.Guard != (typed && leaf) {
				t.Errorf("%s: Guard is %v, but Config types it: %v (a typed key is refused by a guard, an untyped one by its Neutral values)", r.Key, r.Guard, typed)
			}
			if !r.Guard && r.Neutral == nil {
				t.Errorf("%s: a Refused rule without a guard needs Neutral values", r.Key)
			}
		case Ignored:
			if r.Why == "" || r.Neutral != nil || r.Example != "" || r.Guard {
				t.Errorf("%s: an Ignored rule has a reason and nothing else", r.Key)
			}
			if typed && leaf {
				t.Errorf("%s: Ignored, but Config types it", r.Key)
			}
		default:
			t.Errorf("%s: class %v", r.Key, r.Class)
		}
	}
}

// TestTopLevelRecipesAreTodays: testdata/grpo_math_1B*.yaml are the copies
// of NeMo RL main's that testdata/nemo-rl holds.
func TestTopLevelRecipesAreTodays(t *testing.T) {
	for _, f := range []string{"grpo_math_1B.yaml", "grpo_math_1B_megatron.yaml"} {
		a, err := os.ReadFile("testdata/" + f)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile("testdata/nemo-rl/examples/configs/" + f)
		if err != nil {
			t.Fatal(err)
		}
		if string(a) != string(b) {
			t.Errorf("testdata/%s differs from testdata/nemo-rl/examples/configs/%s (make schema refreshes the latter; copy it)", f, f)
		}
	}
}

// TestNeverReadKeysFromNeMoRLsPython: gen_nemorl_keys.tsv records how
// NeMo RL's Python uses each key (scripts/nemorl_schema.py): the keys issue
// 32 found only in YAML are never read, keys consumed whole through a
// section (torch's optimizer kwargs) are read, and every never-read key is
// Ignored with that reason, whatever the key table says; none is typed in
// Config. A rule for a key NeMo RL overwrites before use names the module,
// and the table still records the store there.
func TestNeverReadKeysFromNeMoRLsPython(t *testing.T) {
	tab := nemorlTable(t)
	for k, want := range map[string]string{
		"grpo.penalize_invalid_tool_call":       "no",
		"grpo.penalize_malformed_thinking":      "no",
		"grpo.max_num_steps":                    "yes",
		"policy.optimizer.kwargs.exp_avg_dtype": "via kwargs",
	} {
		if got := tab.keys[k].Reads; got != want {
			t.Errorf("%s: reads %q, want %q", k, got, want)
		}
	}
	n, own := 0, 0
	for _, k := range tab.paths {
		if tab.keys[k].Reads != "no" {
			continue
		}
		n++
		if typed, _ := schemaLeaf(k); typed {
			t.Errorf("%s: NeMo RL never reads it, but Config types it", k)
		}
		cls, r, at := Classify(k, nil)
		if at != k {
			continue // part of a block classified whole (async_rl, on_policy_distillation, ...)
		}
		if cls != Ignored || r == nil || !strings.Contains(r.Why, "never reads it") {
			t.Errorf("%s: never read by NeMo RL, classed %v (%+v); want Ignored saying so", k, cls, r)
		}
		own++
	}
	t.Logf("%d keys NeMo RL never reads, %d of them classified on their own", n, own)
	if n < 10 || own < 10 {
		t.Errorf("%d never-read keys; the committed table had 28", n)
	}
	for _, r := range keyRules {
		if r.Overwritten == "" {
			continue
		}
		if w := tab.keys[r.Key].Writes; !strings.Contains(w, r.Overwritten) {
			t.Errorf("%s: the rule says %s overwrites it, the table records stores in %q (run make schema, and read the module again)", r.Key, r.Overwritten, w)
		}
	}
}

// TestKnownOnlySectionsNameTheNearestKey: in checkpointing, logger, data
// (and cluster), NeMo RL's own keys are ignored quietly, and any other key
// is a warning naming the key meant, first.
func TestKnownOnlySectionsNameTheNearestKey(t *testing.T) {
	ld, err := LoadSources(Sources{Files: []string{recipeBase}, Overrides: []string{
		"++checkpointing.metric_name=val:reward", "++checkpointing.save_perod=1", "++logger.tensorbaord_enabled=true",
		"++data.max_input_seq_lenght=8", "++cluster.gpus_per_nod=8", "++logger.wandb.name=run",
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, k := range ld.Keys {
		if k.Class == Unclassified {
			got[k.Path] = k.Why
		}
	}
	for k, meant := range map[string]string{
		"checkpointing.save_perod":   "checkpointing.save_period",
		"logger.tensorbaord_enabled": "logger.tensorboard_enabled",
		"data.max_input_seq_lenght":  "data.max_input_seq_length",
		"cluster.gpus_per_nod":       "cluster.gpus_per_node",
	} {
		if !strings.HasPrefix(got[k], "unknown key, did you mean "+meant+"?") {
			t.Errorf("%s: %q; want a warning naming %s first", k, got[k], meant)
		}
	}
	if len(got) != 4 {
		t.Errorf("unknown keys %v; want the four typos only (metric_name and wandb.name are NeMo RL's)", got)
	}
	if len(ld.Warnings()) != 4 {
		t.Errorf("warnings %q", ld.Warnings())
	}
}

// TestPlainOverrideNamesTheNearestKey: key=value of a key the recipe lacks
// names the key meant before saying how to add a new one.
func TestPlainOverrideNamesTheNearestKey(t *testing.T) {
	_, err := LoadSources(Sources{Files: []string{recipeBase}, Overrides: []string{"grpo.num_prompt_per_step=2"}})
	msg := fmt.Sprint(err)
	i, j := strings.Index(msg, "did you mean grpo.num_prompts_per_step?"), strings.Index(msg, "+grpo.num_prompt_per_step=2")
	if err == nil || i < 0 || j < i {
		t.Errorf("error %q; want the nearest key named before the way to add the typo", msg)
	}
}

// TestNearestKeyIsNeverAnAncestor: a key under a known one is never told it
// meant its own section (checkpointing.x is two edits from checkpointing,
// and "did you mean checkpointing?" named the section the user wrote),
// for every known key and short new segments under it; a typo of a
// sibling still names the sibling.
func TestNearestKeyIsNeverAnAncestor(t *testing.T) {
	ix := knownKeys()
	n := 0
	for _, b := range ix.byLen {
		for _, k := range b {
			for _, seg := range []string{"x", "ab"} {
				p := k + "." + seg
				if got := Nearest(p); got != "" && (got == p || strings.HasPrefix(p, got+".")) {
					t.Errorf("Nearest(%q) = %q, its own ancestor", p, got)
					if n++; n > 20 {
						t.Fatal("too many")
					}
				}
			}
		}
	}
	for typo, meant := range map[string]string{
		"checkpointing.save_perod":        "checkpointing.save_period",
		"grpo.num_prompt_per_step":        "grpo.num_prompts_per_step",
		"policy.optimizer.kwargs.lrr":     "policy.optimizer.kwargs.lr",
		"policy.optimizer.kwarg":          "policy.optimizer.kwargs",
		"logger.wandb.projct":             "logger.wandb.project",
		"cluster.num_node":                "cluster.num_nodes",
		"checkpointing.checkpoint_dirr.x": "checkpointing.checkpoint_dir",
	} {
		if got := Nearest(typo); got != meant {
			t.Errorf("Nearest(%q) = %q; want %q", typo, got, meant)
		}
	}
}

// TestNewKeysNameTheirOverride: an error or warning about a key that a ++
// override added names that override, not "default" (the key node it
// made had no origin).
func TestNewKeysNameTheirOverride(t *testing.T) {
	_, err := LoadSources(Sources{Files: []string{recipeBase}, Overrides: []string{"++grpo.num_prompt_per_step=2"}})
	if want := "config: override ++grpo.num_prompt_per_step=2: unknown key grpo.num_prompt_per_step (nearest known key: grpo.num_prompts_per_step)"; fmt.Sprint(err) != want {
		t.Errorf("error %q; want %q", err, want)
	}
	ld, err := LoadSources(Sources{Files: []string{recipeBase}, Overrides: []string{"++checkpointing.x=1", "++data.shufle.deep=1"}})
	if err != nil {
		t.Fatal(err)
	}
	w := ld.Warnings()
	want := []string{
		"override ++checkpointing.x=1: checkpointing.x: unknown key (accepted and not used: this section carries no training math)",
		"override ++data.shufle.deep=1: data.shufle: unknown key, did you mean data.shuffle? (accepted and not used: this section carries no training math)",
	}
	if !reflect.DeepEqual(w, want) {
		t.Errorf("warnings\n%q\nwant\n%q", w, want)
	}
}

// TestTypoSuggestionsCanBeWrittenAsTheyAre: a suggestion keeps the list
// indices of the key typed, a plain override names the whole key it meant
// (not only its first missing part), and ~ of a typo names the key meant.
func TestTypoSuggestionsCanBeWrittenAsTheyAre(t *testing.T) {
	for p, want := range map[string]string{
		"policy.scheduler.0.kwargs.total_iter":   "policy.scheduler.0.kwargs.total_iters",
		"policy.scheduler.12.kwargs.start_facto": "policy.scheduler.12.kwargs.start_factor",
		"policy.scheduler.kwargs.total_iter":     "policy.scheduler.kwargs.total_iters",
		"grpo.num_prompt_per_step":               "grpo.num_prompts_per_step",
	} {
		if got := Nearest(p); got != want {
			t.Errorf("Nearest(%q) = %q; want %q", p, got, want)
		}
	}
	for o, want := range map[string]string{
		"grp.num_prompts_per_step=2":             "could not override grp.num_prompts_per_step: did you mean grpo.num_prompts_per_step? grp is not in the recipe",
		"policy.scheduler.0.kwargs.total_iter=7": "did you mean policy.scheduler.0.kwargs.total_iters? policy.scheduler.0.kwargs.total_iter is not in the recipe",
		"~grpo.num_prompt_per_step":              "could not delete grpo.num_prompt_per_step: it does not exist (did you mean grpo.num_prompts_per_step?)",
	} {
		_, err := LoadSources(Sources{Files: []string{recipeBase}, Overrides: []string{o}})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("override %s: error %v; want it to say %q", o, err, want)
		}
	}
}
