package config

import (
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
