package trainer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/internal/inputfile"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

// The ranks' agreement at start. Every rank reads its own flags, recipe and
// input files; a rank started with another --set, another --steps or
// another rollouts file would train something else, in collectives that no
// longer match. Before any work (after the config is read and checked, and
// before the run directory is touched) the ranks compare one digest of the
// run's identity: the build, the backend, the flags that change training,
// the initial weights' source, the data (paths; the rollouts file's size and
// sha256) and every key of the effective config. Equal digests cost one
// exchange of 32 bytes. On a difference the ranks exchange their whole
// identities and every rank stops with the same error, naming the first
// key that differs and each rank's value.
//
// Two checks stay behind it: each step file of a --rollouts directory is
// compared by sha256 in the step's exchange (it appears after the start),
// and the ranks compare a hash of their weights after loading them and at
// every checkpoint (the contents of --init-from and of a resumed
// checkpoint are not hashed at start).

// identityItem is one key of the run's identity as one rank sees it.
type identityItem struct {
	Key, Value string
	Usage      bool // a flag or config key: a mismatch is a usage error
}

// identity lists the run's identity in the order its keys are compared:
// the program, the flags, the initial weights, the data, then the
// effective config's keys in sorted order.
func (t *Trainer) startIdentity() ([]identityItem, error) {
	o := &t.o
	var id []identityItem
	add := func(usage bool, key, value string) {
		id = append(id, identityItem{Key: key, Value: value, Usage: usage})
	}
	add(false, "tracegrpo build", buildID())
	add(true, "--backend", t.be.Name())
	out := o.Out
	if out == "" {
		out = filepath.Join("runs", t.name)
	}
	paths := []struct{ flag, path string }{
		{"--out", out}, {"--init-from", o.InitFrom}, {"--rollouts", o.Rollouts}, {"--captures", o.Captures},
	}
	for _, p := range paths {
		add(true, p.flag, p.path)
	}
	add(true, "--resume", strconv.FormatBool(o.Resume))
	add(true, "--fallback", strconv.FormatBool(o.Fallback))
	add(true, "--on-nonfinite", o.OnNonFinite)
	add(true, "--save-captures", strconv.FormatBool(o.SaveCaptures))
	add(true, "--shard", o.Shard)
	add(true, "--reshard-after-forward", strconv.FormatBool(!o.NoReshard))
	add(true, "--shared-prefix", o.SharedPrefix)
	add(true, "--max-masked-fraction", strconv.FormatFloat(*o.MaxMaskedFraction, 'g', -1, 64))
	if _, ok := t.source.(*builtinSource); ok {
		add(true, "--tasks", strings.Join(o.Tasks, ","))
	}
	// What the paths hold, then where they are: ranks started in other
	// directories name other files by the same relative path.
	if dir := t.initDir(); dir != "" {
		for _, f := range []string{"config.json", safetensors.IndexFileName} {
			add(false, "initial weights: "+f, fileDigest(filepath.Join(dir, f)))
		}
		add(false, "initial weights: "+safetensors.SingleFileName, fileSize(filepath.Join(dir, safetensors.SingleFileName)))
	}
	if src, ok := t.source.(*externalSource); ok && !src.dir {
		add(false, "rollouts file", fmt.Sprintf("%d bytes, sha256 %s", src.size, src.sha256))
	}
	for _, p := range paths {
		add(true, p.flag+" (absolute)", absPath(p.path))
	}
	y, err := config.Marshal(&t.cfg)
	if err != nil {
		return nil, err
	}
	flat, err := flattenYAML(string(y))
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(flat))
	for k := range flat {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		add(true, k, flat[k])
	}
	return id, nil
}

// initDir is the directory the initial weights are read from ("" for the
// built-in model's random weights).
func (t *Trainer) initDir() string {
	if t.o.InitFrom != "" {
		return t.o.InitFrom
	}
	if name := string(t.cfg.Policy.ModelName); name != builtinModelName {
		return name
	}
	return ""
}

// agreeOnIdentity has the ranks compare their identities (one process:
// nothing to compare) and fails every rank on the first difference.
func (t *Trainer) agreeOnIdentity() error {
	if t.comm.Size() == 1 {
		return nil
	}
	id, err := t.startIdentity()
	if err := t.agree(err); err != nil {
		return err
	}
	h := sha256.New()
	for _, it := range id {
		fmt.Fprintf(h, "%q=%q\n", it.Key, it.Value)
	}
	digests, err := gather(t, h.Sum(nil))
	if err != nil {
		return err
	}
	same := true
	for _, d := range digests {
		same = same && bytes.Equal(d, digests[0])
	}
	if same {
		return nil
	}
	all, err := gather(t, id)
	if err != nil {
		return err
	}
	return identityMismatch(all)
}

// identityMismatch is the error for ranks whose identities differ: the
// first key (in rank 0's order, then any key only other ranks have) whose
// values differ, with every rank's value.
func identityMismatch(all [][]identityItem) error {
	values := make([]map[string]string, len(all))
	var order []string
	usage := map[string]bool{}
	seen := map[string]bool{}
	for r, id := range all {
		values[r] = map[string]string{}
		for _, it := range id {
			values[r][it.Key] = it.Value
			usage[it.Key] = it.Usage
			if !seen[it.Key] {
				seen[it.Key] = true
				order = append(order, it.Key)
			}
		}
	}
	for _, k := range order {
		byValue := map[string][]int{}
		var vals []string
		for r := range all {
			v, ok := values[r][k]
			if !ok {
				v = "(absent)"
			}
			if _, ok := byValue[v]; !ok {
				vals = append(vals, v)
			}
			byValue[v] = append(byValue[v], r)
		}
		if len(vals) == 1 {
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "the ranks were started on different runs: %s differs:", k)
		for _, v := range vals {
			fmt.Fprintf(&b, "\n  %s: %s", rankList(byValue[v]), orNone(v))
		}
		b.WriteString("\nstart every rank with the same flags, recipe and input files (on a file system every rank shares)")
		err := errors.New(b.String())
		if usage[k] {
			err = fmt.Errorf("%w: %v", ErrUsage, err)
		}
		return &agreedError{err: err, usage: usage[k]}
	}
	return &agreedError{err: errors.New("the ranks' run identities differ, but no key does (a tracegrpo bug)")}
}

// buildID names the program: its module version and VCS revision.
func buildID() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	id := bi.Main.Path + " " + bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" || s.Key == "vcs.modified" {
			id += " " + s.Key + "=" + s.Value
		}
	}
	return id
}

// absPath is p as an absolute path ("" stays ""): ranks started in other
// directories name other files by the same relative path.
func absPath(p string) string {
	if p == "" {
		return ""
	}
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// fileDigest is a small file's size and sha256, or why there is none.
func fileDigest(path string) string {
	b, err := inputfile.ReadFile(path, inputfile.Kind{Name: "identity input", Max: 64 << 20})
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "(absent)"
	case err != nil:
		return "unreadable: " + err.Error()
	}
	s := sha256.Sum256(b)
	return fmt.Sprintf("%d bytes, sha256 %s", len(b), hex.EncodeToString(s[:]))
}

// fileSize is a file's size, or why there is none.
func fileSize(path string) string {
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "(absent)"
	case err != nil:
		return "unreadable: " + err.Error()
	}
	return fmt.Sprintf("%d bytes", st.Size())
}

// hashingReader hashes what is read through it.
type hashingReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (h *hashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	h.n += int64(n)
	return n, err
}
