package mutate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		name, list string
		want       []Mutant
	}{
		{"one line each", "mutant: a/x\nfile: a/a.go\nwhy: because\nfrom: x + 1\nto: x - 1\n",
			[]Mutant{{Name: "a/x", File: "a/a.go", Why: "because", From: "x + 1", To: "x - 1", Line: 1}}},
		{"blocks keep tabs and spaces", "# c\n\nmutant: a/y\nfile: ./a/../a/a.go\nwhy: w\nfrom:\n|\tif a {\n|  b()\nto:\n|\tif !a {\n|  b()\n",
			[]Mutant{{Name: "a/y", File: "a/a.go", Why: "w", From: "\tif a {\n  b()", To: "\tif !a {\n  b()", Line: 3}}},
		{"an empty to: deletes", "mutant: a/z\nfile: a.go\nwhy: w\nfrom: \tx()\nto:\n",
			[]Mutant{{Name: "a/z", File: "a.go", Why: "w", From: "\tx()", To: "", Line: 1}}},
		{"optional fields, two mutants", "mutant: k/1\nfile: k/k.cu\nwhy: w\nskip: ^TestPTXFresh$\npackages: ./k ./j\nfrom: a\nto: b\n" +
			"mutant: k/2\nfile: k/k.go\nwhy: w\nsurvives: the same value either way\nfrom: a\nto: b\n",
			[]Mutant{
				{Name: "k/1", File: "k/k.cu", Why: "w", Skip: "^TestPTXFresh$", Packages: []string{"./k", "./j"}, From: "a", To: "b", Line: 1},
				{Name: "k/2", File: "k/k.go", Why: "w", Survives: "the same value either way", From: "a", To: "b", Line: 8},
			}},
		{"CRLF", "mutant: a/x\r\nfile: a.go\r\nwhy: w\r\nfrom:\r\n|x\r\nto: y\r\n",
			[]Mutant{{Name: "a/x", File: "a.go", Why: "w", From: "x", To: "y", Line: 1}}},
		{"nothing", "# only a comment\n", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Parse("list", []byte(c.list))
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(c.want, got, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

// TestParseErrors: every defect of a list is refused, naming the list's
// line and what is wrong there.
func TestParseErrors(t *testing.T) {
	ok := "mutant: a/x\nfile: a.go\nwhy: w\nfrom: a\nto: b\n"
	for _, c := range []struct{ name, list, want string }{
		{"field before a mutant", "file: a.go\n", "list:1: file: before the first mutant"},
		{"no colon", "mutant: a/x\nfile a.go\n", `list:2: want key: value, found "file a.go"`},
		{"unknown field", "mutant: a/x\nfiel: a.go\n", `list:2: unknown field "fiel"`},
		{"missing why", "mutant: a/x\nfile: a.go\nfrom: a\nto: b\n", `list:1: mutant "a/x" has no why:`},
		{"missing to", "mutant: a/x\nfile: a.go\nwhy: w\nfrom: a\n", `list:1: mutant "a/x" has no to:`},
		{"empty from", "mutant: a/x\nfile: a.go\nwhy: w\nfrom:\nto: b\n", `list:1: mutant "a/x": from: is empty`},
		{"no change", "mutant: a/x\nfile: a.go\nwhy: w\nfrom: a\nto: a\n", "from: and to: are the same text"},
		{"duplicate name", ok + ok, `list:6: mutant "a/x" is also named on line 1`},
		{"second field", "mutant: a/x\nfile: a.go\nfile: b.go\n", `list:3: mutant "a/x" has a second file:`},
		{"stray block line", ok + "|x\n", `list:6: a "|" line outside a from: or to: block`},
		{"name with a space", "mutant: a x\n", `list:1: mutant: want a name without spaces`},
		{"file outside", "mutant: a/x\nfile: ../etc/passwd\n", "list:2: file: want a path inside the repository"},
		{"absolute file", "mutant: a/x\nfile: /etc/passwd\n", "list:2: file: want a path inside the repository"},
		{"bad skip", "mutant: a/x\nskip: (\n", "list:2: skip: want a go test -skip regular expression"},
		{"empty survives", "mutant: a/x\nsurvives:\n", "list:2: survives: wants the reason"},
		{"empty packages", "mutant: a/x\npackages:\n", "list:2: packages: is empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("list", []byte(c.list))
			var le *ListError
			if !errors.As(err, &le) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse: %v, want a ListError containing %q", err, c.want)
			}
		})
	}
}

// FuzzParse: Parse never panics, and what it accepts is well formed.
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile("../../scripts/mutants.txt"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("mutant: a/x\nfile: a.go\nwhy: w\nfrom:\n|\tx\nto:\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ms, err := Parse("fuzz", data)
		if err != nil {
			return
		}
		names := map[string]bool{}
		for _, m := range ms {
			if m.Name == "" || m.File == "" || m.Why == "" || m.From == "" || m.From == m.To || names[m.Name] {
				t.Fatalf("accepted a malformed mutant %+v", m)
			}
			if filepath.IsAbs(m.File) || strings.HasPrefix(m.File, "../") {
				t.Fatalf("accepted a file outside the repository: %q", m.File)
			}
			names[m.Name] = true
		}
	})
}

// TestReadListsJoinsAndRefusesDuplicates: the lists a pattern names are read
// in name order after the plain ones, each mutant keeps its list's path for
// its messages, and a name listed in two files is refused naming both.
func TestReadListsJoinsAndRefusesDuplicates(t *testing.T) {
	root := t.TempDir()
	write := func(rel, name string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		body := "mutant: " + name + "\nfile: a.go\nwhy: w\nfrom: x\nto: y\n"
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("scripts/mutants.txt", "a/base")
	write("scripts/mutants/b.txt", "b/two")
	write("scripts/mutants/a.txt", "a/one")
	ms, err := ReadLists(root, DefaultLists...)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.Name+"@"+m.where())
	}
	want := []string{"a/base@scripts/mutants.txt:1", "a/one@scripts/mutants/a.txt:1", "b/two@scripts/mutants/b.txt:1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ReadLists (-want +got):\n%s", diff)
	}
	write("scripts/mutants/c.txt", "b/two")
	_, err = ReadLists(root, DefaultLists...)
	var le *ListError
	if !errors.As(err, &le) || le.File != "scripts/mutants/c.txt" || !strings.Contains(err.Error(), "scripts/mutants/b.txt:1") {
		t.Errorf("a name in two lists: %v, want a ListError of scripts/mutants/c.txt naming scripts/mutants/b.txt:1", err)
	}
	if _, err := ReadLists(root, "scripts/missing.txt"); err == nil {
		t.Error("a named list that does not exist was accepted")
	}
}

// TestListApplies: every mutant of scripts/mutants.txt applies to the code
// as it is: its from: text occurs exactly once in its file. When code a
// mutant plants its bug in changes, this fails here (in CI), not months
// later in make mutate: update the mutant's from: and to:.
func TestListApplies(t *testing.T) {
	root, err := Root(".")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := ReadLists(root, DefaultLists...)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 25 {
		t.Errorf("the lists %v hold %d mutants, want at least 25", DefaultLists, len(ms))
	}
	for _, m := range ms {
		if _, err := Check(root, m); err != nil {
			t.Error(err)
		}
	}
}

// TestApplyRestores: Apply plants exactly one replacement with a backup
// beside it, Restore puts back the bytes and mode, and a run killed while a
// mutant was planted is repaired by RecoverLeftovers.
func TestApplyRestores(t *testing.T) {
	root := t.TempDir()
	orig := []byte("package a\n\nfunc F() int { return 1 + 1 }\n")
	path := filepath.Join(root, "a", "a.go")
	os.MkdirAll(filepath.Dir(path), 0o755)
	if err := os.WriteFile(path, orig, 0o640); err != nil {
		t.Fatal(err)
	}
	m := Mutant{Name: "a/minus", File: "a/a.go", From: "1 + 1", To: "1 - 1"}
	p, err := Apply(root, m)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "package a\n\nfunc F() int { return 1 - 1 }\n" {
		t.Fatalf("planted: %q", got)
	}
	if got, _ := os.ReadFile(backupPath(root, m.File)); !bytes.Equal(got, orig) {
		t.Fatalf("backup holds %q", got)
	}
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	if err := p.Restore(); err != nil {
		t.Fatalf("a second Restore: %v", err)
	}
	fi, _ := os.Stat(path)
	if got, _ := os.ReadFile(path); !bytes.Equal(got, orig) || fi.Mode().Perm() != 0o640 {
		t.Fatalf("restored %q mode %v", got, fi.Mode().Perm())
	}
	if _, err := os.Stat(backupPath(root, m.File)); !os.IsNotExist(err) {
		t.Errorf("the backup is still there after Restore: %v", err)
	}
	// A run killed outright: the next run finds the backup and restores.
	if _, err := Apply(root, m); err != nil {
		t.Fatal(err)
	}
	fixed, err := RecoverLeftovers(root)
	if err != nil || len(fixed) != 1 || fixed[0] != "a/a.go" {
		t.Fatalf("RecoverLeftovers = %v, %v", fixed, err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, orig) {
		t.Fatalf("recovered %q", got)
	}
	// Text that is absent, or there twice, is refused before any write.
	for _, from := range []string{"2 + 2", "1"} {
		_, err := Apply(root, Mutant{Name: "a/x", File: "a/a.go", From: from, To: "y"})
		if !errors.Is(err, ErrNotOnce) {
			t.Errorf("from %q: %v, want ErrNotOnce", from, err)
		}
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, orig) {
		t.Fatalf("a refused mutant changed the file: %q", got)
	}
}

// tinyModule writes a module with package a (F, tested), package b (its
// tests use a) and package c (independent) and returns its root.
func tinyModule(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"go.mod":      "module example.com/tiny\n\ngo 1.22\n",
		"a/a.go":      "package a\n\n// F is two.\nfunc F() int { return 1 + 1 }\n\n// G is unused by the tests.\nfunc G() int { return 3 }\n",
		"a/a_test.go": "package a\n\nimport \"testing\"\n\nfunc TestF(t *testing.T) {\n\tif F() != 2 {\n\t\tt.Fatal(F())\n\t}\n}\n",
		"b/b_test.go": "package b\n\nimport (\n\t\"fmt\"\n\t\"os\"\n\t\"testing\"\n\t\"time\"\n\n\t\"example.com/tiny/a\"\n)\n\nfunc TestSlow(t *testing.T) {\n\tif p := os.Getenv(\"TINY_SLOW\"); p != \"\" {\n\t\tos.WriteFile(p+\".tmp\", []byte(fmt.Sprint(os.Getpid())), 0o644)\n\t\tos.Rename(p+\".tmp\", p)\n\t\ttime.Sleep(10 * time.Minute)\n\t}\n\t_ = a.G()\n}\n",
		"b/b.go":      "package b\n",
		"c/c.go":      "package c\n",
		"c/c_test.go": "package c\n\nimport \"testing\"\n\nfunc TestC(t *testing.T) {}\n",
	}
	for name, text := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func needGo(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
}

// TestRunScores: on a tiny module, a mutant that a test catches is caught
// by that test, one no test sees survives (after the tests of its package
// and of the package whose tests use it), one that does not build is
// invalid; every file is restored.
func TestRunScores(t *testing.T) {
	needGo(t)
	root := tinyModule(t)
	before := readTree(t, root)
	ms := []Mutant{
		{Name: "a/caught", File: "a/a.go", Why: "w", From: "1 + 1", To: "1 - 1"},
		{Name: "a/survives", File: "a/a.go", Why: "w", From: "return 3", To: "return 4"},
		{Name: "a/broken", File: "a/a.go", Why: "w", From: "return 3", To: "return"},
	}
	var log bytes.Buffer
	rs, err := Run(context.Background(), Options{Root: root, Log: &log}, ms)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	type outcome struct{ Name, Outcome, By, Package, Area string }
	var got []outcome
	for _, r := range rs {
		got = append(got, outcome{r.Mutant.Name, r.Outcome, r.By, r.Package, r.Area})
	}
	want := []outcome{
		{"a/caught", Caught, "TestF", "./a", "a"},
		{"a/survives", Survived, "", "", "a"},
		{"a/broken", Invalid, "", "./a", "a"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("outcomes (-want +got):\n%s\nlog:\n%s", d, log.String())
	}
	if d := cmp.Diff([]string{"./a", "./b"}, rs[1].Tested); d != "" {
		t.Errorf("the survivor was tested in (-want +got):\n%s", d)
	}
	if d := cmp.Diff(before, readTree(t, root)); d != "" {
		t.Errorf("the module differs after the run (-before +after):\n%s", d)
	}
}

// TestSummary: the score counts caught of caught and survived, per area
// and in all; an expected survivor is listed with its reason and not
// counted, an invalid mutant is listed, not counted, and fails the check.
func TestSummary(t *testing.T) {
	r := func(name, area, outcome, survives string) Result {
		return Result{Mutant: Mutant{Name: name, File: area + "/x.go", Line: 7, Why: "why " + name, Survives: survives}, Area: area, Outcome: outcome}
	}
	for _, c := range []struct {
		name  string
		rs    []Result
		ok    bool
		wants []string
	}{
		{"all caught", []Result{r("a/1", "a", Caught, ""), r("b/1", "b", Caught, ""), r("b/2", "b", Expected, "the same constant")},
			true, []string{"mutation score: 2 of 2 caught", "  a                        1/1", "  b                        1/1",
				"survived as the list expects: b/2: the same constant"}},
		{"a survivor", []Result{r("a/1", "a", Caught, ""), r("a/2", "a", Survived, "")},
			false, []string{"mutation score: 1 of 2 caught", "  a                        1/2", "survived: a/2 (a/x.go; list line 7): why a/2"}},
		{"an invalid mutant", []Result{r("a/1", "a", Caught, ""), r("a/2", "a", Invalid, "")},
			false, []string{"mutation score: 1 of 1 caught", "invalid (does not build): a/2 (a/x.go; list line 7)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			if ok := Summary(&b, c.rs); ok != c.ok {
				t.Errorf("Summary = %v, want %v", ok, c.ok)
			}
			for _, w := range c.wants {
				if !strings.Contains(b.String(), w) {
					t.Errorf("summary lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}

// TestRunInterrupted: cancelling a run (Ctrl-C) kills the tests in
// progress, restores the planted file and returns the cancellation.
func TestRunInterrupted(t *testing.T) {
	needGo(t)
	root := tinyModule(t)
	before := readTree(t, root)
	pidFile := filepath.Join(t.TempDir(), "slow.pid")
	t.Setenv("TINY_SLOW", pidFile)
	ctx, cancel := context.WithCancel(context.Background())
	ms := []Mutant{{Name: "a/slow", File: "a/a.go", Why: "w", From: "return 3", To: "return 5"}}
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, Options{Root: root, Log: &bytes.Buffer{}}, ms)
		done <- err
	}()
	// Wait until b's slow test runs with the mutant planted: it writes its
	// process id, then sleeps 10 minutes. The guards below are hang guards,
	// far below those 10 minutes: what is checked is that the test's
	// process is gone, not how fast.
	var pid int
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err = strconv.Atoi(string(b)); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow test never ran")
		}
	}
	if _, err := os.Stat(backupPath(root, "a/a.go")); err != nil {
		t.Fatalf("the slow test runs without the mutant planted: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("Run did not return after cancel (a hang)")
	}
	for deadline := time.Now().Add(time.Minute); processAlive(pid); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the slow test (pid %d) still runs after Run returned: it was not killed", pid)
		}
	}
	if d := cmp.Diff(before, readTree(t, root)); d != "" {
		t.Errorf("the module differs after an interrupted run (-before +after):\n%s", d)
	}
}

// readTree maps every file under root (but .mutate/) to its content.
func readTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if fi.IsDir() {
			if rel == backupDir || rel == ".mutate" {
				return filepath.SkipDir
			}
			return nil
		}
		b, _ := os.ReadFile(p)
		out[filepath.ToSlash(rel)] = string(b)
		return nil
	})
	return out
}

// TestPackages: a mutant is tested in its file's package first, then in
// every package whose tests build on it; a file outside any Go package
// belongs to the nearest enclosing one.
func TestPackages(t *testing.T) {
	needGo(t)
	root := tinyModule(t)
	os.MkdirAll(filepath.Join(root, "a", "csrc"), 0o755)
	g, err := LoadGraph(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		m    Mutant
		want []string
	}{
		{Mutant{File: "a/a.go"}, []string{"./a", "./b"}},
		{Mutant{File: "a/csrc/k.cu"}, []string{"./a", "./b"}},
		{Mutant{File: "c/c.go"}, []string{"./c"}},
		{Mutant{File: "c/c.go", Packages: []string{"./a"}}, []string{"./a"}},
	} {
		got, err := g.Packages(c.m)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(c.want, got); d != "" {
			t.Errorf("%s: (-want +got):\n%s", c.m.File, d)
		}
	}
}

// processAlive reports whether pid runs (a zombie, ended and not yet
// reaped, does not).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z' && b[i+2] != 'X'
	}
	return true
}
