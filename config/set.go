package config

import (
	"fmt"
	"reflect"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// schemaType is the Go type of the schema key at path (list indices allowed),
// or nil when the schema has no such key.
func schemaType(path string) reflect.Type {
	t := reflect.TypeOf(Config{})
	for _, seg := range splitPath(path) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() == reflect.Slice {
			if _, ok := index(seg); ok {
				t = t.Elem()
				continue
			}
			return nil
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
		fi, ok := fieldsOf(t)[seg]
		if !ok {
			return nil
		}
		t = t.Field(fi).Type
	}
	return t
}

// applySet applies one "a.b=v" override to root.
func (ld *loader) applySet(root *yaml.Node, s string) error {
	path, val, ok := strings.Cut(s, "=")
	path = strings.TrimSpace(path)
	if !ok || path == "" || strings.Contains(path, "..") || strings.HasPrefix(path, ".") || strings.HasSuffix(path, ".") {
		return fmt.Errorf("config: --set %s: want key.path=value", quoted(s))
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("config: --set %s: not valid UTF-8", quoted(s))
	}
	n, err := setValue(path, val)
	if err != nil {
		return fmt.Errorf("config: --set %s: %w", clip(s), err)
	}
	ld.mark(n, "--set")
	// Walk down, creating mappings as needed.
	segs := splitPath(path)
	cur := root
	for k, seg := range segs {
		last := k == len(segs)-1
		switch cur.Kind {
		case yaml.SequenceNode:
			i, ok := index(seg)
			if !ok || i >= len(cur.Content) {
				return fmt.Errorf("config: --set %s: %s: no list element %s", clip(s), clip(strings.Join(segs[:k], ".")), quoted(seg))
			}
			if last {
				cur.Content[i] = n
				return nil
			}
			cur = cur.Content[i]
		case yaml.MappingNode:
			j := mapIndex(cur, seg)
			if last {
				if j < 0 {
					cur.Content = append(cur.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: seg}, n)
				} else {
					// A mapping merges into a mapping, as a file would.
					cur.Content[j+1] = merge(cur.Content[j+1], n)
				}
				return nil
			}
			if j < 0 || cur.Content[j+1].Kind != yaml.MappingNode && cur.Content[j+1].Kind != yaml.SequenceNode {
				m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
				if j < 0 {
					cur.Content = append(cur.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: seg}, m)
				} else {
					cur.Content[j+1] = m
				}
				cur = m
				continue
			}
			cur = cur.Content[j+1]
		default:
			return fmt.Errorf("config: --set %s: %s is not a mapping", clip(s), clip(strings.Join(segs[:k], ".")))
		}
	}
	return nil
}

// setValue builds the node for an override value, typed by the schema.
func setValue(path, val string) (*yaml.Node, error) {
	t := schemaType(path)
	if t == nil {
		parsed, err := parseValue(val)
		if err != nil {
			return nil, err
		}
		isMap := func(q string) bool { return q == normPath(path) && parsed.Kind == yaml.MappingNode }
		if cls, _, _ := Classify(path, isMap); cls != Unclassified || !ForwardCompatible(path) || rulesBeneath(path) {
			return parsed, nil
		}
		return nil, fmt.Errorf("unknown key %s%s", path, suggest(path))
	}
	if strings.Contains(val, "${") {
		// Typed after interpolation, when the tree is decoded.
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: val}, nil
	}
	base := t
	for base.Kind() == reflect.Pointer {
		base = base.Elem()
	}
	if base.Kind() == reflect.String {
		if t.Kind() == reflect.Pointer && val == "null" {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}, nil
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: val}, nil
	}
	n, err := parseValue(val)
	if err != nil {
		return nil, err
	}
	// Type-check now, so a bad override names itself rather than a line.
	w := &walker{ld: &loader{origin: map[*yaml.Node]string{}}, ignored: map[string]bool{}}
	w.decode(n, reflect.New(t).Elem(), path)
	if len(w.errs) > 0 {
		return nil, fmt.Errorf("%s: want %s, found %s", path, typeName(t), describe(n))
	}
	return n, nil
}

// parseValue parses an override value as one YAML node (flow style).
func parseValue(val string) (*yaml.Node, error) {
	if strings.TrimSpace(val) == "" {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: val}, nil
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(val), &doc); err != nil {
		return nil, fmt.Errorf("value %s is not YAML: %w", quoted(val), err)
	}
	if len(doc.Content) != 1 {
		return nil, fmt.Errorf("value %s is not one YAML value", quoted(val))
	}
	if err := checkTree("--set", doc.Content[0]); err != nil {
		return nil, err
	}
	retag(doc.Content[0]) // typed as in a file (YAML 1.1, as OmegaConf reads)
	return doc.Content[0], nil
}
