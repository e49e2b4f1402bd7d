//go:build unix

package loop

import (
	"io/fs"
	"path/filepath"
	"syscall"
	"testing"
)

// TestModesUnderNarrowUmask: under umask 077 every published file is 0644
// and the directory 0755, so a server running as another user reads them.
func TestModesUnderNarrowUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "tokenizer.json"), "{}", 0o600)
	p, _, err := OpenPublisher(filepath.Join(t.TempDir(), "w"), 1)
	if err != nil {
		t.Fatal(err)
	}
	_, dir := publish(t, p, 1, "w", src)
	n := 0
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(FileMode)
		if d.IsDir() {
			want = dirMode
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), want)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 { // the directory, model, config, tokenizer, DONE
		t.Errorf("%d entries checked, want 5", n)
	}
}
