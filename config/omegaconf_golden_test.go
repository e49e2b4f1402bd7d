package config

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// omegaGolden is config/testdata/golden_omegaconf.json, written by
// scripts/golden_omegaconf.py with OmegaConf itself.
type omegaGolden struct {
	Meta struct {
		Script    string            `json:"script"`
		OmegaConf string            `json:"omegaconf"`
		Env       map[string]string `json:"env"`
	} `json:"meta"`
	Cases []struct {
		Name  string          `json:"name"`
		YAML  string          `json:"yaml"`
		Over  string          `json:"over"`
		Want  json.RawMessage `json:"want"`
		Error string          `json:"error"`
	} `json:"cases"`
}

// typedJSON is a node in the golden's typed form: {"int": "3"}, {"float":
// "1e-06"}, {"map": [[k, v], ...]}, ...; floats are compared as float64.
func typedJSON(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.MappingNode:
		var kv []any
		for i := 0; i < len(n.Content); i += 2 {
			v, err := typedJSON(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			kv = append(kv, []any{n.Content[i].Value, v})
		}
		if kv == nil {
			kv = []any{}
		}
		return map[string]any{"map": kv}, nil
	case yaml.SequenceNode:
		l := []any{}
		for _, c := range n.Content {
			v, err := typedJSON(c)
			if err != nil {
				return nil, err
			}
			l = append(l, v)
		}
		return map[string]any{"list": l}, nil
	}
	v, err := toPy(n)
	if err != nil {
		return nil, err
	}
	switch v.kind {
	case pyNone:
		return map[string]any{"null": true}, nil
	case pyBool:
		return map[string]any{"bool": v.b}, nil
	case pyInt:
		return map[string]any{"int": strconv.FormatInt(v.i, 10)}, nil
	case pyFloat:
		return map[string]any{"float": v.f}, nil
	}
	return map[string]any{"str": v.s}, nil
}

// goldenFloats turns the golden's float reprs into float64s.
func goldenFloats(v any) any {
	switch x := v.(type) {
	case map[string]any:
		if f, ok := x["float"].(string); ok {
			if f == "nan" {
				return map[string]any{"float": math.NaN()}
			}
			g, err := strconv.ParseFloat(f, 64)
			if err != nil {
				panic(fmt.Sprintf("golden float %q: %v", f, err))
			}
			return map[string]any{"float": g}
		}
		out := map[string]any{}
		for k, e := range x {
			out[k] = goldenFloats(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = goldenFloats(e)
		}
		return out
	}
	return v
}

// TestOmegaConfGoldens: tracegrpo's YAML typing, interpolation grammar,
// resolvers and merge give what OmegaConf 2.2 gives on every golden case
// (values and their types, or an error where OmegaConf raises one).
func TestOmegaConfGoldens(t *testing.T) {
	b, err := os.ReadFile("testdata/golden_omegaconf.json")
	if err != nil {
		t.Fatal(err)
	}
	var g omegaGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if g.Meta.Script != "scripts/golden_omegaconf.py" || g.Meta.OmegaConf == "" || len(g.Cases) < 40 {
		t.Fatalf("golden provenance: script %q, OmegaConf %q, %d cases", g.Meta.Script, g.Meta.OmegaConf, len(g.Cases))
	}
	for _, c := range g.Cases {
		t.Run(c.Name, func(t *testing.T) {
			ld := &loader{origin: map[*yaml.Node]string{}}
			root, err := parseTree(c.Name+".yaml", []byte(c.YAML))
			if err == nil && c.Over != "" {
				var over *yaml.Node
				if over, err = parseTree(c.Name+".over.yaml", []byte(c.Over)); err == nil {
					root = omegaMerge(root, over)
				}
			}
			if err == nil && c.Over == "" {
				r := newResolver(ld, root)
				r.getenv = func(k string) (string, bool) { v, ok := g.Meta.Env[k]; return v, ok }
				err = r.deep(root, "")
			}
			var want any
			if c.Error == "" {
				if err := json.Unmarshal(c.Want, &want); err != nil {
					t.Fatal(err)
				}
			}
			if c.Error != "" || beyondInt64(want) {
				// An error, or a Python int that 64 bits cannot hold:
				// tracegrpo refuses it rather than wrap it.
				if err == nil {
					got, _ := typedJSON(root)
					t.Fatalf("OmegaConf gives %s%s; tracegrpo resolved %v", c.Error, c.Want, got)
				}
				t.Logf("OmegaConf: %s%s; tracegrpo: %v", c.Error, c.Want, err)
				return
			}
			if err != nil {
				t.Fatalf("OmegaConf resolves it; tracegrpo: %v", err)
			}
			got, err := typedJSON(root)
			if err != nil {
				t.Fatal(err)
			}
			sameFloat := cmp.Comparer(func(a, b float64) bool { return a == b || a != a && b != b })
			if d := cmp.Diff(goldenFloats(want), got, sameFloat); d != "" {
				t.Errorf("%s (-OmegaConf +tracegrpo)\n%s", c.YAML, d)
			}
		})
	}
}
