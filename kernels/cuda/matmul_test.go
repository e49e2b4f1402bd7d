//go:build cgo

package cuda

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels/kerneltest"
)

// bf16Round rounds to the nearest bfloat16, ties to even (as csrc/cast.cu).
func bf16Round(x float32) float32 {
	u := math.Float32bits(x)
	u += 0x7fff + (u>>16)&1
	return math.Float32frombits(u &^ 0xffff)
}

// checkMatmulModes checks Matmul in TF32 and BF16 modes against a float64
// product: for BF16 of the inputs rounded to bf16 (so only the fp32
// accumulation may differ), for TF32 of the exact inputs with a tolerance
// for 10-bit mantissas.
// open receives the subtest's t, so that a skip or failure while opening
// belongs to the subtest.
func checkMatmulModes(t *testing.T, open func(testing.TB, Options) *Backend) {
	const T, C, OC = 37, 256, 65
	r := rand.New(rand.NewPCG(1, 2))
	inp := make([]float32, T*C)
	w := make([]float32, OC*C)
	for i := range inp {
		inp[i] = float32(r.NormFloat64())
	}
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	ref := func(round func(float32) float32) []float32 {
		out := make([]float32, T*OC)
		for t := 0; t < T; t++ {
			for o := 0; o < OC; o++ {
				var s float64
				for c := 0; c < C; c++ {
					s += float64(round(inp[t*C+c])) * float64(round(w[o*C+c]))
				}
				out[t*OC+o] = float32(s)
			}
		}
		return out
	}
	for _, c := range []struct {
		mode MatmulMode
		want []float32
		tol  kerneltest.Tol
	}{
		// fp32 accumulation of 256 exact products of size ~1: ~1e-5.
		{MatmulBF16, ref(bf16Round), kerneltest.Tol{Atol: 1e-4, Rtol: 1e-4}},
		// TF32 inputs carry 2^-11 relative error: sqrt(256)·2·2^-11 ≈ 0.016 abs.
		{MatmulTF32, ref(func(x float32) float32 { return x }), kerneltest.Tol{Atol: 0.05, Rtol: 0}},
		{MatmulFP32, ref(func(x float32) float32 { return x }), kerneltest.Tol{Atol: 1e-4, Rtol: 1e-4}},
	} {
		t.Run(c.mode.String(), func(t *testing.T) {
			b := open(t, Options{Matmul: c.mode})
			if b.MatmulMode() != c.mode {
				t.Fatalf("backend mode %v, want %v", b.MatmulMode(), c.mode)
			}
			di, _ := b.Alloc(F32, T*C)
			dw, _ := b.Alloc(F32, OC*C)
			do, _ := b.Alloc(F32, T*OC)
			defer b.Free(di)
			defer b.Free(dw)
			defer b.Free(do)
			b.UploadF32(di, inp)
			b.UploadF32(dw, w)
			b.Matmul(do, di, dw, T, C, OC)
			got := make([]float32, T*OC)
			b.DownloadF32(got, do)
			if err := b.Sync(); err != nil {
				t.Fatal(err)
			}
			if msg := kerneltest.Compare(c.want, got, c.tol); msg != "" {
				t.Errorf("Matmul %s: %s", c.mode, msg)
			}
		})
	}
}

func TestMatmulModesEmu(t *testing.T) {
	checkMatmulModes(t, emuBackend)
}

func TestMatmulModesGPU(t *testing.T) {
	if _, err := Probe(Options{}); err != nil {
		if os.Getenv("TRACEGRPO_REQUIRE_GPU") == "1" {
			t.Fatalf("no CUDA device: %v", err)
		}
		t.Skipf("no CUDA device: %v", err)
	}
	checkMatmulModes(t, func(t testing.TB, o Options) *Backend {
		b, err := OpenBackend(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	})
}

// TestMatmulModeFromEnv: MatmulDefault follows $TRACEGRPO_CUDA_MATMUL.
func TestMatmulModeFromEnv(t *testing.T) {
	for _, c := range []struct {
		env  string
		want MatmulMode
		bad  bool
	}{{"", MatmulFP32, false}, {"bf16", MatmulBF16, false}, {"tf32", MatmulTF32, false}, {"fp16", 0, true}} {
		t.Setenv("TRACEGRPO_CUDA_MATMUL", c.env)
		got, err := MatmulDefault.resolve()
		if (err != nil) != c.bad || (!c.bad && got != c.want) {
			t.Errorf("env %q: got %v, %v; want %v (error %v)", c.env, got, err, c.want, c.bad)
		}
	}
	t.Setenv("TRACEGRPO_CUDA_MATMUL", "bf16")
	if got, _ := MatmulTF32.resolve(); got != MatmulTF32 {
		t.Errorf("an explicit mode was overridden by the environment: %v", got)
	}
}
