package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxInterpDepth bounds nested references (a cycle is reported before this).
const maxInterpDepth = 256

// resolver evaluates ${...} interpolations over one tree.
type resolver struct {
	ld    *loader
	root  *yaml.Node
	state map[*yaml.Node]int // 1: resolving, 2: done
	depth int
}

// resolveAll replaces every interpolated string in root by its value.
func (ld *loader) resolveAll(root *yaml.Node) error {
	r := &resolver{ld: ld, root: root, state: map[*yaml.Node]int{}}
	return r.node(root, "")
}

func (r *resolver) node(n *yaml.Node, path string) error {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i < len(n.Content); i += 2 {
			if err := r.node(n.Content[i+1], join(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if err := r.node(c, join(path, strconv.Itoa(i))); err != nil {
				return err
			}
		}
	case yaml.ScalarNode:
		return r.scalar(n, path)
	}
	return nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// scalar resolves n in place when it is a string holding "${".
func (r *resolver) scalar(n *yaml.Node, path string) error {
	if n.Tag != "!!str" || !strings.Contains(n.Value, "${") || r.state[n] == 2 {
		return nil
	}
	if r.state[n] == 1 {
		return fmt.Errorf("config: %s: %s: interpolation cycle through %q", r.ld.where(n), path, n.Value)
	}
	r.depth++
	defer func() { r.depth-- }()
	if r.depth > maxInterpDepth {
		return fmt.Errorf("config: %s: %s: interpolation nested deeper than %d", r.ld.where(n), path, maxInterpDepth)
	}
	r.state[n] = 1
	v, err := r.eval(n.Value, n, path)
	if err != nil {
		return err
	}
	line, col := n.Line, n.Column
	origin, had := r.ld.origin[n]
	*n = *v
	n.Line, n.Column = line, col
	if had {
		r.ld.mark(n, origin)
	}
	r.state[n] = 2
	return nil
}

// eval evaluates a string with interpolations. A string that is exactly one
// ${...} yields the referenced node (copied, type kept); otherwise the parts are
// concatenated into a string.
func (r *resolver) eval(s string, at *yaml.Node, path string) (*yaml.Node, error) {
	var parts []*yaml.Node
	var lits []string
	i := 0
	for i < len(s) {
		j := strings.Index(s[i:], "${")
		if j < 0 {
			lits = append(lits, s[i:])
			parts = append(parts, nil)
			break
		}
		if j > 0 {
			lits = append(lits, s[i:i+j])
			parts = append(parts, nil)
		}
		end, err := matchBrace(s, i+j)
		if err != nil {
			return nil, fmt.Errorf("config: %s: %s: %q: %w", r.ld.where(at), path, s, err)
		}
		v, err := r.expr(s[i+j+2:end], at, path)
		if err != nil {
			return nil, err
		}
		lits = append(lits, "")
		parts = append(parts, v)
		i = end + 1
	}
	if len(parts) == 1 && parts[0] != nil {
		return parts[0], nil
	}
	var b strings.Builder
	for k, p := range parts {
		if p == nil {
			b.WriteString(lits[k])
			continue
		}
		if p.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("config: %s: %s: %q: cannot put %s inside a string", r.ld.where(at), path, s, describe(p))
		}
		b.WriteString(p.Value)
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: b.String()}, nil
}

// matchBrace returns the index of the "}" closing the "${" at s[open].
func matchBrace(s string, open int) (int, error) {
	depth := 0
	for k := open; k < len(s); k++ {
		switch {
		case strings.HasPrefix(s[k:], "${"):
			depth++
			k++
		case s[k] == '}':
			depth--
			if depth == 0 {
				return k, nil
			}
		}
	}
	return 0, fmt.Errorf("unterminated ${")
}

// expr evaluates the inside of one ${...}: a key path or resolver:args.
func (r *resolver) expr(e string, at *yaml.Node, path string) (*yaml.Node, error) {
	e = strings.TrimSpace(e)
	if name, args, ok := splitResolver(e); ok {
		return r.call(name, args, at, path)
	}
	if e == "" || strings.HasPrefix(e, ".") {
		return nil, fmt.Errorf("config: %s: %s: interpolation ${%s}: want an absolute key path", r.ld.where(at), path, e)
	}
	target := lookup(r.root, splitPath(e))
	if target == nil {
		return nil, fmt.Errorf("config: %s: %s: interpolation ${%s}: no such key", r.ld.where(at), path, e)
	}
	if err := r.node(target, e); err != nil {
		return nil, err
	}
	return deepCopy(target), nil
}

// splitResolver splits "name:a,b" at its first top-level colon.
func splitResolver(e string) (name string, args []string, ok bool) {
	depth := 0
	for k := 0; k < len(e); k++ {
		switch {
		case strings.HasPrefix(e[k:], "${"):
			depth++
			k++
		case e[k] == '}':
			depth--
		case e[k] == ':' && depth == 0:
			name = strings.TrimSpace(e[:k])
			rest := e[k+1:]
			start, d := 0, 0
			for q := 0; q < len(rest); q++ {
				switch {
				case strings.HasPrefix(rest[q:], "${"):
					d++
					q++
				case rest[q] == '}':
					d--
				case rest[q] == ',' && d == 0:
					args = append(args, strings.TrimSpace(rest[start:q]))
					start = q + 1
				}
			}
			args = append(args, strings.TrimSpace(rest[start:]))
			return name, args, true
		}
	}
	return "", nil, false
}

// call evaluates a resolver. Only mul exists (NeMo RL registers it).
func (r *resolver) call(name string, args []string, at *yaml.Node, path string) (*yaml.Node, error) {
	if name != "mul" {
		return nil, fmt.Errorf("config: %s: %s: unknown resolver %q (tracegrpo has: mul)", r.ld.where(at), path, name)
	}
	if len(args) != 2 {
		return nil, fmt.Errorf("config: %s: %s: ${mul:...} takes 2 arguments, found %d", r.ld.where(at), path, len(args))
	}
	var ints [2]int64
	var flts [2]float64
	allInt := true
	for k, a := range args {
		var v *yaml.Node
		if strings.Contains(a, "${") {
			var err error
			if v, err = r.eval(a, at, path); err != nil {
				return nil, err
			}
		} else {
			v = &yaml.Node{}
			if err := yaml.Unmarshal([]byte(a), v); err != nil || len(v.Content) != 1 {
				return nil, fmt.Errorf("config: %s: %s: ${mul:...} argument %q is not a number", r.ld.where(at), path, a)
			}
			v = v.Content[0]
		}
		if v.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("config: %s: %s: ${mul:...} argument %q is %s, want a number", r.ld.where(at), path, a, describe(v))
		}
		if n, err := strconv.ParseInt(v.Value, 10, 64); err == nil {
			ints[k], flts[k] = n, float64(n)
			continue
		}
		f, err := strconv.ParseFloat(v.Value, 64)
		if err != nil {
			return nil, fmt.Errorf("config: %s: %s: ${mul:...} argument %q is %q, want a number", r.ld.where(at), path, a, v.Value)
		}
		allInt = false
		flts[k] = f
	}
	if allInt {
		p := ints[0] * ints[1]
		if ints[0] != 0 && p/ints[0] != ints[1] {
			return nil, fmt.Errorf("config: %s: %s: ${mul:%d,%d} overflows int64", r.ld.where(at), path, ints[0], ints[1])
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(p, 10)}, nil
	}
	p := flts[0] * flts[1]
	if math.IsInf(p, 0) || math.IsNaN(p) {
		return nil, fmt.Errorf("config: %s: %s: ${mul:...} is not finite", r.ld.where(at), path)
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(p, 'g', -1, 64)}, nil
}
