package trainer

import (
	"bytes"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

// TestStepCountsAreChecked: --steps 0 and -1 ran all 300 steps, and a huge
// count overflowed the schedule (lr started at min_lr, the ETA was
// negative). Each is refused as a usage error naming the flag or key, before
// any work.
func TestStepCountsAreChecked(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--steps", "0"}, "--steps"},
		{[]string{"--steps", "-1"}, "--steps"},
		{[]string{"--steps", "2e17"}, "--steps"},
		{[]string{"--steps", "200000000000000000"}, "--steps"},
		{[]string{"--set", "grpo.max_num_steps=0"}, "grpo.max_num_steps=0"},
		{[]string{"--set", "grpo.max_num_steps=-5"}, "grpo.max_num_steps=-5"},
		{[]string{"--set", "grpo.max_num_steps=1000000000000000"}, "overflow the schedule"},
	} {
		out := filepath.Join(t.TempDir(), "run")
		var stderr bytes.Buffer
		code := run(append([]string{"--out", out, "--quiet"}, c.args...), &bytes.Buffer{}, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("train %s: exit %d, %q; want exit 2 naming %q", strings.Join(c.args, " "), code, stderr.String(), c.want)
		}
	}
}

func TestETAString(t *testing.T) {
	for _, c := range []struct {
		ns   float64
		want string
	}{
		{1.4e9, "1s"}, {61e9, "1m1s"}, {1e30, ">292y"}, {math.Inf(1), ">292y"}, {math.NaN(), ">292y"},
	} {
		if got := etaString(c.ns); got != c.want {
			t.Errorf("etaString(%g) = %q, want %q", c.ns, got, c.want)
		}
	}
}
