package model

// Typed reads of one config.json object, and Python json's spelling of a
// float when writing one back.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
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
