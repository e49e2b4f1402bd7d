package config

import (
	"fmt"
	"regexp"
	"strings"
)

// OmegaConf's interpolation grammar (OmegaConf 2.2: OmegaConfGrammarLexer.g4
// and OmegaConfGrammarParser.g4), parsed by hand. A string value holding "${"
// is parsed as text with interpolations:
//
//	text:          literal runs and ${...}; \${ is a literal "${" and an even
//	               run of backslashes before ${ is halved
//	node:          ${key}, ${.key} (relative: one dot is the enclosing
//	               mapping, each more dot its parent), ${a.b[0].c}, keys that
//	               are themselves interpolations: ${a.${k}}
//	resolver:      ${name:arg,arg,...}; name is ID(.ID)*
//	argument:      a primitive (one token keeps its type: 1, 1.5, true, null,
//	               inf; several are joined as a string, escapes \, \: \{ ...
//	               removed), a quoted string ('..' or "..", with ${...}
//	               inside), a list [..] or a dict {k: v}
//
// The evaluation (interp.go) gives each part OmegaConf's value.

// itext is text with interpolations: a whole value, or a quoted argument.
type itext struct {
	parts []tpart
}

// tpart is a literal (escapes already removed) or an interpolation.
type tpart struct {
	lit    string
	interp *inode
}

// inode is one ${...}.
type inode struct {
	resolver bool
	// Node interpolation: the leading dots and the key segments.
	dots int
	key  []kseg
	// Resolver: its name (segments joined by dots) and arguments.
	name []kseg
	args []*elem
	src  string // the text, for messages
}

// kseg is a key or resolver-name segment: a literal or an interpolation,
// bracketed ([k]) or not.
type kseg struct {
	lit     string
	sub     *inode
	bracket bool
}

type elemKind int

const (
	elemPrim elemKind = iota
	elemList
	elemDict
	elemQuoted
	elemEmpty // a missing element of a sequence: the empty string
)

// elem is one resolver argument (or list item, or dict value).
type elem struct {
	kind   elemKind
	toks   []vtok
	list   []*elem
	dict   []dpair
	quoted *itext
}

type dpair struct {
	key string
	val *elem
}

type vtokType int

const (
	tokFloat vtokType = iota
	tokInt
	tokBool
	tokNull
	tokUnquoted
	tokID
	tokEsc
	tokWS
	tokColon
	tokInterp
)

// vtok is one token of a primitive.
type vtok struct {
	typ  vtokType
	text string
	sub  *inode
}

// Tokens of VALUE_MODE, in the lexer's order (the first of equally long
// matches wins).
var valueTokens = []struct {
	typ vtokType
	re  *regexp.Regexp
}{
	{tokFloat, longest(`[+-]?(?:(?:(?:0|[1-9](?:_?[0-9])*)|(?:(?:0|[1-9](?:_?[0-9])*)\.|(?:0|[1-9](?:_?[0-9])*)?\.[0-9](?:_?[0-9])*))[eE][+-]?[0-9](?:_?[0-9])*|(?:0|[1-9](?:_?[0-9])*)\.|(?:0|[1-9](?:_?[0-9])*)?\.[0-9](?:_?[0-9])*|[Ii][Nn][Ff]|[Nn][Aa][Nn])`)},
	{tokInt, longest(`[+-]?(?:0|[1-9](?:_?[0-9])*)`)},
	{tokBool, longest(`[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]`)},
	{tokNull, longest(`[Nn][Uu][Ll][Ll]`)},
	{tokUnquoted, longest(`[/\-\\+.$%*@?|]`)},
	{tokID, longest(`[a-zA-Z_][a-zA-Z0-9_\-]*`)},
	{tokEsc, longest(`(?:\\\\|\\\(|\\\)|\\\[|\\\]|\\\{|\\\}|\\:|\\=|\\,|\\ |\\\t)+`)},
	{tokWS, longest(`[ \t]+`)},
}

func longest(expr string) *regexp.Regexp {
	re := regexp.MustCompile(`^(?:` + expr + `)`)
	re.Longest()
	return re
}

// idRun matches an ID at the start of a string.
var idRun = longest(`[a-zA-Z_][a-zA-Z0-9_\-]*`)

// isInterKeyChar: the characters of an INTER_KEY (a key segment).
func isInterKeyChar(c byte) bool {
	return !strings.ContainsRune("\\{}()[]:. \t'\"", rune(c))
}

// maxGrammarDepth bounds the nesting of interpolations, lists and dicts in
// one value.
const maxGrammarDepth = 200

type gparser struct {
	s     string
	i     int
	depth int
}

func (p *gparser) errf(format string, args ...any) error {
	return fmt.Errorf("%s at offset %d of %s", fmt.Sprintf(format, args...), p.i, quoted(p.s))
}

func (p *gparser) rest() string { return p.s[p.i:] }

func (p *gparser) skipWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// wsThen reports whether optional blanks and then c come next (without
// consuming them).
func (p *gparser) wsThen(c byte) bool {
	j := p.i
	for j < len(p.s) && (p.s[j] == ' ' || p.s[j] == '\t') {
		j++
	}
	return j < len(p.s) && p.s[j] == c
}

// eat consumes optional blanks, c, and (when after) optional blanks.
func (p *gparser) eat(c byte, after bool) bool {
	if !p.wsThen(c) {
		return false
	}
	p.skipWS()
	p.i++
	if after {
		p.skipWS()
	}
	return true
}

// parseText parses a whole string value (configValue).
func parseText(s string) (*itext, error) {
	p := &gparser{s: s}
	t := &itext{}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, tpart{lit: lit.String()})
			lit.Reset()
		}
	}
	for p.i < len(s) {
		c := s[p.i]
		switch {
		case c == '\\':
			j := p.i
			for j < len(s) && s[j] == '\\' {
				j++
			}
			k := j - p.i
			if strings.HasPrefix(s[j:], "${") {
				if k%2 == 1 { // \${ : a literal ${ after (k-1)/2 backslashes
					lit.WriteString(strings.Repeat(`\`, (k-1)/2) + "${")
					p.i = j + 2
					continue
				}
				lit.WriteString(strings.Repeat(`\`, k/2)) // escaped backslashes before ${
				p.i = j
				continue
			}
			lit.WriteString(s[p.i:j])
			p.i = j
		case c == '$' && strings.HasPrefix(s[p.i:], "${"):
			flush()
			n, err := p.interpolation()
			if err != nil {
				return nil, err
			}
			t.parts = append(t.parts, tpart{interp: n})
		default:
			lit.WriteByte(c)
			p.i++
		}
	}
	flush()
	return t, nil
}

// interpolation parses ${...} at p.i.
func (p *gparser) interpolation() (*inode, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxGrammarDepth {
		return nil, p.errf("interpolations nested deeper than %d", maxGrammarDepth)
	}
	start := p.i
	p.i += 2
	p.skipWS()
	if n, ok, err := p.tryResolver(start); ok || err != nil {
		return n, err
	}
	n := &inode{}
	for p.i < len(p.s) && p.s[p.i] == '.' {
		n.dots++
		p.i++
	}
	first := true
	for {
		switch {
		case p.i < len(p.s) && p.s[p.i] == '[':
			p.i++
			seg, err := p.configKey()
			if err != nil {
				return nil, err
			}
			if p.i >= len(p.s) || p.s[p.i] != ']' {
				return nil, p.errf("want ] after a bracketed key")
			}
			p.i++
			seg.bracket = true
			n.key = append(n.key, seg)
		case first:
			seg, err := p.configKey()
			if err != nil {
				return nil, err
			}
			n.key = append(n.key, seg)
		case p.i < len(p.s) && p.s[p.i] == '.':
			p.i++
			seg, err := p.configKey()
			if err != nil {
				return nil, err
			}
			n.key = append(n.key, seg)
		default:
			if !p.eat('}', false) {
				return nil, p.errf("want . [ or } in an interpolation")
			}
			n.src = p.s[start:p.i]
			return n, nil
		}
		first = false
	}
}

// configKey parses one key segment: an interpolation or an INTER_KEY run.
func (p *gparser) configKey() (kseg, error) {
	if strings.HasPrefix(p.rest(), "${") {
		sub, err := p.interpolation()
		return kseg{sub: sub}, err
	}
	j := p.i
	for j < len(p.s) && isInterKeyChar(p.s[j]) {
		if p.s[j] == '$' && j+1 < len(p.s) && p.s[j+1] == '{' && j > p.i {
			break
		}
		j++
	}
	if j == p.i {
		return kseg{}, p.errf("want a key")
	}
	seg := kseg{lit: p.s[p.i:j]}
	p.i = j
	return seg, nil
}

// tryResolver parses "name:args}" when the interpolation at start is a
// resolver call (an ID(.ID)* name, then a colon); ok is false otherwise and
// p.i is left where it was.
func (p *gparser) tryResolver(start int) (*inode, bool, error) {
	save := p.i
	n := &inode{resolver: true}
	for {
		switch {
		case strings.HasPrefix(p.rest(), "${"):
			sub, err := p.interpolation()
			if err != nil {
				return nil, false, err
			}
			n.name = append(n.name, kseg{sub: sub})
		default:
			id := idRun.FindString(p.rest())
			// An ID followed by more key characters is a key, not a name.
			if id == "" || p.i+len(id) < len(p.s) && isInterKeyChar(p.s[p.i+len(id)]) {
				p.i = save
				return nil, false, nil
			}
			n.name = append(n.name, kseg{lit: id})
			p.i += len(id)
		}
		if p.i < len(p.s) && p.s[p.i] == '.' {
			p.i++
			continue
		}
		break
	}
	if !p.eat(':', true) {
		p.i = save
		return nil, false, nil
	}
	if p.eat('}', false) {
		n.src = p.s[start:p.i]
		return n, true, nil
	}
	args, err := p.sequence('}')
	if err != nil {
		return nil, true, err
	}
	if !p.eat('}', false) {
		return nil, true, p.errf("want , or } after a resolver argument")
	}
	n.args = args
	n.src = p.s[start:p.i]
	return n, true, nil
}

// sequence parses elements separated by commas, up to (not past) close. A
// missing element is the empty string.
func (p *gparser) sequence(close byte) ([]*elem, error) {
	var out []*elem
	for {
		if p.wsThen(',') {
			out = append(out, &elem{kind: elemEmpty})
		} else {
			e, err := p.element()
			if err != nil {
				return nil, err
			}
			out = append(out, e)
		}
		if !p.eat(',', true) {
			return out, nil
		}
		if p.wsThen(close) {
			return append(out, &elem{kind: elemEmpty}), nil
		}
	}
}

// element parses a primitive, a quoted string, a list or a dict.
func (p *gparser) element() (*elem, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxGrammarDepth {
		return nil, p.errf("values nested deeper than %d", maxGrammarDepth)
	}
	if p.i >= len(p.s) {
		return nil, p.errf("unexpected end")
	}
	switch p.s[p.i] {
	case '[':
		p.i++
		p.skipWS()
		e := &elem{kind: elemList}
		if p.eat(']', false) {
			return e, nil
		}
		items, err := p.sequence(']')
		if err != nil {
			return nil, err
		}
		if !p.eat(']', false) {
			return nil, p.errf("want , or ] in a list")
		}
		e.list = items
		return e, nil
	case '{':
		p.i++
		p.skipWS()
		e := &elem{kind: elemDict}
		if p.eat('}', false) {
			return e, nil
		}
		for {
			k, err := p.dictKey()
			if err != nil {
				return nil, err
			}
			if !p.eat(':', true) {
				return nil, p.errf("want : after a dict key")
			}
			v, err := p.element()
			if err != nil {
				return nil, err
			}
			e.dict = append(e.dict, dpair{key: k, val: v})
			if p.eat(',', true) {
				continue
			}
			if p.eat('}', false) {
				return e, nil
			}
			return nil, p.errf("want , or } in a dict")
		}
	case '\'', '"':
		q, err := p.quoted()
		if err != nil {
			return nil, err
		}
		return &elem{kind: elemQuoted, quoted: q}, nil
	}
	return p.primitive(false)
}

// primitive parses the tokens of one primitive (or, with key, of a dict key:
// no colon and no interpolation).
func (p *gparser) primitive(key bool) (*elem, error) {
	e := &elem{kind: elemPrim}
	for p.i < len(p.s) {
		r := p.rest()
		c := r[0]
		if c == ' ' || c == '\t' {
			// Blanks before a separator belong to it.
			j := strings.IndexFunc(r, func(x rune) bool { return x != ' ' && x != '\t' })
			if j < 0 || strings.ContainsRune(",]}", rune(r[j])) || key && r[j] == ':' {
				break
			}
			if r[j] == ':' {
				// WS? ':' WS? is one COLON token.
				k := j + 1
				for k < len(r) && (r[k] == ' ' || r[k] == '\t') {
					k++
				}
				e.toks = append(e.toks, vtok{typ: tokColon, text: r[:k]})
				p.i += k
				continue
			}
		}
		if c == ',' || c == ']' || c == '}' {
			break
		}
		if c == ':' {
			if key {
				break
			}
			k := 1
			for k < len(r) && (r[k] == ' ' || r[k] == '\t') {
				k++
			}
			e.toks = append(e.toks, vtok{typ: tokColon, text: r[:k]})
			p.i += k
			continue
		}
		if strings.HasPrefix(r, "${") {
			if key {
				return nil, p.errf("an interpolation cannot be a dict key")
			}
			sub, err := p.interpolation()
			if err != nil {
				return nil, err
			}
			e.toks = append(e.toks, vtok{typ: tokInterp, text: sub.src, sub: sub})
			continue
		}
		best, bestLen := vtokType(-1), 0
		for _, t := range valueTokens {
			if m := t.re.FindString(r); len(m) > bestLen {
				best, bestLen = t.typ, len(m)
			}
		}
		if bestLen == 0 {
			if len(e.toks) == 0 {
				return nil, p.errf("unexpected %q", c)
			}
			return nil, p.errf("unexpected %q (quote the value, or escape it with a backslash)", c)
		}
		e.toks = append(e.toks, vtok{typ: best, text: r[:bestLen]})
		p.i += bestLen
	}
	if len(e.toks) == 0 {
		return nil, p.errf("want a value")
	}
	return e, nil
}

// dictKey parses a dict key: a primitive without colons or interpolations,
// as a string.
func (p *gparser) dictKey() (string, error) {
	e, err := p.primitive(true)
	if err != nil {
		return "", err
	}
	return unescapeTokens(e.toks), nil
}

// unescapeTokens joins tokens as text, removing the escapes of ESC tokens.
func unescapeTokens(toks []vtok) string {
	var b strings.Builder
	for _, t := range toks {
		if t.typ == tokEsc {
			b.WriteString(everyOther(t.text))
			continue
		}
		b.WriteString(t.text)
	}
	return b.String()
}

// everyOther keeps the characters at odd offsets: "\\,\:" -> ",:".
func everyOther(s string) string {
	var b strings.Builder
	for i := 1; i < len(s); i += 2 {
		b.WriteByte(s[i])
	}
	return b.String()
}

// quoted parses a quoted string at p.i ('...' or "..."), with interpolations
// and escapes: \q is the quote, \${ a literal "${", and a run of backslashes
// before ${ or the closing quote is halved.
func (p *gparser) quoted() (*itext, error) {
	q := p.s[p.i]
	p.i++
	t := &itext{}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, tpart{lit: lit.String()})
			lit.Reset()
		}
	}
	for {
		if p.i >= len(p.s) {
			return nil, p.errf("unterminated quoted string")
		}
		c := p.s[p.i]
		switch {
		case c == q:
			p.i++
			flush()
			return t, nil
		case c == '\\':
			j := p.i
			for j < len(p.s) && p.s[j] == '\\' {
				j++
			}
			k := j - p.i
			switch {
			case strings.HasPrefix(p.s[j:], "${") && k%2 == 1:
				lit.WriteString(strings.Repeat(`\`, (k-1)/2) + "${")
				p.i = j + 2
			case strings.HasPrefix(p.s[j:], "${"), j < len(p.s) && p.s[j] == q && k%2 == 0:
				lit.WriteString(strings.Repeat(`\`, k/2))
				p.i = j
			case j < len(p.s) && p.s[j] == q: // odd: an escaped quote
				lit.WriteString(strings.Repeat(`\`, (k-1)/2) + string(q))
				p.i = j + 1
			default:
				lit.WriteString(p.s[p.i:j])
				p.i = j
			}
		case c == '$' && strings.HasPrefix(p.rest(), "${"):
			flush()
			n, err := p.interpolation()
			if err != nil {
				return nil, err
			}
			t.parts = append(t.parts, tpart{interp: n})
		default:
			lit.WriteByte(c)
			p.i++
		}
	}
}

// parseElement parses a whole string as one element (oc.decode's
// singleElement rule).
func parseElement(s string) (*elem, error) {
	p := &gparser{s: s}
	p.skipWS()
	e, err := p.element()
	if err != nil {
		return nil, err
	}
	p.skipWS()
	if p.i != len(s) {
		return nil, p.errf("unexpected %q after the value", p.s[p.i])
	}
	return e, nil
}
