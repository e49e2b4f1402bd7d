package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCommitAndAbort(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.txt")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("partial"))
	// Before Commit the destination is untouched.
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Fatalf("destination changed before Commit: %q", b)
	}
	f.Abort()
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Fatalf("Abort changed the destination: %q", b)
	}
	if err := WriteFile(path, []byte("new")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "new" {
		t.Fatalf("after WriteFile: %q", b)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("temporary files left behind: %v", ents)
	}
	g, _ := Create(path)
	g.Write([]byte("x"))
	if err := g.Commit(); err != nil {
		t.Fatal(err)
	}
	g.Abort() // a no-op after Commit
	if b, _ := os.ReadFile(path); string(b) != "x" {
		t.Fatalf("Abort after Commit removed the file: %q", b)
	}
	if err := g.Commit(); err == nil {
		t.Error("a second Commit succeeded")
	}
}

func TestCheckNotInput(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "r.jsonl")
	os.WriteFile(in, []byte("{}\n"), 0o644)
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	hard := filepath.Join(dir, "hard.jsonl")
	os.Link(in, hard)
	sym := filepath.Join(dir, "sym.jsonl")
	os.Symlink(in, sym)
	dirLink := filepath.Join(dir, "dirlink")
	os.Symlink(dir, dirLink)
	dangling := filepath.Join(dir, "dangling")
	os.Symlink(filepath.Join(dir, "new-input"), dangling)
	for _, c := range []struct {
		out, in string
		same    bool
	}{
		{in, in, true},
		{filepath.Join(sub, "..", "r.jsonl"), in, true},
		{hard, in, true},
		{sym, in, true},
		{in, sym, true},
		{filepath.Join(dirLink, "r.jsonl"), in, true},
		{filepath.Join(dir, "other.jsonl"), in, false},
		{filepath.Join(dir, "new-input"), dangling, false}, // neither exists: different names
		{filepath.Join(dir, "fresh.jsonl"), "", false},
	} {
		err := CheckNotInput(c.out, "", c.in)
		if got := errors.Is(err, ErrIsInput); got != c.same {
			t.Errorf("CheckNotInput(%s, %s) = %v, want same=%v", c.out, c.in, err, c.same)
		}
	}
}

// TestCheckNotInside: an output (a file or a directory, existing or not)
// that is one of the input directories, or lies anywhere inside one, by
// any spelling or symbolic link, is refused; a sibling whose name merely
// starts with the input's is not.
func TestCheckNotInside(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "ckpt", "step_6")
	if err := os.MkdirAll(in, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(in, "model.safetensors"), []byte("x"), 0o644)
	link := filepath.Join(dir, "link")
	os.Symlink(in, link)
	parentLink := filepath.Join(dir, "plink")
	os.Symlink(filepath.Join(dir, "ckpt"), parentLink)
	for _, c := range []struct {
		out    string
		inside bool
	}{
		{in, true},
		{in + "/", true},
		{filepath.Join(in, "model.safetensors"), true},
		{filepath.Join(in, "new", "deeper", "run"), true},
		{filepath.Join(dir, "ckpt", "..", "ckpt", "step_6", "x"), true},
		{link, true},
		{filepath.Join(link, "sub"), true},
		{filepath.Join(parentLink, "step_6", "sub", "deeper"), true},
		{filepath.Join(dir, "ckpt", "step_60"), false},
		{filepath.Join(dir, "ckpt"), false}, // the parent holds the input: CheckNotInside(in, out) refuses that
		{filepath.Join(dir, "elsewhere", "run"), false},
	} {
		err := CheckNotInside(c.out, "", in)
		if got := errors.Is(err, ErrIsInput); got != c.inside {
			t.Errorf("CheckNotInside(%s, %s) = %v, want inside=%v", c.out, in, err, c.inside)
		}
		if c.inside && (err == nil || !strings.Contains(err.Error(), in)) {
			t.Errorf("CheckNotInside(%s): %v does not name the input %s", c.out, err, in)
		}
	}
	// Through the input's own link too.
	if err := CheckNotInside(filepath.Join(in, "x"), link); !errors.Is(err, ErrIsInput) {
		t.Errorf("an output inside the target of the input's link: %v", err)
	}
}
