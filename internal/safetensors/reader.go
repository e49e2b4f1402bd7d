package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/tracegrpo/tracegrpo/internal/inputfile"
)

// ErrFormat marks a file that is not valid safetensors. Errors that wrap it
// name the file, the tensor and the field, what was expected and what was
// found.
var ErrFormat = errors.New("safetensors: invalid file")

// MaxHeaderSize is the largest header accepted, as in HF's reference reader.
const MaxHeaderSize = 100_000_000

// metadataKey is the reserved header key holding string metadata.
const metadataKey = "__metadata__"

// TensorInfo describes one tensor of a file. Begin and End are byte offsets
// relative to the start of the data section.
type TensorInfo struct {
	Name       string
	DType      DType
	Shape      []int
	Begin, End int64
}

// NumElements is the product of the shape (1 for a scalar).
func (t TensorInfo) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is an open safetensors file read through an io.ReaderAt. It is safe for
// concurrent reads.
type File struct {
	r         io.ReaderAt
	closer    io.Closer
	name      string
	dataStart int64
	dataLen   int64
	metadata  map[string]string
	tensors   []TensorInfo // sorted by name
	byName    map[string]int
}

// Open opens and validates the safetensors file at path.
func Open(path string) (*File, error) {
	fh, err := inputfile.Open(path, inputfile.Safetensors)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	f, err := NewFile(fh, st.Size(), path)
	if err != nil {
		fh.Close()
		return nil, err
	}
	f.closer = fh
	return f, nil
}

// NewFile validates the safetensors file of size bytes read through r; name
// is used in error messages.
func NewFile(r io.ReaderAt, size int64, name string) (*File, error) {
	f := &File{r: r, name: name}
	if size < 8 {
		return nil, f.formatErr("file is %d bytes, shorter than the 8-byte header length", size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors: %s: read header length: %w", name, err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > uint64(size-8) {
		return nil, f.formatErr("header length %d exceeds the %d bytes after it in the file", n, size-8)
	}
	if n > MaxHeaderSize {
		return nil, f.formatErr("header length %d exceeds the limit %d", n, MaxHeaderSize)
	}
	hdr := make([]byte, n)
	if _, err := r.ReadAt(hdr, 8); err != nil {
		return nil, fmt.Errorf("safetensors: %s: read header: %w", name, err)
	}
	f.dataStart = 8 + int64(n)
	f.dataLen = size - f.dataStart
	if err := f.parseHeader(hdr); err != nil {
		return nil, err
	}
	if err := f.checkLayout(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *File) formatErr(format string, args ...any) error {
	return fmt.Errorf("safetensors: %s: %s (re-save the tensors to regenerate the file): %w",
		f.name, fmt.Sprintf(format, args...), ErrFormat)
}

// parseHeader decodes the JSON header token by token so that duplicate keys
// are caught and nothing larger than the header itself is allocated.
func (f *File) parseHeader(hdr []byte) error {
	if len(hdr) == 0 || hdr[0] != '{' {
		return f.formatErr("header does not start with '{'")
	}
	if !utf8.Valid(hdr) {
		return f.formatErr("header is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(hdr))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil {
		return f.formatErr("header: %v", err)
	}
	f.byName = map[string]int{}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return f.formatErr("header: %v", err)
		}
		key := tok.(string) // object keys are always strings
		if seen[key] {
			return f.formatErr("header: duplicate key %q", key)
		}
		seen[key] = true
		if key == metadataKey {
			if err := f.parseMetadata(dec); err != nil {
				return err
			}
			continue
		}
		ti, err := f.parseTensor(dec, key)
		if err != nil {
			return err
		}
		f.tensors = append(f.tensors, ti)
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return f.formatErr("header: %v", err)
	}
	if tok, err := dec.Token(); err != io.EOF {
		return f.formatErr("header: unexpected content after the JSON object (token %v, error %v)", tok, err)
	}
	sort.Slice(f.tensors, func(i, j int) bool { return f.tensors[i].Name < f.tensors[j].Name })
	for i, t := range f.tensors {
		f.byName[t.Name] = i
	}
	return nil
}

func (f *File) parseMetadata(dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return f.formatErr("header: %s: %v", metadataKey, err)
	}
	if tok == nil {
		return nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return f.formatErr("header: %s: expected an object of strings, found %v", metadataKey, tok)
	}
	f.metadata = map[string]string{}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return f.formatErr("header: %s: %v", metadataKey, err)
		}
		k := kt.(string)
		if _, dup := f.metadata[k]; dup {
			return f.formatErr("header: %s: duplicate key %q", metadataKey, k)
		}
		vt, err := dec.Token()
		if err != nil {
			return f.formatErr("header: %s: %q: %v", metadataKey, k, err)
		}
		v, ok := vt.(string)
		if !ok {
			return f.formatErr("header: %s: %q: expected a string, found %v", metadataKey, k, vt)
		}
		f.metadata[k] = v
	}
	if _, err := dec.Token(); err != nil {
		return f.formatErr("header: %s: %v", metadataKey, err)
	}
	return nil
}

func (f *File) parseTensor(dec *json.Decoder, name string) (TensorInfo, error) {
	ti := TensorInfo{Name: name}
	bad := func(field, format string, args ...any) error {
		return f.formatErr("tensor %q: field %s: %s", name, field, fmt.Sprintf(format, args...))
	}
	tok, err := dec.Token()
	if err != nil {
		return ti, bad("(object)", "%v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return ti, bad("(object)", "expected an object, found %v", tok)
	}
	var haveDType, haveShape, haveOffsets bool
	seen := map[string]bool{}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return ti, bad("(object)", "%v", err)
		}
		k := kt.(string)
		if seen[k] {
			return ti, bad(k, "duplicate key")
		}
		seen[k] = true
		switch k {
		case "dtype":
			vt, err := dec.Token()
			if err != nil {
				return ti, bad(k, "%v", err)
			}
			s, ok := vt.(string)
			if !ok {
				return ti, bad(k, "expected a string, found %v", vt)
			}
			ti.DType = DType(s)
			if !ti.DType.Known() {
				return ti, bad(k, "unknown dtype %q", s)
			}
			haveDType = true
		case "shape":
			dims, err := f.parseInts(dec)
			if err != nil {
				return ti, bad(k, "%v", err)
			}
			ti.Shape = make([]int, len(dims))
			for i, d := range dims {
				ti.Shape[i] = int(d)
			}
			haveShape = true
		case "data_offsets":
			offs, err := f.parseInts(dec)
			if err != nil {
				return ti, bad(k, "%v", err)
			}
			if len(offs) != 2 {
				return ti, bad(k, "expected [begin, end], found %d numbers", len(offs))
			}
			ti.Begin, ti.End = offs[0], offs[1]
			haveOffsets = true
		default: // ignored, as HF's reader does
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return ti, bad(k, "%v", err)
			}
		}
	}
	if _, err := dec.Token(); err != nil {
		return ti, bad("(object)", "%v", err)
	}
	switch {
	case !haveDType:
		return ti, bad("dtype", "missing")
	case !haveShape:
		return ti, bad("shape", "missing")
	case !haveOffsets:
		return ti, bad("data_offsets", "missing")
	}
	if ti.Begin > ti.End {
		return ti, bad("data_offsets", "begin %d is after end %d", ti.Begin, ti.End)
	}
	// numel·size must equal the byte span; bound the product by the span so
	// that it cannot overflow.
	span := ti.End - ti.Begin
	numel := int64(1)
	for _, d := range ti.Shape {
		if d == 0 {
			numel = 0
			break
		}
	}
	if numel != 0 {
		for _, d := range ti.Shape {
			if numel > span/int64(d) {
				return ti, bad("shape", "%v holds more elements than data_offsets [%d, %d] span", ti.Shape, ti.Begin, ti.End)
			}
			numel *= int64(d)
		}
	}
	if numel*int64(ti.DType.Size()) != span {
		return ti, bad("data_offsets", "shape %v of %s needs %d bytes, found [%d, %d] (%d bytes)",
			ti.Shape, ti.DType, numel*int64(ti.DType.Size()), ti.Begin, ti.End, span)
	}
	return ti, nil
}

// parseInts reads a JSON array of non-negative integers.
func (f *File) parseInts(dec *json.Decoder) ([]int64, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, fmt.Errorf("expected an array, found %v", tok)
	}
	var out []int64
	for dec.More() {
		vt, err := dec.Token()
		if err != nil {
			return nil, err
		}
		num, ok := vt.(json.Number)
		if !ok {
			return nil, fmt.Errorf("expected an integer, found %v", vt)
		}
		v, err := strconv.ParseInt(string(num), 10, 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("expected a non-negative integer, found %s", num)
		}
		out = append(out, v)
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	return out, nil
}

// checkLayout requires the tensors, sorted by offset, to tile the data section
// exactly.
func (f *File) checkLayout() error {
	order := make([]int, len(f.tensors))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		ta, tb := f.tensors[order[a]], f.tensors[order[b]]
		if ta.Begin != tb.Begin {
			return ta.Begin < tb.Begin
		}
		return ta.End < tb.End
	})
	var pos int64
	for _, i := range order {
		t := f.tensors[i]
		if t.Begin != pos {
			return f.formatErr("tensor %q: field data_offsets: expected begin %d (tensors must tile the data section without gaps or overlaps), found %d", t.Name, pos, t.Begin)
		}
		pos = t.End
	}
	if pos != f.dataLen {
		return f.formatErr("tensors end at data offset %d but the data section is %d bytes", pos, f.dataLen)
	}
	return nil
}

// Close closes the underlying file if Open opened it.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	return f.closer.Close()
}

// Name is the path or name the file was opened with.
func (f *File) Name() string { return f.name }

// Metadata returns the __metadata__ map (nil when absent). Do not modify it.
func (f *File) Metadata() map[string]string { return f.metadata }

// Tensors returns the tensor table sorted by name. Do not modify it.
func (f *File) Tensors() []TensorInfo { return f.tensors }

// Tensor returns the named tensor's description.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.tensors[i], true
}

// ReadRaw copies the named tensor's little-endian bytes into dst, whose length
// must equal End−Begin.
func (f *File) ReadRaw(name string, dst []byte) error {
	t, ok := f.Tensor(name)
	if !ok {
		return fmt.Errorf("safetensors: %s: no tensor %q", f.name, name)
	}
	if int64(len(dst)) != t.End-t.Begin {
		return fmt.Errorf("safetensors: %s: tensor %q: destination holds %d bytes, tensor has %d", f.name, name, len(dst), t.End-t.Begin)
	}
	if _, err := f.r.ReadAt(dst, f.dataStart+t.Begin); err != nil {
		return fmt.Errorf("safetensors: %s: tensor %q: %w", f.name, name, err)
	}
	return nil
}

// ReadRawAt copies bytes [off, off+len(dst)) of the named tensor's data
// into dst.
func (f *File) ReadRawAt(name string, off int64, dst []byte) error {
	t, ok := f.Tensor(name)
	if !ok {
		return fmt.Errorf("safetensors: %s: no tensor %q", f.name, name)
	}
	if off < 0 || int64(len(dst)) > t.End-t.Begin-off {
		return fmt.Errorf("safetensors: %s: tensor %q: bytes [%d, %d) are outside its %d", f.name, name, off, off+int64(len(dst)), t.End-t.Begin)
	}
	if _, err := f.r.ReadAt(dst, f.dataStart+t.Begin+off); err != nil {
		return fmt.Errorf("safetensors: %s: tensor %q: %w", f.name, name, err)
	}
	return nil
}

// readChunk is the number of elements converted per read.
const readChunk = 1 << 14

// ReadF32 converts the named F32, BF16 or F16 tensor into dst, whose length
// must equal the tensor's element count.
func (f *File) ReadF32(name string, dst []float32) error {
	t, ok := f.Tensor(name)
	if !ok {
		return fmt.Errorf("safetensors: %s: no tensor %q", f.name, name)
	}
	if len(dst) != t.NumElements() {
		return fmt.Errorf("safetensors: %s: tensor %q: destination holds %d elements, tensor shape %v has %d", f.name, name, len(dst), t.Shape, t.NumElements())
	}
	return f.ReadF32At(name, 0, dst)
}

// ReadF32At converts elements [start, start+len(dst)) of the named F32, BF16
// or F16 tensor (in its row-major order) into dst, so that a caller can
// stream a large tensor through a small buffer.
func (f *File) ReadF32At(name string, start int, dst []float32) error {
	t, ok := f.Tensor(name)
	if !ok {
		return fmt.Errorf("safetensors: %s: no tensor %q", f.name, name)
	}
	if !t.DType.Float() {
		return fmt.Errorf("safetensors: %s: tensor %q: dtype %s does not convert to float32 (expected F32, BF16 or F16)", f.name, name, t.DType)
	}
	if start < 0 || len(dst) > t.NumElements()-start {
		return fmt.Errorf("safetensors: %s: tensor %q: elements [%d, %d) are outside its %d (shape %v)", f.name, name, start, start+len(dst), t.NumElements(), t.Shape)
	}
	es := t.DType.Size()
	buf := make([]byte, min(len(dst), readChunk)*es)
	off := f.dataStart + t.Begin + int64(start)*int64(es)
	for i := 0; i < len(dst); i += readChunk {
		n := min(readChunk, len(dst)-i)
		b := buf[:n*es]
		if _, err := f.r.ReadAt(b, off); err != nil {
			return fmt.Errorf("safetensors: %s: tensor %q: %w", f.name, name, err)
		}
		decodeF32(dst[i:i+n], b, t.DType)
		off += int64(len(b))
	}
	return nil
}
