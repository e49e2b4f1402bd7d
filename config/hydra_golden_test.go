package config

import (
	"encoding/json"
	"math/big"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// hydraGolden is config/testdata/golden_hydra.json, written by
// scripts/golden_hydra.py: Hydra's override rules applied with OmegaConf,
// and the values of the overrides computed by Python.
type hydraGolden struct {
	Meta struct {
		Script    string `json:"script"`
		OmegaConf string `json:"omegaconf"`
		Python    string `json:"python"`
	} `json:"meta"`
	Cases []struct {
		Name     string          `json:"name"`
		YAML     string          `json:"yaml"`
		Override string          `json:"override"`
		Want     json.RawMessage `json:"want"`
		Error    string          `json:"error"`
	} `json:"cases"`
}

// beyondInt64 reports whether a golden typed value holds an int that int64
// cannot hold (Python's ints have no bound; tracegrpo refuses those).
func beyondInt64(v any) bool {
	switch x := v.(type) {
	case map[string]any:
		if s, ok := x["int"].(string); ok {
			n, ok := new(big.Int).SetString(s, 10)
			return !ok || !n.IsInt64()
		}
		for _, e := range x {
			if beyondInt64(e) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if beyondInt64(e) {
				return true
			}
		}
	}
	return false
}

// TestHydraGolden: each override of the golden, parsed by tracegrpo's
// grammar and applied as NeMo RL applies it, gives the config Hydra's rules
// give under OmegaConf with Python's arithmetic and equality, or fails where
// they raise; an int Python computes beyond 64 bits is refused.
func TestHydraGolden(t *testing.T) {
	b, err := os.ReadFile("testdata/golden_hydra.json")
	if err != nil {
		t.Fatal(err)
	}
	var g hydraGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if g.Meta.Script != "scripts/golden_hydra.py" || g.Meta.OmegaConf == "" || g.Meta.Python == "" || len(g.Cases) < 40 {
		t.Fatalf("golden provenance: script %q, OmegaConf %q, Python %q, %d cases", g.Meta.Script, g.Meta.OmegaConf, g.Meta.Python, len(g.Cases))
	}
	for _, c := range g.Cases {
		t.Run(c.Name, func(t *testing.T) {
			root, err := parseTree("base.yaml", []byte(c.YAML))
			if err != nil {
				t.Fatal(err)
			}
			ld := &loader{origin: map[*yaml.Node]string{}}
			o, err := parseOverride(c.Override)
			if err == nil {
				err = ld.applyOverride(root, o)
			}
			var want any
			if c.Error == "" {
				if err := json.Unmarshal(c.Want, &want); err != nil {
					t.Fatal(err)
				}
			}
			if c.Error != "" || beyondInt64(want) {
				if err == nil {
					got, _ := typedJSON(root)
					t.Fatalf("%s over %q: Python/OmegaConf give %s %s; tracegrpo gave %v", c.Override, c.YAML, c.Error, c.Want, got)
				}
				t.Logf("%s: %v", c.Override, err)
				return
			}
			if err != nil {
				t.Fatalf("%s over %q: Python/OmegaConf give %s; tracegrpo: %v", c.Override, c.YAML, c.Want, err)
			}
			got, err := typedJSON(root)
			if err != nil {
				t.Fatal(err)
			}
			sameFloat := cmp.Comparer(func(a, b float64) bool { return a == b || a != a && b != b })
			if d := cmp.Diff(goldenFloats(want), got, sameFloat); d != "" {
				t.Errorf("%s over %q (-Python/OmegaConf +tracegrpo)\n%s", c.Override, c.YAML, d)
			}
		})
	}
}
