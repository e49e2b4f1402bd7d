package config

import (
	"fmt"
	"math"
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
			return pyval{}, fmt.Errorf("bad boolean %q", n.Value)
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
			return pyval{}, fmt.Errorf("bad float %q", n.Value)
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

// pyMax is Python's max(a, b): a unless b > a.
func pyMax(a, b pyval) (pyval, error) {
	_, af, _, aNum := a.number()
	_, bf, _, bNum := b.number()
	switch {
	case aNum && bNum:
		ai, _, aInt, _ := a.number()
		bi, _, bInt, _ := b.number()
		if aInt && bInt {
			if bi > ai {
				return b, nil
			}
			return a, nil
		}
		if bf > af {
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
