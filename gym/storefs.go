package gym

// Where a capture store keeps its files. The Writer and the snapshot reader
// do all their I/O through a storeFS: osFS is a directory on disk, every
// read of it checked as store_read.go describes (Lstat, symlinks kept inside
// the directory, no FIFO, device or socket, a non-blocking open, reads no
// longer than the size stated); memFS is an in-memory map of path → bytes
// that holds only regular files. Both stores are written the same bytes by
// the same Writer code and read back by the same parser, index checks and
// builders, so a snapshot does not depend on where its capture was kept.

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/tracegrpo/tracegrpo/internal/inputfile"
)

// storeFS is the file operations of one capture store directory. Paths are
// formed as filepath.Join(root(), name).
type storeFS interface {
	// root is the directory paths are formed under. For a memFS it is a
	// name that appears only in messages.
	root() string

	// Reads for snapshots. A path that exists but is not a readable regular
	// file is a *CaptureDamage.
	//
	// statCapture reports whether path exists (as a regular file).
	statCapture(path string) (bool, error)
	// readCapture reads a file of at most limit bytes; ok is false when
	// it does not exist. An existing empty file is a non-nil empty slice.
	readCapture(path string, limit int64) (data []byte, ok bool, err error)
	// openCapture opens a file for streaming; r is nil when it does not
	// exist, and size is the size it states.
	openCapture(path string) (r io.ReadCloser, size int64, err error)
	// names lists the directory's file names.
	names() ([]string, error)

	// The Writer's operations. A missing file is an fs.ErrNotExist error.
	//
	// readFile reads a whole file.
	readFile(path string) ([]byte, error)
	// truncate cuts a file to size bytes.
	truncate(path string, size int64) error
	// appendFile appends data, creating the file if needed, syncs it when
	// sync is set, and returns the file's new size.
	appendFile(path string, data []byte, sync bool) (size int64, err error)
	// replaceFile makes path hold exactly data at once: a reader sees the
	// old content or the new, never a mix (temp file, fsync when sync is
	// set, rename).
	replaceFile(path string, data []byte, sync bool) error
	// remove deletes a file.
	remove(path string) error
	// syncDir makes the directory's entries (creations, renames,
	// removals) durable.
	syncDir() error
}

// osFS is a capture directory on disk.
type osFS struct{ dir string }

func (o osFS) root() string { return o.dir }

func (o osFS) statCapture(path string) (bool, error) {
	fi, err := checkCapturePath(o.dir, path)
	return fi != nil, err
}

func (o osFS) readCapture(path string, limit int64) ([]byte, bool, error) {
	return readCaptureFile(o.dir, path, limit)
}

func (o osFS) openCapture(path string) (io.ReadCloser, int64, error) {
	f, st, err := openCaptureFile(o.dir, path)
	if f == nil || err != nil {
		return nil, 0, err
	}
	return f, st.Size(), nil
}

func (o osFS) names() ([]string, error) {
	des, err := os.ReadDir(o.dir)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(des))
	for i, de := range des {
		out[i] = de.Name()
	}
	return out, nil
}

func (o osFS) readFile(path string) ([]byte, error) {
	return inputfile.ReadFile(path, inputfile.Kind{Name: "capture file", Max: maxEntriesFile})
}

func (o osFS) truncate(path string, size int64) error { return os.Truncate(path, size) }

func (o osFS) appendFile(path string, data []byte, sync bool) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return 0, err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return 0, fmt.Errorf("append %s: %w", path, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return 0, fmt.Errorf("fsync %s: %w", path, err)
		}
	}
	off, err := f.Seek(0, io.SeekCurrent)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	return off, nil
}

func (o osFS) replaceFile(path string, data []byte, sync bool) error {
	tmp, err := os.CreateTemp(o.dir, ".tokens-state-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if sync {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func (o osFS) remove(path string) error { return os.Remove(path) }

func (o osFS) syncDir() error {
	d, err := os.Open(o.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", o.dir, err)
	}
	return nil
}

// memRoot is the directory name of an in-memory store's paths in messages.
const memRoot = "(memory)"

// memFS is an in-memory capture directory: path → the file's bytes. It
// holds regular files only and is safe for concurrent use. Every file
// stored is a non-nil slice; reads return copies.
type memFS struct {
	mu    sync.RWMutex
	files map[string][]byte
}

func newMemFS() *memFS { return &memFS{files: map[string][]byte{}} }

func (m *memFS) root() string { return memRoot }

func (m *memFS) statCapture(path string) (bool, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.files[path]
	return ok, nil
}

func (m *memFS) readCapture(path string, limit int64) ([]byte, bool, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	b, ok := m.files[path]
	if !ok {
		return nil, false, nil
	}
	if int64(len(b)) > limit {
		return nil, false, damage(ReasonCaptureUnreadable, path, -1, "%d bytes, more than the %d this reader accepts", len(b), limit)
	}
	return append(make([]byte, 0, len(b)), b...), true, nil
}

func (m *memFS) openCapture(path string) (io.ReadCloser, int64, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	b, ok := m.files[path]
	if !ok {
		return nil, 0, nil
	}
	return io.NopCloser(bytes.NewReader(bytes.Clone(b))), int64(len(b)), nil
}

func (m *memFS) names() ([]string, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.files))
	for p := range m.files {
		out = append(out, filepath.Base(p))
	}
	sort.Strings(out)
	return out, nil
}

func (m *memFS) readFile(path string) ([]byte, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	b, ok := m.files[path]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: path, Err: fs.ErrNotExist}
	}
	return bytes.Clone(b), nil
}

func (m *memFS) truncate(path string, size int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.files[path]
	switch {
	case !ok:
		return &fs.PathError{Op: "truncate", Path: path, Err: fs.ErrNotExist}
	case size < 0:
		return &fs.PathError{Op: "truncate", Path: path, Err: fs.ErrInvalid}
	case size <= int64(len(b)):
		m.files[path] = b[:size:size] // the next append copies
	default:
		m.files[path] = append(b, make([]byte, size-int64(len(b)))...)
	}
	return nil
}

func (m *memFS) appendFile(path string, data []byte, _ bool) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := append(m.files[path], data...)
	if b == nil {
		b = []byte{}
	}
	m.files[path] = b
	return int64(len(b)), nil
}

func (m *memFS) replaceFile(path string, data []byte, _ bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files[path] = append([]byte{}, data...)
	return nil
}

func (m *memFS) remove(path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.files[path]; !ok {
		return &fs.PathError{Op: "remove", Path: path, Err: fs.ErrNotExist}
	}
	delete(m.files, path)
	return nil
}

func (m *memFS) syncDir() error { return nil }
