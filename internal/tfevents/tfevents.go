// Package tfevents writes TensorBoard event files: scalars by step, as
// TensorBoard's SummaryWriter writes them (PyTorch's add_scalar), so that
// `tensorboard --logdir DIR` plots them.
//
// A file is a sequence of records (TensorFlow's TFRecord format):
//
//	uint64 length              little-endian, of data
//	uint32 masked CRC32C(length's 8 bytes)
//	byte   data[length]        one serialized tensorflow.Event protocol buffer
//	uint32 masked CRC32C(data)
//
// CRC32C is CRC-32 with the Castagnoli polynomial (RFC 3720); the mask is
// ((crc >> 15) | (crc << 17)) + 0xa282ead8, modulo 2^32 (TensorFlow's
// crc32c::Mask). The first record is an Event holding file_version
// "brain.Event:2"; every later one an Event with wall_time, step and a
// Summary of simple_value scalars:
//
//	Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//	Summary { repeated Value value = 1; }
//	Value   { string tag = 1; float simple_value = 2; }
//
// The protocol buffers are encoded here by hand (field tags, varints,
// little-endian fixed widths); nothing else of protobuf is needed. Files
// are named events.out.tfevents.<unix seconds>.<host>.<pid>.0, as
// TensorBoard expects (it reads every such file of a directory, in name
// order).
package tfevents

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"time"
)

// FileVersion is the file_version of the first event.
const FileVersion = "brain.Event:2"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MaskedCRC is TensorFlow's masked CRC32C of b.
func MaskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return (c>>15 | c<<17) + 0xa282ead8
}

// Record frames data as one TFRecord.
func Record(data []byte) []byte {
	out := make([]byte, 0, 16+len(data))
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(data)))
	out = append(out, n[:]...)
	out = binary.LittleEndian.AppendUint32(out, MaskedCRC(n[:]))
	out = append(out, data...)
	return binary.LittleEndian.AppendUint32(out, MaskedCRC(data))
}

// Scalar is one tagged value of a step.
type Scalar struct {
	Tag   string
	Value float32
}

// protobuf wire types.
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

func tag(b []byte, field, wire int) []byte { return binary.AppendUvarint(b, uint64(field<<3|wire)) }

func bytesField(b []byte, field int, v []byte) []byte {
	b = tag(b, field, wireBytes)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// VersionEvent is the serialized first Event of a file.
func VersionEvent(wall float64) []byte {
	b := tag(nil, 1, wireFixed64)
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(wall))
	return bytesField(b, 3, []byte(FileVersion))
}

// ScalarEvent is the serialized Event of one step's scalars.
func ScalarEvent(wall float64, step int64, vals []Scalar) []byte {
	var sum []byte
	for _, v := range vals {
		// proto3: a field at its default (empty, +0) is not written.
		var val []byte
		if v.Tag != "" {
			val = bytesField(val, 1, []byte(v.Tag))
		}
		if bits := math.Float32bits(v.Value); bits != 0 {
			val = tag(val, 2, wireFixed32)
			val = binary.LittleEndian.AppendUint32(val, bits)
		}
		sum = bytesField(sum, 1, val)
	}
	b := tag(nil, 1, wireFixed64)
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(wall))
	if step != 0 {
		b = tag(b, 2, wireVarint)
		b = binary.AppendUvarint(b, uint64(step)) // int64: two's complement as uint64
	}
	return bytesField(b, 5, sum)
}

// Writer appends events to one new event file.
type Writer struct {
	f    *os.File
	w    *bufio.Writer
	path string
	now  func() time.Time
}

// Create starts a new event file in dir (which must exist), writing its
// version event.
func Create(dir string) (*Writer, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	now := time.Now()
	path := filepath.Join(dir, fmt.Sprintf("events.out.tfevents.%d.%s.%d.0", now.Unix(), host, os.Getpid()))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("tfevents: %w", err)
	}
	w := &Writer{f: f, w: bufio.NewWriter(f), path: path, now: time.Now}
	if _, err := w.w.Write(Record(VersionEvent(wallTime(now)))); err != nil {
		f.Close()
		return nil, fmt.Errorf("tfevents: %s: %w", path, err)
	}
	return w, nil
}

// Path is the event file's path.
func (w *Writer) Path() string { return w.path }

func wallTime(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// Add appends one step's scalars (buffered; Flush writes them).
func (w *Writer) Add(step int64, vals []Scalar) error {
	if _, err := w.w.Write(Record(ScalarEvent(wallTime(w.now()), step, vals))); err != nil {
		return fmt.Errorf("tfevents: %s: %w", w.path, err)
	}
	return nil
}

// Flush writes what Add buffered to the file; sync also makes it durable.
func (w *Writer) Flush(sync bool) error {
	if err := w.w.Flush(); err != nil {
		return fmt.Errorf("tfevents: %s: %w", w.path, err)
	}
	if sync {
		if err := w.f.Sync(); err != nil {
			return fmt.Errorf("tfevents: %s: %w", w.path, err)
		}
	}
	return nil
}

// Close flushes, syncs and closes the file.
func (w *Writer) Close() error {
	err := w.Flush(true)
	if cerr := w.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("tfevents: %s: %w", w.path, cerr)
	}
	return err
}
