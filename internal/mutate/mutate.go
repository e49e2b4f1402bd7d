// Package mutate is the mutation check behind `make mutate`: it plants
// known bugs in the source, one at a time, runs the tests of the packages
// they touch as `make test` runs them, and reports which bugs the suite
// catches. A bug the suite lets through (a survivor) is a missing test.
//
// # The list
//
// The bugs ("mutants") are listed in text files (scripts/mutants.txt and
// every scripts/mutants/*.txt, one per area of work, read in name order by
// ReadLists; a name must be unique across all of them), each an exact text
// replacement in one file of the repository:
//
//	# A comment line. Blank lines are ignored.
//	mutant: trainer/weights-hash-drops-tail
//	file: trainer/ranks.go
//	why: the ranks' weights hash skips the last partial 64 KiB chunk
//	from:
//	|	h.Write(buf)
//	|	return h.Sum(nil), nil
//	to:
//	|	return h.Sum(nil), nil
//
// Fields, one per line, "key: value":
//
//	mutant:   a unique name, by convention the package, a slash, and a
//	          few words; it starts a mutant
//	file:     the file to change, relative to the repository root
//	why:      what the planted bug is, in words (required)
//	from:     the exact text to replace: on the same line after "from: ",
//	          or, with nothing after the colon, the following lines that
//	          start with "|" (the "|" removed, the rest kept byte for byte,
//	          tabs included; the lines joined by newlines)
//	to:       the replacement, written as from is; may be empty
//	packages: optional: the packages to test (space-separated patterns such
//	          as ./kernels/cuda) instead of the file's own package and every
//	          package whose tests build on it
//	skip:     optional: a go test -skip regular expression, for tests that
//	          fail on any change to the file rather than on the bug (the
//	          committed-PTX freshness check for a kernel source)
//	survives: optional: why the suite is right to let this mutant through
//	          (an equivalent change); it is then reported, not counted as a
//	          failure of the check
//
// The from text must occur exactly once in the file: a mutant whose text
// has moved or changed fails the whole check before any test runs (and
// TestListApplies fails in CI), so the list cannot rot silently.
//
// # Running
//
// Each mutant is written into its file, the packages' tests run one
// package at a time (its own package first, -count=1 -failfast, stopping
// at the first failure), and the file is put back byte for byte. A copy
// of the original waits in .mutate/backup/ under the repository root while
// the mutant is planted: an interrupted run (Ctrl-C, SIGTERM) restores the
// file before it exits, and a killed one is repaired by the next run.
// A mutant that does not build is an error of the list, not a catch.
package mutate

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Mutant is one planted bug: From replaced by To in File.
type Mutant struct {
	Name     string
	File     string // relative to the repository root, slash-separated
	Why      string
	From, To string
	Packages []string // override of the packages to test (nil: derived)
	Skip     string   // go test -skip regexp ("": none)
	Survives string   // why surviving is correct ("": it must be caught)
	Line     int      // where the mutant starts in the list
	List     string   // the list's path, relative to the root (set by ReadLists)
}

// ListError is a defect of the mutant list: its file, line and what is
// wrong there.
type ListError struct {
	File string
	Line int
	Msg  string
}

func (e *ListError) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg) }

// DefaultLists are the lists `make mutate` and TestListApplies read, as
// patterns relative to the repository root.
var DefaultLists = []string{"scripts/mutants.txt", "scripts/mutants/*.txt"}

// ReadLists reads and parses the lists that the patterns (relative to root,
// filepath.Glob syntax) name, in pattern order and, within a pattern, in name
// order. A pattern with no wildcard must name an existing file; a name given
// twice, in one list or across two, is a ListError.
func ReadLists(root string, patterns ...string) ([]Mutant, error) {
	var out []Mutant
	where := map[string]string{}
	for _, pat := range patterns {
		files := []string{pat}
		if strings.ContainsAny(pat, "*?[") {
			m, err := filepath.Glob(filepath.Join(root, pat))
			if err != nil {
				return nil, fmt.Errorf("mutate: list pattern %q: %w", pat, err)
			}
			files = files[:0]
			for _, f := range m {
				rel, err := filepath.Rel(root, f)
				if err != nil {
					return nil, err
				}
				files = append(files, filepath.ToSlash(rel))
			}
		}
		for _, rel := range files {
			data, err := os.ReadFile(filepath.Join(root, rel))
			if err != nil {
				return nil, fmt.Errorf("mutate: %w", err)
			}
			ms, err := Parse(rel, data)
			if err != nil {
				return nil, err
			}
			for _, m := range ms {
				if prev, dup := where[m.Name]; dup {
					return nil, &ListError{File: rel, Line: m.Line, Msg: fmt.Sprintf("mutant %q is already listed in %s", m.Name, prev)}
				}
				where[m.Name] = fmt.Sprintf("%s:%d", rel, m.Line)
				m.List = rel
				out = append(out, m)
			}
		}
	}
	return out, nil
}

// Parse reads a mutant list (name is the list's path, for errors).
func Parse(name string, data []byte) ([]Mutant, error) {
	fail := func(line int, format string, args ...any) error {
		return &ListError{File: name, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	lines := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	var out []Mutant
	var cur *Mutant
	var have map[string]bool
	seen := map[string]int{}
	finish := func() error {
		if cur == nil {
			return nil
		}
		for _, k := range []string{"file", "why", "from", "to"} {
			if !have[k] {
				return fail(cur.Line, "mutant %q has no %s:", cur.Name, k)
			}
		}
		if cur.From == "" {
			return fail(cur.Line, "mutant %q: from: is empty", cur.Name)
		}
		if cur.From == cur.To {
			return fail(cur.Line, "mutant %q: from: and to: are the same text", cur.Name)
		}
		out = append(out, *cur)
		return nil
	}
	for i := 0; i < len(lines); i++ {
		n, line := i+1, lines[i]
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		if strings.HasPrefix(line, "|") {
			return nil, fail(n, `a "|" line outside a from: or to: block`)
		}
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fail(n, "want key: value, found %q", line)
		}
		key = strings.TrimSpace(key)
		val = strings.TrimPrefix(val, " ")
		if key == "mutant" {
			if err := finish(); err != nil {
				return nil, err
			}
			val = strings.TrimSpace(val)
			if val == "" || strings.ContainsAny(val, " \t") {
				return nil, fail(n, "mutant: want a name without spaces, found %q", val)
			}
			if prev, dup := seen[val]; dup {
				return nil, fail(n, "mutant %q is also named on line %d", val, prev)
			}
			seen[val] = n
			cur, have = &Mutant{Name: val, Line: n}, map[string]bool{}
			continue
		}
		if cur == nil {
			return nil, fail(n, "%s: before the first mutant:", key)
		}
		if have[key] {
			return nil, fail(n, "mutant %q has a second %s:", cur.Name, key)
		}
		have[key] = true
		switch key {
		case "file":
			f := filepath.ToSlash(filepath.Clean(strings.TrimSpace(val)))
			if f == "." || filepath.IsAbs(f) || f == ".." || strings.HasPrefix(f, "../") {
				return nil, fail(n, "file: want a path inside the repository, found %q", val)
			}
			cur.File = f
		case "why":
			if cur.Why = strings.TrimSpace(val); cur.Why == "" {
				return nil, fail(n, "why: is empty")
			}
		case "from", "to":
			text := val
			if strings.TrimSpace(val) == "" {
				// The "|" lines that follow, if any (none: an empty to:).
				var block []string
				for i+1 < len(lines) && strings.HasPrefix(lines[i+1], "|") {
					i++
					block = append(block, lines[i][1:])
				}
				text = strings.Join(block, "\n")
			}
			if key == "from" {
				cur.From = text
			} else {
				cur.To = text
			}
		case "packages":
			if cur.Packages = strings.Fields(val); len(cur.Packages) == 0 {
				return nil, fail(n, "packages: is empty")
			}
		case "skip":
			cur.Skip = strings.TrimSpace(val)
			if _, err := regexp.Compile(cur.Skip); err != nil || cur.Skip == "" {
				return nil, fail(n, "skip: want a go test -skip regular expression, found %q", val)
			}
		case "survives":
			if cur.Survives = strings.TrimSpace(val); cur.Survives == "" {
				return nil, fail(n, "survives: wants the reason the suite may let it through")
			}
		default:
			return nil, fail(n, "unknown field %q (want mutant, file, why, from, to, packages, skip or survives)", key)
		}
	}
	if err := finish(); err != nil {
		return nil, err
	}
	return out, nil
}

// where names the mutant's place in its list: "list:line", or "list line N"
// when it was parsed alone.
func (m Mutant) where() string {
	if m.List == "" {
		return fmt.Sprintf("list line %d", m.Line)
	}
	return fmt.Sprintf("%s:%d", m.List, m.Line)
}

// ErrNotOnce is wrapped by Check and Apply when a mutant's from text does
// not occur exactly once in its file.
var ErrNotOnce = errors.New("mutate: the from text does not occur exactly once")

// Check confirms that m's from text occurs exactly once in its file under
// root, and returns the file's content.
func Check(root string, m Mutant) ([]byte, error) {
	path := filepath.Join(root, filepath.FromSlash(m.File))
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("mutant %s (%s): %w", m.Name, m.where(), err)
	}
	if c := bytes.Count(data, []byte(m.From)); c != 1 {
		return nil, fmt.Errorf("mutant %s (%s): %w: %s holds it %d times; update the mutant's from: to the code as it is now",
			m.Name, m.where(), ErrNotOnce, m.File, c)
	}
	return data, nil
}

// Planted is a mutant written into its file; Restore puts the file back.
type Planted struct {
	path, backup string
	orig         []byte
	mode         os.FileMode
	restored     bool
}

// backupDir is where originals wait while their mutant is planted.
const backupDir = ".mutate/backup"

func backupPath(root, file string) string {
	return filepath.Join(root, backupDir, strings.ReplaceAll(file, "/", "%"))
}

// Apply plants m under root: a copy of the file goes to .mutate/ first,
// then the mutated text is written in place.
func Apply(root string, m Mutant) (*Planted, error) {
	data, err := Check(root, m)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(root, filepath.FromSlash(m.File))
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	p := &Planted{path: path, backup: backupPath(root, m.File), orig: data, mode: fi.Mode().Perm()}
	if err := os.MkdirAll(filepath.Dir(p.backup), 0o755); err != nil {
		return nil, err
	}
	if err := writeSynced(p.backup, data, p.mode); err != nil {
		return nil, fmt.Errorf("mutate: back up %s: %w", m.File, err)
	}
	mutated := bytes.Replace(data, []byte(m.From), []byte(m.To), 1)
	if err := os.WriteFile(path, mutated, p.mode); err != nil {
		p.Restore()
		return nil, fmt.Errorf("mutate: plant %s: %w", m.Name, err)
	}
	return p, nil
}

// Restore writes the original file back and removes its backup; it may be
// called more than once.
func (p *Planted) Restore() error {
	if p == nil || p.restored {
		return nil
	}
	if err := writeSynced(p.path, p.orig, p.mode); err != nil {
		return fmt.Errorf("mutate: restore %s (its original is in %s): %w", p.path, p.backup, err)
	}
	p.restored = true
	return os.Remove(p.backup)
}

func writeSynced(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// RecoverLeftovers puts back every file a killed run left mutated (its
// original still in .mutate/) and returns their paths.
func RecoverLeftovers(root string) ([]string, error) {
	dir := filepath.Join(root, backupDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var done []string
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		file := strings.ReplaceAll(e.Name(), "%", "/")
		orig, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return done, err
		}
		path := filepath.Join(root, filepath.FromSlash(file))
		mode := os.FileMode(0o644)
		if fi, err := os.Stat(path); err == nil {
			mode = fi.Mode().Perm()
		}
		if err := writeSynced(path, orig, mode); err != nil {
			return done, fmt.Errorf("mutate: restore %s from %s: %w", file, e.Name(), err)
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return done, err
		}
		done = append(done, file)
	}
	return done, nil
}
