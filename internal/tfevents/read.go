package tfevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Records splits an event file into its records' data, checking both CRCs
// of each; a record cut short is an error naming its offset.
func Records(file []byte) ([][]byte, error) {
	var out [][]byte
	for off := 0; off < len(file); {
		if len(file)-off < 12 {
			return out, fmt.Errorf("tfevents: offset %d: a record header of %d bytes (want 12)", off, len(file)-off)
		}
		head := file[off : off+8]
		n := binary.LittleEndian.Uint64(head)
		if got := binary.LittleEndian.Uint32(file[off+8:]); got != MaskedCRC(head) {
			return out, fmt.Errorf("tfevents: offset %d: length CRC %#x, want %#x", off, got, MaskedCRC(head))
		}
		if rem := len(file) - off; rem < 16 || n > uint64(rem-16) {
			return out, fmt.Errorf("tfevents: offset %d: a record of %d bytes, %d left after its header", off, n, rem-12)
		}
		data := file[off+12 : off+12+int(n)]
		if got := binary.LittleEndian.Uint32(file[off+12+int(n):]); got != MaskedCRC(data) {
			return out, fmt.Errorf("tfevents: offset %d: data CRC %#x, want %#x", off, got, MaskedCRC(data))
		}
		out = append(out, data)
		off += 16 + int(n)
	}
	return out, nil
}

// Event is a decoded event: the fields this package writes.
type Event struct {
	WallTime    float64
	Step        int64
	FileVersion string
	Scalars     []Scalar
}

// Decode decodes one serialized Event (fields this package does not write
// are skipped).
func Decode(b []byte) (Event, error) {
	var e Event
	err := fields(b, func(f, wire int, v uint64, data []byte) error {
		switch {
		case f == 1 && wire == wireFixed64:
			e.WallTime = math.Float64frombits(v)
		case f == 2 && wire == wireVarint:
			e.Step = int64(v)
		case f == 3 && wire == wireBytes:
			e.FileVersion = string(data)
		case f == 5 && wire == wireBytes:
			return fields(data, func(f, wire int, _ uint64, val []byte) error {
				if f != 1 || wire != wireBytes {
					return nil
				}
				var s Scalar
				err := fields(val, func(f, wire int, v uint64, data []byte) error {
					switch {
					case f == 1 && wire == wireBytes:
						s.Tag = string(data)
					case f == 2 && wire == wireFixed32:
						s.Value = math.Float32frombits(uint32(v))
					}
					return nil
				})
				e.Scalars = append(e.Scalars, s)
				return err
			})
		}
		return nil
	})
	return e, err
}

// fields walks the fields of one protocol buffer message.
func fields(b []byte, fn func(field, wire int, v uint64, data []byte) error) error {
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		if n <= 0 {
			return fmt.Errorf("tfevents: a bad field key")
		}
		b = b[n:]
		f, wire := int(key>>3), int(key&7)
		var v uint64
		var data []byte
		switch wire {
		case wireVarint:
			if v, n = binary.Uvarint(b); n <= 0 {
				return fmt.Errorf("tfevents: field %d: a bad varint", f)
			}
			b = b[n:]
		case wireFixed64:
			if len(b) < 8 {
				return fmt.Errorf("tfevents: field %d: cut short", f)
			}
			v, b = binary.LittleEndian.Uint64(b), b[8:]
		case wireFixed32:
			if len(b) < 4 {
				return fmt.Errorf("tfevents: field %d: cut short", f)
			}
			v, b = uint64(binary.LittleEndian.Uint32(b)), b[4:]
		case wireBytes:
			l, n := binary.Uvarint(b)
			if n <= 0 || l > uint64(len(b)-n) {
				return fmt.Errorf("tfevents: field %d: a bad length", f)
			}
			data, b = b[n:n+int(l)], b[n+int(l):]
		default:
			return fmt.Errorf("tfevents: field %d: wire type %d", f, wire)
		}
		if err := fn(f, wire, v, data); err != nil {
			return err
		}
	}
	return nil
}
