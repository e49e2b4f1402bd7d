package model

// Typed reads of one config.json object, and Python json's spelling of a
// float when writing one back.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
)

// configReader reads typed fields of one JSON object, naming the file and
// the field (with its block prefix) in errors.
type configReader struct {
	name, prefix string
	raw          map[string]json.RawMessage
}

func (r configReader) bad(field, expected string, found any) error {
	return fmt.Errorf("model: %s: field %s%s: expected %s, found %v", r.name, r.prefix, field, expected, found)
}

func (r configReader) has(k string) bool {
	v, ok := r.raw[k]
	return ok && string(v) != "null"
}

func (r configReader) str(k string) (string, bool, error) {
	if !r.has(k) {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(r.raw[k], &s); err != nil {
		return "", false, r.bad(k, "a string", string(r.raw[k]))
	}
	return s, true, nil
}

func (r configReader) intf(k string, required bool, dst *int) (bool, error) {
	if !r.has(k) {
		if required {
			return false, r.bad(k, "an integer", "nothing")
		}
		return false, nil
	}
	var f float64
	if err := json.Unmarshal(r.raw[k], &f); err != nil || f != math.Trunc(f) || f < 0 || f > 1<<40 {
		return false, r.bad(k, "a non-negative integer", string(r.raw[k]))
	}
	*dst = int(f)
	return true, nil
}

// num reads a positive number within float32 range.
func (r configReader) num(k string, required bool, dst *float64) (bool, error) {
	if !r.has(k) {
		if required {
			return false, r.bad(k, "a positive number", "nothing")
		}
		return false, nil
	}
	var f float64
	if err := json.Unmarshal(r.raw[k], &f); err != nil || !(float32(f) > 0) || math.IsInf(float64(float32(f)), 0) {
		return false, r.bad(k, "a positive number within float32 range", string(r.raw[k]))
	}
	*dst = f
	return true, nil
}

func (r configReader) boolf(k string, dst *bool) error {
	if !r.has(k) {
		return nil
	}
	if err := json.Unmarshal(r.raw[k], dst); err != nil {
		return r.bad(k, "true or false", string(r.raw[k]))
	}
	return nil
}

// pyFloat renders f as JSON the way Python's json writes a float (a decimal
// point even for whole numbers), so transformers reads back a float.
func pyFloat(f float64) json.RawMessage {
	b, _ := json.Marshal(f)
	if !bytes.ContainsAny(b, ".eE") {
		b = append(b, '.', '0')
	}
	return b
}

// compactJSON returns v without insignificant spaces (v itself if it does
// not parse).
func compactJSON(v json.RawMessage) json.RawMessage {
	var buf bytes.Buffer
	if json.Compact(&buf, v) != nil {
		return v
	}
	return buf.Bytes()
}

// Python's json module writes the floats inf, -inf and nan as the bare
// words Infinity, -Infinity and NaN, which strict JSON has no spelling for
// (transformers writes time_step_limit: [0.0, Infinity] so). StrictJSON
// turns each such word outside a string into a string holding pyNonFinite
// and the word, so encoding/json reads the file; the readers of numbers
// that allow them (configReader.pyFloat) read it back, every other reader
// refuses it as a non-number, and PythonJSON turns it back into the bare
// word when a config is written.
const pyNonFinite = `\u0000py:`

// StrictJSON returns data with Python's non-finite floats quoted (see
// pyNonFinite); data without them is returned unchanged.
func StrictJSON(data []byte) []byte {
	var out bytes.Buffer
	last := 0 // data[:last] is in out
	in := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if in {
			switch c {
			case '\\':
				i++
			case '"':
				in = false
			}
			continue
		}
		if c == '"' {
			in = true
			continue
		}
		for _, w := range pyWords {
			if bytes.HasPrefix(data[i:], []byte(w)) {
				out.Write(data[last:i])
				out.WriteString(`"` + pyNonFinite + w + `"`)
				i += len(w) - 1
				last = i + 1
				break
			}
		}
	}
	if last == 0 {
		return data
	}
	out.Write(data[last:])
	return out.Bytes()
}

// pyWords are Python json's spellings of the non-finite floats.
var pyWords = []string{"-Infinity", "Infinity", "NaN"}

// PythonJSON is StrictJSON's inverse: each quoted non-finite word becomes
// the bare word Python's json writes and reads.
func PythonJSON(data []byte) []byte {
	for _, w := range pyWords {
		data = bytes.ReplaceAll(data, []byte(`"`+pyNonFinite+w+`"`), []byte(w))
	}
	return data
}

// pyFloat reads a number as Python's json reads one: a JSON number, or
// Infinity, -Infinity or NaN (StrictJSON's quoted words).
func pyNumber(v json.RawMessage) (float64, bool) {
	var f float64
	if json.Unmarshal(v, &f) == nil {
		return f, true
	}
	var s string
	if json.Unmarshal(v, &s) != nil || !strings.HasPrefix(s, "\x00py:") {
		return 0, false
	}
	switch s[len("\x00py:"):] {
	case "Infinity":
		return math.Inf(1), true
	case "-Infinity":
		return math.Inf(-1), true
	case "NaN":
		return math.NaN(), true
	}
	return 0, false
}

// pyNumberJSON renders f as Python's json writes it: a float with a
// decimal point, or a non-finite word (quoted, for PythonJSON).
func pyNumberJSON(f float64) json.RawMessage {
	switch {
	case math.IsInf(f, 1):
		return json.RawMessage(`"` + pyNonFinite + `Infinity"`)
	case math.IsInf(f, -1):
		return json.RawMessage(`"` + pyNonFinite + `-Infinity"`)
	case math.IsNaN(f):
		return json.RawMessage(`"` + pyNonFinite + `NaN"`)
	}
	return pyFloat(f)
}
