package docs

import (
	"context"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/internal/testtool"
	"github.com/tracegrpo/tracegrpo/trainer"
)

var update = flag.Bool("update", false, "rewrite the generated parts of README.md and docs/*.md from their commands (make docs)")

// repo is the repository's root, from this package's directory.
const repo = "../.."

// blockTimeout bounds one shell block, so that a block that hangs fails
// (it is no measure of speed: the longest, make run, takes seconds).
const blockTimeout = 10 * time.Minute

// docFiles are the files the docs test reads: README.md, then docs/*.md by
// name.
func docFiles(t *testing.T) []string {
	t.Helper()
	md, err := filepath.Glob(filepath.Join(repo, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(md)
	files := []string{"README.md"}
	for _, m := range md {
		files = append(files, "docs/"+filepath.Base(m))
	}
	return files
}

func readDoc(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, file))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var env struct {
	once sync.Once
	e    *Env
	err  error
}

// sharedEnv is one scratch copy of the repository for the package's tests
// (in a directory removed when the test binary exits).
func sharedEnv(t *testing.T) *Env {
	t.Helper()
	env.once.Do(func() {
		// Go is what the repository is built with, not a tool deps.sh
		// installs: make test puts its bin on PATH.
		goBin, err := exec.LookPath("go")
		if err != nil {
			env.err = fmt.Errorf("the go command is not on PATH: %w", err)
			return
		}
		dir, err := os.MkdirTemp("", "tracegrpo-docs-")
		if err != nil {
			env.err = err
			return
		}
		env.e, env.err = NewEnv(repo, filepath.Join(dir, "repo"), goBin)
	})
	if env.err != nil {
		t.Fatal(env.err)
	}
	return env.e
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if env.e != nil {
		os.RemoveAll(filepath.Dir(env.e.Root))
	}
	os.Exit(code)
}

// TestShellBlocks runs every shell block of README.md and docs/*.md, in
// order, in one scratch copy of the repository, as a reader would paste
// them; a block marked "# needs:" is counted and not run.
func TestShellBlocks(t *testing.T) {
	if *update {
		t.Skip("-update (make docs) rewrites the generated parts; the shell blocks run without it")
	}
	var blocks []Block
	for _, f := range docFiles(t) {
		bs, err := ParseBlocks(f, readDoc(t, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			if b.Shell() {
				blocks = append(blocks, b)
			}
		}
	}
	bash := testtool.Path(t, "bash", "")
	var missing []string
	for _, b := range blocks {
		if b.Needs != "" {
			continue
		}
		for _, p := range Programs(b.Text) {
			if _, err := testtool.Find(p); err != nil && !repoProgram(p) {
				missing = append(missing, fmt.Sprintf("%s runs %s: %v", b, p, err))
			}
		}
	}
	if len(missing) > 0 {
		t.Fatalf("blocks run programs scripts/deps.sh does not provide:\n%s", strings.Join(missing, "\n"))
	}
	e := sharedEnv(t)
	ran, marked := 0, map[string]int{}
	for _, b := range blocks {
		if b.Needs != "" {
			marked[b.Needs]++
			t.Logf("%s: not run (# needs: %s)", b, b.Needs)
			continue
		}
		t0 := time.Now()
		out, err := runBlock(e.Root, bash, b)
		if err != nil {
			t.Fatalf("%s: %v\n--- the block:\n%s--- its output:\n%s", b, err, b.Text, out)
		}
		ran++
		t.Logf("%s: ran in %.1fs", b, time.Since(t0).Seconds())
	}
	t.Logf("%d shell blocks: %d run, %d marked (gpu %d, cluster %d, suite %d)", len(blocks), ran,
		marked["gpu"]+marked["cluster"]+marked["suite"], marked["gpu"], marked["cluster"], marked["suite"])
}

// repoProgram reports whether p is a program of the repository itself,
// run by its path (bin/train, scripts/...).
func repoProgram(p string) bool {
	return strings.HasPrefix(p, "bin/") || strings.HasPrefix(p, "scripts/") || strings.HasPrefix(p, "./")
}

// runBlock runs b with bash -e -o pipefail in dir, in a process group of its
// own that is ended with it.
func runBlock(dir, bash string, b Block) (string, error) {
	script := filepath.Join(dir, "runs", fmt.Sprintf(".docs-block-%d.sh", b.Line))
	if err := os.MkdirAll(filepath.Dir(script), 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(script, []byte(b.Text), 0o644); err != nil {
		return "", err
	}
	defer os.Remove(script)
	ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bash, "-e", "-o", "pipefail", script)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // anything it left behind
	}
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("no end in %v (a hang)", blockTimeout)
	}
	return string(out), err
}

// TestGenerated regenerates every generated part of README.md and docs/*.md
// and fails where the committed text differs: make docs (this test with
// -update) writes them.
func TestGenerated(t *testing.T) {
	e := sharedEnv(t)
	bodies := map[string]string{}
	for _, f := range docFiles(t) {
		text := readDoc(t, f)
		parts, err := ParseParts(f, text)
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := ParseBlocks(f, text)
		if err != nil {
			t.Fatal(err)
		}
		next := map[string]string{}
		for _, p := range parts {
			g, ok := Generators[p.Name]
			key := p.Name // bodies are shared between files, outputs are not
			if strings.HasPrefix(p.Name, OutputPrefix) {
				b, found := BlockBefore(blocks, p)
				if !found {
					t.Errorf("%s:%d: the part %s holds a block's output, and no shell block comes before it", f, p.Line, p.Name)
					continue
				}
				bash := testtool.Path(t, "bash", "")
				g, ok = Generator{Name: p.Name, From: "the shell block at " + b.String(), Gen: func(e *Env) (string, error) { return e.Output(bash, b) }}, true
				key = f + ":" + p.Name
			}
			if !ok {
				t.Errorf("%s:%d: no generator makes a part named %s", f, p.Line, p.Name)
				continue
			}
			body, done := bodies[key]
			if !done {
				t0 := time.Now()
				if body, err = g.Gen(e); err != nil {
					t.Errorf("%s:%d: gen %s (from %s): %v", f, p.Line, p.Name, g.From, err)
					continue
				}
				bodies[key] = body
				t.Logf("gen %s: %.1fs", p.Name, time.Since(t0).Seconds())
			}
			same := body == p.Body
			if g.Same != nil {
				same = g.Same(body, p.Body)
			}
			if same {
				continue
			}
			if *update {
				next[p.Name] = body
				continue
			}
			t.Errorf("%s:%d: the part %s is not what %s prints now; run make docs (-committed +now):\n%s", f, p.Line, p.Name, g.From, cmp.Diff(p.Body, body))
		}
		if len(next) > 0 {
			if err := os.WriteFile(filepath.Join(repo, f), []byte(Replace(text, parts, next)), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: rewrote %d parts", f, len(next))
		}
	}
}

// TestMetricsDocumented: docs/metrics.md has one row for every field
// metrics.jsonl can hold (trainer.Metrics, phase_s's fields as
// phase_s.NAME), and none for a field that does not exist.
func TestMetricsDocumented(t *testing.T) {
	want := jsonFields(reflect.TypeOf(trainer.Metrics{}), "")
	got := tableNames(t, "docs/metrics.md", "# Metrics")
	sort.Strings(want)
	sort.Strings(got)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("docs/metrics.md's fields against trainer.Metrics (-code +doc):\n%s", d)
	}
}

// jsonFields lists the JSON names of t's fields, a struct field's own
// fields as prefix.name too.
func jsonFields(t reflect.Type, prefix string) []string {
	var out []string
	for f := range t.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" || !f.IsExported() {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		out = append(out, prefix+tag)
		if f.Type.Kind() == reflect.Struct && f.Type.NumField() > 0 && f.Type.PkgPath() == t.PkgPath() {
			out = append(out, jsonFields(f.Type, prefix+tag+".")...)
		}
	}
	return out
}

// tableNames returns the backquoted first cells of the table rows of the
// section of file that starts at heading (up to the next heading of any
// level but deeper ones).
func tableNames(t *testing.T, file, heading string) []string {
	t.Helper()
	_, sec, ok := strings.Cut(readDoc(t, file), heading+"\n")
	if !ok {
		t.Fatalf("%s has no %q", file, heading)
	}
	level := strings.Count(strings.Fields(heading)[0], "#")
	var names []string
	for _, l := range strings.Split(sec, "\n") {
		if h := strings.Fields(l); len(h) > 0 && strings.Trim(h[0], "#") == "" && len(h[0]) <= level {
			break
		}
		if rest, ok := strings.CutPrefix(l, "| `"); ok {
			name, _, _ := strings.Cut(rest, "`")
			names = append(names, name)
		}
	}
	return names
}

// TestMaskReasonsDocumented: docs/gym.md's mask reasons are the codes
// package gym defines (its Reason constants), each once.
func TestMaskReasonsDocumented(t *testing.T) {
	fset := token.NewFileSet()
	srcs, err := filepath.Glob(filepath.Join(repo, "gym", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, src := range srcs {
		if strings.HasSuffix(src, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, src, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "Reason") || i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, _ := strconv.Unquote(lit.Value)
						want = append(want, v)
					}
				}
			}
		}
	}
	if len(want) < 10 {
		t.Fatalf("found %d Reason constants in gym/: the parse is wrong", len(want))
	}
	got := tableNames(t, "docs/gym.md", "## Mask reasons")
	sort.Strings(want)
	sort.Strings(got)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("docs/gym.md's mask reasons against package gym's Reason constants (-code +doc):\n%s", d)
	}
}

// TestDocLinks: every relative link of README.md and docs/*.md names a file
// that exists, and a #fragment a heading of it.
func TestDocLinks(t *testing.T) {
	linkRE := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, f := range docFiles(t) {
		text := readDoc(t, f)
		for _, m := range linkRE.FindAllStringSubmatch(stripFences(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := f
			if file != "" {
				path = filepath.ToSlash(filepath.Join(filepath.Dir(f), file))
			}
			b, err := os.ReadFile(filepath.Join(repo, path))
			if err != nil {
				if fi, serr := os.Stat(filepath.Join(repo, path)); serr == nil && fi.IsDir() {
					continue
				}
				t.Errorf("%s: link %s: %v", f, target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !slices.Contains(anchors(string(b)), frag) {
				t.Errorf("%s: link %s: %s has no heading #%s", f, target, path, frag)
			}
		}
	}
}

func stripFences(text string) string {
	bs, _ := ParseBlocks("", text)
	for _, b := range bs {
		text = strings.Replace(text, b.Text, "", 1)
	}
	return text
}

// anchors are the GitHub anchors of text's headings.
func anchors(text string) []string {
	var out []string
	seen := map[string]int{}
	for _, l := range strings.Split(stripFences(text), "\n") {
		h, ok := strings.CutPrefix(l, "#")
		if !ok {
			continue
		}
		h = strings.TrimLeft(h, "#")
		if !strings.HasPrefix(h, " ") {
			continue
		}
		a := strings.Map(func(r rune) rune {
			switch {
			case r == ' ' || r == '-':
				return '-'
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
				return r
			case r >= 'A' && r <= 'Z':
				return r + 'a' - 'A'
			case r > 127:
				return r
			}
			return -1
		}, strings.TrimSpace(h))
		if n := seen[a]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}
