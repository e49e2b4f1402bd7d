package checkpoint

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/internal/testtool"
)

// benchSizesMB are the state sizes (fp32 weights + 2 moments, in MiB) the
// checkpoint benchmarks run at; TRACEGRPO_BENCH_CKPT_MB="256,1024" overrides.
// A 1.7B-parameter state is 1.7e9 × 12 bytes ≈ 20 GB; the default stays well
// inside this machine's disk and memory, and the scaling is reported.
func benchSizesMB(b *testing.B) []int {
	s := os.Getenv("TRACEGRPO_BENCH_CKPT_MB")
	if s == "" {
		return []int{1024}
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("TRACEGRPO_BENCH_CKPT_MB: %q is not a positive size in MiB", f)
		}
		out = append(out, n)
	}
	return out
}

// benchState is a state of mb MiB: one weight tensor of N fp32 values and
// two moments of N each (12·N bytes).
func benchState(mb int) *State {
	n := mb << 20 / 12
	// Random normal values: like real weights and moments they compress
	// poorly, so the zstd variant is not flattered.
	v := make([]float32, 3*n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range v {
		v[i] = float32(rng.NormFloat64()) * 0.02
	}
	st := testState(1, 8)
	st.Model = []Tensor{{Spec: safetensors.Spec{Name: "model.weights", DType: safetensors.F32, Shape: []int{n}}, F32: v[:n]}}
	st.Optimizer = []Tensor{
		{Spec: safetensors.Spec{Name: "exp_avg", DType: safetensors.F32, Shape: []int{n}}, F32: v[n : 2*n]},
		{Spec: safetensors.Spec{Name: "exp_avg_sq", DType: safetensors.F32, Shape: []int{n}}, F32: v[2*n:]},
	}
	return st
}

func dirBytes(b *testing.B, dir string) int64 {
	var total int64
	ents, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			b.Fatal(err)
		}
		total += info.Size()
	}
	return total
}

func run(b *testing.B, name string, args ...string) {
	if out, err := exec.Command(testtool.Path(b, name, ""), args...).CombinedOutput(); err != nil {
		b.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// BenchmarkCheckpoint measures Save (write + sha256 + fsync + rename) and
// Load (sha256 verify + decode) of the same state, against cp of the same
// files (cp, and cp followed by sync of the copies, the fair reference for a
// save that fsyncs) and cat of them to /dev/null (the reference for a load).
// MB/s are of the state's bytes; compare the sub-benchmarks of one run.
func BenchmarkCheckpoint(b *testing.B) {
	for _, mb := range benchSizesMB(b) {
		st := benchState(mb)
		root := b.TempDir()
		src, err := Save(filepath.Join(root, "src"), st, SaveOptions{})
		if err != nil {
			b.Fatal(err)
		}
		size := dirBytes(b, src)
		files, _ := filepath.Glob(filepath.Join(src, "*"))
		b.Run(fmt.Sprintf("%dMiB/save", mb), func(b *testing.B) {
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				dst := filepath.Join(root, fmt.Sprintf("save%d", i))
				if _, err := Save(dst, st, SaveOptions{}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				os.RemoveAll(dst)
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("%dMiB/save-zstd", mb), func(b *testing.B) {
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				dst := filepath.Join(root, fmt.Sprintf("savez%d", i))
				if _, err := Save(dst, st, SaveOptions{CompressOptimizer: true}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				os.RemoveAll(dst)
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("%dMiB/cp", mb), func(b *testing.B) {
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				dst := filepath.Join(root, fmt.Sprintf("cp%d", i))
				run(b, "cp", "-r", src, dst)
				b.StopTimer()
				os.RemoveAll(dst)
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("%dMiB/cp+sync", mb), func(b *testing.B) {
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				dst := filepath.Join(root, fmt.Sprintf("cps%d", i))
				run(b, "cp", "-r", src, dst)
				copies, _ := filepath.Glob(filepath.Join(dst, "*"))
				run(b, "sync", copies...)
				b.StopTimer()
				os.RemoveAll(dst)
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("%dMiB/load", mb), func(b *testing.B) {
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				if _, err := Load(src, LoadOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("%dMiB/cat", mb), func(b *testing.B) {
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				run(b, "sh", append([]string{"-c", `cat "$@" > /dev/null`, "cat"}, files...)...)
			}
		})
	}
}
