package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// hydraBase is the config the override cases start from (a NeMo RL recipe
// in miniature).
const hydraBase = `
foo: {bar: 1, n: null, l: [1, 2, 3]}
db:
  driver: mysql
  user: ???
  pass: ???
a: {b: 3}
name: me
policy: {model_name: Qwen/Qwen2.5-1.5B, scheduler: [{name: x, kwargs: {total_iters: 5}}]}
`

// applyHydra applies overrides to yaml as NeMo RL does, then resolves it.
func applyHydra(t *testing.T, base string, overrides ...string) (*yaml.Node, error) {
	t.Helper()
	ld := &loader{origin: map[*yaml.Node]string{}}
	root, err := parseTree("base.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range overrides {
		o, err := parseOverride(s)
		if err != nil {
			return nil, err
		}
		if err := ld.applyOverride(root, o); err != nil {
			return nil, err
		}
	}
	r := newResolver(ld, root)
	r.getenv = func(string) (string, bool) { return "", false }
	return root, r.deep(root, "")
}

// yamlValue parses one YAML value (typed as OmegaConf types it).
func yamlValue(t *testing.T, s string) any {
	t.Helper()
	n, err := parseTree("want", []byte("v: "+s))
	if err != nil {
		t.Fatal(err)
	}
	v, err := typedJSON(n.Content[1])
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestHydraOverrides: the override cases of Hydra's documented grammar
// (hydra.cc, Basic and Extended Override syntax), applied as NeMo RL applies
// them (struct mode).
func TestHydraOverrides(t *testing.T) {
	cases := []struct {
		name      string
		overrides []string
		key       string // the key to check
		want      string // its value, as YAML; "<absent>" for a deleted key
		err       string // or a substring of the error
	}{
		// The four operations.
		{"change", []string{"foo.bar=value"}, "foo.bar", "value", ""},
		{"change a missing key", []string{"foo.nope=1"}, "", "", "foo.nope is not in the recipe (a new key is added with +foo.nope=1)"},
		{"change below a scalar", []string{"foo.bar.x=1"}, "", "", "could not override foo.bar.x"},
		{"append", []string{"+foo.new=1"}, "foo.new", "1", ""},
		{"append a deep key", []string{"+foo.x.y=2"}, "foo.x", "{y: 2}", ""},
		{"append over a value", []string{"+foo.bar=2"}, "", "", "an item is already at foo.bar; remove the + to change it (foo.bar=2), or write ++ to add or change it (++foo.bar=2)"},
		{"append over null", []string{"+foo.n=5"}, "foo.n", "5", ""},
		{"append a dict merges", []string{"+foo={baz: 4}"}, "foo", "{bar: 1, n: null, l: [1, 2, 3], baz: 4}", ""},
		{"force add changes", []string{"++foo.bar=2"}, "foo.bar", "2", ""},
		{"force add creates", []string{"++x.y.z=3"}, "x", "{y: {z: 3}}", ""},
		{"delete", []string{"~foo.bar"}, "foo.bar", "<absent>", ""},
		{"delete a mapping", []string{"~foo"}, "foo", "<absent>", ""},
		{"delete with its value", []string{"~foo.bar=1"}, "foo.bar", "<absent>", ""},
		{"delete with another value", []string{"~foo.bar=2"}, "", "", "its value is 1, not 2"},
		{"delete what is not there", []string{"~foo.nope"}, "", "", "could not delete foo.nope: it does not exist"},
		{"delete null", []string{"~foo.n"}, "", "", "it does not exist"}, // Hydra's select() sees null as absent
		{"list index", []string{"policy.scheduler.0.kwargs.total_iters=7"}, "policy.scheduler", "[{name: x, kwargs: {total_iters: 7}}]", ""},
		{"list index out of range", []string{"policy.scheduler.3.name=y"}, "", "", "has no element 3"},
		// Primitives.
		{"int", []string{"foo.bar=-20"}, "foo.bar", "-20", ""},
		{"int with underscores", []string{"foo.bar=1_000_000"}, "foo.bar", "1000000", ""},
		{"float", []string{"foo.bar=3.14"}, "foo.bar", "3.14", ""},
		{"float exponent", []string{"foo.bar=1e-6"}, "foo.bar", "1.0e-6", ""},
		{"inf", []string{"foo.bar=-inf"}, "foo.bar", "-.inf", ""},
		{"bool, any case", []string{"foo.bar=TrUe"}, "foo.bar", "true", ""},
		{"null", []string{"foo.bar=NULL"}, "foo.bar", "null", ""},
		{"dot path is a string", []string{"foo.bar=foo.bar"}, "foo.bar", "foo.bar", ""},
		{"model name", []string{"policy.model_name=Qwen/Qwen3-8B"}, "policy.model_name", "Qwen/Qwen3-8B", ""},
		{"empty value", []string{"foo.bar="}, "foo.bar", "''", ""},
		{"inner blanks kept, outer dropped", []string{"foo.bar=    hello world    "}, "foo.bar", "hello world", ""},
		// Quoted values are strings.
		{"single quotes", []string{"foo.bar='hello world'"}, "foo.bar", "hello world", ""},
		{"quoted number", []string{`foo.bar="10"`}, "foo.bar", "'10'", ""},
		{"quoted commas", []string{`foo.bar="1,2,3"`}, "foo.bar", "'1,2,3'", ""},
		{"escaped quote", []string{`foo.bar='escaped \'single quote\''`}, "foo.bar", `"escaped 'single quote'"`, ""},
		{"escaped double quote", []string{`foo.bar="escaped \"double quote\""`}, "foo.bar", `'escaped "double quote"'`, ""},
		{"backslashes before a quote", []string{`foo.bar='the path is C:\\\'some folder\'\\'`}, "foo.bar", `"the path is C:\\'some folder'\\"`, ""},
		{"other quote inside", []string{`foo.bar="'single quoted string'"`}, "foo.bar", `"'single quoted string'"`, ""},
		{"quoted dict is a string", []string{`foo.bar="{a: 10}"`}, "foo.bar", "'{a: 10}'", ""},
		// Escapes in unquoted values.
		{"escaped specials", []string{`foo.bar=job\{a\=1\,b\=2\,c\=3\}`}, "foo.bar", "job{a=1,b=2,c=3}", ""},
		{"unescaped bracket", []string{"foo.bar=A[B"}, "", "", "unexpected"},
		{"quoted bracket", []string{`foo.bar="A[B"`}, "foo.bar", "A[B", ""},
		{"escaped bracket", []string{`foo.bar=A\[B`}, "foo.bar", "A[B", ""},
		// Lists are assigned, dicts merged.
		{"list", []string{"foo.l=[4,5]"}, "foo.l", "[4, 5]", ""},
		{"nested list", []string{"foo.l=[a,[b,[c]]]"}, "foo.l", "[a, [b, [c]]]", ""},
		{"dict merges", []string{"db={user: root, pass: 1234}"}, "db", "{driver: mysql, user: root, pass: 1234}", ""},
		{"dict with a new key", []string{"db={port: 1}"}, "", "", "db.port is not in the recipe"},
		{"dict with a new key, forced", []string{"++db={port: 1}"}, "db.port", "1", ""},
		// Interpolations are resolved with the recipe.
		{"interpolation", []string{"foo.bar=${a.b}"}, "foo.bar", "3", ""},
		{"interpolation in a string", []string{"foo.bar=/root/${name}"}, "foo.bar", "/root/me", ""},
		{"quoted resolver", []string{`foo.bar="${mul:${a.b},2}"`}, "foo.bar", "6", ""},
		{"unquoted nested braces", []string{"foo.bar=${mul:${a.b},2}"}, "", "", "must be quoted"},
		{"quoted interpolation with a dict", []string{`foo.bar='{a:10} ${name}'`}, "foo.bar", "'{a:10} me'", ""},
		// Functions: casts and extend_list; sweeps are refused.
		{"int()", []string{"foo.bar=int(3.14)"}, "foo.bar", "3", ""},
		{"int(value=)", []string{"foo.bar=int(value=3.14)"}, "foo.bar", "3", ""},
		{"float()", []string{"foo.bar=float(10)"}, "foo.bar", "10.0", ""},
		{"str()", []string{"foo.bar=str(10)"}, "foo.bar", "'10'", ""},
		{"bool()", []string{"foo.bar=bool(1)"}, "foo.bar", "true", ""},
		{"str() of a list", []string{"foo.l=str([1,2,3])"}, "foo.l", "['1', '2', '3']", ""},
		{"int() of foo", []string{"foo.bar=int(foo)"}, "", "", "cannot cast 'foo' to int"},
		{"extend_list", []string{"foo.l=extend_list([4, 5])"}, "foo.l", "[1, 2, 3, 4, 5]", ""},
		{"sweep", []string{"foo.bar=1,2"}, "", "", "is a sweep"},
		{"choice sweep", []string{"foo.bar=choice(1,2)"}, "", "", "choice(...) is a Hydra sweep"},
		{"range sweep", []string{"foo.bar=range(0,5)"}, "", "", "range(...) is a Hydra sweep"},
		// Keys.
		{"config group", []string{"server/db=mysql"}, "", "", "config group"},
		{"package", []string{"db@pkg=mysql"}, "", "", "config group or package"},
		{"no value", []string{"foo.bar"}, "", "", "want key.path=value"},
		{"bad key", []string{"foo..bar=1"}, "", "", "want key.path=value"},
		// In order.
		{"later wins", []string{"foo.bar=2", "foo.bar=3"}, "foo.bar", "3", ""},
		{"add then change", []string{"+foo.k=1", "foo.k=2"}, "foo.k", "2", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root, err := applyHydra(t, hydraBase, tc.overrides...)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("%v: error %v, want one containing %q", tc.overrides, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v: %v", tc.overrides, err)
			}
			got := lookup(root, splitPath(tc.key))
			if tc.want == "<absent>" {
				if got != nil {
					t.Fatalf("%s is still there: %s", tc.key, flowText(got))
				}
				return
			}
			if got == nil {
				t.Fatalf("no key %s", tc.key)
			}
			g, err := typedJSON(got)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(yamlValue(t, tc.want), g); d != "" {
				t.Errorf("%v: %s (-want +got)\n%s", tc.overrides, tc.key, d)
			}
		})
	}
}
