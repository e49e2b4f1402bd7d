package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"

	"github.com/tracegrpo/tracegrpo/internal/atomicfile"
)

// Spec declares one tensor of a file to be written.
type Spec struct {
	Name  string
	DType DType
	Shape []int
}

// Writer streams a safetensors file: the header is written by NewWriter and
// the tensors' data follows, in the order Tensors returns, through WriteF32 or
// WriteRaw (a tensor may be written in several chunks).
type Writer struct {
	bw      *bufio.Writer
	tensors []TensorInfo // file order
	cur     int          // index of the tensor being written
	done    int64        // bytes of tensors[cur] written so far
	scratch []byte
}

// layout checks the specs and places the tensors in HF's order, returning
// them with the file's header.
func layout(specs []Spec, metadata map[string]string) ([]TensorInfo, []byte, error) {
	tensors := make([]TensorInfo, len(specs))
	seen := map[string]bool{}
	for i, s := range specs {
		switch {
		case s.Name == "" || s.Name == metadataKey:
			return nil, nil, fmt.Errorf("safetensors: write: tensor %d: invalid name %q", i, s.Name)
		case seen[s.Name]:
			return nil, nil, fmt.Errorf("safetensors: write: tensor %q declared twice", s.Name)
		case !s.DType.Known():
			return nil, nil, fmt.Errorf("safetensors: write: tensor %q: unknown dtype %q", s.Name, s.DType)
		}
		seen[s.Name] = true
		for _, d := range s.Shape {
			if d < 0 {
				return nil, nil, fmt.Errorf("safetensors: write: tensor %q: negative dimension in shape %v", s.Name, s.Shape)
			}
		}
		tensors[i] = TensorInfo{Name: s.Name, DType: s.DType, Shape: append([]int(nil), s.Shape...)}
	}
	// HF's serializer order: larger dtype rank (alignment) first, then name.
	sort.Slice(tensors, func(i, j int) bool {
		ri, rj := dtypeInfo[tensors[i].DType].rank, dtypeInfo[tensors[j].DType].rank
		if ri != rj {
			return ri > rj
		}
		return tensors[i].Name < tensors[j].Name
	})
	var off int64
	for i := range tensors {
		tensors[i].Begin = off
		off += int64(tensors[i].NumElements()) * int64(tensors[i].DType.Size())
		tensors[i].End = off
	}
	hdr, err := encodeHeader(tensors, metadata)
	return tensors, hdr, err
}

// FileSize is the size of the file a Writer of specs and metadata writes:
// the 8-byte header length, the header and the tensors' bytes.
func FileSize(specs []Spec, metadata map[string]string) (int64, error) {
	tensors, hdr, err := layout(specs, metadata)
	if err != nil {
		return 0, err
	}
	n := 8 + int64(len(hdr))
	if len(tensors) > 0 {
		n += tensors[len(tensors)-1].End
	}
	return n, nil
}

// NewWriter checks the specs, writes the header to w and returns a Writer
// for the data. metadata goes into __metadata__, with "format": "pt" added
// when absent.
func NewWriter(w io.Writer, specs []Spec, metadata map[string]string) (*Writer, error) {
	tensors, hdr, err := layout(specs, metadata)
	if err != nil {
		return nil, err
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hdr)))
	bw.Write(lenBuf[:])
	if _, err := bw.Write(hdr); err != nil {
		return nil, fmt.Errorf("safetensors: write header: %w", err)
	}
	return &Writer{bw: bw, tensors: tensors}, nil
}

func encodeHeader(tensors []TensorInfo, metadata map[string]string) ([]byte, error) {
	var b bytes.Buffer
	str := func(s string) {
		enc, _ := json.Marshal(s) // a string always marshals
		b.Write(enc)
	}
	meta := map[string]string{"format": "pt"}
	for k, v := range metadata {
		meta[k] = v
	}
	keys := make([]string, 0, len(meta))
	for k := range meta {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b.WriteString(`{"` + metadataKey + `":{`)
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		str(k)
		b.WriteByte(':')
		str(meta[k])
	}
	b.WriteByte('}')
	for _, t := range tensors {
		b.WriteByte(',')
		str(t.Name)
		b.WriteString(`:{"dtype":`)
		str(string(t.DType))
		b.WriteString(`,"shape":[`)
		for i, d := range t.Shape {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(d))
		}
		b.WriteString(`],"data_offsets":[`)
		b.WriteString(strconv.FormatInt(t.Begin, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(t.End, 10))
		b.WriteString("]}")
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 { // HF pads the header with spaces to 8 bytes
		b.WriteByte(' ')
	}
	if b.Len() > MaxHeaderSize {
		return nil, fmt.Errorf("safetensors: write: header of %d bytes exceeds the limit %d", b.Len(), MaxHeaderSize)
	}
	return b.Bytes(), nil
}

// Tensors returns the tensors in file order, with their offsets. Data must be
// written in this order.
func (w *Writer) Tensors() []TensorInfo { return w.tensors }

func (w *Writer) size(i int) int64 { return w.tensors[i].End - w.tensors[i].Begin }

// next moves past completed tensors to the one named and checks that nbytes
// more fit in it.
func (w *Writer) next(name string, nbytes int64) (TensorInfo, error) {
	for w.cur < len(w.tensors) && w.tensors[w.cur].Name != name && w.done == w.size(w.cur) {
		w.cur++
		w.done = 0
	}
	if w.cur >= len(w.tensors) {
		return TensorInfo{}, fmt.Errorf("safetensors: write: tensor %q: all declared tensors are already written", name)
	}
	t := w.tensors[w.cur]
	if t.Name != name {
		return t, fmt.Errorf("safetensors: write: expected data for tensor %q (file order), found %q", t.Name, name)
	}
	if w.done+nbytes > t.End-t.Begin {
		return t, fmt.Errorf("safetensors: write: tensor %q: %d bytes written past its %d bytes", name, w.done+nbytes, t.End-t.Begin)
	}
	return t, nil
}

// WriteF32 appends vals, converted to the tensor's dtype (F32, BF16 or F16),
// to the named tensor, which must be the current one in file order.
func (w *Writer) WriteF32(name string, vals []float32) error {
	t, err := w.next(name, 0)
	if err != nil {
		return err
	}
	if !t.DType.Float() {
		return fmt.Errorf("safetensors: write: tensor %q: dtype %s does not convert from float32", name, t.DType)
	}
	es := int64(t.DType.Size())
	if _, err := w.next(name, int64(len(vals))*es); err != nil {
		return err
	}
	for i := 0; i < len(vals); i += readChunk {
		n := min(readChunk, len(vals)-i)
		if cap(w.scratch) < n*int(es) {
			w.scratch = make([]byte, readChunk*int(es))
		}
		b := w.scratch[:n*int(es)]
		encodeF32(b, vals[i:i+n], t.DType)
		if _, err := w.bw.Write(b); err != nil {
			return fmt.Errorf("safetensors: write: tensor %q: %w", name, err)
		}
	}
	w.done += int64(len(vals)) * es
	return nil
}

// WriteRaw appends little-endian bytes to the named tensor, which must be the
// current one in file order.
func (w *Writer) WriteRaw(name string, b []byte) error {
	if _, err := w.next(name, int64(len(b))); err != nil {
		return err
	}
	if _, err := w.bw.Write(b); err != nil {
		return fmt.Errorf("safetensors: write: tensor %q: %w", name, err)
	}
	w.done += int64(len(b))
	return nil
}

// Close flushes the data and checks that every declared tensor was written
// in full. It does not close the underlying writer.
func (w *Writer) Close() error {
	for ; w.cur < len(w.tensors); w.cur++ {
		if w.done != w.size(w.cur) {
			t := w.tensors[w.cur]
			return fmt.Errorf("safetensors: write: tensor %q: %d of %d bytes written", t.Name, w.done, t.End-t.Begin)
		}
		w.done = 0
	}
	if err := w.bw.Flush(); err != nil {
		return fmt.Errorf("safetensors: write: %w", err)
	}
	return nil
}

// Tensor is a declared tensor with its values, for WriteFile.
type Tensor struct {
	Spec
	F32 []float32 // values converted to Spec.DType; or
	Raw []byte    // little-endian bytes already in Spec.DType (when F32 is nil)
}

// WriteFile writes tensors to path atomically: a temporary file in the same
// directory is written, synced and renamed over path.
func WriteFile(path string, tensors []Tensor, metadata map[string]string) error {
	specs := make([]Spec, len(tensors))
	byName := make(map[string]*Tensor, len(tensors))
	for i := range tensors {
		specs[i] = tensors[i].Spec
		byName[tensors[i].Name] = &tensors[i]
	}
	return WriteFileStream(path, specs, metadata, func(w *Writer) error {
		for _, t := range w.Tensors() {
			src := byName[t.Name]
			var err error
			if src.F32 != nil {
				if len(src.F32) != t.NumElements() {
					return fmt.Errorf("safetensors: write %s: tensor %q: %d values for shape %v", path, t.Name, len(src.F32), t.Shape)
				}
				err = w.WriteF32(t.Name, src.F32)
			} else {
				err = w.WriteRaw(t.Name, src.Raw)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// WriteFileStream writes the declared tensors to path atomically, calling
// write to stream their data in file order (Writer.Tensors) so that no
// tensor needs to be in memory all at once. The file appears at path only
// if write and every check succeed.
func WriteFileStream(path string, specs []Spec, metadata map[string]string, write func(w *Writer) error) error {
	f, err := atomicfile.Create(path)
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	defer f.Abort()
	w, err := NewWriter(f, specs, metadata)
	if err != nil {
		return err
	}
	if err := write(w); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := f.Commit(); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}
