// Package atomicfile writes output files so that a reader never sees a
// partial one: the content goes to a temporary file in the same directory,
// which is synced and renamed over the destination only when the writer
// commits. A failed or interrupted write leaves the previous file (or none)
// in place. It also refuses an output that is one of a command's inputs
// (CheckNotInput), or that lies inside an input directory (CheckNotInside).
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// File is an output being written. Write to it, then Commit; Abort (safe
// after Commit, so it can be deferred) removes the temporary file.
type File struct {
	*os.File
	path string
	done bool
}

// Create starts writing path through a temporary file next to it.
func Create(path string) (*File, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp*")
	if err != nil {
		return nil, err
	}
	return &File{File: tmp, path: path}, nil
}

// Commit syncs the temporary file and renames it to the destination.
func (f *File) Commit() error {
	if f.done {
		return fmt.Errorf("atomicfile: %s: committed or aborted already", f.path)
	}
	f.done = true
	err := f.File.Sync()
	if cerr := f.File.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.File.Name(), f.path)
	}
	if err != nil {
		os.Remove(f.File.Name())
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	syncDir(filepath.Dir(f.path))
	return nil
}

// Abort discards what was written; a no-op after Commit.
func (f *File) Abort() {
	if f.done {
		return
	}
	f.done = true
	f.File.Close()
	os.Remove(f.File.Name())
}

// WriteFile writes data to path atomically.
func WriteFile(path string, data []byte) error {
	f, err := Create(path)
	if err != nil {
		return err
	}
	defer f.Abort()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Commit()
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// ErrIsInput is wrapped by CheckNotInput's error.
var ErrIsInput = errors.New("output is one of the inputs")

// CheckNotInput refuses an output path that names the same file as one of
// inputs, by any path: another spelling, a hard link, or a symbolic link
// (followed on either side). An output that does not exist yet cannot be an
// input, unless it is a dangling link whose target is one; empty input
// names are skipped.
func CheckNotInput(output string, inputs ...string) error {
	out, err := os.Stat(output)
	if err != nil {
		// A name that does not exist yet: compare where it would land.
		for _, in := range inputs {
			if in != "" && sameName(output, in) {
				return fmt.Errorf("%w: %s is %s", ErrIsInput, output, in)
			}
		}
		return nil
	}
	for _, in := range inputs {
		if in == "" {
			continue
		}
		if st, err := os.Stat(in); err == nil && os.SameFile(out, st) {
			return fmt.Errorf("%w: %s is the same file as %s", ErrIsInput, output, in)
		}
	}
	return nil
}

// sameName compares two paths after resolving symbolic links in their
// directories.
func sameName(a, b string) bool {
	ra, err1 := resolve(a)
	rb, err2 := resolve(b)
	return err1 == nil && err2 == nil && ra == rb
}

func resolve(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r, nil
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return abs, nil
	}
	return filepath.Join(dir, filepath.Base(abs)), nil
}

// CheckNotInside refuses an output path (a file or a directory, existing
// or not) that is one of the directories dirs or lies anywhere inside one,
// by any path: another spelling, a symbolic link on either side (existing
// parts of a path are resolved), or, for the parts that exist, the same
// directory reached another way. Writing there would overwrite or add to
// an input store (a checkpoint read with --init-from, a capture store).
// An empty output, and empty names in dirs, are skipped.
func CheckNotInside(output string, dirs ...string) error {
	if output == "" {
		return nil
	}
	ro, err := resolveExisting(output)
	if err != nil {
		return err
	}
	var ancestors []os.FileInfo // output and its parents, those that exist
	for p := ro; ; p = filepath.Dir(p) {
		if st, err := os.Stat(p); err == nil {
			ancestors = append(ancestors, st)
		}
		if filepath.Dir(p) == p {
			break
		}
	}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		rd, err := resolveExisting(d)
		if err != nil {
			return err
		}
		inside := ro == rd || strings.HasPrefix(ro, strings.TrimSuffix(rd, string(filepath.Separator))+string(filepath.Separator))
		if st, err := os.Stat(d); err == nil && st.IsDir() && !inside {
			for _, a := range ancestors {
				if os.SameFile(a, st) {
					inside = true
					break
				}
			}
		}
		if inside {
			if ro == rd {
				return &insideError{fmt.Sprintf("%s is %s", output, d)}
			}
			return &insideError{fmt.Sprintf("%s is inside %s", output, d)}
		}
	}
	return nil
}

// insideError is CheckNotInside's error: it says where the output is, and
// is ErrIsInput.
type insideError struct{ where string }

func (e *insideError) Error() string        { return e.where }
func (e *insideError) Is(target error) bool { return target == ErrIsInput }

// ResolveExisting returns p's absolute path with symbolic links resolved
// in its longest existing prefix (the rest does not exist yet, so holds no
// links): where a file written at p would land.
func ResolveExisting(p string) (string, error) { return resolveExisting(p) }

// resolveExisting returns p's absolute path with symbolic links resolved in
// its longest existing prefix (the rest does not exist yet, so holds no
// links).
func resolveExisting(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	rest := ""
	for cur := abs; ; {
		if r, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(r, rest), nil
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return abs, nil
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = parent
	}
}
