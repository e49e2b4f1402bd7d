package config

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// walker decodes a resolved tree into the typed schema, classifying keys.
type walker struct {
	ld      *loader
	r       *resolver // resolves what the walker reads (nil: resolved already)
	ignored map[string]bool
	// keys records every key met outside the typed schema, with its class.
	keys []KeyInfo
	errs []error
	// reported are the resolver's errors already in errs (a key that failed
	// to resolve fails every key that refers to it with the same error).
	reported map[error]bool
	sug      suggester // the load's budget of nearest-key suggestions
	// more counts the errors past maxErrors, reported as a count only: a
	// recipe with 64k unknown keys must fail in milliseconds with a
	// readable message, not compute 64k suggestions into a 7 MB one.
	more int
}

// maxErrors is the number of configuration errors reported one by one.
const maxErrors = 20

// result is the walker's errors, the ones past maxErrors counted.
func (w *walker) result() error {
	if len(w.errs) == 0 {
		return nil
	}
	errs := w.errs
	if w.more > 0 {
		errs = append(errs[:len(errs):len(errs)], fmt.Errorf("config: ... and %d more errors of the same recipe (the first %d are shown)", w.more, maxErrors))
	}
	return errors.Join(errs...)
}

func valueOf(p any) reflect.Value { return reflect.ValueOf(p).Elem() }

func (w *walker) fail(n *yaml.Node, format string, args ...any) {
	if len(w.errs) >= maxErrors {
		w.more++
		return
	}
	w.errs = append(w.errs, fmt.Errorf("config: %s: %s", w.ld.where(n), fmt.Sprintf(format, args...)))
}

// resolve resolves n (deep: and all under it) before it is read; false
// when that failed (the error is recorded).
func (w *walker) resolve(n *yaml.Node, path string, deep bool) bool {
	if w.r == nil {
		return true
	}
	var err error
	if deep {
		err = w.r.deep(n, path)
	} else {
		err = w.r.shallow(n, path)
	}
	if err != nil {
		switch {
		case w.reported[err]:
		case len(w.errs) >= maxErrors:
			w.more++
		default:
			if w.reported == nil {
				w.reported = map[error]bool{}
			}
			w.reported[err] = true
			w.errs = append(w.errs, err)
		}
		return false
	}
	if isMissing(n) {
		w.fail(n, "%s: mandatory value (???) that no file or override set", orRoot(path))
		return false
	}
	return true
}

// decodeStruct decodes mapping n into struct v at path.
func (w *walker) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if !w.resolve(n, path, false) {
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		v.Set(reflect.Zero(v.Type()))
		return
	}
	if n.Kind != yaml.MappingNode {
		w.fail(n, "%s: want a mapping, found %s", orRoot(path), describe(n))
		return
	}
	fields := fieldsOf(v.Type())
	for i := 0; i < len(n.Content); i += 2 {
		k, c := n.Content[i], n.Content[i+1]
		p := join(path, k.Value)
		fi, ok := fields[k.Value]
		if !ok {
			w.untyped(k, c, p)
			continue
		}
		w.decode(c, v.Field(fi), p)
	}
}

// untyped classifies key k (value c, path p), which Config does not type, by
// the key class table: a section with more specific rules is walked key by
// key; an Ignored key is recorded, a Refused one kept for the check; a key in
// no class follows ForwardCompatible.
func (w *walker) untyped(k, c *yaml.Node, p string) {
	// Where the value was set: a merged key keeps the node of the file
	// that first had it, its value is the file that set it; a block's
	// switch is its enabled.
	where := w.ld.where(k)
	switch {
	case c.Kind == yaml.ScalarNode:
		where = w.ld.where(c)
	case c.Kind == yaml.MappingNode && mapIndex(c, "enabled") >= 0:
		where = w.ld.where(c.Content[mapIndex(c, "enabled")+1])
	}
	if strings.Contains(k.Value, ".") {
		// OmegaConf keeps a dotted key as one key of that name (it does
		// not nest it), and NeMo RL reads the nested key, so the value
		// would be silently unused there.
		nested := strings.Join(splitPath(p), ": {") + ": ..." + strings.Repeat("}", strings.Count(p, "."))
		w.fail(k, "key %s holds a dot: OmegaConf keeps it as one key of that name, not as the nested key %s, and NeMo RL reads only the nested one, so this value would have no effect; write it nested (%s) or as the override %s=...",
			quoted(k.Value), p, nested, p)
		return
	}
	if k.Value == "_override_" {
		w.ignored[p] = true
		w.keys = append(w.keys, KeyInfo{Path: p, Class: Ignored, Where: where,
			Why: "NeMo RL honours _override_ only on the top-level sections of a file it merges; here it is a plain key, and this section was merged as NeMo RL merges it"})
		return
	}
	if rulesBeneath(p) {
		switch c.Kind {
		case yaml.MappingNode:
			for i := 0; i < len(c.Content); i += 2 {
				w.untyped(c.Content[i], c.Content[i+1], join(p, c.Content[i].Value))
			}
			return
		case yaml.SequenceNode:
			for i, e := range c.Content {
				if e.Kind == yaml.MappingNode {
					w.untyped(&yaml.Node{Kind: yaml.ScalarNode, Value: strconv.Itoa(i), Line: e.Line}, e, join(p, strconv.Itoa(i)))
				}
			}
			return
		}
	}
	r := ruleFor(p, c)
	switch {
	case r == nil:
		if len(w.errs) >= maxErrors {
			w.more++ // no suggestion computed for an error not shown
			return
		}
		w.unknown(k, p, where)
	case r.Class == Ignored:
		w.ignored[p] = true
		w.keys = append(w.keys, KeyInfo{Path: p, Class: Ignored, Why: r.Why, Rule: r, Where: where})
		if r.KnownOnly {
			w.unknownUnder(c, p)
		}
	case r.Class == Refused && !r.Guard:
		if !w.resolve(c, p, true) {
			return
		}
		w.keys = append(w.keys, KeyInfo{Path: p, Class: Refused, Why: r.Why, Rule: r, Where: where, Value: c})
	default:
		// A Used or guarded rule names a Config field: this key is not one.
		w.fail(k, "key %s: the key table calls it %s, but Config has no such field (a tracegrpo bug)", p, r.Class)
	}
}

// unknown records key k (path p), in no class: an error where it may
// change the math, else a warning (ForwardCompatible); the first
// maxSuggestions of a load name the nearest known key.
func (w *walker) unknown(k *yaml.Node, p, where string) {
	if ForwardCompatible(p) {
		if len(w.errs) >= maxErrors {
			w.more++ // no suggestion computed for an error not shown
			return
		}
		w.fail(k, "unknown key %s%s", clip(p), w.sug.suggest(p))
		return
	}
	why := "unknown key"
	if k := w.sug.nearest(p); k != "" {
		why += ", did you mean " + k + "?"
	}
	w.keys = append(w.keys, KeyInfo{Path: p, Class: Unclassified, Where: where,
		Why: why + " (accepted and not used: this section carries no training math)"})
}

// unknownUnder records the keys under c (at path p, a KnownOnly section)
// that NeMo RL's schema and recipes do not know.
func (w *walker) unknownUnder(c *yaml.Node, p string) {
	switch c.Kind {
	case yaml.MappingNode:
		for i := 0; i < len(c.Content); i += 2 {
			k, v := c.Content[i], c.Content[i+1]
			q := join(p, k.Value)
			if !knownToNeMoRL(normPath(q)) {
				where := w.ld.where(k)
				if v.Kind == yaml.ScalarNode {
					where = w.ld.where(v)
				}
				w.unknown(k, q, where)
				continue
			}
			w.unknownUnder(v, q)
		}
	case yaml.SequenceNode:
		for _, e := range c.Content {
			w.unknownUnder(e, p) // list elements share the list's key path
		}
	}
}

// typedLeaf records a value Config types, with its class (Used, or Refused
// by a guard).
func (w *walker) typedLeaf(n *yaml.Node, path string) {
	if w.r == nil { // a --set value checked alone
		return
	}
	k := KeyInfo{Path: path, Class: Used, Where: w.ld.where(n)}
	if r := ruleFor(path, nil); r != nil && r.Key == normPath(path) && r.Class == Refused {
		k.Class, k.Rule, k.Why = Refused, r, r.Why+" (refused by the capability guards when not neutral)"
	}
	w.keys = append(w.keys, k)
}

func orRoot(p string) string {
	if p == "" {
		return "top level"
	}
	return p
}

// decode decodes n into v (any kind) at path.
func (w *walker) decode(n *yaml.Node, v reflect.Value, path string) {
	t := v.Type()
	if !w.resolve(n, path, t.Kind() == reflect.Map || t.Kind() == reflect.Interface) {
		return
	}
	switch {
	case t.Kind() == reflect.Pointer:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			v.Set(reflect.Zero(t))
			return
		}
		nv := reflect.New(t.Elem())
		w.decode(n, nv.Elem(), path)
		v.Set(nv)
	case t.Kind() == reflect.Struct:
		w.decodeStruct(n, v, path)
	case t.Kind() == reflect.Map:
		w.typedLeaf(n, path)
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			v.Set(reflect.Zero(t))
			return
		}
		if n.Kind != yaml.MappingNode {
			w.fail(n, "%s: want a mapping, found %s", path, describe(n))
			return
		}
		if len(n.Content) == 0 {
			// {} and null are the same (no entries): both decode to nil,
			// which prints as {}.
			v.Set(reflect.Zero(t))
			return
		}
		m := reflect.New(t)
		if err := n.Decode(m.Interface()); err != nil {
			w.fail(n, "%s: %v", path, err)
			return
		}
		v.Set(m.Elem())
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			v.Set(reflect.Zero(t))
			return
		}
		if n.Kind != yaml.SequenceNode {
			w.fail(n, "%s: want a list, found %s", path, describe(n))
			return
		}
		// null stays nil and [] stays empty: each prints back as written.
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, e := range n.Content {
			w.decodeStruct(e, s.Index(i), fmt.Sprintf("%s.%d", path, i))
		}
		v.Set(s)
	default:
		w.typedLeaf(n, path)
		if t == reflect.TypeOf(OptionalString("")) && n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			v.SetString("")
			return
		}
		if t.Kind() != reflect.Interface && t.Kind() != reflect.Slice && n.Kind != yaml.ScalarNode {
			w.fail(n, "%s: want %s, found %s", path, typeName(t), describe(n))
			return
		}
		if !tagFits(n, t) {
			w.fail(n, "%s: want %s, found %s", path, typeName(t), describe(n))
			return
		}
		nv := reflect.New(t)
		if t.Kind() == reflect.String && n.ShortTag() != "!!binary" {
			// OmegaConf converts any scalar into a string field.
			nv.Elem().SetString(n.Value)
			v.Set(nv.Elem())
			return
		}
		if err := n.Decode(nv.Interface()); err != nil {
			w.fail(n, "%s: want %s, found %s", path, typeName(t), describe(n))
			return
		}
		v.Set(nv.Elem())
	}
}

// tagFits reports whether scalar n may decode into kind t without loss: yaml.v3
// alone would truncate 1.5 into an integer field.
func tagFits(n *yaml.Node, t reflect.Type) bool {
	if n.Kind != yaml.ScalarNode {
		return true
	}
	tag := n.ShortTag()
	switch t.Kind() {
	case reflect.Bool:
		return tag == "!!bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return tag == "!!int"
	case reflect.Float32, reflect.Float64:
		return tag == "!!int" || tag == "!!float"
	case reflect.String:
		return tag != "!!null"
	}
	return true
}

func typeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list of " + strings.TrimPrefix(strings.TrimPrefix(typeName(t.Elem()), "a "), "an ") + "s"
	case reflect.Pointer:
		return typeName(t.Elem()) + " or null"
	}
	return t.String()
}

// fieldsOf maps yaml key names to field indices.
func fieldsOf(t reflect.Type) map[string]int {
	m := map[string]int{}
	for i := 0; i < t.NumField(); i++ {
		tag := t.Field(i).Tag.Get("yaml")
		name, _, _ := strings.Cut(tag, ",")
		if name != "" && name != "-" {
			m[name] = i
		}
	}
	return m
}

// normPath drops list indices: "policy.scheduler.0.name" -> "policy.scheduler.name".
func normPath(p string) string {
	segs := splitPath(p)
	out := segs[:0:0]
	for _, s := range segs {
		if _, ok := index(s); ok {
			continue
		}
		out = append(out, s)
	}
	return strings.Join(out, ".")
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
