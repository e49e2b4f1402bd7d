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
		// TF32 inputs carry up to 2^-11 relative error each when rounded to
		// nearest (the emulator, and cvt.rna): random in sign, about
		// sqrt(256)·2·2^-11 ≈ 0.016 abs on the largest of these sums. A GPU
		// whose kernels hand the tensor cores raw fp32 drops the low 13 bits
		// instead (truncation): each product then shrinks by 2^-10 on
		// average, a bias of 2^-10 of the result (0.06 on the largest
		// here), which the rtol allows twice over.
		{MatmulTF32, ref(func(x float32) float32 { return x }), kerneltest.Tol{Atol: 0.05, Rtol: 0x1p-9}},
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

// TestFakeCublasRoundsEmu: the emulator's cuBLAS rounds like a GPU's, not
// better: in TF32 mode each fp32 input keeps 10 mantissa bits (to nearest,
// ties away from zero: 1+2^-11 becomes 1+2^-10), and every mode
// accumulates in fp32 (2^24 + 1 + 1 stays 2^24, whose ulp is 2, where an
// exact sum is 2^24 + 2). On a GPU cuBLAS may choose kernels that round
// otherwise, so this runs on the emulator only.
func TestFakeCublasRoundsEmu(t *testing.T) {
	for _, c := range []struct {
		mode   MatmulMode
		inp, w []float32
		C      int
		want   []float32
	}{
		{mode: MatmulTF32, C: 1, w: []float32{1},
			inp:  []float32{1 + 0x1p-12, 1 + 0x1p-11, 1 + 3*0x1p-12, -(1 + 0x1p-11), 1 + 0x1p-10, 3},
			want: []float32{1, 1 + 0x1p-10, 1 + 0x1p-10, -(1 + 0x1p-10), 1 + 0x1p-10, 3}},
		{mode: MatmulFP32, C: 1, w: []float32{1},
			inp:  []float32{1 + 0x1p-12, 1 + 0x1p-11},
			want: []float32{1 + 0x1p-12, 1 + 0x1p-11}},
		{mode: MatmulFP32, C: 3, w: []float32{1, 1, 1}, inp: []float32{1 << 24, 1, 1}, want: []float32{1 << 24}},
		{mode: MatmulTF32, C: 3, w: []float32{1, 1, 1}, inp: []float32{1 << 24, 1, 1}, want: []float32{1 << 24}},
	} {
		b := emuBackend(t, Options{Matmul: c.mode})
		T := len(c.inp) / c.C
		di, _ := b.Alloc(F32, len(c.inp))
		dw, _ := b.Alloc(F32, len(c.w))
		do, _ := b.Alloc(F32, T)
		b.UploadF32(di, c.inp)
		b.UploadF32(dw, c.w)
		b.Matmul(do, di, dw, T, c.C, 1)
		got := make([]float32, T)
		b.DownloadF32(got, do)
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
		if msg := kerneltest.Compare(c.want, got, kerneltest.TolExact); msg != "" {
			t.Errorf("%s, inputs %v: %s", c.mode, c.inp, msg)
		}
		b.Free(di)
		b.Free(dw)
		b.Free(do)
	}
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
