package config

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Hydra overrides, as NeMo RL's examples/run_grpo.py takes them after
// --config (nemo_rl/utils/config.py: parse_hydra_overrides puts the composed
// recipe in struct mode and applies Hydra's overrides to it). The grammar is
// Hydra's (hydra.cc, "Basic Override syntax"):
//
//	key=value    change a key the recipe has (an error if it has none)
//	+key=value   add a key the recipe lacks (an error if it has a value,
//	             unless value is a list or a dict)
//	++key=value  add or change
//	~key         delete a key (~key=value: only if it has that value)
//
// A value is a primitive (one token keeps its type: 10, 1.5, 1e-6, true,
// null, inf; several make a string, "a b" and /path/to/x included, with
// \( \) \[ \] \{ \} \: \= \, \  escaped), a quoted string ('...' or "...",
// always a string, with \' or \" for the quote), an interpolation (${...},
// resolved with the rest of the recipe; quote one that holds braces), a
// list [a, b] (assigned) or a dict {a: 1} (merged into the mapping it
// overrides). Hydra's casts int(), float(), str(), bool() and extend_list()
// work; a sweep (a,b or choice(), range(), glob(), ...) asks for several
// runs and is refused, and so are config groups (a/b=x, key@pkg).

// hydraOp is what an override does.
type hydraOp int

const (
	hydraChange hydraOp = iota
	hydraAdd
	hydraForceAdd
	hydraDelete
)

// hydraOverride is one parsed override.
type hydraOverride struct {
	op    hydraOp
	key   string
	value *yaml.Node // nil: ~key without a value
	// extend: the value extends a list (extend_list).
	extend bool
	text   string
}

var hydraKey = regexp.MustCompile(`^(?:[A-Za-z_$][A-Za-z0-9_$\-]*|0|[1-9][0-9]*)(?:\.(?:[A-Za-z_$][A-Za-z0-9_$\-]*|0|[1-9][0-9]*))*$`)

// CheckOverride parses a Hydra override without applying it: a command line
// checks its positional arguments with it before any work.
func CheckOverride(s string) error {
	_, err := parseOverride(s)
	return err
}

// parseOverride parses one Hydra override.
func parseOverride(s string) (*hydraOverride, error) {
	o := &hydraOverride{text: s}
	rest := s
	switch {
	case strings.HasPrefix(rest, "~"):
		o.op, rest = hydraDelete, rest[1:]
	case strings.HasPrefix(rest, "++"):
		o.op, rest = hydraForceAdd, rest[2:]
	case strings.HasPrefix(rest, "+"):
		o.op, rest = hydraAdd, rest[1:]
	}
	key, val, hasVal := strings.Cut(rest, "=")
	if strings.ContainsAny(key, "/@") {
		return nil, fmt.Errorf("override %s: %s names a Hydra config group or package; NeMo RL recipes have none (write key.path=value)", quoted(s), quoted(key))
	}
	if !hydraKey.MatchString(key) {
		return nil, fmt.Errorf("override %s: want key.path=value (+key=value adds a key, ++key=value adds or changes, ~key deletes), found the key %s", quoted(s), quoted(key))
	}
	o.key = key
	if !hasVal {
		if o.op != hydraDelete {
			return nil, fmt.Errorf("override %s: want key.path=value (~%s deletes the key)", quoted(s), clip(key))
		}
		return o, nil
	}
	p := &hparser{s: val}
	p.skipWS()
	if p.i == len(p.s) {
		// key= is the empty string.
		o.value = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: ""}
		return o, nil
	}
	v, ext, err := p.value()
	if err != nil {
		return nil, fmt.Errorf("override %s: %w", quoted(s), err)
	}
	o.value, o.extend = v, ext
	return o, nil
}

// hparser parses an override value (Hydra's VALUE_MODE).
type hparser struct {
	s     string
	i     int
	depth int
}

func (p *hparser) errf(format string, args ...any) error {
	return fmt.Errorf("%s at offset %d of the value %s", fmt.Sprintf(format, args...), p.i, quoted(p.s))
}

func (p *hparser) skipWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *hparser) wsThen(c byte) bool {
	j := p.i
	for j < len(p.s) && (p.s[j] == ' ' || p.s[j] == '\t') {
		j++
	}
	return j < len(p.s) && p.s[j] == c
}

func (p *hparser) eat(c byte) bool {
	if !p.wsThen(c) {
		return false
	}
	p.skipWS()
	p.i++
	p.skipWS()
	return true
}

// value parses value EOF: an element, refusing a sweep.
func (p *hparser) value() (*yaml.Node, bool, error) {
	n, ext, err := p.element()
	if err != nil {
		return nil, false, err
	}
	p.skipWS()
	if p.i < len(p.s) && p.s[p.i] == ',' {
		if strings.Contains(p.s, "${") {
			return nil, false, fmt.Errorf("%s: an interpolation holding braces or commas must be quoted, as Hydra requires: 'key=\"%s\"'", quoted(p.s), clip(p.s))
		}
		return nil, false, fmt.Errorf("%s is a sweep (Hydra's multirun: several runs); tracegrpo runs one configuration. For a list write [%s], for a string quote it: '%s'", quoted(p.s), clip(p.s), clip(p.s))
	}
	if p.i != len(p.s) {
		return nil, false, p.errf("unexpected %q", p.s[p.i])
	}
	return n, ext, nil
}

var hydraFuncs = map[string]bool{"int": true, "float": true, "str": true, "bool": true, "extend_list": true}
var hydraSweeps = map[string]bool{"choice": true, "range": true, "interval": true, "glob": true, "tag": true, "sort": true, "shuffle": true}

// element parses a primitive, quoted string, list, dict or function call.
func (p *hparser) element() (*yaml.Node, bool, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxGrammarDepth {
		return nil, false, p.errf("values nested deeper than %d", maxGrammarDepth)
	}
	if p.i >= len(p.s) {
		return nil, false, p.errf("want a value")
	}
	switch p.s[p.i] {
	case '[':
		p.i++
		p.skipWS()
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		if p.eat(']') {
			return n, false, nil
		}
		for {
			e, _, err := p.element()
			if err != nil {
				return nil, false, err
			}
			n.Content = append(n.Content, e)
			if p.eat(',') {
				continue
			}
			if p.eat(']') {
				return n, false, nil
			}
			return nil, false, p.errf("want , or ] in a list")
		}
	case '{':
		p.i++
		p.skipWS()
		n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		if p.eat('}') {
			return n, false, nil
		}
		for {
			k, err := p.primitive(true)
			if err != nil {
				return nil, false, err
			}
			if !p.eat(':') {
				return nil, false, p.errf("want : after a dict key")
			}
			v, _, err := p.element()
			if err != nil {
				return nil, false, err
			}
			if mapIndex(n, k.Value) >= 0 {
				return nil, false, p.errf("duplicate dict key %q", k.Value)
			}
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k.Value}, v)
			if p.eat(',') {
				continue
			}
			if p.eat('}') {
				return n, false, nil
			}
			return nil, false, p.errf("want , or } in a dict")
		}
	case '\'', '"':
		s, err := p.quoted()
		if err != nil {
			return nil, false, err
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}, false, nil
	}
	if m := idRun.FindString(p.s[p.i:]); m != "" && p.wsAfter(len(m), '(') {
		return p.function(m)
	}
	n, err := p.primitive(false)
	return n, false, err
}

// wsAfter reports whether, k bytes on, optional blanks and c follow.
func (p *hparser) wsAfter(k int, c byte) bool {
	j := p.i + k
	for j < len(p.s) && (p.s[j] == ' ' || p.s[j] == '\t') {
		j++
	}
	return j < len(p.s) && p.s[j] == c
}

// function parses name(args) for the casts and extend_list.
func (p *hparser) function(name string) (*yaml.Node, bool, error) {
	if hydraSweeps[name] {
		return nil, false, fmt.Errorf("%s(...) is a Hydra sweep (several runs); tracegrpo runs one configuration", name)
	}
	if !hydraFuncs[name] {
		return nil, false, fmt.Errorf("%s(...) is not a Hydra function tracegrpo knows (it has int, float, str, bool and extend_list)", name)
	}
	p.i += len(name)
	p.skipWS()
	p.i++ // (
	p.skipWS()
	var args []*yaml.Node
	if !p.eat(')') {
		for {
			// A named argument: name=value.
			if m := idRun.FindString(p.s[p.i:]); m != "" && p.wsAfter(len(m), '=') {
				p.i += len(m)
				p.eat('=')
			}
			a, _, err := p.element()
			if err != nil {
				return nil, false, err
			}
			args = append(args, a)
			if p.eat(',') {
				continue
			}
			if p.eat(')') {
				break
			}
			return nil, false, p.errf("want , or ) in %s(...)", name)
		}
	}
	if name == "extend_list" {
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, a := range args {
			if a.Kind == yaml.SequenceNode {
				n.Content = append(n.Content, a.Content...)
			} else {
				n.Content = append(n.Content, a)
			}
		}
		return n, true, nil
	}
	if len(args) != 1 {
		return nil, false, fmt.Errorf("%s(...) takes one value, found %d", name, len(args))
	}
	v, err := hydraCast(name, args[0])
	return v, false, err
}

// hydraCast is Hydra's cast function (lists and dicts cast element-wise).
func hydraCast(name string, n *yaml.Node) (*yaml.Node, error) {
	switch n.Kind {
	case yaml.SequenceNode, yaml.MappingNode:
		c := deepCopy(n)
		step, off := 1, 0
		if n.Kind == yaml.MappingNode {
			step, off = 2, 1
		}
		for i := off; i < len(c.Content); i += step {
			v, err := hydraCast(name, c.Content[i])
			if err != nil {
				return nil, err
			}
			c.Content[i] = v
		}
		return c, nil
	}
	v, err := toPy(n)
	if err != nil {
		return nil, err
	}
	fail := func() (*yaml.Node, error) {
		return nil, fmt.Errorf("cannot cast %s to %s", clip(v.repr()), name)
	}
	_, f, isInt, isNum := v.number()
	switch name {
	case "str":
		if v.kind == pyFloat {
			return pyStrVal(pyFloatRepr(v.f)).toNode(), nil
		}
		if v.kind == pyBool {
			return pyStrVal(strconv.FormatBool(v.b)).toNode(), nil
		}
		return pyStrVal(v.str()).toNode(), nil
	case "int":
		switch {
		case isNum && isInt:
			i, _, _, _ := v.number()
			return pyval{kind: pyInt, i: i}.toNode(), nil
		case isNum:
			// Python's int(x) truncates towards zero; an int beyond 64
			// bits (int(1e20)) is refused, not wrapped.
			if f != f || f >= 1<<63 || f < -(1<<63) {
				return fail()
			}
			return pyval{kind: pyInt, i: int64(f)}.toNode(), nil
		case v.kind == pyStr:
			i, err := pyParseInt(v.s)
			if err != nil {
				return nil, fmt.Errorf("cannot cast %s to int: %v", clip(v.repr()), err)
			}
			return pyval{kind: pyInt, i: i}.toNode(), nil
		}
	case "float":
		switch {
		case isNum:
			return pyval{kind: pyFloat, f: f}.toNode(), nil
		case v.kind == pyStr:
			x, err := pyParseFloat(v.s)
			if err != nil {
				return fail()
			}
			return pyval{kind: pyFloat, f: x}.toNode(), nil
		}
	case "bool":
		switch {
		case isNum:
			return pyval{kind: pyBool, b: f != 0}.toNode(), nil
		case v.kind == pyStr && strings.EqualFold(v.s, "true"):
			return pyval{kind: pyBool, b: true}.toNode(), nil
		case v.kind == pyStr && strings.EqualFold(v.s, "false"):
			return pyval{kind: pyBool, b: false}.toNode(), nil
		}
	}
	return fail()
}

// Hydra's value tokens (OverrideLexer.g4, VALUE_MODE), in its order.
var hydraTokens = []struct {
	typ vtokType
	re  *regexp.Regexp
}{
	valueTokens[0], valueTokens[1], valueTokens[2], valueTokens[3],
	{tokUnquoted, longest(`[/\-\\+.$%*@?|]`)},
	{tokID, longest(`[a-zA-Z_][a-zA-Z0-9_\-]*`)},
	{tokEsc, longest(`(?:\\\\|\\\(|\\\)|\\\[|\\\]|\\\{|\\\}|\\:|\\=|\\,|\\ |\\\t)+`)},
	{tokWS, longest(`[ \t]+`)},
	{tokInterp, longest(`\$\{[^}]+\}`)},
}

// primitive parses an unquoted primitive (key: a dict key, no colon or
// interpolation). One token keeps its type; several make a string.
func (p *hparser) primitive(key bool) (*yaml.Node, error) {
	var toks []vtok
	for p.i < len(p.s) {
		r := p.s[p.i:]
		c := r[0]
		if c == ' ' || c == '\t' {
			j := strings.IndexFunc(r, func(x rune) bool { return x != ' ' && x != '\t' })
			if j < 0 || strings.ContainsRune(",])}", rune(r[j])) || key && r[j] == ':' {
				break
			}
		}
		if strings.ContainsRune(",])}", rune(c)) || key && c == ':' {
			break
		}
		if c == ':' {
			// A colon is part of an unquoted value ('=' must be escaped).
			toks = append(toks, vtok{typ: tokColon, text: string(c)})
			p.i++
			continue
		}
		best, bestLen := vtokType(-1), 0
		for _, t := range hydraTokens {
			if key && t.typ == tokInterp {
				continue
			}
			if m := t.re.FindString(r); len(m) > bestLen {
				best, bestLen = t.typ, len(m)
			}
		}
		if bestLen == 0 {
			hint := ""
			if strings.HasPrefix(r, "${") {
				hint = " (an interpolation holding braces must be quoted: 'key=\"${...}\"')"
			}
			return nil, p.errf("unexpected %q%s (quote the value, or escape the character with a backslash)", c, hint)
		}
		toks = append(toks, vtok{typ: best, text: r[:bestLen]})
		p.i += bestLen
	}
	if len(toks) == 0 {
		return nil, p.errf("want a value")
	}
	if len(toks) == 1 {
		t := toks[0]
		switch t.typ {
		case tokNull:
			return pyval{kind: pyNone}.toNode(), nil
		case tokBool:
			return pyval{kind: pyBool, b: strings.EqualFold(t.text, "true")}.toNode(), nil
		case tokInt:
			i, err := strconv.ParseInt(strings.ReplaceAll(t.text, "_", ""), 10, 64)
			if err != nil {
				return nil, p.errf("integer %s does not fit 64 bits", t.text)
			}
			return pyval{kind: pyInt, i: i}.toNode(), nil
		case tokFloat:
			f, err := strconv.ParseFloat(strings.ReplaceAll(t.text, "_", ""), 64)
			if err != nil {
				return nil, p.errf("bad number %s", t.text)
			}
			return pyval{kind: pyFloat, f: f}.toNode(), nil
		}
	}
	return pyStrVal(unescapeTokens(toks)).toNode(), nil
}

// quoted parses a quoted string: \q is the quote, and a run of backslashes
// before a quote is halved; anything else (interpolations included) is kept.
func (p *hparser) quoted() (string, error) {
	q := p.s[p.i]
	p.i++
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == q:
			p.i++
			return b.String(), nil
		case c == '\\':
			j := p.i
			for j < len(p.s) && p.s[j] == '\\' {
				j++
			}
			k := j - p.i
			if j < len(p.s) && p.s[j] == q {
				b.WriteString(strings.Repeat(`\`, k/2))
				if k%2 == 1 {
					b.WriteByte(q)
					j++
				}
			} else {
				b.WriteString(p.s[p.i:j])
			}
			p.i = j
		default:
			b.WriteByte(c)
			p.i++
		}
	}
	return "", p.errf("unterminated quoted string")
}

// applyOverride applies one override to the composed recipe root, as Hydra
// applies it to NeMo RL's config in struct mode.
func (ld *loader) applyOverride(root *yaml.Node, o *hydraOverride) error {
	origin := "override " + clip(o.text)
	if o.value != nil {
		ld.mark(o.value, origin)
	}
	segs := splitPath(o.key)
	sel := func() *yaml.Node {
		// OmegaConf.select(cfg, key, throw_on_missing=False): the value, with
		// interpolations resolved; None for an absent key, null or ???.
		// Resolving works on a copy (the recipe keeps its interpolations),
		// made only when there is something to resolve: a copy per
		// override made 60,000 overrides quadratic.
		n := ld.lookup(root, segs)
		if n == nil || isNull(n) || isMissing(n) {
			return nil
		}
		if !holdsInterpolation(n) {
			return n
		}
		c := deepCopy(root)
		n = lookup(c, segs)
		if err := newResolver(ld, c).deep(n, o.key); err != nil {
			return n
		}
		return n
	}
	switch o.op {
	case hydraDelete:
		cur := sel()
		if cur == nil {
			hint := ""
			if k := Nearest(o.key); k != "" && k != o.key && k != normPath(o.key) {
				hint = fmt.Sprintf(" (did you mean %s?)", k)
			}
			return fmt.Errorf("config: override %s: could not delete %s: it does not exist%s", clip(o.text), clip(o.key), hint)
		}
		if o.value != nil && !sameValue(cur, o.value) {
			return fmt.Errorf("config: override %s: could not delete %s: its value is %s, not %s", clip(o.text), clip(o.key), flowText(cur), flowText(o.value))
		}
		parent := lookup(root, segs[:len(segs)-1])
		if parent == nil || parent.Kind != yaml.MappingNode {
			return fmt.Errorf("config: override %s: could not delete %s: only a mapping's key can be deleted", clip(o.text), clip(o.key))
		}
		j := ld.find(parent, segs[len(segs)-1])
		parent.Content = append(parent.Content[:j:j], parent.Content[j+2:]...)
		delete(ld.keyAt, parent)
		return nil
	case hydraAdd:
		if sel() != nil && o.value.Kind != yaml.MappingNode && o.value.Kind != yaml.SequenceNode {
			return fmt.Errorf("config: override %s: could not append to config: an item is already at %s; remove the + to change it (%s), or write ++ to add or change it (+%s)", clip(o.text), clip(o.key), clip(o.text[1:]), clip(o.text))
		}
		return ld.update(root, segs, o, true)
	case hydraForceAdd:
		return ld.update(root, segs, o, true)
	}
	return ld.update(root, segs, o, false)
}

// update is OmegaConf.update(cfg, key, value, merge=True, force_add=add) on
// a struct-mode config: without add, every key on the way must exist.
func (ld *loader) update(root *yaml.Node, segs []string, o *hydraOverride, add bool) error {
	notThere := func(what string) error {
		text := clip(o.text)
		hint := ""
		// The whole key's nearest first (grp.num_prompts_per_step: did you
		// mean grpo.num_prompts_per_step?), else the missing part's.
		if k := Nearest(o.key); what != o.key && k != "" && k != o.key && k != normPath(o.key) {
			hint = fmt.Sprintf("did you mean %s? ", k)
		} else if k := Nearest(what); k != "" && k != what && k != normPath(what) {
			hint = fmt.Sprintf("did you mean %s? ", k)
		}
		return fmt.Errorf("config: override %s: could not override %s: %s%s is not in the recipe (a new key is added with +%s)", text, clip(o.key), hint, clip(what), strings.TrimLeft(text, "+"))
	}
	cur := root
	for k, seg := range segs {
		last := k == len(segs)-1
		var child *yaml.Node
		set := func(n *yaml.Node) {}
		switch cur.Kind {
		case yaml.MappingNode:
			j := ld.find(cur, seg)
			if j >= 0 {
				child = cur.Content[j+1]
				set = func(n *yaml.Node) { cur.Content[j+1] = n }
			} else if add {
				c := cur
				set = func(n *yaml.Node) {
					key := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: seg}
					ld.mark(key, "override "+clip(o.text)) // a message about the new key names its override
					c.Content = append(c.Content, key, n)
				}
			}
		case yaml.SequenceNode:
			i, ok := index(seg)
			if !ok || i >= len(cur.Content) {
				return fmt.Errorf("config: override %s: %s has no element %s", clip(o.text), clip(strings.Join(segs[:k], ".")), clip(seg))
			}
			child = cur.Content[i]
			set = func(n *yaml.Node) { cur.Content[i] = n }
		default:
			return notThere(strings.Join(segs[:k+1], "."))
		}
		if child == nil && !add {
			return notThere(strings.Join(segs[:k+1], "."))
		}
		if !last {
			if child == nil || child.Kind != yaml.MappingNode && child.Kind != yaml.SequenceNode {
				if !add {
					// The key exists but holds no mapping: struct mode
					// refuses the key below it.
					return notThere(strings.Join(segs[:k+2], "."))
				}
				child = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
				ld.mark(child, "override "+clip(o.text))
				set(child)
			}
			cur = child
			continue
		}
		v := o.value
		switch {
		case o.extend:
			if child == nil || child.Kind != yaml.SequenceNode {
				return fmt.Errorf("config: override %s: extend_list needs a list at %s", clip(o.text), clip(o.key))
			}
			child.Content = append(child.Content, v.Content...)
			return nil
		case child != nil && child.Kind == yaml.MappingNode && v.Kind == yaml.MappingNode:
			if !add {
				if k := newKey(child, v); k != "" {
					return notThere(o.key + "." + k)
				}
			}
			set(omegaMerge(child, v))
		case child != nil && (child.Kind == yaml.MappingNode && v.Kind == yaml.SequenceNode || child.Kind == yaml.SequenceNode && v.Kind == yaml.MappingNode):
			// OmegaConf's merge cannot merge a list into a mapping or the
			// reverse (ConfigTypeError), whatever the prefix.
			return fmt.Errorf("config: override %s: %s holds %s, and OmegaConf cannot merge %s into it; delete it first (~%s), then add the new value (+%s=...)",
				clip(o.text), clip(o.key), describe(child), describe(v), clip(o.key), clip(o.key))
		default:
			set(v)
		}
	}
	return nil
}

// holdsInterpolation reports whether n or a node under it is a string
// holding "${" (or n is itself a "${" at an index path's start).
func holdsInterpolation(n *yaml.Node) bool {
	if n.Kind == yaml.ScalarNode {
		return n.Tag == "!!str" && strings.Contains(n.Value, "${")
	}
	for _, c := range n.Content {
		if holdsInterpolation(c) {
			return true
		}
	}
	return false
}

// find is mapIndex(m, key) through an index of m's keys that the loader
// keeps across overrides (each override's lookup scanned the mapping, so
// 60,000 overrides of one section were quadratic). The index extends itself
// over keys appended since it was built; a deletion drops it.
func (ld *loader) find(m *yaml.Node, key string) int {
	if len(m.Content) < 32 {
		return mapIndex(m, key)
	}
	if ld.keyAt == nil {
		ld.keyAt = map[*yaml.Node]*keyPos{}
	}
	ix := ld.keyAt[m]
	if ix == nil || ix.n > len(m.Content) {
		ix = &keyPos{at: make(map[string]int, len(m.Content)/2)}
		ld.keyAt[m] = ix
	}
	for ; ix.n+1 < len(m.Content); ix.n += 2 {
		if _, dup := ix.at[m.Content[ix.n].Value]; !dup {
			ix.at[m.Content[ix.n].Value] = ix.n
		}
	}
	work.keyProbes.Add(1)
	if j, ok := ix.at[key]; ok && j+1 < len(m.Content) && m.Content[j].Value == key {
		return j
	}
	if _, ok := ix.at[key]; ok { // stale (the mapping was rewritten in place)
		delete(ld.keyAt, m)
		return mapIndex(m, key)
	}
	return -1
}

// lookup is lookup through find.
func (ld *loader) lookup(n *yaml.Node, path []string) *yaml.Node {
	for _, seg := range path {
		if n.Kind != yaml.MappingNode {
			if n = lookup(n, []string{seg}); n == nil { // a list index, or nothing
				return nil
			}
			continue
		}
		j := ld.find(n, seg)
		if j < 0 {
			return nil
		}
		n = n.Content[j+1]
	}
	return n
}

// keyPos indexes one mapping's keys: at[key] is the key node's index, for
// the first n nodes of its Content.
type keyPos struct {
	at map[string]int
	n  int
}

// newKey is a key path in src that dst lacks ("" when none).
func newKey(dst, src *yaml.Node) string {
	for i := 0; i < len(src.Content); i += 2 {
		k := src.Content[i].Value
		j := mapIndex(dst, k)
		if j < 0 {
			return k
		}
		d, s := dst.Content[j+1], src.Content[i+1]
		if d.Kind == yaml.MappingNode && s.Kind == yaml.MappingNode {
			if sub := newKey(d, s); sub != "" {
				return k + "." + sub
			}
		}
	}
	return ""
}

// sameValue compares two resolved values as Python's == compares config
// values: numbers exactly across int, float and bool (1 == 1.0 == True, but
// 2^53 + 1 != 2^53 as a float), mappings whatever their key order, lists
// element by element.
func sameValue(a, b *yaml.Node) bool {
	if a.Kind != b.Kind {
		return false
	}
	switch a.Kind {
	case yaml.MappingNode:
		if len(a.Content) != len(b.Content) {
			return false
		}
		for i := 0; i < len(a.Content); i += 2 {
			j := mapIndex(b, a.Content[i].Value)
			if j < 0 || !sameValue(a.Content[i+1], b.Content[j+1]) {
				return false
			}
		}
		return true
	case yaml.SequenceNode:
		if len(a.Content) != len(b.Content) {
			return false
		}
		for i := range a.Content {
			if !sameValue(a.Content[i], b.Content[i]) {
				return false
			}
		}
		return true
	}
	x, err1 := toPy(a)
	y, err2 := toPy(b)
	if err1 != nil || err2 != nil {
		return a.Value == b.Value
	}
	_, xf, _, xn := x.number()
	_, yf, _, yn := y.number()
	if xn && yn {
		return xf == xf && yf == yf && !pyGreater(x, y) && !pyGreater(y, x)
	}
	return x.kind == y.kind && x.str() == y.str()
}
