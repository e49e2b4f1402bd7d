package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxInterpDepth bounds nested references (a cycle is reported before this).
const maxInterpDepth = 256

// maxValueBytes bounds one resolved value (a string, or a container's
// keys, scalars and nodes), and maxResolvedBytes all the values one load
// resolves: 40 lines of x_i: ${x_{i-1}}${x_{i-1}} would otherwise build a
// 2^40-byte string (a fan-out bomb), as YAML aliases would without
// maxTreeNodes.
const (
	maxValueBytes    = 1 << 20
	maxResolvedBytes = 1 << 24
)

// missingValue is OmegaConf's mandatory value: a key that a later file or an
// override must set.
const missingValue = "???"

// isMissing reports whether n is the mandatory-value marker "???".
func isMissing(n *yaml.Node) bool {
	return n != nil && n.Kind == yaml.ScalarNode && n.Tag == "!!str" && n.Value == missingValue
}

// Resolvers names the resolvers tracegrpo evaluates, as OmegaConf does: the
// four NeMo RL registers (nemo_rl/utils/config.py: add, mul, div and max are
// Python's a + b, a * b, a / b and max(a, b)) and OmegaConf's oc.env,
// oc.select and oc.decode.
const Resolvers = "add, mul, div, max, oc.env, oc.select, oc.decode"

// resolver evaluates ${...} interpolations over one tree, on demand: a node
// is resolved when the walker reads it (or an interpolation refers to it), as
// OmegaConf resolves on access. Keys tracegrpo does not read are never
// resolved, so an oc.env variable that only an engine block names need not
// be set.
type resolver struct {
	ld     *loader
	root   *yaml.Node
	parent map[*yaml.Node]*yaml.Node
	state  map[*yaml.Node]int // resolving, resolved or failed
	// failed holds the error of each node whose resolution failed: a second
	// read of it returns the same error (the walker reports it once), not a
	// false "cycle".
	failed map[*yaml.Node]error
	// stack are the nodes being resolved, outermost first (a cycle is the
	// part of it from the node met again).
	stack  []*yaml.Node
	spent  int64 // bytes of the values resolved so far (maxResolvedBytes)
	getenv func(string) (string, bool)
}

// The states of a node holding an interpolation.
const (
	unresolved = iota
	resolving
	resolved
	failed
)

func newResolver(ld *loader, root *yaml.Node) *resolver {
	r := &resolver{ld: ld, root: root, parent: map[*yaml.Node]*yaml.Node{}, state: map[*yaml.Node]int{},
		failed: map[*yaml.Node]error{}, getenv: os.LookupEnv}
	r.index(root)
	return r
}

// index records the parent of every node under n.
func (r *resolver) index(n *yaml.Node) {
	step := 1
	if n.Kind == yaml.MappingNode {
		step = 2
	}
	for i := 0; i < len(n.Content); i += step {
		c := n.Content[i]
		if n.Kind == yaml.MappingNode {
			c = n.Content[i+1]
		}
		r.parent[c] = n
		r.index(c)
	}
}

// deep resolves n and everything under it.
func (r *resolver) deep(n *yaml.Node, path string) error {
	if err := r.shallow(n, path); err != nil {
		return err
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i < len(n.Content); i += 2 {
			if err := r.deep(n.Content[i+1], join(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if err := r.deep(c, join(path, strconv.Itoa(i))); err != nil {
				return err
			}
		}
	}
	return nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// shallow resolves n itself in place when it is a string holding "${".
// A node whose resolution failed keeps its error: reading it again returns
// that error, the same value, so that it is reported once.
func (r *resolver) shallow(n *yaml.Node, path string) error {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" || !strings.Contains(n.Value, "${") {
		return nil
	}
	switch r.state[n] {
	case resolved:
		return nil
	case failed:
		return r.failed[n]
	case resolving:
		return r.cycle(n)
	}
	if len(r.stack) >= maxInterpDepth {
		return fmt.Errorf("config: %s: %s: interpolation nested deeper than %d", r.ld.where(n), orRoot(r.pathOf(n, path)), maxInterpDepth)
	}
	r.state[n] = resolving
	r.stack = append(r.stack, n)
	err := r.resolve(n, path)
	r.stack = r.stack[:len(r.stack)-1]
	if err != nil {
		r.state[n], r.failed[n] = failed, err
		return err
	}
	return nil
}

func (r *resolver) resolve(n *yaml.Node, path string) error {
	t, err := parseText(n.Value)
	if err != nil {
		return fmt.Errorf("config: %s: %s: %w", r.ld.where(n), orRoot(path), err)
	}
	ctx := &ictx{at: n, path: path}
	v, err := r.text(t, ctx)
	if err != nil {
		return err
	}
	if err := r.spend(v, ctx); err != nil {
		return err
	}
	line, col := n.Line, n.Column
	origin, had := r.ld.origin[n]
	*n = *v.toNode()
	n.Line, n.Column = line, col
	if had {
		r.ld.mark(n, origin)
	}
	r.index(n)
	r.state[n] = resolved
	return nil
}

// cycle is the error of node n met again while it is being resolved: the
// keys of the cycle, in the order they refer to each other.
func (r *resolver) cycle(n *yaml.Node) error {
	i := len(r.stack) - 1
	for i > 0 && r.stack[i] != n {
		i--
	}
	var keys []string
	for _, m := range r.stack[i:] {
		keys = append(keys, orRoot(r.pathOf(m, "")))
	}
	keys = append(keys, keys[0])
	return fmt.Errorf("config: %s: interpolation cycle: %s", r.ld.where(n), strings.Join(keys, " -> "))
}

// pathOf is the key path of node n (list indices as segments), found from
// the parents; fallback when n is not in the tree.
func (r *resolver) pathOf(n *yaml.Node, fallback string) string {
	var segs []string
	for c := n; c != r.root; {
		p := r.parent[c]
		if p == nil {
			return fallback
		}
		switch p.Kind {
		case yaml.MappingNode:
			for i := 1; i < len(p.Content); i += 2 {
				if p.Content[i] == c {
					segs = append(segs, p.Content[i-1].Value)
					break
				}
			}
		case yaml.SequenceNode:
			for i, e := range p.Content {
				if e == c {
					segs = append(segs, strconv.Itoa(i))
					break
				}
			}
		}
		c = p
	}
	for i, j := 0, len(segs)-1; i < j; i, j = i+1, j-1 {
		segs[i], segs[j] = segs[j], segs[i]
	}
	return strings.Join(segs, ".")
}

// size is the bytes v stands for: a string's length, a container's keys and
// scalars plus 16 per node; it stops counting past limit.
func size(v pyval, limit int64) int64 {
	switch v.kind {
	case pyStr:
		return int64(len(v.s))
	case pyMap, pyList:
		return nodeSize(v.node, limit)
	}
	return 16
}

func nodeSize(n *yaml.Node, limit int64) int64 {
	s := int64(16 + len(n.Value))
	for _, c := range n.Content {
		if s > limit {
			break
		}
		s += nodeSize(c, limit-s)
	}
	return s
}

// spend charges value v to the budgets: one value at most maxValueBytes,
// all of them maxResolvedBytes.
func (r *resolver) spend(v pyval, ctx *ictx) error {
	s := size(v, maxValueBytes)
	if s > maxValueBytes {
		return r.tooLarge(ctx)
	}
	r.spent += s
	if r.spent > maxResolvedBytes {
		return r.errf(ctx, "the recipe's interpolations resolve to more than %d MiB in all (interpolations that repeat others fan out: each ${x}${x} doubles)", maxResolvedBytes>>20)
	}
	return nil
}

func (r *resolver) tooLarge(ctx *ictx) error {
	return r.errf(ctx, "the resolved value exceeds %d MiB (interpolations that repeat others fan out: each ${x}${x} doubles)", maxValueBytes>>20)
}

// ictx is where an interpolation is evaluated: the node holding it.
type ictx struct {
	at   *yaml.Node
	path string
}

func (r *resolver) errf(ctx *ictx, format string, args ...any) error {
	return fmt.Errorf("config: %s: %s: %s", r.ld.where(ctx.at), ctx.path, fmt.Sprintf(format, args...))
}

// text evaluates text with interpolations: exactly one interpolation keeps
// its value and type; anything else is the concatenation of Python's str()
// of each part.
func (r *resolver) text(t *itext, ctx *ictx) (pyval, error) {
	if len(t.parts) == 1 && t.parts[0].interp != nil {
		return r.interp(t.parts[0].interp, ctx)
	}
	var b strings.Builder
	for _, p := range t.parts {
		if p.interp == nil {
			b.WriteString(p.lit)
			continue
		}
		v, err := r.interp(p.interp, ctx)
		if err != nil {
			return pyval{}, err
		}
		if err := r.concat(&b, v, ctx); err != nil {
			return pyval{}, err
		}
	}
	return pyStrVal(b.String()), nil
}

// concat appends str(v) to b within maxValueBytes.
func (r *resolver) concat(b *strings.Builder, v pyval, ctx *ictx) error {
	if int64(b.Len())+size(v, maxValueBytes) > maxValueBytes {
		return r.tooLarge(ctx)
	}
	s := v.str()
	if b.Len()+len(s) > maxValueBytes {
		return r.tooLarge(ctx)
	}
	b.WriteString(s)
	return nil
}

func (r *resolver) interp(n *inode, ctx *ictx) (pyval, error) {
	if n.resolver {
		return r.call(n, ctx)
	}
	key, err := r.keyString(n.key, ctx)
	if err != nil {
		return pyval{}, err
	}
	target, err := r.selectNode(strings.Repeat(".", n.dots)+key, ctx)
	if err != nil {
		return pyval{}, r.errf(ctx, "interpolation %s: %v", clip(n.src), err)
	}
	if target == nil {
		return pyval{}, r.errf(ctx, "interpolation %s: no such key", clip(n.src))
	}
	if err := r.deep(target, strings.TrimLeft(key, ".")); err != nil {
		return pyval{}, err
	}
	if isMissing(target) {
		return pyval{}, r.errf(ctx, "interpolation %s: the key is a mandatory value (???) that no file or override set", clip(n.src))
	}
	v, err := toPy(target)
	if err != nil {
		return pyval{}, r.errf(ctx, "interpolation %s: %v", clip(n.src), err)
	}
	if v.kind == pyMap || v.kind == pyList {
		if nodeSize(target, maxValueBytes) > maxValueBytes {
			return pyval{}, r.tooLarge(ctx)
		}
		v.node = deepCopy(target)
	}
	return v, nil
}

// keyString joins key segments into OmegaConf's key text ("a.b[0]").
func (r *resolver) keyString(segs []kseg, ctx *ictx) (string, error) {
	var b strings.Builder
	for i, s := range segs {
		v := s.lit
		if s.sub != nil {
			pv, err := r.interp(s.sub, ctx)
			if err != nil {
				return "", err
			}
			if pv.kind != pyStr {
				return "", r.errf(ctx, "interpolation %s names a key, so it must be a string, found %s", clip(s.sub.src), clip(pv.repr()))
			}
			v = pv.s
		}
		switch {
		case s.bracket:
			b.WriteString("[" + v + "]")
		case i > 0:
			b.WriteString("." + v)
		default:
			b.WriteString(v)
		}
	}
	return b.String(), nil
}

// splitKey splits OmegaConf key text ("a.b[c].d") into segments.
func splitKey(k string) ([]string, error) {
	var out []string
	for k != "" {
		switch {
		case k[0] == '[':
			j := strings.IndexByte(k, ']')
			if j < 0 {
				return nil, fmt.Errorf("unclosed [ in key")
			}
			out = append(out, k[1:j])
			k = k[j+1:]
		case k[0] == '.':
			k = k[1:]
		default:
			j := strings.IndexAny(k, ".[")
			if j < 0 {
				j = len(k)
			}
			out = append(out, k[:j])
			k = k[j:]
		}
	}
	return out, nil
}

// selectNode finds key (absolute, or relative with leading dots: one dot is
// the mapping or list holding the node being resolved, each more dot its
// parent) from ctx; nil when there is no such key.
func (r *resolver) selectNode(key string, ctx *ictx) (*yaml.Node, error) {
	base := r.root
	if strings.HasPrefix(key, ".") {
		base = r.parent[ctx.at]
		key = key[1:]
		for strings.HasPrefix(key, ".") {
			key = key[1:]
			if base == nil {
				break
			}
			base = r.parent[base]
		}
		if base == nil {
			return nil, nil
		}
	}
	segs, err := splitKey(key)
	if err != nil {
		return nil, err
	}
	n := base
	for _, seg := range segs {
		if err := r.shallow(n, ""); err != nil {
			return nil, err
		}
		switch n.Kind {
		case yaml.MappingNode:
			j := mapIndex(n, seg)
			if j < 0 {
				return nil, nil
			}
			n = n.Content[j+1]
		case yaml.SequenceNode:
			i, ok := index(seg)
			if !ok || i >= len(n.Content) {
				return nil, nil
			}
			n = n.Content[i]
		default:
			return nil, nil
		}
	}
	return n, nil
}

// call evaluates a resolver.
func (r *resolver) call(n *inode, ctx *ictx) (pyval, error) {
	name, err := r.keyString(n.name, ctx)
	if err != nil {
		return pyval{}, err
	}
	args := make([]pyval, len(n.args))
	for i, a := range n.args {
		if args[i], err = r.element(a, ctx); err != nil {
			return pyval{}, err
		}
	}
	bad := func(format string, a ...any) (pyval, error) {
		return pyval{}, r.errf(ctx, "%s: %s", clip(n.src), fmt.Sprintf(format, a...))
	}
	binary := map[string]func(a, b pyval) (pyval, error){"add": pyAdd, "mul": pyMul, "div": pyDiv, "max": pyMax}
	if op, ok := binary[name]; ok {
		if len(args) != 2 {
			return bad("%s takes 2 arguments, found %d", name, len(args))
		}
		v, err := op(args[0], args[1])
		if err != nil {
			return bad("%v", err)
		}
		if size(v, maxValueBytes) > maxValueBytes {
			return pyval{}, r.tooLarge(ctx)
		}
		return v, nil
	}
	switch name {
	case "oc.env":
		if len(args) < 1 || len(args) > 2 || args[0].kind != pyStr {
			return bad("oc.env takes a variable name and an optional default")
		}
		if v, ok := r.getenv(args[0].s); ok {
			return pyStrVal(v), nil
		}
		if len(args) == 2 {
			if args[1].kind == pyNone {
				return args[1], nil
			}
			return pyStrVal(args[1].str()), nil
		}
		return bad("environment variable %s is not set (give a default: ${oc.env:%s,default})", clip(args[0].s), clip(args[0].s))
	case "oc.select":
		if len(args) < 1 || len(args) > 2 || args[0].kind != pyStr {
			return bad("oc.select takes a key and an optional default")
		}
		target, err := r.selectNode(args[0].s, ctx)
		if err != nil {
			return bad("%v", err)
		}
		if target != nil {
			if err := r.deep(target, args[0].s); err != nil {
				return pyval{}, err
			}
		}
		if target == nil || isMissing(target) {
			if len(args) == 2 {
				return args[1], nil
			}
			return pyval{kind: pyNone}, nil
		}
		v, err := toPy(target)
		if err != nil {
			return bad("%v", err)
		}
		if v.kind == pyMap || v.kind == pyList {
			if nodeSize(target, maxValueBytes) > maxValueBytes {
				return pyval{}, r.tooLarge(ctx)
			}
			v.node = deepCopy(target)
		}
		return v, nil
	case "oc.decode":
		if len(args) != 1 {
			return bad("oc.decode takes 1 argument, found %d", len(args))
		}
		switch args[0].kind {
		case pyNone:
			return args[0], nil
		case pyStr:
		default:
			return bad("oc.decode takes a string or null, found %s", args[0].kind)
		}
		e, err := parseElement(args[0].s)
		if err != nil {
			return bad("%v", err)
		}
		return r.element(e, ctx)
	}
	return bad("unknown resolver %q (tracegrpo has: %s)", name, Resolvers)
}

// element evaluates a resolver argument.
func (r *resolver) element(e *elem, ctx *ictx) (pyval, error) {
	switch e.kind {
	case elemEmpty:
		return pyStrVal(""), nil
	case elemQuoted:
		v, err := r.text(e.quoted, ctx)
		if err != nil {
			return pyval{}, err
		}
		return pyStrVal(v.str()), nil
	case elemList:
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, it := range e.list {
			v, err := r.element(it, ctx)
			if err != nil {
				return pyval{}, err
			}
			n.Content = append(n.Content, v.toNode())
		}
		return pyval{kind: pyList, node: n}, nil
	case elemDict:
		n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for _, kv := range e.dict {
			v, err := r.element(kv.val, ctx)
			if err != nil {
				return pyval{}, err
			}
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: kv.key}, v.toNode())
		}
		return pyval{kind: pyMap, node: n}, nil
	}
	if len(e.toks) == 1 {
		t := e.toks[0]
		switch t.typ {
		case tokInterp:
			return r.interp(t.sub, ctx)
		case tokNull:
			return pyval{kind: pyNone}, nil
		case tokBool:
			return pyval{kind: pyBool, b: strings.EqualFold(t.text, "true")}, nil
		case tokInt:
			i, err := strconv.ParseInt(strings.ReplaceAll(t.text, "_", ""), 10, 64)
			if err != nil {
				return pyval{}, r.errf(ctx, "integer %s does not fit 64 bits", t.text)
			}
			return pyval{kind: pyInt, i: i}, nil
		case tokFloat:
			f, err := strconv.ParseFloat(strings.ReplaceAll(t.text, "_", ""), 64)
			if err != nil {
				return pyval{}, r.errf(ctx, "bad number %s", t.text)
			}
			return pyval{kind: pyFloat, f: f}, nil
		case tokEsc:
			return pyStrVal(everyOther(t.text)), nil
		}
		return pyStrVal(t.text), nil
	}
	var b strings.Builder
	for _, t := range e.toks {
		switch t.typ {
		case tokEsc:
			b.WriteString(everyOther(t.text))
		case tokInterp:
			v, err := r.interp(t.sub, ctx)
			if err != nil {
				return pyval{}, err
			}
			if err := r.concat(&b, v, ctx); err != nil {
				return pyval{}, err
			}
		default:
			b.WriteString(t.text)
		}
	}
	return pyStrVal(b.String()), nil
}
