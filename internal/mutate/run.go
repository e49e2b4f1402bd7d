package mutate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// Graph is the module's packages and what their tests build on, from
// go list.
type Graph struct {
	pkgs map[string]*pkgInfo // by import path
}

type pkgInfo struct {
	path, rel   string          // import path; directory relative to the root, slash-separated
	deps        map[string]bool // what the package itself builds on (transitively)
	testImports []string        // what its tests import directly
}

// LoadGraph lists the module's packages under root with go list.
func LoadGraph(ctx context.Context, root string) (*Graph, error) {
	const sep = "\x1f"
	cmd := exec.CommandContext(ctx, "go", "list", "-e", "-f",
		strings.Join([]string{"{{.ImportPath}}", "{{.Dir}}", `{{join .Deps " "}}`,
			`{{join .TestImports " "}} {{join .XTestImports " "}}`}, sep), "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("mutate: go list: %v\n%s", err, stderr.Bytes())
	}
	absRoot, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	g := &Graph{pkgs: map[string]*pkgInfo{}}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, sep)
		if len(f) != 4 {
			return nil, fmt.Errorf("mutate: go list printed %q", line)
		}
		rel, err := filepath.Rel(absRoot, f[1])
		if err != nil {
			return nil, err
		}
		p := &pkgInfo{path: f[0], rel: filepath.ToSlash(rel), deps: map[string]bool{}, testImports: strings.Fields(f[3])}
		for _, d := range strings.Fields(f[2]) {
			p.deps[d] = true
		}
		g.pkgs[p.path] = p
	}
	return g, nil
}

// ownPackage is the package a file belongs to: its directory's, or, for a
// file in a directory without Go code (kernels/cuda/csrc), the nearest
// enclosing package's.
func (g *Graph) ownPackage(file string) (*pkgInfo, error) {
	byDir := map[string]*pkgInfo{}
	for _, p := range g.pkgs {
		byDir[p.rel] = p
	}
	for dir := filepath.ToSlash(filepath.Dir(file)); ; dir = filepath.ToSlash(filepath.Dir(dir)) {
		if p, ok := byDir[dir]; ok {
			return p, nil
		}
		if dir == "." || dir == "/" {
			return nil, fmt.Errorf("mutate: %s is in no Go package of the module and no enclosing one", file)
		}
	}
}

// affected reports whether the tests of q build on p.
func (g *Graph) affected(q *pkgInfo, p string) bool {
	if q.path == p || q.deps[p] {
		return true
	}
	for _, i := range q.testImports {
		if i == p {
			return true
		}
		if d, ok := g.pkgs[i]; ok && d.deps[p] {
			return true
		}
	}
	return false
}

// Packages returns the packages whose tests m is checked against, as
// ./dir patterns: m.Packages when the list names them, else the file's own
// package first, then every package whose tests build on it, by path.
func (g *Graph) Packages(m Mutant) ([]string, error) {
	if len(m.Packages) > 0 {
		return m.Packages, nil
	}
	own, err := g.ownPackage(m.File)
	if err != nil {
		return nil, err
	}
	var rest []string
	for _, q := range g.pkgs {
		if q != own && g.affected(q, own.path) {
			rest = append(rest, dirPattern(q.rel))
		}
	}
	sort.Strings(rest)
	return append([]string{dirPattern(own.rel)}, rest...), nil
}

// Area is where a mutant is counted in the summary: its file's package
// directory.
func (g *Graph) Area(m Mutant) string {
	if p, err := g.ownPackage(m.File); err == nil {
		return p.rel
	}
	return filepath.ToSlash(filepath.Dir(m.File))
}

func dirPattern(rel string) string {
	if rel == "." {
		return "."
	}
	return "./" + rel
}

// Outcomes of a mutant.
const (
	Caught   = "caught"
	Survived = "SURVIVED"
	Expected = "survived as expected"
	Invalid  = "INVALID"
)

// Result is what became of one mutant.
type Result struct {
	Mutant  Mutant
	Area    string
	Outcome string
	By      string   // the failing test (or "panic", "timeout") when caught
	Package string   // where it was caught
	Tested  []string // the packages whose tests ran
	Elapsed time.Duration
	Output  string // the failing go test's output, when caught or invalid
}

// Options of Run.
type Options struct {
	Root    string
	Timeout time.Duration // go test -timeout per package (0: go test's default)
	Log     io.Writer     // one line per mutant, as it finishes
	Verbose bool          // also the output of the go test that caught each
}

// Run plants each mutant in turn, runs its packages' tests and restores
// the file. It first checks that every mutant applies, so that a stale
// list fails before any test runs. When ctx is cancelled (a signal) the
// planted file is restored and Run returns ctx's error.
func Run(ctx context.Context, opt Options, ms []Mutant) ([]Result, error) {
	if opt.Log == nil {
		opt.Log = io.Discard
	}
	if fixed, err := RecoverLeftovers(opt.Root); err != nil {
		return nil, err
	} else if len(fixed) > 0 {
		fmt.Fprintf(opt.Log, "mutate: restored %s from %s/ (left mutated by a run that was killed)\n", strings.Join(fixed, ", "), backupDir)
	}
	var errs []error
	for _, m := range ms {
		if _, err := Check(opt.Root, m); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	g, err := LoadGraph(ctx, opt.Root)
	if err != nil {
		return nil, err
	}
	var out []Result
	for i, m := range ms {
		r, err := runOne(ctx, opt, g, m)
		if err != nil {
			return out, err
		}
		out = append(out, r)
		line := fmt.Sprintf("[%d/%d] %-44s %s", i+1, len(ms), m.Name, r.Outcome)
		switch r.Outcome {
		case Caught:
			line += fmt.Sprintf(" by %s in %s", r.By, r.Package)
		case Survived, Expected:
			line += fmt.Sprintf(" (tested %s)", strings.Join(r.Tested, " "))
		case Invalid:
			line += fmt.Sprintf(": %s does not build with it:\n%s", r.Package, r.Output)
		}
		fmt.Fprintf(opt.Log, "%s (%.0fs)\n", line, r.Elapsed.Seconds())
		if opt.Verbose && r.Outcome == Caught {
			fmt.Fprintln(opt.Log, indent(r.Output))
		}
	}
	return out, nil
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

func runOne(ctx context.Context, opt Options, g *Graph, m Mutant) (r Result, err error) {
	r = Result{Mutant: m, Area: g.Area(m), Outcome: Survived}
	if m.Survives != "" {
		r.Outcome = Expected
	}
	pkgs, err := g.Packages(m)
	if err != nil {
		return r, err
	}
	start := time.Now()
	p, err := Apply(opt.Root, m)
	if err != nil {
		return r, err
	}
	defer func() {
		if rerr := p.Restore(); rerr != nil && err == nil {
			err = rerr
		}
		r.Elapsed = time.Since(start)
	}()
	for _, pkg := range pkgs {
		r.Tested = append(r.Tested, pkg)
		out, failed, err := goTest(ctx, opt, m, pkg)
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		if err != nil {
			return r, err
		}
		if !failed {
			continue
		}
		r.Package, r.Output = pkg, tail(out, 60)
		if buildFailed(out) {
			r.Outcome = Invalid
			return r, nil
		}
		r.Outcome, r.By = Caught, failingTest(out)
		return r, nil
	}
	return r, nil
}

// goTest runs one package's tests with the mutant planted, in the
// environment the check runs in (make mutate passes make test's), in its
// own process group so that a cancellation ends every process it started.
// -count=1: go test's cache does not see files that only a subprocess reads
// (the headers g++ includes for the CUDA emulator).
func goTest(ctx context.Context, opt Options, m Mutant, pkg string) (out []byte, failed bool, err error) {
	args := []string{"test", "-count=1", "-failfast"}
	if opt.Timeout > 0 {
		args = append(args, "-timeout", opt.Timeout.String())
	}
	if m.Skip != "" {
		args = append(args, "-skip", m.Skip)
	}
	args = append(args, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = opt.Root
	ownProcessGroup(cmd)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return buf.Bytes(), true, nil
	}
	if err != nil {
		return buf.Bytes(), false, fmt.Errorf("mutate: go %s: %v", strings.Join(args, " "), err)
	}
	return buf.Bytes(), false, nil
}

var (
	buildFailedRE = regexp.MustCompile(`(?m)\[(build|setup) failed\]|^# `)
	failRE        = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)
)

func buildFailed(out []byte) bool { return buildFailedRE.Match(out) }

// failingTest names the first test that failed, or how the binary ended.
func failingTest(out []byte) string {
	if m := failRE.FindSubmatch(out); m != nil {
		return string(m[1])
	}
	switch {
	case bytes.Contains(out, []byte("panic: test timed out")):
		return "timeout"
	case bytes.Contains(out, []byte("panic:")):
		return "panic"
	}
	return "the test binary's exit status"
}

func tail(b []byte, lines int) string {
	s := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(s) > lines {
		s = s[len(s)-lines:]
	}
	return strings.Join(s, "\n")
}

// Summary writes the score: caught of total per area and in all (mutants
// that do not build, and the survivors the list expects, are not counted),
// the survivors, the invalid mutants, and the expected survivors with their
// reasons. ok is false when a mutant that must be caught survived or was
// invalid.
func Summary(w io.Writer, rs []Result) (ok bool) {
	type score struct{ caught, total int }
	areas := map[string]*score{}
	var names []string
	var total score
	ok = true
	for _, r := range rs {
		s := areas[r.Area]
		if s == nil {
			s = &score{}
			areas[r.Area] = s
			names = append(names, r.Area)
		}
		if r.Outcome == Expected || r.Outcome == Invalid {
			ok = ok && r.Outcome != Invalid
			continue // not counted: an equivalent change, or an error of the list
		}
		s.total++
		total.total++
		if r.Outcome == Caught {
			s.caught++
			total.caught++
		} else {
			ok = false
		}
	}
	slices.Sort(names)
	fmt.Fprintf(w, "mutation score: %d of %d caught\n", total.caught, total.total)
	for _, a := range names {
		fmt.Fprintf(w, "  %-24s %d/%d\n", a, areas[a].caught, areas[a].total)
	}
	for _, r := range rs {
		switch r.Outcome {
		case Survived:
			fmt.Fprintf(w, "survived: %s (%s; %s): %s\n", r.Mutant.Name, r.Mutant.File, r.Mutant.where(), r.Mutant.Why)
		case Invalid:
			fmt.Fprintf(w, "invalid (does not build): %s (%s; %s)\n", r.Mutant.Name, r.Mutant.File, r.Mutant.where())
		case Expected:
			fmt.Fprintf(w, "survived as the list expects: %s: %s\n", r.Mutant.Name, r.Mutant.Survives)
		}
	}
	return ok
}

// Root returns the repository root: the nearest directory at or above dir
// holding go.mod.
func Root(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("mutate: no go.mod at or above %s", dir)
		}
		d = parent
	}
}
