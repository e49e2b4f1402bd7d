package inputfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRefusesWhatIsNotARegularFile: a FIFO with no writer, /dev/zero and a
// directory are refused at once by name; a FIFO used to hang the reader
// and /dev/zero to fill memory.
func TestRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "config.json")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path, what string }{
		{"fifo", fifo, "a named pipe"},
		{"dev zero", "/dev/zero", "a character device"},
		{"directory", dir, "a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				_, err := ReadFile(tc.path, ModelConfig)
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), tc.what) || !strings.Contains(err.Error(), tc.path) {
					t.Errorf("ReadFile(%s) = %v, want ErrNotRegular naming the path and %q", tc.path, err, tc.what)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("ReadFile(%s) still running after 10 s", tc.path)
			}
		})
	}
}

// TestSizeCaps: a file over its kind's cap is refused before it is read;
// one at the cap is read whole; a kind without a cap opens any size.
func TestSizeCaps(t *testing.T) {
	dir := t.TempDir()
	k := Kind{Name: "test input", Max: 10}
	for _, tc := range []struct {
		size    int
		wantErr bool
	}{{0, false}, {10, false}, {11, true}, {1 << 20, true}} {
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, make([]byte, tc.size), 0o644); err != nil {
			t.Fatal(err)
		}
		data, err := ReadFile(p, k)
		switch {
		case tc.wantErr && (!errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "at most 10 bytes")):
			t.Errorf("%d bytes: %v, want ErrTooLarge naming the cap", tc.size, err)
		case !tc.wantErr && (err != nil || len(data) != tc.size):
			t.Errorf("%d bytes: read %d, %v", tc.size, len(data), err)
		}
		f, err := Open(p, Kind{Name: "stream"})
		if err != nil {
			t.Errorf("%d bytes, no cap: %v", tc.size, err)
		} else {
			f.Close()
		}
	}
}
