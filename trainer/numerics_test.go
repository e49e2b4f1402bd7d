package trainer

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// numericsAs is a backend that reports another rounding path and kernel
// path (as the same build does on another kind of host) and computes as
// the one it wraps.
type numericsAs struct {
	kernels.Backend
	rounding, kernel string
}

func (n numericsAs) RoundingPath() string { return n.rounding }
func (n numericsAs) KernelPath() string   { return n.kernel }

// resumeArgs are trainArgs without --quiet (the resume notes are setup
// lines), for a run of steps steps that resumes a 2-step one.
func resumeArgs(out string, steps int, extra ...string) []string {
	args := trainArgs(out, steps, extra...)
	args = slices.DeleteFunc(args, func(a string) bool { return a == "--quiet" })
	if steps > 2 {
		args = append(args, "--resume", "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=2")
	}
	return args
}

// TestResumeOnAnotherRoundingPath: a checkpoint resumed where the CPU
// backend rounds differently (another kind of host) keeps training, and the
// run names both rounding paths; where only the kernel differs it says the
// results stay bit-identical; where nothing differs it says nothing.
func TestResumeOnAnotherRoundingPath(t *testing.T) {
	host := cpu.New(1)
	here, kernel := host.RoundingPath(), host.KernelPath()
	host.Close()
	cases := []struct {
		name   string
		as     *numericsAs
		want   []string
		absent []string
	}{
		{name: "same host", absent: []string{"rounding path", "kernels changed"}},
		{name: "another rounding path", as: &numericsAs{rounding: "fma-test64", kernel: "avx2 kernel on Test CPU"},
			want: []string{"the rounding path changed: the checkpoint was written on " + here + " (" + kernel + "), this run computes on fma-test64 (avx2 kernel on Test CPU)", "not bit-identical"}},
		{name: "another kernel, same rounding", as: &numericsAs{rounding: here, kernel: "avx2 kernel on Test CPU"},
			want: []string{"the kernels changed (checkpoint: " + kernel + "; now: avx2 kernel on Test CPU) but the rounding path is the same (" + here + "): results stay bit-identical"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := t.TempDir()
			mustTrain(t, resumeArgs(out, 2)...)
			if c.as != nil {
				as := *c.as
				testWrap = func(b kernels.Backend) kernels.Backend { as.Backend = b; return as }
				defer func() { testWrap = nil }()
			}
			log := mustTrain(t, resumeArgs(out, 4)...)
			for _, w := range c.want {
				if !strings.Contains(log, w) {
					t.Errorf("resume log does not say %q:\n%s", w, log)
				}
			}
			for _, a := range c.absent {
				if strings.Contains(log, a) {
					t.Errorf("resume log mentions %q:\n%s", a, log)
				}
			}
			if ms := metricsNoTimes(t, out); len(ms) != 4 {
				t.Errorf("resumed run logged %d steps, want 4", len(ms))
			}
		})
	}
}

// TestResumeUnderForcedSIMD: the real thing, in a process whose CPU
// backend runs another path (TRACEGRPO_CPU_SIMD=go, the rounding of a host
// without AVX2): the checkpoint of this process's path resumes, trains on,
// and the run names both rounding paths.
func TestResumeUnderForcedSIMD(t *testing.T) {
	host := cpu.New(1)
	here := host.RoundingPath()
	host.Close()
	if cpu.SIMDChoice().Path == "go" {
		t.Skipf("this host runs the go path already (%s): no other rounding path to resume on", cpu.SIMDChoice())
	}
	out := t.TempDir()
	mustTrain(t, resumeArgs(out, 2)...)
	cmd := trainerCommand(t, resumeArgs(out, 4)...)
	cmd.Env = append(cmd.Env, "TRACEGRPO_CPU_SIMD=go")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("resume under TRACEGRPO_CPU_SIMD=go: %v\n%s", err, stderr.String())
	}
	want := "the rounding path changed: the checkpoint was written on " + here
	if !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), "this run computes on go-") {
		t.Errorf("resume log does not name both rounding paths (%q ... go-):\n%s", want, stderr.String())
	}
	if ms := metricsNoTimes(t, out); len(ms) != 4 {
		t.Errorf("resumed run logged %d steps, want 4", len(ms))
	}
}
