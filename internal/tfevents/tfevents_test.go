package tfevents

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestCRC32CVectors: the CRC32C test vectors of RFC 3720, appendix B.4,
// and the mask's inverse, ((m - 0xa282ead8) rotated left by 15).
func TestCRC32CVectors(t *testing.T) {
	inc, dec := make([]byte, 32), make([]byte, 32)
	for i := range inc {
		inc[i], dec[i] = byte(i), byte(31-i)
	}
	pdu := []byte{ // the iSCSI read command PDU of B.4
		0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
		0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
		0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	}
	for _, c := range []struct {
		name string
		in   []byte
		want uint32
	}{
		{"32 zeros", make([]byte, 32), 0x8a9136aa},
		{"32 ones", bytes.Repeat([]byte{0xff}, 32), 0x62a8ab43},
		{"incrementing", inc, 0x46dd794e},
		{"decrementing", dec, 0x113fdb5c},
		{"iSCSI read PDU", pdu, 0xd9963a56},
		{"123456789", []byte("123456789"), 0xe3069283},
	} {
		m := MaskedCRC(c.in)
		u := m - 0xa282ead8
		if got := u<<15 | u>>17; got != c.want {
			t.Errorf("%s: CRC32C %#08x, want %#08x", c.name, got, c.want)
		}
	}
}

// TestGoldenFile: the writer's encoding gives, byte for byte, the event
// file that protobuf itself and crcmod wrote (scripts/golden_tfevents.py).
func TestGoldenFile(t *testing.T) {
	want, err := os.ReadFile("testdata/golden.tfevents")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Script      string  `json:"script"`
		Protobuf    string  `json:"protobuf"`
		VersionWall float64 `json:"version_wall_time"`
		Events      []struct {
			WallTime float64    `json:"wall_time"`
			Step     int64      `json:"step"`
			Values   [][]string `json:"values"`
		} `json:"events"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if g.Script != "scripts/golden_tfevents.py" || g.Protobuf == "" || len(g.Events) < 4 {
		t.Fatalf("golden provenance: %q, protobuf %q, %d events", g.Script, g.Protobuf, len(g.Events))
	}
	got := Record(VersionEvent(g.VersionWall))
	for _, e := range g.Events {
		var vals []Scalar
		for _, v := range e.Values {
			f, err := strconv.ParseFloat(v[1], 64)
			if err != nil {
				t.Fatal(err)
			}
			vals = append(vals, Scalar{v[0], float32(f)})
		}
		got = append(got, Record(ScalarEvent(e.WallTime, e.Step, vals))...)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%d bytes, want %d; first difference at byte %d", len(got), len(want), i)
	}
	recs, err := Records(want)
	if err != nil || len(recs) != len(g.Events)+1 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
}

// TestWriterRoundTrip: what Create and Add write reads back, record by
// record, with both CRCs checked; a flipped byte is found.
func TestWriterRoundTrip(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Unix(1700000000, 500000000)
	w.now = func() time.Time { return clock }
	want := []Event{{Step: 3, Scalars: []Scalar{{"a", 1.5}, {"b", float32(math.Inf(1))}}}, {Step: 4, Scalars: []Scalar{{"a", -2}}}}
	for _, e := range want {
		if err := w.Add(e.Step, e.Scalars); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Match("events.out.tfevents.*.*.*.0", filepath.Base(w.Path())); !m {
		t.Errorf("file name %s", filepath.Base(w.Path()))
	}
	data, err := os.ReadFile(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	recs, err := Records(data)
	if err != nil || len(recs) != 3 {
		t.Fatalf("%d records: %v", len(recs), err)
	}
	if v, _ := Decode(recs[0]); v.FileVersion != FileVersion || v.WallTime <= 0 {
		t.Errorf("first event %+v", v)
	}
	for i, r := range recs[1:] {
		e, err := Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		want[i].WallTime = 1700000000.5
		if d := cmp.Diff(want[i], e); d != "" {
			t.Errorf("event %d (-want +got)\n%s", i+1, d)
		}
	}
	for _, at := range []int{3, 9, 14, len(data) - 1} {
		bad := append([]byte(nil), data...)
		bad[at] ^= 0x40
		if _, err := Records(bad); err == nil {
			t.Errorf("byte %d flipped: read without error", at)
		}
	}
}

// FuzzRecords: any bytes are split into records or refused; never a panic,
// and what is read back re-frames to the same bytes.
func FuzzRecords(f *testing.F) {
	if b, err := os.ReadFile("testdata/golden.tfevents"); err == nil {
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := Records(b)
		var again []byte
		for _, r := range recs {
			again = append(again, Record(r)...)
			Decode(r) // must not panic
		}
		if err == nil && !bytes.Equal(again, b) {
			t.Fatalf("%d records re-frame to %d bytes of %d", len(recs), len(again), len(b))
		}
	})
}
