package gym

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// maxJSONDepth bounds the nesting of any JSON value the package scans, so a
// hostile line cannot exhaust the stack.
const maxJSONDepth = 512

// scanner is a strict, allocation-lean JSON reader over one complete value in
// memory. It is type-exact where encoding/json is not: an integer must be
// written as a JSON integer (no fraction, no exponent), and true/false are
// never numbers. Every accepted document is also accepted by encoding/json
// (checked by FuzzScannerAgreesWithEncodingJSON).
type scanner struct {
	data []byte
	pos  int
}

// syntaxError is a malformed-JSON error at a byte offset.
type syntaxError struct {
	off int
	msg string
}

func (e *syntaxError) Error() string {
	return fmt.Sprintf("malformed JSON at byte %d: %s", e.off, e.msg)
}

func (s *scanner) errf(format string, args ...any) error {
	return &syntaxError{off: s.pos, msg: fmt.Sprintf(format, args...)}
}

func (s *scanner) skipWS() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the next non-space byte without consuming it (0 at the end).
func (s *scanner) peek() byte {
	s.skipWS()
	if s.pos >= len(s.data) {
		return 0
	}
	return s.data[s.pos]
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		return s.errf("expected %q, found %s", c, s.describe())
	}
	s.pos++
	return nil
}

// end checks that only white space follows the value.
func (s *scanner) end() error {
	s.skipWS()
	if s.pos != len(s.data) {
		return s.errf("unexpected %s after the value", s.describe())
	}
	return nil
}

// describe names the value at the cursor for an error message ("found ...").
func (s *scanner) describe() string {
	s.skipWS()
	if s.pos >= len(s.data) {
		return "end of input"
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		if hasPrefix(s.data[s.pos:], "null") {
			return "null"
		}
		return "invalid literal"
	case c == 'N', c == 'I', c == '-' && s.pos+1 < len(s.data) && s.data[s.pos+1] == 'I':
		return "a non-finite number (NaN/Infinity)"
	case c == '-' || (c >= '0' && c <= '9'):
		end := s.numberEnd(s.pos)
		if end <= s.pos {
			return "an invalid number"
		}
		t := s.data[s.pos:end]
		if len(t) > 32 {
			return "number " + string(t[:32]) + "..."
		}
		return "number " + string(t)
	default:
		return strconv.QuoteRune(rune(c))
	}
}

func hasPrefix(b []byte, p string) bool {
	return len(b) >= len(p) && string(b[:len(p)]) == p
}

// numberEnd returns the end of a JSON number starting at i, or i if there is
// no well-formed number there.
func (s *scanner) numberEnd(i int) int {
	d := s.data
	j := i
	if j < len(d) && d[j] == '-' {
		j++
	}
	if j >= len(d) {
		return i
	}
	switch {
	case d[j] == '0':
		j++
	case d[j] >= '1' && d[j] <= '9':
		for j < len(d) && d[j] >= '0' && d[j] <= '9' {
			j++
		}
	default:
		return i
	}
	if j < len(d) && d[j] == '.' {
		j++
		k := j
		for j < len(d) && d[j] >= '0' && d[j] <= '9' {
			j++
		}
		if j == k {
			return i
		}
	}
	if j < len(d) && (d[j] == 'e' || d[j] == 'E') {
		j++
		if j < len(d) && (d[j] == '+' || d[j] == '-') {
			j++
		}
		k := j
		for j < len(d) && d[j] >= '0' && d[j] <= '9' {
			j++
		}
		if j == k {
			return i
		}
	}
	return j
}

// typeError is a well-formed value of the wrong type; callers add the field.
type typeError struct{ msg string }

func (e *typeError) Error() string { return e.msg }

func (s *scanner) typeErr(want string) error {
	return &typeError{msg: "expected " + want + ", found " + s.describe()}
}

// readInt reads a JSON integer (no fraction or exponent) in [lo, hi].
func (s *scanner) readInt(lo, hi int64) (int64, error) {
	c := s.peek()
	if c != '-' && (c < '0' || c > '9') {
		return 0, s.typeErr("an integer")
	}
	start := s.pos
	end := s.numberEnd(start)
	if end == start {
		return 0, s.typeErr("an integer")
	}
	d := s.data[start:end]
	neg := d[0] == '-'
	if neg {
		d = d[1:]
	}
	var v uint64
	for _, ch := range d {
		if ch < '0' || ch > '9' {
			return 0, s.typeErr("an integer")
		}
		if v > (math.MaxUint64-9)/10 {
			return 0, &typeError{msg: "integer " + string(s.data[start:end]) + " is out of range"}
		}
		v = v*10 + uint64(ch-'0')
	}
	var x int64
	switch {
	case !neg && v <= math.MaxInt64:
		x = int64(v)
	case neg && v <= 1<<63:
		x = -int64(v-1) - 1
	default:
		return 0, &typeError{msg: "integer " + string(s.data[start:end]) + " is out of range"}
	}
	if x < lo || x > hi {
		return 0, &typeError{msg: fmt.Sprintf("integer %s is out of range [%d, %d]", s.data[start:end], lo, hi)}
	}
	s.pos = end
	return x, nil
}

// readFloat reads a finite JSON number (integer or not).
func (s *scanner) readFloat() (float64, error) {
	c := s.peek()
	if c != '-' && (c < '0' || c > '9') {
		return 0, s.typeErr("a finite number")
	}
	start := s.pos
	end := s.numberEnd(start)
	if end == start {
		return 0, s.typeErr("a finite number")
	}
	b := s.data[start:end]
	// The string aliases the line only for the duration of the call; the
	// error (which would keep it) is replaced by our own message.
	f, err := strconv.ParseFloat(unsafe.String(&b[0], len(b)), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, &typeError{msg: "number " + string(b) + " is not a finite float64"}
	}
	s.pos = end
	return f, nil
}

// readBool reads true or false.
func (s *scanner) readBool() (bool, error) {
	switch c := s.peek(); {
	case c == 't' && hasPrefix(s.data[s.pos:], "true"):
		s.pos += 4
		return true, nil
	case c == 'f' && hasPrefix(s.data[s.pos:], "false"):
		s.pos += 5
		return false, nil
	}
	return false, s.typeErr("a boolean")
}

// readNull consumes null and reports whether it was there.
func (s *scanner) readNull() bool {
	if s.peek() == 'n' && hasPrefix(s.data[s.pos:], "null") {
		s.pos += 4
		return true
	}
	return false
}

// readString reads a JSON string. Invalid UTF-8 is rejected.
func (s *scanner) readString() (string, error) {
	if s.peek() != '"' {
		return "", s.typeErr("a string")
	}
	start := s.pos
	i := start + 1
	escaped := false
	d := s.data
	for {
		if i >= len(d) {
			s.pos = i
			return "", s.errf("unterminated string")
		}
		c := d[i]
		if c == '"' {
			break
		}
		if c < 0x20 {
			s.pos = i
			return "", s.errf("control character in string")
		}
		if c == '\\' {
			escaped = true
			i++
			if i >= len(d) {
				s.pos = i
				return "", s.errf("unterminated string")
			}
			if d[i] == 'u' {
				if i+4 >= len(d) {
					s.pos = i
					return "", s.errf("short \\u escape")
				}
				for k := 1; k <= 4; k++ {
					if !isHex(d[i+k]) {
						s.pos = i
						return "", s.errf("bad \\u escape")
					}
				}
				i += 5
				continue
			}
			switch d[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			default:
				s.pos = i
				return "", s.errf("bad escape \\%c", d[i])
			}
		}
		i++
	}
	raw := d[start : i+1]
	s.pos = i + 1
	body := raw[1 : len(raw)-1]
	if !escaped {
		if !utf8.Valid(body) {
			return "", &syntaxError{off: start, msg: "invalid UTF-8 in string"}
		}
		return string(body), nil
	}
	if !utf8.Valid(body) {
		return "", &syntaxError{off: start, msg: "invalid UTF-8 in string"}
	}
	var out string
	if err := json.Unmarshal(raw, &out); err != nil {
		return "", &syntaxError{off: start, msg: "bad string: " + err.Error()}
	}
	return out, nil
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// skipValue consumes and validates one JSON value of any type.
func (s *scanner) skipValue(depth int) error {
	if depth > maxJSONDepth {
		return s.errf("nesting deeper than %d", maxJSONDepth)
	}
	switch c := s.peek(); {
	case c == '{':
		s.pos++
		if s.peek() == '}' {
			s.pos++
			return nil
		}
		for {
			if _, err := s.readString(); err != nil {
				if _, ok := err.(*typeError); ok {
					return s.errf("expected an object key, found %s", s.describe())
				}
				return err
			}
			if err := s.expect(':'); err != nil {
				return err
			}
			if err := s.skipValue(depth + 1); err != nil {
				return err
			}
			switch s.peek() {
			case ',':
				s.pos++
			case '}':
				s.pos++
				return nil
			default:
				return s.errf("expected ',' or '}' in object, found %s", s.describe())
			}
		}
	case c == '[':
		s.pos++
		if s.peek() == ']' {
			s.pos++
			return nil
		}
		for {
			if err := s.skipValue(depth + 1); err != nil {
				return err
			}
			switch s.peek() {
			case ',':
				s.pos++
			case ']':
				s.pos++
				return nil
			default:
				return s.errf("expected ',' or ']' in array, found %s", s.describe())
			}
		}
	case c == '"':
		_, err := s.readString()
		return err
	case c == 't' || c == 'f':
		_, err := s.readBool()
		if err != nil {
			return s.errf("invalid literal")
		}
		return nil
	case c == 'n':
		if !s.readNull() {
			return s.errf("invalid literal")
		}
		return nil
	case c == '-' || (c >= '0' && c <= '9'):
		end := s.numberEnd(s.pos)
		if end == s.pos {
			return s.errf("invalid number")
		}
		s.pos = end
		return nil
	default:
		return s.errf("unexpected %s", s.describe())
	}
}

// readRaw consumes one value and returns its bytes (aliasing the input).
func (s *scanner) readRaw() ([]byte, error) {
	s.skipWS()
	start := s.pos
	if err := s.skipValue(0); err != nil {
		return nil, err
	}
	return s.data[start:s.pos], nil
}

// object iterates the members of an object: fn is called with each key and
// the scanner positioned at its value; fn must consume the value.
func (s *scanner) object(fn func(key string) error) error {
	if s.peek() != '{' {
		return s.typeErr("an object")
	}
	s.pos++
	if s.peek() == '}' {
		s.pos++
		return nil
	}
	for {
		if s.peek() != '"' {
			return s.errf("expected an object key, found %s", s.describe())
		}
		key, err := s.readString()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := fn(key); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.pos++
		case '}':
			s.pos++
			return nil
		default:
			return s.errf("expected ',' or '}' in object, found %s", s.describe())
		}
	}
}

// array iterates the elements of an array: fn is called with the index and
// the scanner positioned at the element; fn must consume it.
func (s *scanner) array(fn func(i int) error) error {
	if s.peek() != '[' {
		return s.typeErr("an array")
	}
	s.pos++
	if s.peek() == ']' {
		s.pos++
		return nil
	}
	for i := 0; ; i++ {
		if err := fn(i); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.pos++
		case ']':
			s.pos++
			return nil
		default:
			return s.errf("expected ',' or ']' in array, found %s", s.describe())
		}
	}
}

// appendJSONString appends s as a JSON string (encoding/json's escaping
// without HTML escaping).
func appendJSONString(dst []byte, s string) []byte {
	simple := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			simple = false
			break
		}
	}
	if simple {
		dst = append(dst, '"')
		dst = append(dst, s...)
		return append(dst, '"')
	}
	var buf []byte
	buf, _ = marshalNoHTML(s)
	return append(dst, buf...)
}

func marshalNoHTML(v any) ([]byte, error) {
	var b jsonBuf
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	out := b.b
	if n := len(out); n > 0 && out[n-1] == '\n' {
		out = out[:n-1]
	}
	return out, nil
}

type jsonBuf struct{ b []byte }

func (j *jsonBuf) Write(p []byte) (int, error) { j.b = append(j.b, p...); return len(p), nil }

// appendPyFloat appends f the way Python's json module writes a float:
// repr(f) (appendPyFloatRepr), and NaN, Infinity, -Infinity for the
// non-finite values.
func appendPyFloat(dst []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, "NaN"...)
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...)
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...)
	}
	return appendPyFloatRepr(dst, f)
}
