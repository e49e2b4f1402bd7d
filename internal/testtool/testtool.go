// Package testtool finds the external programs that tests run, and only
// those scripts/deps.sh provides: a test that asks for any other program
// fails at once, naming it, because a bare machine would not have it (the
// machine it was written on did, by hand).
//
// scripts/deps.sh holds the two lists, one line each:
//
//	toolkit_tools="ptxas cuobjdump nvdisasm"
//	system_tools="g++:g++ gcc:g++ mpirun:openmpi-bin ..."
//
// A toolkit tool is taken from $TRACEGRPO_TOOLS alone when it is set (make
// test sets it to the directory deps.sh extracts them into), else from
// PATH. Its path is a link or copy in a directory of the test's own, next
// to links to the other listed toolkit tools and nothing else, and Env
// gives it a PATH of that directory alone: cuobjdump, which runs nvdisasm
// from beside itself or from PATH, then finds it only if deps.sh lists it.
// A system tool is taken from PATH (make test cuts PATH to $TOOLS, Go's
// bin and the system directories, where apt-get installs).
//
// A listed program that is missing skips the test, saying what did not
// run, or fails it when the test names an environment variable that is set
// to 1 (make test sets TRACEGRPO_REQUIRE_EMU, _PTXAS and _MPI).
package testtool

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// ToolsEnv names the directory the toolkit tools are taken from.
const ToolsEnv = "TRACEGRPO_TOOLS"

// ErrNotProvided is the error for a program scripts/deps.sh does not list.
var ErrNotProvided = errors.New("testtool: scripts/deps.sh does not provide it")

// Lists are deps.sh's two lists.
type Lists struct {
	Toolkit []string          // into $TOOLS from the CUDA toolkit's .deb
	System  map[string]string // program → Debian package
}

var (
	listRE = regexp.MustCompile(`(?m)^(toolkit_tools|system_tools)="([^"]*)"$`)
	lists  struct {
		once sync.Once
		l    Lists
		err  error
	}
)

// ParseLists reads the two lists from deps.sh's text.
func ParseLists(text string) (Lists, error) {
	l := Lists{System: map[string]string{}}
	found := map[string]bool{}
	for _, m := range listRE.FindAllStringSubmatch(text, -1) {
		if found[m[1]] {
			return Lists{}, fmt.Errorf("testtool: scripts/deps.sh sets %s twice", m[1])
		}
		found[m[1]] = true
		for _, f := range strings.Fields(m[2]) {
			if m[1] == "toolkit_tools" {
				l.Toolkit = append(l.Toolkit, f)
				continue
			}
			prog, pkg, ok := strings.Cut(f, ":")
			if !ok || prog == "" || pkg == "" {
				return Lists{}, fmt.Errorf("testtool: scripts/deps.sh: system_tools entry %q is not PROGRAM:PACKAGE", f)
			}
			l.System[prog] = pkg
		}
	}
	for _, k := range []string{"toolkit_tools", "system_tools"} {
		if !found[k] {
			return Lists{}, fmt.Errorf("testtool: scripts/deps.sh has no line %s=\"...\"", k)
		}
	}
	return l, nil
}

// moduleRoot is the directory of the go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testtool: no go.mod above the working directory")
		}
		dir = parent
	}
}

// depsLists reads scripts/deps.sh of the module the test runs in.
func depsLists() (Lists, error) {
	lists.once.Do(func() {
		dir, err := moduleRoot()
		if err != nil {
			lists.err = err
			return
		}
		text, err := os.ReadFile(filepath.Join(dir, "scripts", "deps.sh"))
		if err != nil {
			lists.err = fmt.Errorf("testtool: %w", err)
			return
		}
		lists.l, lists.err = ParseLists(string(text))
	})
	return lists.l, lists.err
}

// find looks name up as deps.sh says: ErrNotProvided when it is on neither
// list, an error saying where it looked when it is missing.
func find(l Lists, name string) (path string, toolkit bool, err error) {
	switch {
	case slices.Contains(l.Toolkit, name):
		if dir := os.Getenv(ToolsEnv); dir != "" {
			p := filepath.Join(dir, name)
			if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
				return "", true, fmt.Errorf("no %s in $%s=%s (scripts/deps.sh extracts it there from Debian's nvidia-cuda-toolkit)", name, ToolsEnv, dir)
			}
			return p, true, nil
		}
		p, err := exec.LookPath(name)
		if err != nil {
			return "", true, fmt.Errorf("no %s (CUDA toolkit) on PATH, and $%s is not set (make test runs scripts/deps.sh, which provides it)", name, ToolsEnv)
		}
		return p, true, nil
	case l.System[name] != "":
		p, err := exec.LookPath(name)
		if err != nil {
			return "", false, fmt.Errorf("no %s on PATH (Debian package %s; scripts/deps.sh installs it)", name, l.System[name])
		}
		return p, false, nil
	}
	return "", false, fmt.Errorf("%w: %s (add it to one of its lists, with how it is installed)", ErrNotProvided, name)
}

// Find returns the path of the program name for code that has no test to
// fail (a build done once per test binary): an error wrapping
// ErrNotProvided when deps.sh does not list it, else one saying why it is
// missing. A toolkit tool's path is the one it was found at: use Path for
// a tool that runs others.
func Find(name string) (string, error) {
	l, err := depsLists()
	if err != nil {
		return "", err
	}
	p, _, err := find(l, name)
	return p, err
}

// Path returns the path of the program name for t. It fails t when
// scripts/deps.sh does not provide name; when name is missing it skips t,
// or fails it if requireEnv is set to 1. A toolkit tool comes as a link (or
// copy) in a directory of t's own holding links to the listed toolkit tools
// alone; run it with Env's environment.
func Path(t testing.TB, name, requireEnv string) string {
	t.Helper()
	l, err := depsLists()
	if err != nil {
		t.Fatal(err)
	}
	return pathIn(t, l, name, requireEnv)
}

// pathIn is Path with deps.sh's lists l.
func pathIn(t testing.TB, l Lists, name, requireEnv string) string {
	t.Helper()
	p, toolkit, err := find(l, name)
	switch {
	case errors.Is(err, ErrNotProvided):
		t.Fatalf("this test runs %s, which a bare machine does not have: %v", name, err)
	case err != nil && requireEnv != "" && os.Getenv(requireEnv) == "1":
		t.Fatalf("%s=1 but %v", requireEnv, err)
	case err != nil:
		t.Skipf("NOT RUN: %v", err)
	}
	if !toolkit {
		return p
	}
	view := viewDir(t, l)
	dst := filepath.Join(view, name)
	os.Remove(dst) // a symlink viewDir made
	if err := linkOrCopy(p, dst); err != nil {
		t.Fatal(err)
	}
	return dst
}

// viewDir makes t's directory of the listed toolkit tools: a symlink to
// each one found (where find finds it).
func viewDir(t testing.TB, l Lists) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tools")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range l.Toolkit {
		if p, _, err := find(l, name); err == nil {
			if err := os.Symlink(p, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// linkOrCopy hard-links src to dst, or copies it when they are on
// different file systems. A copy, not a symlink: a program that looks
// beside its own executable (/proc/self/exe) must see dst's directory.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Env is the environment to run a toolkit tool from Path in: PATH is the
// directory it sits in (the listed toolkit tools alone), and the variables
// through which CUDA's tools find each other elsewhere are removed.
func Env(tool string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "PATH" || k == "NVDISASM_PATH" || k == "CUDA_HOME" || k == "CUDA_PATH" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PATH="+filepath.Dir(tool))
}
