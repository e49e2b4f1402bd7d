package config

import (
	_ "embed"
	"fmt"
	"strings"
	"sync"
)

// NeMo RL's own keys, as scripts/nemorl_schema.py read them from its
// source at the commit gen_nemorl_keys.tsv records: every key path of its
// GRPO schema and recipes, and whether its Python reads each one. The
// loader uses them twice: a key NeMo RL never reads is Ignored whatever the
// key table says (it cannot change what NeMo RL trains), and the keys a
// section rule marks KnownOnly cover only the keys NeMo RL knows there (an
// unknown one there is a typo to warn about).

//go:embed gen_nemorl_keys.tsv
var nemoRLKeysTSV string

// nemoRLKey is one row of gen_nemorl_keys.tsv.
type nemoRLKey struct {
	Path, Declared, Type, Reads, Writes string
}

type nemoRLTable struct {
	commit     string // the upstream commit, abbreviated
	fullCommit string
	keys       map[string]nemoRLKey
	paths      []string // in file order
}

var (
	nemoRLOnce sync.Once
	nemoRLTab  *nemoRLTable
)

func nemoRL() *nemoRLTable {
	nemoRLOnce.Do(func() {
		t, err := parseNeMoRLKeys(nemoRLKeysTSV)
		if err != nil {
			panic(err) // the embedded file is ours: a test parses it
		}
		nemoRLTab = t
	})
	return nemoRLTab
}

func parseNeMoRLKeys(data string) (*nemoRLTable, error) {
	t := &nemoRLTable{keys: map[string]nemoRLKey{}}
	for i, line := range strings.Split(data, "\n") {
		if rest, ok := strings.CutPrefix(line, "# upstream: NVIDIA-NeMo/RL "); ok {
			c, _, _ := strings.Cut(rest, " ")
			t.fullCommit, t.commit = c, c[:min(len(c), 9)]
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 6 {
			return nil, fmt.Errorf("config: gen_nemorl_keys.tsv:%d: want 6 columns, found %d (run make schema)", i+1, len(f))
		}
		k := nemoRLKey{Path: f[0], Declared: f[1], Type: f[2], Reads: f[4], Writes: f[5]}
		t.keys[k.Path] = k
		t.paths = append(t.paths, k.Path)
	}
	if t.commit == "" || len(t.keys) == 0 {
		return nil, fmt.Errorf("config: gen_nemorl_keys.tsv: no upstream commit or no keys (run make schema)")
	}
	return t, nil
}

func nemoRLKeyPaths() []string { return nemoRL().paths }

// knownToNeMoRL reports whether NeMo RL's schema or recipes have key path p
// (list indices dropped), or p lies under a key declared as a mapping of
// any keys.
func knownToNeMoRL(p string) bool {
	t := nemoRL()
	if _, ok := t.keys[p]; ok {
		return true
	}
	for q := p; ; {
		i := strings.LastIndexByte(q, '.')
		if i < 0 {
			return false
		}
		q = q[:i]
		if k, ok := t.keys[q]; ok && strings.Contains(k.Type, "mapping(any key)") {
			return true
		}
	}
}

// neverReadRules are the synthesized rules of the keys NeMo RL never reads.
var neverReadRules sync.Map // path -> *KeyRule

// neverRead is the Ignored rule of key path p (list indices dropped) when
// NeMo RL's Python never reads it, or nil. under is the key table's rule
// for p (may be nil), whose reason the new one keeps.
func neverRead(p string, under *KeyRule) *KeyRule {
	k, ok := nemoRL().keys[p]
	if !ok || k.Reads != "no" {
		return nil
	}
	if r, ok := neverReadRules.Load(p); ok {
		return r.(*KeyRule)
	}
	why := fmt.Sprintf("NeMo RL's Python never reads it (nothing in nemo_rl/ or examples/ at %s reads %s, as scripts/nemorl_schema.py finds), so it cannot change what NeMo RL trains", nemoRL().commit, lastSeg(p))
	if under != nil && under.Key == p && under.Why != "" {
		why += "; " + under.Why
	}
	r := &KeyRule{Key: p, Class: Ignored, Why: why}
	act, _ := neverReadRules.LoadOrStore(p, r)
	return act.(*KeyRule)
}

func lastSeg(p string) string {
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[i+1:]
	}
	return p
}
