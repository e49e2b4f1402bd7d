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

// TestReadFileOfAFileThatGrewPastItsCap (issue 33, item 3): a file whose
// size when opened is within the cap but whose bytes run past it (it grew
// after the size check) is an error, never its first Max bytes; one that
// ends at the cap is read whole. Linux's /proc files are such files: they
// stat as 0 bytes and read as many, so the size check passes and only the
// bounded read can tell.
func TestReadFileOfAFileThatGrewPastItsCap(t *testing.T) {
	const path = "/proc/self/cmdline" // the same bytes at every read, in this process
	want, err := os.ReadFile(path)
	if err != nil {
		t.Skipf("no %s here: %v", path, err)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != 0 || len(want) < 2 {
		t.Skipf("%s stats as %v (%v) and reads %d bytes: not a file whose size lies", path, st, err, len(want))
	}
	for _, max := range []int{1, len(want) / 2, len(want) - 1} {
		data, err := ReadFile(path, Kind{Name: "test input", Max: int64(max)})
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "grew past") {
			t.Errorf("cap %d of a %d-byte read: got %d bytes, %v; want ErrTooLarge naming the path and that it grew", max, len(want), len(data), err)
		}
		if data != nil {
			t.Errorf("cap %d: %d bytes returned with the error", max, len(data))
		}
	}
	for _, max := range []int{len(want), len(want) + 1, 1 << 20} {
		data, err := ReadFile(path, Kind{Name: "test input", Max: int64(max)})
		if err != nil || string(data) != string(want) {
			t.Errorf("cap %d of a %d-byte read: got %q, %v; want it whole", max, len(want), data, err)
		}
	}
}
