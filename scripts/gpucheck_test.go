package scripts

import (
	"bytes"
	"compress/gzip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/internal/testtool"
)

// checkout makes a git checkout in a temporary folder with
// scripts/gpu-check.sh and scripts/gpu-check-loop.sh copied in, and
// returns its root.
func checkout(t *testing.T) string {
	t.Helper()
	testtool.Path(t, "git", "") // git is a tool the tests have (scripts/deps.sh)
	root := t.TempDir()
	for _, f := range []string{"gpu-check.sh", "gpu-check-loop.sh"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(root, "scripts", f), b, 0o755)
	}
	git(t, root, "init", "-q")
	return root
}

func write(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
}

func git(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(testtool.Path(t, "git", ""), append([]string{"-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// run runs scripts/gpu-check.sh in root with args and env added; returns
// its output and exit status.
func run(t *testing.T, root string, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(testtool.Path(t, "bash", ""), append([]string{filepath.Join(root, "scripts", "gpu-check.sh")}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		t.Fatalf("gpu-check.sh %v: %v\n%s", args, err, out)
	}
	return string(out), 0
}

const mib = 1 << 20

// TestSizeGuard: the transfer is measured as the device tool counts it
// (tracked files, untracked files git does not ignore, an ignored shared/,
// the carry), not counting what git ignores, and --size fails over
// GPU_CHECK_MAX_MIB.
func TestSizeGuard(t *testing.T) {
	root := checkout(t)
	write(t, filepath.Join(root, ".gitignore"), []byte("/bin/\n/big\n/shared/\n"), 0o644)
	write(t, filepath.Join(root, "tracked.bin"), make([]byte, mib), 0o644)
	git(t, root, "add", ".")
	git(t, root, "commit", "-q", "-m", "tree")
	write(t, filepath.Join(root, "untracked.bin"), make([]byte, mib), 0o644)                // travels
	write(t, filepath.Join(root, "big"), make([]byte, 8*mib), 0o644)                        // ignored: stays
	write(t, filepath.Join(root, "shared", "s.bin"), make([]byte, mib), 0o644)              // ignored, but shared/ travels
	write(t, filepath.Join(root, "bin", "gpu-check", "train.gz"), make([]byte, mib), 0o644) // the carry
	write(t, filepath.Join(root, "bin", "other"), make([]byte, 8*mib), 0o644)               // ignored, not carried

	scripts := 0
	for _, f := range []string{".gitignore", "scripts/gpu-check.sh", "scripts/gpu-check-loop.sh"} {
		st, err := os.Stat(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		scripts += int(st.Size())
	}
	want := 4*mib + scripts
	out, rc := run(t, root, []string{"GPU_CHECK_MAX_MIB=5"}, "--size")
	if rc != 0 {
		t.Fatalf("--size under 5 MiB: exit %d\n%s", rc, out)
	}
	m := regexp.MustCompile(`transfer: ([0-9.]+) MiB = tree ([0-9.]+) MiB .* \+ shared/ ([0-9.]+) MiB \+ carry bin/gpu-check ([0-9.]+) MiB`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("--size printed no transfer line:\n%s", out)
	}
	total, _ := strconv.ParseFloat(m[1], 64)
	if w := float64(want) / mib; total < w-0.06 || total > w+0.06 {
		t.Errorf("transfer %s MiB, want %.2f (tracked, untracked, shared/ and the carry; not the 16 MiB ignored)\n%s", m[1], w, out)
	}
	if m[3] != "1.0" || m[4] != "1.0" {
		t.Errorf("shared/ %s MiB and carry %s MiB, want 1.0 each\n%s", m[3], m[4], out)
	}
	if out, rc := run(t, root, []string{"GPU_CHECK_MAX_MIB=4"}, "--size"); rc != 1 || !strings.Contains(out, "over the 4 MiB limit") {
		t.Errorf("--size over the limit (4 MiB + the scripts under 4 MiB): exit %d, want 1 and the reason\n%s", rc, out)
	}
	// The default limit is 56 MiB.
	if out, rc := run(t, root, nil, "--size"); rc != 0 || !strings.Contains(out, "limit 56 MiB") {
		t.Errorf("--size with the default limit: exit %d\n%s", rc, out)
	}
}

// The stand-ins of the carried binaries and of python: each appends its
// arguments (and TRACEGRPO_CUDA_LOAD) to $GPU_CHECK_CALLS and answers as
// the real one would when everything passes; $FAKE_FAIL names a test that
// fails.
const fakeCudaTest = `#!/usr/bin/env bash
echo "cuda.test load=${TRACEGRPO_CUDA_LOAD:-all} $*" >>"$GPU_CHECK_CALLS"
for n in TestLibrariesGPU TestMMALayoutGPU TestTinyStepBF16GPU TestTinyStepGPU TestTinyStepNCCLGPU TestSamplerGPU TestMatmulModesGPU TestConformanceGPU; do
	if [ "$n" = "${FAKE_FAIL:-}" ]; then echo "--- FAIL: $n (0.01s)"; else echo "--- PASS: $n (0.01s)"; fi
done
for c in AttentionBF16 TokenLogprob TokenLogprobBF16 SampleTokens RMSNormBF16Fused; do echo "    --- PASS: TestConformanceGPU/$c (0.01s)"; done
echo "PERF sampler 1000 tokens/s"
[ -z "${FAKE_FAIL:-}" ]
`

const fakeTrain = `#!/usr/bin/env bash
echo "train $*" >>"$GPU_CHECK_CALLS"
case "$1" in
bench)
	{
		printf 'predicted against measured time per op: one step\n\n| part | launches |\n|---|---:|\n| attention (own) | 2 |\n| **step** | 9 |\n\n'
		printf '| op (by measured time) | launches |\n|---|---:|\n'
		for i in $(seq 1 20); do echo "| Op$i | 1 |"; done
		printf '\npredicted step 1.0 ms, measured 2.0 ms\n'
	} >&2
	echo '{"tokens_per_s": 1000, "ms_per_step": 8, "plan_mib": 5}'
	;;
score) for i in 1 2 3 4 5 6 7 8; do echo '{"logprobs": [0]}'; done ;;
*)
	while [ $# -gt 0 ]; do
		if [ "$1" = --weights-out ]; then mkdir -p "$2/step_0" "$2/step_1"; touch "$2/step_1/DONE" "$2/step_1/model.safetensors"; fi
		shift
	done
	;;
esac
`

const fakePython = `#!/usr/bin/env bash
echo "python $*" >>"$GPU_CHECK_CALLS"
case "$1" in
-) echo 1e9 ;;
-c) exit 1 ;;
*) echo '{"tokens_per_s": 900, "ms_per_step": 9, "peak_mem_mib": 6}' ;;
esac
`

func gz(t *testing.T, text string) []byte {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.Write([]byte(text))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// lastOut is the output folder of the last stageRun.
var lastOut string

// stageRun runs a dry run of gpu-check.sh on the stand-ins with stages
// (GPU_CHECK_STAGES; "" for the default) and returns its output, exit
// status, the calls made and stages.txt.
func stageRun(t *testing.T, stages string, env ...string) (out string, rc int, calls, stagesTxt string) {
	t.Helper()
	root := checkout(t)
	write(t, filepath.Join(root, "bin", "gpu-check", "cuda.test.gz"), gz(t, fakeCudaTest), 0o644)
	write(t, filepath.Join(root, "bin", "gpu-check", "train.gz"), gz(t, fakeTrain), 0o644)
	write(t, filepath.Join(root, "bin", "gpu-check", "optim.test.gz"), gz(t, fakeCudaTest), 0o644)
	write(t, filepath.Join(root, "py"), []byte(fakePython), 0o755)
	for _, d := range []string{"kernels/cuda", "optim"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	callsFile := filepath.Join(root, "calls")
	outDir := filepath.Join(root, "out")
	env = append(env, "GPU_CHECK_CALLS="+callsFile, "GPU_CHECK_PYTHON="+filepath.Join(root, "py"), "GPU_CHECK_DRY_SCALE=1",
		"GPU_CHECK_STAGES="+stages, "CUDA_CACHE_PATH="+filepath.Join(root, "cache"))
	out, rc = run(t, root, env, "--dry", outDir)
	lastOut = outDir
	c, _ := os.ReadFile(callsFile)
	s, _ := os.ReadFile(filepath.Join(outDir, "stages.txt"))
	return out, rc, string(c), string(s)
}

func stageNames(stagesTxt string) []string {
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(stagesTxt), "\n") {
		if f := strings.Fields(l); len(f) >= 2 {
			names = append(names, f[0]+" "+f[1])
		}
	}
	return names
}

// TestStages: the default run is the four core stages in order, each
// writing its line to stages.txt; GPU_CHECK_STAGES runs the chosen ones
// alone, in the stages' order; a failing test fails its stage and the
// exit status; an unknown stage or a choice over one call's 420 s is
// refused before anything runs.
func TestStages(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		out, rc, calls, st := stageRun(t, "")
		if rc != 0 {
			t.Fatalf("exit %d\n%s", rc, out)
		}
		if got, want := strings.Join(stageNames(st), ", "), "preflight PASS, correct PASS, sanitize PASS, bench PASS"; got != want {
			t.Errorf("stages.txt: %s, want %s\n%s", got, want, out)
		}
		if !strings.Contains(out, "stages: preflight correct sanitize bench: 420 s of the 420 s") {
			t.Errorf("no schedule line\n%s", out)
		}
		for _, w := range []string{"TestLibrariesGPU", "TestTinyStepGPU", "load=lazy", "train bench", "bench_torch_gpu.py", "TestSamplerThroughputGPU"} {
			if !strings.Contains(calls, w) {
				t.Errorf("no call with %q:\n%s", w, calls)
			}
		}
		for _, l := range strings.Split(calls, "\n") {
			// Only the sanitizer's runs load lazily.
			if strings.Contains(l, "load=lazy") != strings.Contains(l, "TokenLogprobBF16|SampleTokens|RMSNormBF16Fused") {
				t.Errorf("call %q: the sanitizer's runs, and they alone, load the kernel files lazily", l)
			}
			if strings.HasPrefix(l, "train bench") && !strings.Contains(l, "--ledger") {
				t.Errorf("the bench runs without --ledger (predicted against measured): %q", l)
			}
		}
		if strings.Contains(calls, "AdamWGolden") || strings.Contains(calls, "--weights-out") {
			t.Errorf("the default run ran the extra or loop stage:\n%s", calls)
		}
		// The summary has the parts and the 12 ops measured longest.
		for _, w := range []string{"predicted against measured", "| attention (own) | 2 |", "| **step** | 9 |", "| Op1 | 1 |", "| Op12 | 1 |"} {
			if !strings.Contains(out, w) {
				t.Errorf("the summary lacks %q\n%s", w, out)
			}
		}
		if strings.Contains(out, "| Op13 |") || strings.Contains(out, "predicted step 1.0 ms") {
			t.Errorf("the summary has more than 12 ops of the table\n%s", out)
		}
	})
	t.Run("bench alone", func(t *testing.T) {
		out, rc, calls, st := stageRun(t, "bench")
		if rc != 0 || strings.Join(stageNames(st), ",") != "bench PASS" {
			t.Fatalf("exit %d, stages %q\n%s", rc, st, out)
		}
		if strings.Contains(calls, "TestLibrariesGPU") || strings.Contains(calls, "TestConformanceGPU") {
			t.Errorf("GPU_CHECK_STAGES=bench ran other stages' tests:\n%s", calls)
		}
		if !strings.Contains(calls, "train bench") {
			t.Errorf("GPU_CHECK_STAGES=bench did not run the bench:\n%s", calls)
		}
	})
	t.Run("order", func(t *testing.T) {
		out, rc, _, st := stageRun(t, "sanitize,preflight")
		if got := strings.Join(stageNames(st), ","); rc != 0 || got != "preflight PASS,sanitize PASS" {
			t.Fatalf("exit %d, stages %q\n%s", rc, got, out)
		}
	})
	t.Run("loop", func(t *testing.T) {
		out, rc, calls, st := stageRun(t, "loop")
		if got := strings.Join(stageNames(st), ","); rc != 0 || got != "loop PASS" {
			t.Fatalf("exit %d, stages %q\n%s", rc, got, out)
		}
		if !strings.Contains(calls, "--weights-out") || !strings.Contains(calls, "train score") {
			t.Errorf("the loop stage did not publish and score:\n%s", calls)
		}
		// The loop stage's limits are gpu-check.sh's, passed down.
		if log, _ := os.ReadFile(filepath.Join(lastOut, "loop.log")); !strings.Contains(string(log), "[limit 45 s]") || !strings.Contains(string(log), "[limit 30 s]") {
			t.Errorf("loop.log does not run under the loop stage's limits 45 and 30 s:\n%s", log)
		}
	})
	t.Run("a failing test", func(t *testing.T) {
		out, rc, _, st := stageRun(t, "preflight,correct", "FAKE_FAIL=TestTinyStepGPU")
		if rc != 1 {
			t.Errorf("exit %d with a failing test, want 1\n%s", rc, out)
		}
		if got := strings.Join(stageNames(st), ","); got != "preflight PASS,correct FAIL" {
			t.Errorf("stages %q, want preflight PASS,correct FAIL\n%s", got, out)
		}
	})
	for _, c := range []struct{ stages, why string }{
		{"bench,nonsense", "names stage 'nonsense'"},
		{"extra,loop", "refused: the chosen stages' limits add up to 435 s"},
		{"preflight,correct,sanitize,bench,loop", "refused"},
	} {
		t.Run("refused "+c.stages, func(t *testing.T) {
			out, rc, calls, _ := stageRun(t, c.stages)
			if rc != 2 || !strings.Contains(out, c.why) || calls != "" {
				t.Errorf("GPU_CHECK_STAGES=%s: exit %d, calls %q, want 2 before anything ran, saying %q\n%s", c.stages, rc, calls, c.why, out)
			}
		})
	}
}

// TestPlan: the default stages take one call's 7 minutes at most, and
// every stage can be rerun alone in a second call on a fresh machine in
// what the 15-minute lease leaves (two start-ups of 2 minutes counted).
func TestPlan(t *testing.T) {
	root := checkout(t)
	out, rc := run(t, root, nil, "--plan")
	if rc != 0 {
		t.Fatalf("--plan: exit %d\n%s", rc, out)
	}
	m := regexp.MustCompile(`chosen: preflight correct sanitize bench: (\d+) s of the 420 s`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("--plan: no line for the default stages\n%s", out)
	}
	if n, _ := strconv.Atoi(m[1]); n > 420 {
		t.Errorf("the default stages take %d s, over 420", n)
	}
	stages := regexp.MustCompile(`(?m)^  ([a-z]+) +(\d+) s`).FindAllStringSubmatch(out, -1)
	if len(stages) != 6 {
		t.Fatalf("--plan lists %d stages, want 6\n%s", len(stages), out)
	}
	for _, s := range stages {
		if n, _ := strconv.Atoi(s[2]); n > 900-2*120-420 {
			t.Errorf("stage %s: %d s, over the 240 s a second call has", s[1], n)
		}
	}
}
