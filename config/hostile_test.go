package config

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/internal/nearest"
)

// The loader under hostile input (issue 34): each case fails with one
// clear message, in bounded work.

// loadErr loads recipe text (with overrides) and returns the error text.
func loadErr(t *testing.T, recipe string, overrides ...string) string {
	t.Helper()
	p := writeFile(t, t.TempDir(), "r.yaml", recipe)
	_, err := LoadSources(Sources{Files: []string{p}, Overrides: overrides})
	if err == nil {
		t.Fatalf("loaded:\n%s", recipe)
	}
	return err.Error()
}

// TestResolverErrorsReportedOnce: a key whose interpolation fails is reported
// once, with its own reason, even when other keys refer to it; nothing says
// "cycle" unless there is one. A real cycle is reported once, naming its keys
// in order.
func TestResolverErrorsReportedOnce(t *testing.T) {
	for _, c := range []struct{ name, value, want string }{
		{"division by zero", "${div:1,0}", "division by zero"},
		{"no arguments", "${add:}", "add takes 2 arguments, found 0"},
		{"unset variable", "${oc.env:TG_SURELY_UNSET_VAR}", "environment variable TG_SURELY_UNSET_VAR is not set"},
		{"unknown resolver", "${nosuch:1}", `unknown resolver "nosuch"`},
		{"decode error", `${oc.decode:"[1,"}`, "unexpected end"},
		{"above the root", "${....x}", "no such key"},
		{"overflow", "${add:9223372036854775807,1}", "overflows 64 bits"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// max_num_steps fails; seed and the typed map refer to it, so the
			// walker reads it three times.
			msg := loadErr(t, fmt.Sprintf("grpo:\n  seed: ${grpo.max_num_steps}\n  max_num_steps: '%s'\npolicy:\n  hf_config_overrides: {n: '${grpo.max_num_steps}'}\n", c.value))
			if !strings.Contains(msg, c.want) {
				t.Errorf("error lacks %q:\n%s", c.want, msg)
			}
			if strings.Contains(msg, "interpolation cycle") {
				t.Errorf("a resolver error reported as a cycle:\n%s", msg)
			}
			if n := strings.Count(msg, "\n") + 1; n != 1 {
				t.Errorf("%d lines for one failing key:\n%s", n, msg)
			}
		})
	}
	t.Run("cycle", func(t *testing.T) {
		msg := loadErr(t, "grpo:\n  max_num_steps: ${grpo.seed}\n  seed: ${.num_prompts_per_step}\n  num_prompts_per_step: ${grpo.max_num_steps}\n")
		// The cycle is named from the key the walker reads first, each key
		// before the one it refers to.
		cycle := []string{"grpo.max_num_steps", "grpo.seed", "grpo.num_prompts_per_step"}
		found := false
		for i := range cycle {
			rot := append(append([]string{}, cycle[i:]...), cycle[:i+1]...)
			found = found || strings.Contains(msg, "interpolation cycle: "+strings.Join(rot, " -> "))
		}
		if !found || strings.Count(msg, "interpolation cycle") != 1 || strings.Contains(msg, "\n") {
			t.Errorf("want one line naming the cycle %v, found:\n%s", cycle, msg)
		}
	})
}

// TestInterpolationFanOutBounded: 40 lines of x_i: ${x_{i-1}}${x_{i-1}}
// (a 2^40-byte value) fail naming the first key past the byte budget, having
// allocated a bounded amount; so do containers that repeat each other, and
// strings that mul repeats.
func TestInterpolationFanOutBounded(t *testing.T) {
	fan := func(line string) string {
		var b strings.Builder
		b.WriteString("policy:\n  hf_config_overrides:\n    x0: abcdefgh\n")
		for i := 1; i <= 40; i++ {
			fmt.Fprintf(&b, "    x%d: "+line+"\n", i, i-1, i-1)
		}
		return b.String()
	}
	for _, c := range []struct{ name, recipe, want string }{
		{"strings", fan(`"${.x%d}${.x%d}"`), "policy.hf_config_overrides.x18: the resolved value exceeds 1 MiB"},
		{"lists", fan(`["${..x%d}", "${..x%d}"]`), "exceeds 1 MiB"},
		{"add", fan(`"${add:${.x%d},${.x%d}}"`), "policy.hf_config_overrides.x18: the resolved value exceeds 1 MiB"},
		{"mul", "policy:\n  hf_config_overrides:\n    x0: abcdefgh\n    x1: ${mul:${.x0},1000000}\n", "too large"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			msg := loadErr(t, c.recipe)
			runtime.ReadMemStats(&m1)
			if !strings.Contains(msg, c.want) {
				t.Errorf("error lacks %q:\n%s", c.want, msg)
			}
			// Counted, not timed: what loading allocated.
			if a := m1.TotalAlloc - m0.TotalAlloc; a > 256<<20 {
				t.Errorf("loading allocated %d MiB", a>>20)
			}
		})
	}
}

// TestDottedKeyIsTheUsersKey: a literal dotted key is refused as the user's
// key, saying what OmegaConf does with it (config/testdata/golden_omegaconf.json
// keeps it as one key beside the nested one), never as a tracegrpo bug.
func TestDottedKeyIsTheUsersKey(t *testing.T) {
	for _, recipe := range []string{
		"\"grpo.max_num_steps\": 3\n",
		"grpo:\n  \"adv_estimator.name\": grpo\n",
		"logger:\n  \"wandb.name\": x\n",
	} {
		msg := loadErr(t, recipe)
		for _, w := range []string{"holds a dot: OmegaConf keeps it as one key of that name", "r.yaml:"} {
			if !strings.Contains(msg, w) {
				t.Errorf("%q: error lacks %q:\n%s", recipe, w, msg)
			}
		}
		if strings.Contains(msg, "tracegrpo bug") {
			t.Errorf("%q: blamed on tracegrpo:\n%s", recipe, msg)
		}
	}
}

// TestLongValuesCutInMessages: a value of 100 KB is quoted in a message cut
// at maxQuoted bytes, with its length.
func TestLongValuesCutInMessages(t *testing.T) {
	long := strings.Repeat("x", 100<<10)
	for _, c := range []struct {
		name      string
		recipe    string
		overrides []string
	}{
		{"type error", "grpo:\n  max_num_steps: " + long + "\n", nil},
		{"unknown key", "grpo:\n  ? " + long + "\n  : 1\n", nil},
		{"bad override", "", []string{"grpo.max_num_steps=[" + long}},
		{"sweep", "", []string{"grpo.max_num_steps=" + long + ",b"}},
		{"override of an absent key", "grpo: {}\n", []string{"grpo." + long + "=1"}},
		{"delete mismatch", "grpo: {seed: 1}\n", []string{"~grpo.seed=" + long}},
		{"unset variable", "grpo:\n  seed: ${oc.env:" + long + "}\n", nil},
		{"bad interpolation", "grpo:\n  seed: '${" + long + "'\n", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			msg := loadErr(t, c.recipe, c.overrides...)
			if len(msg) > 4096 {
				t.Errorf("a %d-byte message:\n%.600s...", len(msg), msg)
			}
			if !strings.Contains(msg, " bytes)") {
				t.Errorf("the message does not give the cut value's length:\n%.600s", msg)
			}
		})
	}
}

// TestManyOverridesLinear: 20,000 overrides adding keys to one section
// (++ and +) cost mapping lookups linear in their number (each scanned the
// section before, and + copied the recipe), and the warnings stop at
// maxWarnings plus a count.
func TestManyOverridesLinear(t *testing.T) {
	const n = 20000
	var ov []string
	for i := 0; i < n/2; i++ {
		ov = append(ov, fmt.Sprintf("++cluster.k%d=1", i), fmt.Sprintf("+cluster.m%d=1", i))
	}
	// The suggestions the warnings shown need, as the bound's unit.
	c0 := nearest.Cells.Load()
	for _, o := range ov[:maxSuggestions] {
		k, _, _ := strings.Cut(strings.TrimLeft(o, "+"), "=")
		Nearest(k)
	}
	need := nearest.Cells.Load() - c0
	probes, cells := work.keyProbes.Load(), nearest.Cells.Load()
	ld, err := LoadSources(Sources{Overrides: ov})
	probes, cells = work.keyProbes.Load()-probes, nearest.Cells.Load()-cells
	if err != nil {
		t.Fatal(err)
	}
	if probes > 50*n {
		t.Errorf("%d overrides compared %d mapping keys", n, probes)
	}
	if cells > 2*need {
		t.Errorf("%d unknown keys computed %d edit-distance cells, more than twice the %d the %d warnings shown need", n, cells, need, maxSuggestions)
	}
	w := ld.Warnings()
	if len(w) != maxWarnings+1 || !strings.Contains(w[maxWarnings], fmt.Sprintf("and %d more unknown keys", n-maxWarnings)) {
		t.Errorf("%d warning lines, the last %q", len(w), w[len(w)-1])
	}
}
