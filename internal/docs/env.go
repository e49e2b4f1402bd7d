package docs

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// Env is where the shell blocks and the generators run: a scratch copy of
// the repository with bin/train built in it, as a reader's clone is after
// make build.
type Env struct {
	Root  string // the scratch copy
	Train string // Root/bin/train
}

// NewEnv copies the repository at repo into dir (which must be empty or
// absent): every file but .git and what repo's .gitignore ignores (bin/,
// runs/, .cache and the like), as a fresh clone has them. Then it builds
// bin/train there with the go command goBin.
func NewEnv(repo, dir, goBin string) (*Env, error) {
	ign, err := readIgnore(filepath.Join(repo, ".gitignore"))
	if err != nil {
		return nil, err
	}
	err = filepath.WalkDir(repo, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repo, p)
		if rel == "." {
			return os.MkdirAll(dir, 0o755)
		}
		rel = filepath.ToSlash(rel)
		if rel == ".git" || ign.ignored(rel, d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		dst := filepath.Join(dir, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, dst)
		case d.Type().IsRegular():
			return copyFile(p, dst)
		}
		return nil // sockets, pipes: not part of a clone
	})
	if err != nil {
		return nil, fmt.Errorf("docs: copy the repository: %w", err)
	}
	e := &Env{Root: dir, Train: filepath.Join(dir, "bin", "train")}
	cmd := exec.Command(goBin, "build", "-o", e.Train, "./cmd/train")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("docs: go build -o bin/train ./cmd/train: %v\n%s", err, out)
	}
	return e, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// ignore is the part of .gitignore's grammar this repository uses: "/x"
// and "/x/" anchor at the root, "x/" matches directories only, a pattern
// without a slash matches a name anywhere; * and ? glob.
type ignore []string

func readIgnore(p string) (ignore, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("docs: %w", err)
	}
	var ig ignore
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "!") {
			return nil, fmt.Errorf("docs: %s: negated pattern %q: not understood here", p, l)
		}
		ig = append(ig, l)
	}
	return ig, nil
}

func (ig ignore) ignored(rel string, dir bool) bool {
	for _, pat := range ig {
		onlyDir := strings.HasSuffix(pat, "/")
		pat = strings.TrimSuffix(pat, "/")
		if onlyDir && !dir {
			continue
		}
		name := rel
		if anchored := strings.Contains(pat, "/"); anchored {
			pat = strings.TrimPrefix(pat, "/")
		} else {
			name = path.Base(rel)
		}
		if ok, _ := path.Match(pat, name); ok {
			return true
		}
	}
	return false
}

// Run runs bin/train with args in Root. A non-zero exit is an error that
// holds stderr.
func (e *Env) Run(args ...string) (stdout, stderr string, err error) {
	cmd := exec.Command(e.Train, args...)
	cmd.Dir = e.Root
	var o, s bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &s
	if err := cmd.Run(); err != nil {
		return o.String(), s.String(), fmt.Errorf("train %s: %v\n%s", strings.Join(args, " "), err, s.String())
	}
	return o.String(), s.String(), nil
}
