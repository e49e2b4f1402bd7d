package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// TestStartupLineNamesSIMDPath: the CPU backend's start-up line (train,
// export and score open it through openBackend) names the micro-kernel path
// this process runs, the CPU, why that path, and the rounding path.
func TestStartupLineNamesSIMDPath(t *testing.T) {
	s := cpu.SIMDChoice()
	for _, name := range []string{"cpu", "auto"} {
		var log bytes.Buffer
		be, err := openBackend(name, 1, 0, &log)
		if err != nil {
			if name == "auto" {
				t.Logf("--backend auto: %v", err)
				continue
			}
			t.Fatalf("--backend %s: %v", name, err)
		}
		closeBackend(be)
		line := log.String()
		if _, isCPU := be.(*cpu.Backend); !isCPU {
			continue // auto found a GPU
		}
		for _, want := range []string{"SIMD " + s.Path + " on " + s.CPU.String(), s.Reason, "rounding path " + s.Rounding} {
			if !strings.Contains(line, want) {
				t.Errorf("--backend %s: start-up line %q does not say %q", name, line, want)
			}
		}
	}
}

// TestSIMDEnvForcesPath: TRACEGRPO_CPU_SIMD=go forces the portable kernel
// in a real bench process, which says so (and what the CPU alone would
// choose) and records the kernel and rounding path in its result; a value
// that names no path is a usage error (status 2) naming the variable, and
// nothing runs.
func TestSIMDEnvForcesPath(t *testing.T) {
	args := []string{"bench", "--backend", "cpu", "--threads", "1", "--model", "../../model/testdata/qwen3_untied/config.json",
		"--rows", "1", "--seq", "8", "--steps", "1"}
	auto := cpu.SIMDChoice().Path

	cmd := trainCommand(args...)
	cmd.Env = append(cmd.Env, "TRACEGRPO_CPU_SIMD=go")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench under TRACEGRPO_CPU_SIMD=go: %v\n%s", err, errb.String())
	}
	want := "SIMD go on " + cpu.SIMDChoice().CPU.String() + ": forced by TRACEGRPO_CPU_SIMD=go; the CPU alone would choose " + auto + "; rounding path go-"
	if !strings.Contains(errb.String(), want) {
		t.Errorf("start-up line does not say %q:\n%s", want, errb.String())
	}
	var r struct {
		Kernel   string `json:"kernel_path"`
		Rounding string `json:"rounding_path"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("bench output %q: %v", out.String(), err)
	}
	if !strings.HasPrefix(r.Kernel, "go kernel on ") || !strings.HasPrefix(r.Rounding, "go-") {
		t.Errorf("bench result records kernel %q, rounding %q; want the go kernel and a go- rounding path", r.Kernel, r.Rounding)
	}

	for _, bad := range []string{"AVX512", "sse"} {
		cmd := trainCommand(args...)
		cmd.Env = append(cmd.Env, "TRACEGRPO_CPU_SIMD="+bad)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("TRACEGRPO_CPU_SIMD=%s: %v, want exit status 2\n%s", bad, err, errb.String())
		}
		if want := `TRACEGRPO_CPU_SIMD="` + bad + `": want avx512, avx2 or go`; !strings.Contains(errb.String(), want) {
			t.Errorf("TRACEGRPO_CPU_SIMD=%s: stderr does not say %q:\n%s", bad, want, errb.String())
		}
		if out.Len() != 0 || strings.Contains(errb.String(), "SIMD ") {
			t.Errorf("TRACEGRPO_CPU_SIMD=%s: something ran:\n%s%s", bad, out.String(), errb.String())
		}
	}
}

// TestSIMDEnvInEveryCommand: every command that computes on the CPU (score
// and generate open it themselves) says its SIMD path at start, honours a
// forced one, and refuses a TRACEGRPO_CPU_SIMD naming no path with status 2
// before anything runs, as bench and train do.
func TestSIMDEnvInEveryCommand(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, []byte(`{"token_ids": [1, 2, 3, 4]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	model := filepath.Join("..", "..", "model", "testdata", "llama_untied")
	cmds := map[string][]string{
		"score": {"score", "--model", model, "--input", in, "--threads", "1"},
		"generate": append([]string{"generate", "--weights", filepath.Join(dir, "w"), "--captures", filepath.Join(dir, "c"),
			"--step", "1", "--records", filepath.Join(dir, "r.jsonl"), "--threads", "1"}, loopSets...),
	}
	for name, args := range cmds {
		cmd := trainCommand(args...)
		cmd.Env = append(cmd.Env, "TRACEGRPO_CPU_SIMD=avx-512")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(errb.String(), `TRACEGRPO_CPU_SIMD="avx-512": want avx512, avx2 or go`) {
			t.Errorf("%s under TRACEGRPO_CPU_SIMD=avx-512: %v, want status 2 naming the variable\n%s", name, err, errb.String())
		}
		if out.Len() != 0 {
			t.Errorf("%s under TRACEGRPO_CPU_SIMD=avx-512 wrote %q", name, out.String())
		}
	}
	cmd := trainCommand(cmds["score"]...)
	cmd.Env = append(cmd.Env, "TRACEGRPO_CPU_SIMD=go")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("score under TRACEGRPO_CPU_SIMD=go: %v\n%s", err, errb.String())
	}
	if want := "score: backend cpu (1 threads), SIMD go on " + cpu.SIMDChoice().CPU.String() + ": forced by TRACEGRPO_CPU_SIMD=go"; !strings.Contains(errb.String(), want) {
		t.Errorf("score's stderr does not say %q:\n%s", want, errb.String())
	}
	if out.Len() == 0 {
		t.Errorf("score under TRACEGRPO_CPU_SIMD=go scored nothing:\n%s", errb.String())
	}
}
