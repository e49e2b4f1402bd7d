package testtool

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseLists: deps.sh's two lines, and what is wrong with bad ones.
func TestParseLists(t *testing.T) {
	for _, c := range []struct {
		name, text string
		want       Lists
		err        string
	}{
		{"both", "x=1\ntoolkit_tools=\"ptxas cuobjdump\"\nsystem_tools=\"g++:g++ mpirun:openmpi-bin\"\n",
			Lists{Toolkit: []string{"ptxas", "cuobjdump"}, System: map[string]string{"g++": "g++", "mpirun": "openmpi-bin"}}, ""},
		{"no system line", "toolkit_tools=\"ptxas\"\n", Lists{}, "no line system_tools"},
		{"an entry without its package", "toolkit_tools=\"\"\nsystem_tools=\"g++\"\n", Lists{}, `"g++" is not PROGRAM:PACKAGE`},
		{"twice", "toolkit_tools=\"a\"\ntoolkit_tools=\"b\"\nsystem_tools=\"\"\n", Lists{}, "sets toolkit_tools twice"},
		{"indented lines are not the lists", "  toolkit_tools=\"a\"\nsystem_tools=\"\"\n", Lists{}, "no line toolkit_tools"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseLists(c.text)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(c.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

// TestTheRepositoryLists: scripts/deps.sh parses, and lists what the
// tests of this repository run.
func TestTheRepositoryLists(t *testing.T) {
	l, err := depsLists()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"ptxas", "cuobjdump", "nvdisasm"} {
		if !strings.Contains(" "+strings.Join(l.Toolkit, " ")+" ", " "+p+" ") {
			t.Errorf("toolkit_tools lacks %s: %v", p, l.Toolkit)
		}
	}
	for _, p := range []string{"g++", "gcc", "mpirun", "pgrep", "kill"} {
		if l.System[p] == "" {
			t.Errorf("system_tools lacks %s: %v", p, l.System)
		}
	}
}

// script writes an executable shell script.
func script(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestToolkitView: a toolkit tool runs from a directory where only the
// listed toolkit tools are. A stand-in cuobjdump that runs nvdisasm from
// beside itself, or from PATH, finds it while nvdisasm is listed, and does
// not once it is dropped from the list, though it is still in the tools
// directory (a stale cache) and on the caller's PATH: the check that a
// tool deps.sh stopped providing fails the tests.
func TestToolkitView(t *testing.T) {
	tools := t.TempDir()
	script(t, filepath.Join(tools, "cuobjdump"), `d=${0%/*}; if [ -x "$d/nvdisasm" ]; then exec "$d/nvdisasm"; fi; exec nvdisasm`)
	script(t, filepath.Join(tools, "nvdisasm"), `echo disassembled`)
	t.Setenv(ToolsEnv, tools)
	t.Setenv("PATH", tools+":"+os.Getenv("PATH"))
	run := func(l Lists) (string, error) {
		p := pathIn(t, l, "cuobjdump", "")
		if filepath.Dir(p) == tools {
			t.Fatalf("cuobjdump runs from the tools directory itself: %s", p)
		}
		cmd := exec.Command(p)
		cmd.Env = Env(p)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run(Lists{Toolkit: []string{"cuobjdump", "nvdisasm"}}); err != nil || out != "disassembled\n" {
		t.Errorf("with nvdisasm listed: %q, %v", out, err)
	}
	if out, err := run(Lists{Toolkit: []string{"cuobjdump"}}); err == nil {
		t.Errorf("with nvdisasm not listed, cuobjdump still found it: %q", out)
	}
}

// TestFind: a program on neither list is refused as not provided; a listed
// toolkit tool comes from $TRACEGRPO_TOOLS alone when it is set (not from
// PATH), and a missing one says where it was looked for.
func TestFind(t *testing.T) {
	tools, other := t.TempDir(), t.TempDir()
	script(t, filepath.Join(other, "ptxas"), "true")
	script(t, filepath.Join(other, "mytool"), "true")
	t.Setenv("PATH", other)
	l := Lists{Toolkit: []string{"ptxas"}, System: map[string]string{"mytool": "mypkg", "gone": "gonepkg"}}
	if _, _, err := find(l, "python3"); !errors.Is(err, ErrNotProvided) {
		t.Errorf("python3: %v, want ErrNotProvided", err)
	}
	t.Setenv(ToolsEnv, "")
	if p, _, err := find(l, "ptxas"); err != nil || p != filepath.Join(other, "ptxas") {
		t.Errorf("ptxas without %s: %q, %v; want it from PATH", ToolsEnv, p, err)
	}
	t.Setenv(ToolsEnv, tools)
	if _, _, err := find(l, "ptxas"); err == nil || !strings.Contains(err.Error(), "no ptxas in $TRACEGRPO_TOOLS="+tools) {
		t.Errorf("ptxas only on PATH with %s set: %v, want it not found", ToolsEnv, err)
	}
	if p, _, err := find(l, "mytool"); err != nil || p != filepath.Join(other, "mytool") {
		t.Errorf("mytool: %q, %v", p, err)
	}
	if _, _, err := find(l, "gone"); err == nil || !strings.Contains(err.Error(), "Debian package gonepkg") {
		t.Errorf("gone: %v, want its package named", err)
	}
}

// TestTestsNameOnlyListedPrograms reads every test file of the module: a
// test starts a program through Path (or Find), never by a name of its own
// (exec.Command("git", ...) would find whatever the machine has), and each
// name given to Path or Find is on one of deps.sh's lists. It covers the
// tests that CI skips too (those behind an environment variable), which
// the run-time check reaches only when they run.
func TestTestsNameOnlyListedPrograms(t *testing.T) {
	l, err := depsLists()
	if err != nil {
		t.Fatal(err)
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	var bad []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		files++
		rel, _ := filepath.Rel(root, path)
		bad = append(bad, unlistedPrograms(t, l, path, rel)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("read %d test files under %s; the walk missed the module", files, root)
	}
	for _, b := range bad {
		t.Error(b)
	}
}

// unlistedPrograms returns, for one test file, each program started by a
// literal name and each literal name given to Path or Find that deps.sh
// does not list.
func unlistedPrograms(t *testing.T, l Lists, path, rel string) []string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		pkg, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}
		arg := -1
		switch {
		case pkg.Name == "exec" && sel.Sel.Name == "Command":
			arg = 0
		case pkg.Name == "exec" && sel.Sel.Name == "CommandContext":
			arg = 1
		case pkg.Name == "testtool" && sel.Sel.Name == "Path":
			arg = 1
		case pkg.Name == "testtool" && sel.Sel.Name == "Find":
			arg = 0
		default:
			return true
		}
		if arg >= len(call.Args) {
			return true
		}
		lit, ok := call.Args[arg].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		name, _ := strconv.Unquote(lit.Value)
		at := fmt.Sprintf("%s:%d", rel, fset.Position(lit.Pos()).Line)
		if pkg.Name == "exec" {
			bad = append(bad, fmt.Sprintf("%s: exec.%s(%q): take the program from testtool.Path, which checks that scripts/deps.sh provides it", at, sel.Sel.Name, name))
		} else if _, _, err := find(l, name); errors.Is(err, ErrNotProvided) {
			bad = append(bad, fmt.Sprintf("%s: %v", at, err))
		}
		return true
	})
	return bad
}
