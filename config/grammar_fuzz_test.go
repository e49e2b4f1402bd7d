package config

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// FuzzInterpolation: any string value, in a small config, either resolves or
// fails with an error naming the key; it never panics or hangs, and a value
// that resolves to a string holding no "${" resolves to itself again (the
// result of an interpolation is not interpolated a second time).
func FuzzInterpolation(f *testing.F) {
	b, err := os.ReadFile("testdata/golden_omegaconf.json")
	if err != nil {
		f.Fatal(err)
	}
	var g omegaGolden
	if err := json.Unmarshal(b, &g); err != nil {
		f.Fatal(err)
	}
	for _, c := range g.Cases {
		for _, line := range strings.Split(c.YAML, "\n") {
			if _, v, ok := strings.Cut(line, ": "); ok && strings.Contains(v, "${") {
				f.Add(strings.Trim(v, `'"`))
			}
		}
	}
	f.Add(`\\\${a.b}x${oc.select:'a.${k}',[1,{q: 2}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		root, err := parseTree("f.yaml", []byte("a: {b: 3, c: [1, 2]}\nk: b\ns: x\nv: null\n"))
		if err != nil {
			t.Fatal(err)
		}
		val := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "x"}, val)
		ld := &loader{origin: map[*yaml.Node]string{}}
		r := newResolver(ld, root)
		r.getenv = func(string) (string, bool) { return "", false }
		err = r.deep(root, "")
		// The work is counted, not timed (a 2 s limit here failed on a loaded
		// machine by itself): a value that resolved spent at most the byte
		// budget; one over it must have been refused.
		if err == nil && r.spent > maxResolvedBytes {
			t.Fatalf("resolving %q produced %d bytes, over the %d budget", s, r.spent, maxResolvedBytes)
		}
		if err != nil {
			if !strings.Contains(err.Error(), "x") {
				t.Fatalf("error %q does not name the key x", err)
			}
			return
		}
		if val.Kind == yaml.ScalarNode && val.Tag == "!!str" && !strings.Contains(val.Value, "${") {
			again := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: val.Value}
			if err := newResolver(ld, again).shallow(again, "x"); err != nil || again.Value != val.Value {
				t.Fatalf("%q resolved to %q, which resolves to %q, %v", s, val.Value, again.Value, err)
			}
		}
	})
}

// FuzzHydraOverride: any command-line override either applies to a recipe
// or fails with an error; it never panics, and an applied override leaves
// a tree that resolves or fails with an error.
func FuzzHydraOverride(f *testing.F) {
	for _, s := range []string{"foo.bar=value", "+foo.new=1", "++x.y.z=3", "~foo.bar", "~foo.bar=1", "foo.l=[a,[b,[c]]]",
		"db={user: root, pass: 1234}", `foo.bar='escaped \'q\''`, `foo.bar=job\{a\=1\,b\=2\}`, "foo.bar=${a.b}",
		`foo.bar="${mul:${a.b},2}"`, "foo.bar=int(3.14)", "foo.l=extend_list([4, 5])", "foo.bar=1,2", "foo.bar=choice(1,2)",
		"server/db=mysql", "foo.bar=", "policy.scheduler.0.kwargs.total_iters=7", "foo.bar=str({a: [1, 2]})"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ld := &loader{origin: map[*yaml.Node]string{}}
		root, err := parseTree("base.yaml", []byte(hydraBase))
		if err != nil {
			t.Fatal(err)
		}
		o, err := parseOverride(s)
		if err != nil {
			return
		}
		if err := ld.applyOverride(root, o); err != nil {
			return
		}
		r := newResolver(ld, root)
		r.getenv = func(string) (string, bool) { return "", false }
		_ = r.deep(root, "")
	})
}
