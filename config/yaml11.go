package config

import (
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// OmegaConf reads YAML with PyYAML's SafeLoader (YAML 1.1), plus one more float
// rule and without timestamps. yaml.v3 types plain scalars by YAML 1.2, which
// differs: "yes" and "on" are booleans, "012" is octal, "1:20" is 80 and
// "1e-6" is a float there. retag gives every plain scalar the type OmegaConf
// gives it, in canonical form (config/testdata/golden_omegaconf.json checks
// it against OmegaConf itself). Quoted, block and explicitly tagged scalars
// keep their type.

var (
	yaml11Bool = regexp.MustCompile(`^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$`)
	yaml11Int  = regexp.MustCompile(`^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$`)
	// PyYAML's float rule, and the one OmegaConf adds (exponents without a
	// dot or a sign).
	yaml11Float = regexp.MustCompile(`^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$`)
	omegaFloat  = regexp.MustCompile(`^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$`)
	yaml11Null  = regexp.MustCompile(`^(?:~|null|Null|NULL|)$`)
)

// retag types every plain scalar under n as OmegaConf does.
func retag(n *yaml.Node) {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Style&(yaml.TaggedStyle|yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
			return
		}
		tag, val := yaml11Scalar(n.Value)
		n.Tag, n.Value = tag, val
	case yaml.MappingNode:
		// Keys stay strings; values are typed.
		for i := 1; i < len(n.Content); i += 2 {
			retag(n.Content[i])
		}
	case yaml.SequenceNode, yaml.DocumentNode:
		for _, c := range n.Content {
			retag(c)
		}
	}
}

// yaml11Scalar types plain scalar s: its tag and canonical value.
func yaml11Scalar(s string) (tag, val string) {
	switch {
	case yaml11Bool.MatchString(s):
		switch strings.ToLower(s) {
		case "yes", "true", "on":
			return "!!bool", "true"
		}
		return "!!bool", "false"
	case yaml11Float.MatchString(s):
		if v, ok := yaml11FloatValue(s); ok {
			return "!!float", v
		}
	case yaml11Int.MatchString(s):
		if v, ok := yaml11IntValue(s); ok {
			return "!!int", v
		}
	case yaml11Null.MatchString(s):
		return "!!null", "null"
	case omegaFloat.MatchString(s):
		if v, ok := yaml11FloatValue(s); ok {
			return "!!float", v
		}
	}
	return "!!str", s
}

// yaml11IntValue is PyYAML's construct_yaml_int, as a decimal string.
func yaml11IntValue(s string) (string, bool) {
	v := strings.ReplaceAll(s, "_", "")
	neg := false
	if v != "" && (v[0] == '-' || v[0] == '+') {
		neg = v[0] == '-'
		v = v[1:]
	}
	n := new(big.Int)
	ok := true
	switch {
	case v == "0":
	case strings.HasPrefix(v, "0b"):
		_, ok = n.SetString(v[2:], 2)
	case strings.HasPrefix(v, "0x"):
		_, ok = n.SetString(v[2:], 16)
	case strings.HasPrefix(v, "0"):
		_, ok = n.SetString(v[1:], 8)
	case strings.Contains(v, ":"):
		for _, d := range strings.Split(v, ":") {
			x, err := strconv.ParseInt(d, 10, 64)
			if err != nil {
				return "", false
			}
			n.Mul(n, big.NewInt(60))
			n.Add(n, big.NewInt(x))
		}
	default:
		_, ok = n.SetString(v, 10)
	}
	if !ok {
		return "", false
	}
	if neg {
		n.Neg(n)
	}
	return n.String(), true
}

// yaml11FloatValue is PyYAML's construct_yaml_float, in canonical YAML form.
func yaml11FloatValue(s string) (string, bool) {
	v := strings.ToLower(strings.ReplaceAll(s, "_", ""))
	sign := 1.0
	if v != "" && (v[0] == '-' || v[0] == '+') {
		if v[0] == '-' {
			sign = -1
		}
		v = v[1:]
	}
	var f float64
	switch {
	case v == ".inf":
		f = math.Inf(1)
	case v == ".nan":
		f = math.NaN()
	case strings.Contains(v, ":"):
		parts := strings.Split(v, ":")
		base := 1.0
		for i := len(parts) - 1; i >= 0; i-- {
			x, err := strconv.ParseFloat(parts[i], 64)
			if err != nil {
				return "", false
			}
			f += x * base
			base *= 60
		}
	default:
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return "", false
		}
		f = x
	}
	return formatYAMLFloat(sign * f), true
}

// formatYAMLFloat writes f so that yaml.v3 reads back the same float64.
func formatYAMLFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return ".inf"
	case math.IsInf(f, -1):
		return "-.inf"
	case math.IsNaN(f):
		return ".nan"
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".en") {
		s += ".0" // keep it a float when printed
	}
	return s
}
