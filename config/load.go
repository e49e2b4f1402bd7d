package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tracegrpo/tracegrpo/internal/inputfile"
)

// Loaded is a loaded configuration: the typed values and what was skipped.
type Loaded struct {
	Config Config
	// Files are the files read, parents before children, in merge order.
	Files []string
	// Ignored lists, sorted, the key paths accepted but not used by tracegrpo
	// (each subtree once, by its root).
	Ignored []string
	// Keys are the configuration's keys with their classes, in the order
	// met: the values Config types, Ignored subtrees, Refused keys (see
	// Refusals) and the Unclassified ones accepted with a warning (see
	// Warnings).
	Keys []KeyInfo

	root *yaml.Node // the resolved tree, for the Neutral checks
}

// maxDefaultsDepth bounds `defaults:` chains (a cycle is reported before this).
const maxDefaultsDepth = 64

// Sources are what one configuration is made of, in the order they apply.
type Sources struct {
	// Base is an in-memory recipe under the files (the built-in job); it may
	// not use defaults:.
	Base *Recipe
	// Files are NeMo RL recipes; each is composed with its defaults: chain,
	// and later files merge over earlier ones, as a child over its parents
	// (NeMo RL's merge_with_override: a top-level section with _override_:
	// true replaces the one below).
	Files []string
	// Overrides are Hydra overrides (key=v, +key=v, ++key=v, ~key), applied
	// to the composed recipe as NeMo RL's run_grpo.py applies its command
	// line's.
	Overrides []string
	// Sets are tracegrpo's --set key=value, applied last, over Default():
	// any schema key, typed by the schema.
	Sets []string
}

// Load reads files (merged in order, later over earlier, all over Default()),
// applies sets ("a.b=v", in order), resolves interpolations and decodes the
// result. With no files it loads Default() plus the sets.
func Load(files []string, sets []string) (*Loaded, error) {
	return LoadSources(Sources{Files: files, Sets: sets})
}

// Recipe is an in-memory recipe, such as the one embedded for the built-in
// run. It may not use `defaults:`.
type Recipe struct {
	Name string // shown in errors as the file name
	Data []byte
}

// LoadOver is Load with base merged over Default() before files: files and
// sets override the base recipe as they override the defaults.
func LoadOver(base Recipe, files []string, sets []string) (*Loaded, error) {
	return LoadSources(Sources{Base: &base, Files: files, Sets: sets})
}

// LoadSources composes the recipe (Base, then Files), applies the Hydra
// Overrides to it, merges it over Default(), applies Sets, and decodes the
// result, resolving interpolations as the decoder reads them.
func LoadSources(src Sources) (*Loaded, error) {
	ld := &loader{origin: map[*yaml.Node]string{}}
	var recipe *yaml.Node
	if src.Base != nil {
		t, err := parseTree(src.Base.Name, src.Base.Data)
		if err != nil {
			return nil, err
		}
		ld.mark(t, src.Base.Name)
		if lookup(t, []string{"defaults"}) != nil {
			return nil, fmt.Errorf("config: %s: an in-memory recipe cannot use a defaults key", src.Base.Name)
		}
		ld.files = append(ld.files, src.Base.Name)
		recipe = t
	}
	for _, f := range src.Files {
		t, err := ld.loadFile(f, nil)
		if err != nil {
			return nil, err
		}
		if recipe == nil {
			recipe = t
		} else {
			recipe = mergeOverride(recipe, t)
		}
	}
	if recipe == nil {
		recipe = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	}
	for _, s := range src.Overrides {
		o, err := parseOverride(s)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if err := ld.applyOverride(recipe, o); err != nil {
			return nil, err
		}
	}
	root, err := ld.defaultsTree()
	if err != nil {
		return nil, err
	}
	root = merge(root, recipe)
	for _, s := range src.Sets {
		if err := ld.applySet(root, s); err != nil {
			return nil, err
		}
	}
	out := &Loaded{Files: ld.files}
	w := &walker{ld: ld, ignored: map[string]bool{}, r: newResolver(ld, root)}
	w.decodeStruct(root, valueOf(&out.Config), "")
	if err := w.result(); err != nil {
		return nil, err
	}
	out.Ignored = sortedKeys(w.ignored)
	out.Keys = w.keys
	out.root = root
	return out, nil
}

// loader holds the origin (file name) of every node, for error messages.
type loader struct {
	origin map[*yaml.Node]string
	files  []string
	keyAt  map[*yaml.Node]*keyPos // mapping key indexes for overrides (find)
}

// where names a node's origin as "file:line".
func (ld *loader) where(n *yaml.Node) string {
	if n == nil {
		return "config"
	}
	f, ok := ld.origin[n]
	if !ok {
		return "default"
	}
	if f == "--set" || strings.HasPrefix(f, "override ") {
		return f
	}
	return fmt.Sprintf("%s:%d", f, n.Line)
}

func (ld *loader) mark(n *yaml.Node, file string) {
	ld.origin[n] = file
	for _, c := range n.Content {
		ld.mark(c, file)
	}
}

// loadFile parses path and merges it over its `defaults:` parents.
func (ld *loader) loadFile(path string, stack []string) (*yaml.Node, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", path, err)
	}
	for _, s := range stack {
		if s == abs {
			return nil, fmt.Errorf("config: %s: defaults cycle: %s -> %s", path, strings.Join(stack, " -> "), abs)
		}
	}
	if len(stack) >= maxDefaultsDepth {
		return nil, fmt.Errorf("config: %s: defaults nested deeper than %d files", path, maxDefaultsDepth)
	}
	data, err := inputfile.ReadFile(path, inputfile.Recipe)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	t, err := parseTree(path, data)
	if err != nil {
		return nil, err
	}
	ld.mark(t, path)
	var parents []string
	for i := 0; i < len(t.Content); i += 2 {
		if t.Content[i].Value != "defaults" {
			continue
		}
		v := t.Content[i+1]
		switch {
		case v.Kind == yaml.ScalarNode && v.Tag == "!!null":
		case v.Kind == yaml.ScalarNode:
			parents = append(parents, v.Value)
		case v.Kind == yaml.SequenceNode:
			for _, e := range v.Content {
				if e.Kind != yaml.ScalarNode || e.Tag == "!!null" {
					return nil, fmt.Errorf("config: %s:%d: defaults: want a file name, found %s", path, e.Line, describe(e))
				}
				parents = append(parents, e.Value)
			}
		default:
			return nil, fmt.Errorf("config: %s:%d: defaults: want a file name or a list of them, found %s", path, v.Line, describe(v))
		}
		t.Content = append(t.Content[:i], t.Content[i+2:]...)
		break
	}
	var base *yaml.Node
	for _, p := range parents {
		pp := p
		if !filepath.IsAbs(pp) {
			pp = filepath.Join(filepath.Dir(path), pp)
		}
		pt, err := ld.loadFile(pp, append(stack, abs))
		if err != nil {
			return nil, err
		}
		if base == nil {
			base = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		}
		base = mergeOverride(base, pt)
	}
	ld.files = append(ld.files, path)
	if base == nil {
		return t, nil
	}
	return mergeOverride(base, t), nil
}

// parseTree parses one YAML document whose top level must be a mapping (an
// empty document is an empty mapping).
func parseTree(name string, data []byte) (*yaml.Node, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}, nil
		}
		return nil, fmt.Errorf("config: %s: %w", name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, fmt.Errorf("config: %s:%d: want one YAML document, found a second", name, extra.Line)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}, nil
	}
	t := doc.Content[0]
	if t.Kind == yaml.ScalarNode && t.Tag == "!!null" {
		return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}, nil
	}
	if t.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("config: %s:%d: want a mapping at the top level, found %s", name, t.Line, describe(t))
	}
	if err := checkTree(name, t); err != nil {
		return nil, err
	}
	retag(t)
	return t, nil
}

// maxTreeNodes bounds a tree after alias expansion (a "billion laughs" file).
const maxTreeNodes = 1 << 20

// checkTree expands aliases (OmegaConf sees the aliased value) and rejects what
// the merge cannot represent: merge keys, non-scalar and duplicate mapping keys.
func checkTree(name string, n *yaml.Node) error {
	budget := maxTreeNodes
	return checkNode(name, n, &budget, 0)
}

func checkNode(name string, n *yaml.Node, budget *int, depth int) error {
	*budget--
	if *budget < 0 || depth > 1000 {
		return fmt.Errorf("config: %s:%d: document too large or too deep after expanding aliases", name, n.Line)
	}
	switch n.Kind {
	case yaml.AliasNode:
		if n.Alias == nil {
			return fmt.Errorf("config: %s:%d: unresolved alias", name, n.Line)
		}
		*n = *deepCopyBudget(n.Alias, budget, 0)
		if *budget < 0 {
			return fmt.Errorf("config: %s:%d: document too large after expanding aliases", name, n.Line)
		}
		return checkNode(name, n, budget, depth+1)
	case yaml.MappingNode:
		seen := map[string]bool{}
		for i := 0; i < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
				return fmt.Errorf("config: %s:%d: unsupported mapping key %s", name, k.Line, describe(k))
			}
			if seen[k.Value] {
				return fmt.Errorf("config: %s:%d: duplicate key %s", name, k.Line, quoted(k.Value))
			}
			seen[k.Value] = true
			if err := checkNode(name, n.Content[i+1], budget, depth+1); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			if err := checkNode(name, c, budget, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return quoted(n.Value)
	}
	return "an unsupported YAML node"
}

// merge deep-merges src over dst and returns dst: mappings merge key by key;
// anything else replaces. This is how a recipe goes over Default(): a "???"
// in the recipe stays missing (it is still mandatory).
func merge(dst, src *yaml.Node) *yaml.Node { return mergeNodes(dst, src, false) }

// omegaMerge is OmegaConf.merge(dst, src), how NeMo RL composes files and
// overrides: as merge, except that a mandatory "???" in src keeps dst's value.
func omegaMerge(dst, src *yaml.Node) *yaml.Node { return mergeNodes(dst, src, true) }

func mergeNodes(dst, src *yaml.Node, keepOnMissing bool) *yaml.Node {
	if keepOnMissing && dst != nil && isMissing(src) {
		return dst
	}
	if dst == nil || dst.Kind != yaml.MappingNode || src.Kind != yaml.MappingNode {
		return src
	}
	// Index dst's keys once: a scan per key made merging two mappings of n
	// keys O(n²) (a 64k-key recipe took 10 s here).
	at := make(map[string]int, len(dst.Content)/2)
	for i := 0; i < len(dst.Content); i += 2 {
		if _, dup := at[dst.Content[i].Value]; !dup {
			at[dst.Content[i].Value] = i
		}
	}
	for i := 0; i < len(src.Content); i += 2 {
		k, v := src.Content[i], src.Content[i+1]
		j, ok := at[k.Value]
		if !ok {
			at[k.Value] = len(dst.Content)
			dst.Content = append(dst.Content, k, v)
			continue
		}
		dst.Content[j+1] = mergeNodes(dst.Content[j+1], v, keepOnMissing)
	}
	return dst
}

// overrideMarker is NeMo RL's marker for a section that replaces the one it
// would merge into.
const overrideMarker = "_override_"

// mergeOverride is NeMo RL's merge_with_override (nemo_rl/utils/config.py),
// how it merges a file over its parents and a child over the parents'
// merge: a top-level section of over holding a true _override_ loses the
// marker and replaces base's section instead of merging into it; then
// OmegaConf.merge. Markers below the top level are left in place (NeMo RL
// does not read them there; the walker lists them as ignored).
func mergeOverride(base, over *yaml.Node) *yaml.Node {
	if base != nil && base.Kind == yaml.MappingNode && over.Kind == yaml.MappingNode {
		for i := 0; i < len(over.Content); i += 2 {
			sec := over.Content[i+1]
			if sec.Kind != yaml.MappingNode {
				continue
			}
			j := mapIndex(sec, overrideMarker)
			if j < 0 || !pyTruthy(sec.Content[j+1]) {
				continue
			}
			sec.Content = append(sec.Content[:j:j], sec.Content[j+2:]...)
			if b := mapIndex(base, over.Content[i].Value); b >= 0 {
				base.Content = append(base.Content[:b:b], base.Content[b+2:]...)
			}
		}
	}
	return omegaMerge(base, over)
}

// pyTruthy is Python's truth of a node's value.
func pyTruthy(n *yaml.Node) bool {
	if n.Kind != yaml.ScalarNode {
		return len(n.Content) > 0
	}
	v, err := toPy(n)
	if err != nil {
		return n.Value != ""
	}
	switch v.kind {
	case pyBool:
		return v.b
	case pyInt:
		return v.i != 0
	case pyFloat:
		return v.f != 0
	case pyStr:
		return v.s != ""
	}
	return false
}

// mapIndex is the index of key's key node in mapping m, or -1.
func mapIndex(m *yaml.Node, key string) int {
	for i := 0; i < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			work.keyProbes.Add(int64(i/2 + 1))
			return i
		}
	}
	work.keyProbes.Add(int64(len(m.Content) / 2))
	return -1
}

// deepCopyBudget copies n, spending budget per node; it stops (returning a
// partial copy) when the budget or depth runs out.
func deepCopyBudget(n *yaml.Node, budget *int, depth int) *yaml.Node {
	c := *n
	*budget--
	if *budget < 0 || depth > 1000 {
		c.Content = nil
		return &c
	}
	if n.Content != nil {
		c.Content = make([]*yaml.Node, len(n.Content))
		for i, e := range n.Content {
			c.Content[i] = deepCopyBudget(e, budget, depth+1)
		}
	}
	return &c
}

func deepCopy(n *yaml.Node) *yaml.Node {
	c := *n
	if n.Content != nil {
		c.Content = make([]*yaml.Node, len(n.Content))
		for i, e := range n.Content {
			c.Content[i] = deepCopy(e)
		}
	}
	return &c
}

// defaultLinks are the defaults that NeMo RL's recipes write as references,
// kept as references so that overriding the target moves them too.
var defaultLinks = map[string]string{
	"grpo.adv_estimator.normalize_rewards":             "${grpo.normalize_rewards}",
	"grpo.adv_estimator.use_leave_one_out_baseline":    "${grpo.use_leave_one_out_baseline}",
	"policy.megatron_cfg.optimizer.clip_grad":          "${policy.max_grad_norm}",
	"policy.megatron_cfg.scheduler.start_weight_decay": "${policy.megatron_cfg.optimizer.weight_decay}",
	"policy.megatron_cfg.scheduler.end_weight_decay":   "${policy.megatron_cfg.optimizer.weight_decay}",
	"policy.generation.max_new_tokens":                 "${policy.max_total_sequence_length}",
}

// defaultsTree is Default() as a YAML tree, with defaultLinks in place.
func (ld *loader) defaultsTree() (*yaml.Node, error) {
	d := Default()
	var n yaml.Node
	if err := n.Encode(&d); err != nil {
		return nil, fmt.Errorf("config: encode defaults: %w", err)
	}
	for path, ref := range defaultLinks {
		v := lookup(&n, splitPath(path))
		if v == nil {
			return nil, fmt.Errorf("config: default link %s: no such key", path)
		}
		*v = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: ref}
	}
	return &n, nil
}

// splitPath splits "a.b.0.c" into segments.
func splitPath(p string) []string { return strings.Split(p, ".") }

// lookup finds the node at path (mapping keys; decimal indices into lists).
func lookup(n *yaml.Node, path []string) *yaml.Node {
	for _, seg := range path {
		switch n.Kind {
		case yaml.MappingNode:
			j := mapIndex(n, seg)
			if j < 0 {
				return nil
			}
			n = n.Content[j+1]
		case yaml.SequenceNode:
			i, ok := index(seg)
			if !ok || i >= len(n.Content) {
				return nil
			}
			n = n.Content[i]
		default:
			return nil
		}
	}
	return n
}

func index(seg string) (int, bool) {
	if seg == "" || len(seg) > 9 {
		return 0, false
	}
	i := 0
	for _, c := range seg {
		if c < '0' || c > '9' {
			return 0, false
		}
		i = i*10 + int(c-'0')
	}
	return i, true
}
