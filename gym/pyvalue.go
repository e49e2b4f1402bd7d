package gym

// Python values, as NeMo Gym's fingerprint code sees them.
//
// Gym's content fingerprint (fingerprint.go) is computed in Python over
// dicts loaded from JSON: it calls str() on some fields, json.loads on tool
// arguments, tests truthiness, iterates strings and dicts, and serializes
// non-text content with orjson. To reproduce its bytes, this file models a
// JSON value the way Python holds it and implements exactly those
// operations:
//
//   - parsePy: JSON → value with json.loads semantics (NaN/Infinity literals,
//     integers of any size kept as decimal text, 1e400 → inf, lone
//     surrogates kept) or orjson.loads semantics (integers outside
//     [-2^63, 2^64) become floats; non-finite literals and lone surrogates
//     are errors), selected by the caller;
//   - pyStr: Python's str() (repr for floats and containers);
//   - orjsonDumps: orjson.dumps(v, option=OPT_SORT_KEYS) of orjson 3.8
//     (ryu float formatting, integers limited to 64 bits, NaN/inf as null,
//     at most 255 levels of nesting).
//
// Strings are held as Go strings in which a lone UTF-16 surrogate is
// encoded as its 3-byte WTF-8 sequence; encoding such a string to UTF-8
// fails in Python, and fails here (utf8.ValidString is false).

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

type pyKind uint8

const (
	pyNone pyKind = iota
	pyBool
	pyInt
	pyFloat
	pyStr_
	pyList
	pyDict
)

// pyValue is one Python object loaded from JSON.
type pyValue struct {
	kind pyKind
	b    bool
	i    string // decimal text of an int, normalized ("-0" is "0")
	f    float64
	s    string
	list []*pyValue
	// A dict keeps its keys in first-insertion order with the last value
	// for a repeated key, as a Python dict built by json.loads does.
	keys []string
	vals map[string]*pyValue
}

func (v *pyValue) get(key string) *pyValue {
	if v == nil || v.kind != pyDict {
		return nil
	}
	return v.vals[key]
}

// truthy is Python's bool(v).
func (v *pyValue) truthy() bool {
	if v == nil {
		return false
	}
	switch v.kind {
	case pyNone:
		return false
	case pyBool:
		return v.b
	case pyInt:
		return v.i != "0"
	case pyFloat:
		return v.f != 0
	case pyStr_:
		return v.s != ""
	case pyList:
		return len(v.list) > 0
	case pyDict:
		return len(v.keys) > 0
	}
	return false
}

func (v *pyValue) isStr(s string) bool { return v != nil && v.kind == pyStr_ && v.s == s }

// typeName is Python's type(v).__name__.
func (v *pyValue) typeName() string {
	if v == nil {
		return "NoneType"
	}
	return [...]string{"NoneType", "bool", "int", "float", "str", "list", "dict"}[v.kind]
}

// Errors of the fingerprint's Python operations. errPyValue stands for the
// exceptions Gym's terminal attribution catches (ValueError, TypeError and
// their subclasses: JSONDecodeError, UnicodeEncodeError, orjson's
// JSONEncodeError); errPyCrash for the ones it does not (AttributeError),
// which escape Gym's resolve_terminal.
var (
	errPyValue = errors.New("python ValueError/TypeError")
	errPyCrash = errors.New("python AttributeError")
)

func pyValueErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errPyValue, fmt.Sprintf(format, args...))
}

func pyCrash(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errPyCrash, fmt.Sprintf(format, args...))
}

// maxPyDepth bounds the nesting the parser accepts. Python's json.loads
// raises RecursionError near 1000 levels (its exact limit depends on the
// interpreter's stack); orjson refuses more than 255 when dumping, so a
// deeper value can never be fingerprinted anyway.
const maxPyDepth = 512

// pyIntMaxDigits is Python 3.11's default int_max_str_digits: json.loads
// raises ValueError for a longer integer literal.
const pyIntMaxDigits = 4300

type pyParser struct {
	data   []byte
	pos    int
	orjson bool // orjson.loads semantics instead of json.loads
}

// parsePy parses one JSON document. orjson selects orjson.loads semantics
// (Gym reads store lines with it); otherwise json.loads (Gym parses tool
// arguments with it). Any failure is an errPyValue (JSONDecodeError is a
// ValueError).
func parsePy(data []byte, orjson bool) (*pyValue, error) {
	p := &pyParser{data: data, orjson: orjson}
	p.ws()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.ws()
	if p.pos != len(p.data) {
		return nil, pyValueErr("extra data at byte %d", p.pos)
	}
	return v, nil
}

func (p *pyParser) ws() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *pyParser) lit(s string) bool {
	if strings.HasPrefix(string(p.data[p.pos:min(len(p.data), p.pos+len(s))]), s) {
		p.pos += len(s)
		return true
	}
	return false
}

func (p *pyParser) value(depth int) (*pyValue, error) {
	if depth > maxPyDepth {
		return nil, pyValueErr("nesting deeper than %d", maxPyDepth)
	}
	if p.pos >= len(p.data) {
		return nil, pyValueErr("expecting value at byte %d", p.pos)
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		p.pos++
		d := &pyValue{kind: pyDict, vals: map[string]*pyValue{}}
		p.ws()
		if p.pos < len(p.data) && p.data[p.pos] == '}' {
			p.pos++
			return d, nil
		}
		for {
			p.ws()
			if p.pos >= len(p.data) || p.data[p.pos] != '"' {
				return nil, pyValueErr("expecting property name at byte %d", p.pos)
			}
			k, err := p.str()
			if err != nil {
				return nil, err
			}
			p.ws()
			if p.pos >= len(p.data) || p.data[p.pos] != ':' {
				return nil, pyValueErr("expecting ':' at byte %d", p.pos)
			}
			p.pos++
			p.ws()
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			if _, ok := d.vals[k]; !ok {
				d.keys = append(d.keys, k)
			}
			d.vals[k] = v
			p.ws()
			if p.pos < len(p.data) && p.data[p.pos] == ',' {
				p.pos++
				continue
			}
			if p.pos < len(p.data) && p.data[p.pos] == '}' {
				p.pos++
				return d, nil
			}
			return nil, pyValueErr("expecting ',' or '}' at byte %d", p.pos)
		}
	case c == '[':
		p.pos++
		l := &pyValue{kind: pyList}
		p.ws()
		if p.pos < len(p.data) && p.data[p.pos] == ']' {
			p.pos++
			return l, nil
		}
		for {
			p.ws()
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			l.list = append(l.list, v)
			p.ws()
			if p.pos < len(p.data) && p.data[p.pos] == ',' {
				p.pos++
				continue
			}
			if p.pos < len(p.data) && p.data[p.pos] == ']' {
				p.pos++
				return l, nil
			}
			return nil, pyValueErr("expecting ',' or ']' at byte %d", p.pos)
		}
	case c == '"':
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		return &pyValue{kind: pyStr_, s: s}, nil
	case p.lit("null"):
		return &pyValue{kind: pyNone}, nil
	case p.lit("true"):
		return &pyValue{kind: pyBool, b: true}, nil
	case p.lit("false"):
		return &pyValue{kind: pyBool}, nil
	case !p.orjson && p.lit("NaN"):
		return &pyValue{kind: pyFloat, f: math.NaN()}, nil
	case !p.orjson && p.lit("Infinity"):
		return &pyValue{kind: pyFloat, f: math.Inf(1)}, nil
	case !p.orjson && p.lit("-Infinity"):
		return &pyValue{kind: pyFloat, f: math.Inf(-1)}, nil
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	return nil, pyValueErr("expecting value at byte %d", p.pos)
}

// number reads -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)? (Python's NUMBER_RE).
func (p *pyParser) number() (*pyValue, error) {
	start := p.pos
	if p.data[p.pos] == '-' {
		p.pos++
	}
	digits := func() int {
		n := 0
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.pos >= len(p.data) {
		return nil, pyValueErr("expecting value at byte %d", start)
	}
	if p.data[p.pos] == '0' {
		p.pos++
	} else if digits() == 0 {
		return nil, pyValueErr("expecting value at byte %d", start)
	}
	isFloat := false
	if p.pos+1 < len(p.data) && p.data[p.pos] == '.' && p.data[p.pos+1] >= '0' && p.data[p.pos+1] <= '9' {
		p.pos++
		digits()
		isFloat = true
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		save := p.pos
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			p.pos = save
		} else {
			isFloat = true
		}
	}
	text := string(p.data[start:p.pos])
	if isFloat {
		f, err := strconv.ParseFloat(text, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, pyValueErr("bad number %q", text)
		}
		if p.orjson && (math.IsInf(f, 0) || math.IsNaN(f)) {
			return nil, pyValueErr("number is infinity when parsed as double: %q", text)
		}
		return &pyValue{kind: pyFloat, f: f}, nil
	}
	neg := text[0] == '-'
	mag := strings.TrimLeft(strings.TrimPrefix(text, "-"), "0")
	if mag == "" {
		return &pyValue{kind: pyInt, i: "0"}, nil
	}
	if !p.orjson && len(mag) > pyIntMaxDigits {
		return nil, pyValueErr("exceeds the limit (%d digits) for integer string conversion", pyIntMaxDigits)
	}
	if p.orjson {
		// orjson reads integers in [-2^63, 2^64) exactly and larger ones
		// as doubles.
		if neg {
			if _, err := strconv.ParseInt(text, 10, 64); err != nil {
				f, _ := strconv.ParseFloat(text, 64)
				return &pyValue{kind: pyFloat, f: f}, nil
			}
		} else if _, err := strconv.ParseUint(text, 10, 64); err != nil {
			f, _ := strconv.ParseFloat(text, 64)
			return &pyValue{kind: pyFloat, f: f}, nil
		}
	}
	if neg {
		mag = "-" + mag
	}
	return &pyValue{kind: pyInt, i: mag}, nil
}

// str reads a JSON string. Raw control characters are errors (json.loads
// strict mode, orjson); a lone \uD800-\uDFFF escape is kept (json.loads) or
// an error (orjson).
func (p *pyParser) str() (string, error) {
	start := p.pos
	p.pos++ // opening quote
	var b strings.Builder
	for {
		if p.pos >= len(p.data) {
			return "", pyValueErr("unterminated string starting at byte %d", start)
		}
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			return b.String(), nil
		case c < 0x20:
			return "", pyValueErr("invalid control character at byte %d", p.pos)
		case c == '\\':
			if p.pos+1 >= len(p.data) {
				return "", pyValueErr("unterminated string starting at byte %d", start)
			}
			e := p.data[p.pos+1]
			p.pos += 2
			switch e {
			case '"', '\\', '/':
				b.WriteByte(e)
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return "", pyValueErr("invalid \\uXXXX escape at byte %d", p.pos-2)
				}
				if utf16.IsSurrogate(r) {
					if r < 0xDC00 && p.pos+1 < len(p.data) && p.data[p.pos] == '\\' && p.data[p.pos+1] == 'u' {
						save := p.pos
						p.pos += 2
						if r2, ok := p.hex4(); ok && r2 >= 0xDC00 && r2 <= 0xDFFF {
							b.WriteRune(utf16.DecodeRune(r, r2))
							continue
						}
						p.pos = save
					}
					if p.orjson {
						return "", pyValueErr("unmatched surrogate in string at byte %d", p.pos)
					}
					// WTF-8: keep the lone surrogate as its 3-byte form.
					b.WriteByte(byte(0xE0 | r>>12))
					b.WriteByte(byte(0x80 | (r>>6)&0x3F))
					b.WriteByte(byte(0x80 | r&0x3F))
					continue
				}
				b.WriteRune(r)
			default:
				return "", pyValueErr("invalid \\escape at byte %d", p.pos-2)
			}
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				// A Python str can hold a lone surrogate (WTF-8 here), and
				// json.loads keeps it inside a string literal.
				if !p.orjson && isWTF8Surrogate(p.data[p.pos:]) {
					b.Write(p.data[p.pos : p.pos+3])
					p.pos += 3
					continue
				}
				return "", pyValueErr("invalid UTF-8 at byte %d", p.pos)
			}
			b.Write(p.data[p.pos : p.pos+size])
			p.pos += size
		}
	}
}

// isWTF8Surrogate reports whether b starts with the 3-byte encoding of a
// UTF-16 surrogate (U+D800..U+DFFF).
func isWTF8Surrogate(b []byte) bool {
	return len(b) >= 3 && b[0] == 0xED && b[1] >= 0xA0 && b[1] <= 0xBF && b[2] >= 0x80 && b[2] <= 0xBF
}

func (p *pyParser) hex4() (rune, bool) {
	if p.pos+4 > len(p.data) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(p.data[p.pos:p.pos+4]), 16, 32)
	if err != nil || strings.ContainsAny(string(p.data[p.pos:p.pos+4]), "+-") {
		return 0, false
	}
	p.pos += 4
	return rune(v), true
}

// pyStr is Python's str(v).
func pyStr(v *pyValue) string {
	if v != nil && v.kind == pyStr_ {
		return v.s
	}
	var b strings.Builder
	pyRepr(&b, v)
	return b.String()
}

// pyRepr writes Python's repr(v).
func pyRepr(b *strings.Builder, v *pyValue) {
	if v == nil {
		b.WriteString("None")
		return
	}
	switch v.kind {
	case pyNone:
		b.WriteString("None")
	case pyBool:
		if v.b {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case pyInt:
		b.WriteString(v.i)
	case pyFloat:
		b.Write(appendPyFloatRepr(nil, v.f))
	case pyStr_:
		pyReprStr(b, v.s)
	case pyList:
		b.WriteByte('[')
		for i, x := range v.list {
			if i > 0 {
				b.WriteString(", ")
			}
			pyRepr(b, x)
		}
		b.WriteByte(']')
	case pyDict:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			pyReprStr(b, k)
			b.WriteString(": ")
			pyRepr(b, v.vals[k])
		}
		b.WriteByte('}')
	}
}

// pyReprStr is Python's repr of a str: single quotes unless the text holds
// a ' and no ", printable characters as they are (unicode.IsPrint is
// Python's str.isprintable up to the Unicode version of the tables), the
// rest escaped.
func pyReprStr(b *strings.Builder, s string) {
	quote := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		quote = '"'
	}
	b.WriteByte(quote)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			// A WTF-8 lone surrogate (3 bytes ED A0..BF xx).
			if isWTF8Surrogate([]byte(s[i:min(len(s), i+3)])) {
				sr := rune(s[i]&0x0F)<<12 | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F)
				fmt.Fprintf(b, "\\u%04x", sr)
				i += 3
				continue
			}
			fmt.Fprintf(b, "\\x%02x", s[i])
			i++
			continue
		}
		i += size
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(b, "\\x%02x", r)
		case r < 0x7f:
			b.WriteRune(r)
		case unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xff:
			fmt.Fprintf(b, "\\x%02x", r)
		case r <= 0xffff:
			fmt.Fprintf(b, "\\u%04x", r)
		default:
			fmt.Fprintf(b, "\\U%08x", r)
		}
	}
	b.WriteByte(quote)
}

// appendPyFloatRepr appends Python's repr(float): the shortest digits that
// round-trip, in positional form for decimal exponents -4..15 and in
// exponent form (at least two exponent digits, with sign) otherwise.
func appendPyFloatRepr(dst []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, "nan"...)
	case math.IsInf(f, 1):
		return append(dst, "inf"...)
	case math.IsInf(f, -1):
		return append(dst, "-inf"...)
	case f == 0:
		if math.Signbit(f) {
			return append(dst, "-0.0"...)
		}
		return append(dst, "0.0"...)
	}
	if _, exp := shortestDigits(f); exp < -4 || exp >= 16 {
		return strconv.AppendFloat(dst, f, 'e', -1, 64)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'f', -1, 64)
	if !strings.ContainsRune(string(dst[start:]), '.') {
		dst = append(dst, '.', '0')
	}
	return dst
}

// shortestDigits returns the shortest round-tripping decimal digits of a
// finite non-zero |f| and its decimal exponent: |f| = 0.d1d2... × 10^(exp+1),
// i.e. d1.d2... × 10^exp.
func shortestDigits(f float64) (string, int) {
	s := strconv.FormatFloat(math.Abs(f), 'e', -1, 64) // d.ddde±XX
	mant, e, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(e)
	return strings.Replace(mant, ".", "", 1), exp
}

// appendRyu appends f as orjson 3.8 writes a float (Rust ryu's format64):
// positional when the decimal point falls within 16 digits of the first
// digit or up to 5 places left of it, otherwise d[.ddd]e[-]X.
func appendRyu(dst []byte, f float64) []byte {
	if f == 0 {
		if math.Signbit(f) {
			return append(dst, "-0.0"...)
		}
		return append(dst, "0.0"...)
	}
	if f < 0 {
		dst = append(dst, '-')
	}
	digits, exp := shortestDigits(f)
	n := len(digits)
	kk := exp + 1 // 10^(kk-1) <= |f| < 10^kk
	k := kk - n   // |f| = digits × 10^k
	switch {
	case k >= 0 && kk <= 16:
		dst = append(dst, digits...)
		for i := n; i < kk; i++ {
			dst = append(dst, '0')
		}
		return append(dst, '.', '0')
	case kk > 0 && kk <= 16:
		dst = append(dst, digits[:kk]...)
		dst = append(dst, '.')
		return append(dst, digits[kk:]...)
	case kk > -5 && kk <= 0:
		dst = append(dst, '0', '.')
		for i := kk; i < 0; i++ {
			dst = append(dst, '0')
		}
		return append(dst, digits...)
	case n == 1:
		dst = append(dst, digits...)
	default:
		dst = append(dst, digits[0], '.')
		dst = append(dst, digits[1:]...)
	}
	dst = append(dst, 'e')
	return strconv.AppendInt(dst, int64(kk-1), 10)
}

// maxOrjsonDepth is orjson's dumps recursion limit: 255 nested containers
// serialize, 256 raise "Recursion limit reached".
const maxOrjsonDepth = 255

// orjsonDumps is orjson.dumps(v, option=OPT_SORT_KEYS).decode(): compact,
// keys sorted by code point, non-ASCII written as UTF-8, integers limited
// to 64 bits, NaN and infinities written as null. Its failures are
// errPyValue (orjson.JSONEncodeError is a TypeError).
func orjsonDumps(v *pyValue) (string, error) {
	var b []byte
	b, err := appendOrjson(b, v, 0)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

func appendOrjson(dst []byte, v *pyValue, depth int) ([]byte, error) {
	switch v.kind {
	case pyNone:
		return append(dst, "null"...), nil
	case pyBool:
		return strconv.AppendBool(dst, v.b), nil
	case pyInt:
		if _, err := strconv.ParseInt(v.i, 10, 64); err != nil {
			if _, err := strconv.ParseUint(v.i, 10, 64); err != nil {
				return nil, pyValueErr("Integer exceeds 64-bit range")
			}
		}
		return append(dst, v.i...), nil
	case pyFloat:
		if math.IsNaN(v.f) || math.IsInf(v.f, 0) {
			return append(dst, "null"...), nil
		}
		return appendRyu(dst, v.f), nil
	case pyStr_:
		if !utf8.ValidString(v.s) {
			return nil, pyValueErr("str is not valid UTF-8: surrogates not allowed")
		}
		return appendOrjsonString(dst, v.s), nil
	case pyList:
		if depth >= maxOrjsonDepth {
			return nil, pyValueErr("Recursion limit reached")
		}
		dst = append(dst, '[')
		for i, x := range v.list {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendOrjson(dst, x, depth+1); err != nil {
				return nil, err
			}
		}
		return append(dst, ']'), nil
	case pyDict:
		if depth >= maxOrjsonDepth {
			return nil, pyValueErr("Recursion limit reached")
		}
		keys := append([]string(nil), v.keys...)
		sort.Strings(keys)
		dst = append(dst, '{')
		for i, k := range keys {
			if !utf8.ValidString(k) {
				return nil, pyValueErr("str is not valid UTF-8: surrogates not allowed")
			}
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendOrjsonString(dst, k)
			dst = append(dst, ':')
			var err error
			if dst, err = appendOrjson(dst, v.vals[k], depth+1); err != nil {
				return nil, err
			}
		}
		return append(dst, '}'), nil
	}
	return nil, pyValueErr("unsupported type")
}

// appendOrjsonString escapes '"', '\\' and the control characters below
// 0x20 (\b \t \n \f \r by name, the rest as \u00xx); everything else,
// DEL and non-ASCII included, is written as it is.
func appendOrjsonString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c == '\b':
			dst = append(dst, '\\', 'b')
		case c == '\t':
			dst = append(dst, '\\', 't')
		case c == '\n':
			dst = append(dst, '\\', 'n')
		case c == '\f':
			dst = append(dst, '\\', 'f')
		case c == '\r':
			dst = append(dst, '\\', 'r')
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// pyStrip is Python's str.strip(): it removes the characters for which
// str.isspace() is true, which are Go's unicode.IsSpace plus the ASCII
// separators U+001C..U+001F.
func pyStrip(s string) string {
	isSpace := func(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) }
	return strings.TrimFunc(s, isSpace)
}
