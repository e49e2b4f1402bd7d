package cuda

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestGPUCheckNamesExist: every test and conformance case that
// scripts/gpu-check.sh runs on a GPU exists. A renamed test would match no
// -test.run filter there, and the device's one try would be spent finding
// out; here it fails in CI.
func TestGPUCheckNamesExist(t *testing.T) {
	text, err := os.ReadFile("../../scripts/gpu-check.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := string(text)
	funcs := map[string]bool{}
	for _, dir := range []string{".", "../../optim"} {
		testFuncs(t, dir, funcs)
	}
	var names []string
	for _, m := range regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9]*`).FindAllString(script, -1) {
		if !slices.Contains(names, m) {
			names = append(names, m)
		}
	}
	if len(names) < 10 {
		t.Fatalf("found only %d test names in scripts/gpu-check.sh: %v", len(names), names)
	}
	for _, n := range names {
		if !funcs[n] {
			t.Errorf("scripts/gpu-check.sh runs %s, which is no test of kernels/cuda or optim", n)
		}
	}
	cases, err := os.ReadFile("../kerneltest/cases.go")
	if err != nil {
		t.Fatal(err)
	}
	var caseNames []string
	for _, m := range regexp.MustCompile(`(?m)^\t\{"(\w+)", func\(s \*suite\)`).FindAllStringSubmatch(string(cases), -1) {
		caseNames = append(caseNames, m[1])
	}
	sets := regexp.MustCompile(`(?m)^\s*(subset|sanset)='([^']*)'$`).FindAllStringSubmatch(script, -1)
	if len(sets) != 2 {
		t.Fatalf("scripts/gpu-check.sh: want the lines subset='...' and sanset='...', found %d", len(sets))
	}
	for _, s := range sets {
		for _, c := range strings.Split(s[2], "|") {
			if !slices.Contains(caseNames, c) {
				t.Errorf("scripts/gpu-check.sh's %s names conformance case %s, which kernels/kerneltest does not have (it has %v)", s[1], c, caseNames)
			}
		}
	}
}

// testFuncs adds the names of the Test functions of dir's _test.go files.
func testFuncs(t *testing.T, dir string, into map[string]bool) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Test") {
				into[fd.Name.Name] = true
			}
		}
	}
}
