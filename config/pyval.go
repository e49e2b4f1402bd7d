package config

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// pyval is a value as OmegaConf hands it to a resolver or to str(): Python's
// None, bool, int, float, str, or a container (a mapping or a list, kept as
// its YAML node).
type pyval struct {
	kind pyKind
	b    bool
	i    int64
	f    float64
	s    string
	node *yaml.Node // pyMap, pyList
}

type pyKind int

const (
	pyNone pyKind = iota
	pyBool
	pyInt
	pyFloat
	pyStr
	pyMap
	pyList
)

func (k pyKind) String() string {
	return [...]string{"NoneType", "bool", "int", "float", "str", "dict", "list"}[k]
}

func pyStrVal(s string) pyval { return pyval{kind: pyStr, s: s} }

// toPy is the value of a (resolved, retagged) node.
func toPy(n *yaml.Node) (pyval, error) {
	switch n.Kind {
	case yaml.MappingNode:
		return pyval{kind: pyMap, node: n}, nil
	case yaml.SequenceNode:
		return pyval{kind: pyList, node: n}, nil
	case yaml.ScalarNode:
	default:
		return pyval{}, fmt.Errorf("unsupported YAML node")
	}
	switch n.ShortTag() {
	case "!!null":
		return pyval{kind: pyNone}, nil
	case "!!bool":
		b, err := strconv.ParseBool(n.Value)
		if err != nil {
			return pyval{}, fmt.Errorf("bad boolean %s", quoted(n.Value))
		}
		return pyval{kind: pyBool, b: b}, nil
	case "!!int":
		i, err := strconv.ParseInt(n.Value, 0, 64)
		if err != nil {
			return pyval{}, fmt.Errorf("integer %s does not fit 64 bits", n.Value)
		}
		return pyval{kind: pyInt, i: i}, nil
	case "!!float":
		f, err := parseYAMLFloat(n.Value)
		if err != nil {
			return pyval{}, fmt.Errorf("bad float %s", quoted(n.Value))
		}
		return pyval{kind: pyFloat, f: f}, nil
	}
	return pyStrVal(n.Value), nil
}

// node is v as a YAML node (containers are copied).
func (v pyval) toNode() *yaml.Node {
	switch v.kind {
	case pyNone:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
	case pyBool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(v.b)}
	case pyInt:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(v.i, 10)}
	case pyFloat:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: formatYAMLFloat(v.f)}
	case pyStr:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v.s}
	}
	return deepCopy(v.node)
}

// str is Python's str(v).
func (v pyval) str() string {
	switch v.kind {
	case pyStr:
		return v.s
	case pyMap, pyList:
		return pyRepr(v.node)
	}
	return v.repr()
}

// repr is Python's repr(v) for a scalar.
func (v pyval) repr() string {
	switch v.kind {
	case pyNone:
		return "None"
	case pyBool:
		if v.b {
			return "True"
		}
		return "False"
	case pyInt:
		return strconv.FormatInt(v.i, 10)
	case pyFloat:
		return pyFloatRepr(v.f)
	case pyStr:
		return pyStrRepr(v.s)
	}
	return pyRepr(v.node)
}

// pyFloatRepr is Python's repr of a float: the shortest digits that read
// back, in fixed notation from 1e-4 up to 1e16 (with ".0" when integral),
// in exponent notation ("1e-05", "1e+16") outside.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case f == 0:
		if math.Signbit(f) {
			return "-0.0"
		}
		return "0.0"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, exps, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(exps)
	sign := ""
	if mant[0] == '-' {
		sign, mant = "-", mant[1:]
	}
	digits := strings.Replace(mant, ".", "", 1)
	decpt := exp + 1 // the value is 0.digits × 10^decpt
	if decpt <= -4 || decpt > 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	switch {
	case decpt <= 0:
		return sign + "0." + strings.Repeat("0", -decpt) + digits
	case decpt >= len(digits):
		return sign + digits + strings.Repeat("0", decpt-len(digits)) + ".0"
	}
	return sign + digits[:decpt] + "." + digits[decpt:]
}

// pyStrRepr is Python's repr of a str.
func pyStrRepr(s string) string {
	q := byte('\'')
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == rune(q):
			b.WriteByte('\\')
			b.WriteByte(q)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// pyRepr is Python's repr of a container node: {'a': 1, 'b': [2, 'x']}.
func pyRepr(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		parts := make([]string, 0, len(n.Content)/2)
		for i := 0; i < len(n.Content); i += 2 {
			parts = append(parts, pyStrRepr(n.Content[i].Value)+": "+pyRepr(n.Content[i+1]))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case yaml.SequenceNode:
		parts := make([]string, 0, len(n.Content))
		for _, c := range n.Content {
			parts = append(parts, pyRepr(c))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	v, err := toPy(n)
	if err != nil {
		return n.Value
	}
	return v.repr()
}

// number is v as a Python number (bool counts as int).
func (v pyval) number() (i int64, f float64, isInt, ok bool) {
	switch v.kind {
	case pyBool:
		if v.b {
			return 1, 1, true, true
		}
		return 0, 0, true, true
	case pyInt:
		return v.i, float64(v.i), true, true
	case pyFloat:
		return 0, v.f, false, true
	}
	return 0, 0, false, false
}

func typeErr(op string, a, b pyval) error {
	return fmt.Errorf("unsupported operand type(s) for %s: '%v' and '%v'", op, a.kind, b.kind)
}

// pyAdd is Python's a + b.
func pyAdd(a, b pyval) (pyval, error) {
	ai, af, aInt, aNum := a.number()
	bi, bf, bInt, bNum := b.number()
	switch {
	case aNum && bNum && aInt && bInt:
		s := ai + bi
		if (s > ai) != (bi > 0) {
			return pyval{}, fmt.Errorf("%d + %d overflows 64 bits", ai, bi)
		}
		return pyval{kind: pyInt, i: s}, nil
	case aNum && bNum:
		return pyval{kind: pyFloat, f: af + bf}, nil
	case a.kind == pyStr && b.kind == pyStr:
		return pyStrVal(a.s + b.s), nil
	case a.kind == pyList && b.kind == pyList:
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, c := range append(append([]*yaml.Node{}, a.node.Content...), b.node.Content...) {
			n.Content = append(n.Content, deepCopy(c))
		}
		return pyval{kind: pyList, node: n}, nil
	}
	return pyval{}, typeErr("+", a, b)
}

// maxRepeat bounds a string or list repeated by mul.
const maxRepeat = 1 << 20

// pyMul is Python's a * b.
func pyMul(a, b pyval) (pyval, error) {
	ai, af, aInt, aNum := a.number()
	bi, bf, bInt, bNum := b.number()
	switch {
	case aNum && bNum && aInt && bInt:
		p := ai * bi
		if ai != 0 && (p/ai != bi || ai == -1 && bi == math.MinInt64) {
			return pyval{}, fmt.Errorf("%d * %d overflows 64 bits", ai, bi)
		}
		return pyval{kind: pyInt, i: p}, nil
	case aNum && bNum:
		return pyval{kind: pyFloat, f: af * bf}, nil
	case a.kind == pyStr && bNum && bInt, b.kind == pyStr && aNum && aInt:
		s, k := a.s, bi
		if b.kind == pyStr {
			s, k = b.s, ai
		}
		if k <= 0 {
			return pyStrVal(""), nil
		}
		if int64(len(s))*k > maxRepeat {
			return pyval{}, fmt.Errorf("repeating a string of %d bytes %d times is too large", len(s), k)
		}
		return pyStrVal(strings.Repeat(s, int(k))), nil
	}
	return pyval{}, typeErr("*", a, b)
}

// pyDiv is Python's a / b (true division: always a float).
func pyDiv(a, b pyval) (pyval, error) {
	_, af, _, aNum := a.number()
	_, bf, _, bNum := b.number()
	if !aNum || !bNum {
		return pyval{}, typeErr("/", a, b)
	}
	if bf == 0 {
		return pyval{}, fmt.Errorf("division by zero")
	}
	return pyval{kind: pyFloat, f: af / bf}, nil
}

// pyMax is Python's max(a, b): a unless b > a (so the first of equal
// values: max(True, 1) is True, max(1, True) is 1). An int and a float are
// compared exactly, as Python compares them (2^53 + 1 > 2^53 as a float).
func pyMax(a, b pyval) (pyval, error) {
	_, _, _, aNum := a.number()
	_, _, _, bNum := b.number()
	switch {
	case aNum && bNum:
		if pyGreater(b, a) {
			return b, nil
		}
		return a, nil
	case a.kind == pyStr && b.kind == pyStr:
		if b.s > a.s {
			return b, nil
		}
		return a, nil
	}
	return pyval{}, fmt.Errorf("'>' not supported between instances of '%v' and '%v'", b.kind, a.kind)
}

// pyGreater is Python's x > y for numbers (bool counts as int): exact
// between int and float, false when either is NaN.
func pyGreater(x, y pyval) bool {
	xi, xf, xInt, _ := x.number()
	yi, yf, yInt, _ := y.number()
	switch {
	case xInt && yInt:
		return xi > yi
	case !xInt && !yInt:
		return xf > yf
	case xf != xf || yf != yf:
		return false
	}
	exact := func(i int64, f float64, isInt bool) *big.Float {
		if isInt {
			return new(big.Float).SetInt64(i)
		}
		return new(big.Float).SetFloat64(f)
	}
	return exact(xi, xf, xInt).Cmp(exact(yi, yf, yInt)) > 0
}

// pyParseInt is Python's int(s) for a str: blanks around, an optional sign,
// decimal digits with single underscores between them; the value must fit
// 64 bits (Python's would not be bounded). Non-ASCII digits, which Python
// also accepts, are refused.
func pyParseInt(s string) (int64, error) {
	t := strings.Trim(s, pyBlanks)
	digits, sign := t, ""
	if digits != "" && (digits[0] == '+' || digits[0] == '-') {
		sign, digits = digits[:1], digits[1:]
	}
	if !pyDigitRun(digits) {
		return 0, fmt.Errorf("not a decimal integer")
	}
	i, err := strconv.ParseInt(sign+strings.ReplaceAll(digits, "_", ""), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("does not fit 64 bits")
	}
	return i, nil
}

// pyParseFloat is Python's float(s) for a str: blanks around, an optional
// sign, then inf, infinity or nan in any case, or decimal digits (single
// underscores between digits) with an optional fraction and exponent. Go's
// own hexadecimal and other forms are refused, as Python refuses them.
func pyParseFloat(s string) (float64, error) {
	t := strings.Trim(s, pyBlanks)
	body := t
	if body != "" && (body[0] == '+' || body[0] == '-') {
		body = body[1:]
	}
	switch strings.ToLower(body) {
	case "inf", "infinity", "nan":
		return strconv.ParseFloat(t, 64)
	}
	mant, exp := body, ""
	if i := strings.IndexAny(body, "eE"); i >= 0 {
		mant, exp = body[:i], body[i+1:]
		if exp != "" && (exp[0] == '+' || exp[0] == '-') {
			exp = exp[1:]
		}
		if !pyDigitRun(exp) {
			return 0, fmt.Errorf("bad exponent")
		}
	}
	ip, fp, dot := strings.Cut(mant, ".")
	if ip == "" && fp == "" || ip != "" && !pyDigitRun(ip) || dot && fp != "" && !pyDigitRun(fp) {
		return 0, fmt.Errorf("not a decimal number")
	}
	return strconv.ParseFloat(strings.ReplaceAll(t, "_", ""), 64)
}

// pyBlanks are the ASCII characters Python's int() and float() strip.
const pyBlanks = " \t\n\r\v\f"

// pyDigitRun reports whether s is ASCII digits with single underscores
// between them.
func pyDigitRun(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
		case c == '_' && i > 0 && i < len(s)-1 && s[i-1] != '_':
		default:
			return false
		}
	}
	return true
}
