package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const goldenMixed = "testdata/golden_mixed.safetensors"

func openGolden(t *testing.T) *File {
	t.Helper()
	f, err := Open(goldenMixed)
	if err != nil {
		t.Fatalf("open golden (regenerate with /usr/bin/python3 scripts/golden_safetensors.py): %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func readF32(t *testing.T, f interface {
	Tensor(string) (TensorInfo, bool)
	ReadF32(string, []float32) error
}, name string) []float32 {
	t.Helper()
	ti, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("no tensor %q", name)
	}
	out := make([]float32, ti.NumElements())
	if err := f.ReadF32(name, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func readRaw(t *testing.T, f *File, name string) []byte {
	t.Helper()
	ti, _ := f.Tensor(name)
	b := make([]byte, ti.End-ti.Begin)
	if err := f.ReadRaw(name, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestConversionsMatchTorch checks float32→bf16/f16 rounding and the widening
// back against torch's results stored in the golden file.
func TestConversionsMatchTorch(t *testing.T) {
	f := openGolden(t)
	src := readF32(t, f, "src")
	for _, c := range []struct {
		name, widened string
		enc           func(float32) uint16
	}{
		{"src.bf16", "bf16.widened", F32ToBF16},
		{"src.f16", "f16.widened", F32ToF16},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := readRaw(t, f, c.name)
			bad := 0
			for i, x := range src {
				got := c.enc(x)
				w := binary.LittleEndian.Uint16(want[2*i:])
				if got != w {
					bad++
					if bad <= 5 {
						t.Errorf("element %d: %g rounds to %#04x, torch gives %#04x", i, x, got, w)
					}
				}
			}
			gotW := readF32(t, f, c.name)
			wantW := readF32(t, f, c.widened)
			for i := range wantW {
				if math.Float32bits(gotW[i]) != math.Float32bits(wantW[i]) {
					t.Fatalf("element %d: widened to %g, torch gives %g", i, gotW[i], wantW[i])
				}
			}
		})
	}
	for _, n := range []string{"nan.bf16", "nan.f16"} {
		if v := readF32(t, f, n); !math.IsNaN(float64(v[0])) {
			t.Errorf("%s widened to %g, want NaN", n, v[0])
		}
	}
	if got := F16ToF32(F32ToF16(float32(math.NaN()))); !math.IsNaN(float64(got)) {
		t.Errorf("f16 NaN round trip gave %g", got)
	}
	if got := BF16ToF32(F32ToBF16(float32(math.NaN()))); !math.IsNaN(float64(got)) {
		t.Errorf("bf16 NaN round trip gave %g", got)
	}
}

// TestHalfRoundTripExhaustive: every non-NaN 16-bit pattern survives widening
// and rounding back.
func TestHalfRoundTripExhaustive(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		x := F16ToF32(uint16(h))
		if !math.IsNaN(float64(x)) && F32ToF16(x) != uint16(h) {
			t.Fatalf("f16 %#04x → %g → %#04x", h, x, F32ToF16(x))
		}
		y := BF16ToF32(uint16(h))
		if !math.IsNaN(float64(y)) && F32ToBF16(y) != uint16(h) {
			t.Fatalf("bf16 %#04x → %g → %#04x", h, y, F32ToBF16(y))
		}
	}
}

// TestWriterMatchesGolden re-writes the golden's tensors with Writer and
// expects the exact bytes of the independently written file.
func TestWriterMatchesGolden(t *testing.T) {
	f := openGolden(t)
	want, err := os.ReadFile(goldenMixed)
	if err != nil {
		t.Fatal(err)
	}
	var specs []Spec
	for _, ti := range f.Tensors() {
		specs = append(specs, Spec{Name: ti.Name, DType: ti.DType, Shape: ti.Shape})
	}
	var buf bytes.Buffer
	w, err := NewWriter(&buf, specs, f.Metadata())
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range w.Tensors() {
		if ti.DType == F32 {
			err = w.WriteF32(ti.Name, readF32(t, f, ti.Name))
		} else {
			err = w.WriteRaw(ti.Name, readRaw(t, f, ti.Name))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		n := 0
		for n < len(want) && n < buf.Len() && want[n] == buf.Bytes()[n] {
			n++
		}
		t.Fatalf("written file differs from the golden at byte %d (got %d bytes, want %d)\n got: %q\nwant: %q",
			n, buf.Len(), len(want), buf.Bytes()[n:min(n+80, buf.Len())], want[n:min(n+80, len(want))])
	}
}

func randomTensors(r *rand.Rand) []Tensor {
	n := r.IntN(6)
	var ts []Tensor
	for i := range n {
		dt := []DType{F32, BF16, F16}[r.IntN(3)]
		shape := make([]int, r.IntN(4))
		numel := 1
		for j := range shape {
			shape[j] = r.IntN(5)
			numel *= shape[j]
		}
		vals := make([]float32, numel)
		for j := range vals {
			vals[j] = float32(r.NormFloat64() * math.Exp(r.NormFloat64()*3))
		}
		ts = append(ts, Tensor{Spec: Spec{Name: string(rune('a'+r.IntN(26))) + strings.Repeat("x", i), DType: dt, Shape: shape}, F32: vals})
	}
	return ts
}

// TestRoundTripRandom writes random tensors and reads them back.
func TestRoundTripRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	dir := t.TempDir()
	for it := range 200 {
		ts := randomTensors(r)
		path := filepath.Join(dir, "x.safetensors")
		meta := map[string]string{"tracegrpo_format": "test", "k\"ey": "v\u00e9"}
		if err := WriteFile(path, ts, meta); err != nil {
			t.Fatalf("iteration %d: %v", it, err)
		}
		f, err := Open(path)
		if err != nil {
			t.Fatalf("iteration %d: %v", it, err)
		}
		wantMeta := map[string]string{"format": "pt", "tracegrpo_format": "test", "k\"ey": "v\u00e9"}
		if d := cmp.Diff(wantMeta, f.Metadata()); d != "" {
			t.Fatalf("metadata (-want +got):\n%s", d)
		}
		if len(f.Tensors()) != len(ts) {
			t.Fatalf("iteration %d: %d tensors read, %d written", it, len(f.Tensors()), len(ts))
		}
		for _, tw := range ts {
			ti, ok := f.Tensor(tw.Name)
			if !ok {
				t.Fatalf("tensor %q missing", tw.Name)
			}
			if d := cmp.Diff(tw.Shape, ti.Shape); d != "" || ti.DType != tw.DType {
				t.Fatalf("tensor %q: dtype %s want %s, shape (-want +got):\n%s", tw.Name, ti.DType, tw.DType, d)
			}
			got := readF32(t, f, tw.Name)
			for j, x := range tw.F32 {
				want := x
				switch tw.DType {
				case BF16:
					want = BF16ToF32(F32ToBF16(x))
				case F16:
					want = F16ToF32(F32ToF16(x))
				}
				if math.Float32bits(got[j]) != math.Float32bits(want) {
					t.Fatalf("tensor %q element %d: got %g want %g", tw.Name, j, got[j], want)
				}
			}
		}
		f.Close()
	}
}

// build assembles a file from a raw header and data section.
func build(header string, data []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(header)))
	b.WriteString(header)
	b.Write(data)
	return b.Bytes()
}

func TestRejectsInvalid(t *testing.T) {
	eight := make([]byte, 8)
	huge := make([]byte, 8)
	binary.LittleEndian.PutUint64(huge, 1<<40)
	cases := []struct {
		name string
		file []byte
		want string // substring of the error
	}{
		{"short", []byte{1, 2, 3}, "shorter than"},
		{"header longer than file", append(huge, "{}"...), "exceeds the"},
		{"header one byte past the end", append([]byte{3, 0, 0, 0, 0, 0, 0, 0}, "{}"...), "exceeds the 2 bytes"},
		{"header not object", build(`[]`, nil), "does not start with '{'"},
		{"trailing garbage", build(`{}x`, nil), "after the JSON object"},
		{"two objects", build(`{}{}`, nil), "after the JSON object"},
		{"duplicate tensor", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, eight[:4]), "duplicate key"},
		{"unknown dtype", build(`{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}}`, eight[:4]), "unknown dtype"},
		{"shape mismatch", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, eight[:4]), "needs 8 bytes"},
		{"shape short of its span", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}}`, eight), "needs 4 bytes"},
		{"negative dim", build(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, eight[:4]), "non-negative"},
		{"fractional offset", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}}`, eight[:4]), "non-negative integer"},
		{"overflowing shape", build(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}`, eight[:4]), "more elements"},
		{"begin after end", build(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, eight[:4]), "is after end"},
		{"gap", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), "expected begin 0"},
		{"overlap", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, eight[:4]), "expected begin 4"},
		{"trailing data", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, eight), "data section is 8 bytes"},
		{"data past end", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, eight[:4]), "data section is 4 bytes"},
		{"missing offsets", build(`{"a":{"dtype":"F32","shape":[1]}}`, eight[:4]), "data_offsets: missing"},
		{"metadata not strings", build(`{"__metadata__":{"a":1}}`, nil), "expected a string"},
		{"invalid utf8", build("{\"\xff\":{}}", nil), "UTF-8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewFile(bytes.NewReader(c.file), int64(len(c.file)), c.name)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.name) {
				t.Fatalf("error %q: want ErrFormat naming the file and containing %q", err, c.want)
			}
		})
	}
	// A valid minimal file for contrast, with an unknown field ignored as HF does.
	ok := build(`{"__metadata__":null,"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":[1]}}  `, eight[:4])
	if _, err := NewFile(bytes.NewReader(ok), int64(len(ok)), "ok"); err != nil {
		t.Fatalf("valid file rejected: %v", err)
	}
}

func TestWriterMisuse(t *testing.T) {
	specs := []Spec{{Name: "b", DType: F32, Shape: []int{2}}, {Name: "a", DType: BF16, Shape: []int{1}}}
	var buf bytes.Buffer
	w, err := NewWriter(&buf, specs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{w.Tensors()[0].Name, w.Tensors()[1].Name}; !cmp.Equal(got, []string{"b", "a"}) {
		t.Fatalf("file order %v, want F32 before BF16", got)
	}
	if err := w.WriteF32("a", []float32{1}); err == nil {
		t.Fatal("out-of-order write accepted")
	}
	if err := w.WriteF32("b", []float32{1, 2, 3}); err == nil {
		t.Fatal("over-long write accepted")
	}
	if err := w.WriteF32("b", []float32{1}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err == nil {
		t.Fatal("Close accepted an incomplete tensor")
	}
	for _, bad := range [][]Spec{
		{{Name: "x", DType: F32}, {Name: "x", DType: F32}},
		{{Name: "__metadata__", DType: F32}},
		{{Name: "x", DType: "F7"}},
		{{Name: "x", DType: F32, Shape: []int{-2}}},
	} {
		if _, err := NewWriter(&buf, bad, nil); err == nil {
			t.Errorf("specs %+v accepted", bad)
		}
	}
}

func TestShardedIndex(t *testing.T) {
	s, err := OpenDir("testdata/sharded")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	exp, err := Open("testdata/sharded/expected.f32.safetensors.golden")
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close()
	var names []string
	for _, ti := range s.Tensors() {
		names = append(names, ti.Name)
		if ti.DType != BF16 {
			t.Errorf("%s: dtype %s, want BF16", ti.Name, ti.DType)
		}
		if d := cmp.Diff(readF32(t, exp, ti.Name), readF32(t, s, ti.Name)); d != "" {
			t.Errorf("%s (-want +got):\n%s", ti.Name, d)
		}
	}
	if d := cmp.Diff([]string{"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"}, names); d != "" {
		t.Errorf("names (-want +got):\n%s", d)
	}

	// Broken indexes.
	for _, c := range []struct{ name, index, want string }{
		{"traversal", `{"weight_map":{"model.norm.weight":"../x.safetensors"}}`, "file name in the same directory"},
		{"empty", `{"weight_map":{}}`, "non-empty"},
		{"wrong shard", `{"weight_map":{"model.norm.weight":"model-00001-of-00002.safetensors","lm_head.weight":"model-00002-of-00002.safetensors","model.embed_tokens.weight":"model-00001-of-00002.safetensors"}}`, "expected model-00001"},
		{"missing tensor", `{"weight_map":{"nope":"model-00002-of-00002.safetensors","lm_head.weight":"model-00002-of-00002.safetensors","model.norm.weight":"model-00002-of-00002.safetensors"}}`, "not found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, n := range []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"} {
				b, _ := os.ReadFile(filepath.Join("testdata/sharded", n))
				os.WriteFile(filepath.Join(dir, n), b, 0o644)
			}
			os.WriteFile(filepath.Join(dir, IndexFileName), []byte(c.index), 0o644)
			_, err := OpenDir(dir)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	if _, err := OpenDir(t.TempDir()); !errors.Is(err, ErrNoWeights) {
		t.Fatalf("empty dir: %v, want ErrNoWeights", err)
	}
}

// FuzzNewFile: any input is either rejected with ErrFormat or is a file whose
// tensors tile the data, read back, and survive a rewrite unchanged.
func FuzzNewFile(f *testing.F) {
	for _, p := range []string{goldenMixed, "testdata/sharded/model-00001-of-00002.safetensors", "testdata/sharded/model-00002-of-00002.safetensors"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(build(`{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, []byte{1, 2, 3, 4}))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := NewFile(bytes.NewReader(data), int64(len(data)), "fuzz")
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error not ErrFormat: %v", err)
			}
			return
		}
		var specs []Spec
		for _, ti := range file.Tensors() {
			specs = append(specs, Spec{Name: ti.Name, DType: ti.DType, Shape: ti.Shape})
			if ti.DType.Float() {
				dst := make([]float32, ti.NumElements())
				if err := file.ReadF32(ti.Name, dst); err != nil {
					t.Fatal(err)
				}
				checkReadF32At(t, file, ti.Name, dst, len(data))
			}
		}
		var buf bytes.Buffer
		w, err := NewWriter(&buf, specs, file.Metadata())
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range w.Tensors() {
			if err := w.WriteRaw(ti.Name, readRaw(t, file, ti.Name)); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		again, err := NewFile(bytes.NewReader(buf.Bytes()), int64(buf.Len()), "rewritten")
		if err != nil {
			t.Fatalf("rewritten file rejected: %v", err)
		}
		for _, ti := range file.Tensors() {
			tj, ok := again.Tensor(ti.Name)
			if !ok || tj.DType != ti.DType || !cmp.Equal(tj.Shape, ti.Shape) {
				t.Fatalf("tensor %q changed on rewrite: %+v → %+v", ti.Name, ti, tj)
			}
			if !bytes.Equal(readRaw(t, file, ti.Name), readRaw(t, again, ti.Name)) {
				t.Fatalf("tensor %q bytes changed on rewrite", ti.Name)
			}
		}
	})
}

// TestWriteFileStreamAtomic: a failed stream leaves no file behind and does
// not replace an existing one.
func TestWriteFileStreamAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.safetensors")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	specs := []Spec{{Name: "a", DType: F32, Shape: []int{2}}}
	boom := errors.New("boom")
	err := WriteFileStream(path, specs, nil, func(w *Writer) error {
		if err := w.WriteF32("a", []float32{1}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("error %v, want the callback's", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Fatalf("file replaced after a failed write: %q", b)
	}
	// An incomplete stream is caught by Close.
	if err := WriteFileStream(path, specs, nil, func(w *Writer) error { return w.WriteF32("a", []float32{1}) }); err == nil {
		t.Fatal("incomplete tensor accepted")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left behind: %v", entries)
	}
	if err := WriteFileStream(path, specs, nil, func(w *Writer) error { return w.WriteF32("a", []float32{1, 2}) }); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]float32, 2)
	if err := f.ReadF32("a", got); err != nil || got[0] != 1 || got[1] != 2 {
		t.Fatalf("read back %v, %v", got, err)
	}
}

// checkReadF32At: every part of a tensor read on its own equals that part of
// the whole (each start and length from seed), and a part reaching outside
// the tensor is refused.
func checkReadF32At(t *testing.T, f *File, name string, whole []float32, seed int) {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(seed), uint64(len(whole))))
	n := len(whole)
	for range 4 {
		start := r.IntN(n + 1)
		part := make([]float32, r.IntN(n-start+1))
		if err := f.ReadF32At(name, start, part); err != nil {
			t.Fatalf("%q [%d, %d) of %d: %v", name, start, start+len(part), n, err)
		}
		for i, x := range part {
			if math.Float32bits(x) != math.Float32bits(whole[start+i]) {
				t.Fatalf("%q element %d read from %d: %g, the whole tensor has %g", name, start+i, start, x, whole[start+i])
			}
		}
	}
	if err := f.ReadF32At(name, n, make([]float32, 1)); err == nil {
		t.Fatalf("%q: element %d of %d read without an error", name, n, n)
	}
	if err := f.ReadF32At(name, -1, nil); err == nil {
		t.Fatalf("%q: start -1 read without an error", name)
	}
}

// TestReadF32AtRandom streams random F32, BF16 and F16 tensors in random
// parts and compares them with the whole.
func TestReadF32AtRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for trial := range 30 {
		var ts []Tensor
		for i, dt := range []DType{F32, BF16, F16} {
			n := 1 + r.IntN(3*readChunk)
			vals := make([]float32, n)
			for j := range vals {
				vals[j] = float32(r.NormFloat64())
			}
			ts = append(ts, Tensor{Spec: Spec{Name: fmt.Sprintf("t%d", i), DType: dt, Shape: []int{n}}, F32: vals})
		}
		path := filepath.Join(t.TempDir(), "x.safetensors")
		if err := WriteFile(path, ts, nil); err != nil {
			t.Fatal(err)
		}
		f, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, ti := range f.Tensors() {
			whole := make([]float32, ti.NumElements())
			if err := f.ReadF32(ti.Name, whole); err != nil {
				t.Fatal(err)
			}
			// The whole tensor is what was written, to its dtype's precision
			// (half an ulp: 2⁻⁸ relative for BF16's 8-bit significand, 2⁻¹¹
			// for F16's 11 bits, plus half F16's subnormal spacing 2⁻²⁴),
			// exactly for F32.
			rel := map[DType]float64{F32: 0, BF16: 0x1p-8, F16: 0x1p-11}[ti.DType]
			abs := map[DType]float64{F16: 0x1p-25}[ti.DType]
			for j, x := range whole {
				if v := ts[i].F32[j]; math.Abs(float64(x)-float64(v)) > rel*math.Abs(float64(v))+abs {
					t.Fatalf("%s %s element %d: read %g, wrote %g", ti.Name, ti.DType, j, x, v)
				}
			}
			checkReadF32At(t, f, ti.Name, whole, trial)
		}
		f.Close()
	}
}

// TestReadRawAtBounds: ReadRawAt returns exactly the bytes of the range
// asked within its tensor, and refuses any range that passes the tensor's
// end, even where the next tensor's bytes follow in the file.
func TestReadRawAtBounds(t *testing.T) {
	data := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	file := build(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}`, data)
	f, err := NewFile(bytes.NewReader(file), int64(len(file)), "bounds")
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range f.Tensors() {
		span := int(ti.End - ti.Begin)
		for off := 0; off <= span+2; off++ {
			for n := 1; n <= span+2; n++ {
				dst := make([]byte, n)
				err := f.ReadRawAt(ti.Name, int64(off), dst)
				if off+n > span {
					if err == nil {
						t.Errorf("%s: ReadRawAt(%d, %d bytes) past its %d bytes accepted (read %v)", ti.Name, off, n, span, dst)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: ReadRawAt(%d, %d bytes): %v", ti.Name, off, n, err)
					continue
				}
				if want := data[int(ti.Begin)+off : int(ti.Begin)+off+n]; !bytes.Equal(dst, want) {
					t.Errorf("%s: ReadRawAt(%d, %d bytes) = %v, want %v", ti.Name, off, n, dst, want)
				}
			}
		}
	}
}
