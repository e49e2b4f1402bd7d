package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tracegrpo/tracegrpo/checkpoint"
)

func init() {
	register(command{
		name:    "verify",
		summary: "check checkpoints against their manifests (sizes and sha256 of every file)",
		run:     runVerify,
	})
}

const verifySynopsis = `train verify PATH...

Checks each checkpoint against its DONE marker and manifest.json: the files on
disk are exactly the manifest's, with its sizes and sha256 digests. PATH is a
checkpoint (step_<N>/), a checkpoints directory, or a run directory (--out of
train), whose every step_<N>/ is checked, newest first. A checkpoint still
being written (no DONE) is reported as incomplete. One line per checkpoint; the
exit status is 1 when any checkpoint fails, 2 for a usage error.

Flags:`

func runVerify(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("verify", verifySynopsis, stdout)
	if err := parseFlags(fs, args, -1); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("%w: verify: name at least one checkpoint, checkpoints directory or run directory (see train verify --help)", errUsage)
	}
	var steps []string
	for _, p := range fs.Args() {
		found, err := checkpointsUnder(p)
		if err != nil {
			return err
		}
		steps = append(steps, found...)
	}
	bad := 0
	for _, p := range steps {
		man, err := checkpoint.Verify(p)
		if err != nil {
			bad++
			fmt.Fprintf(stdout, "%s: FAILED: %v\n", p, err)
			continue
		}
		var bytes int64
		for _, f := range man.Files {
			bytes += f.Size
		}
		fmt.Fprintf(stdout, "%s: ok (step %d, %d files, %d bytes, sha256 verified)\n", p, man.Step, len(man.Files), bytes)
	}
	if bad > 0 {
		return fmt.Errorf("verify: %d of %d checkpoints failed", bad, len(steps))
	}
	return nil
}

// isStepDir says whether path is named like a checkpoint or holds a
// checkpoint's marker files.
func isStepDir(path string) bool {
	if _, err := fmt.Sscanf(filepath.Base(filepath.Clean(path)), "step_%d", new(int64)); err == nil {
		return true
	}
	for _, f := range []string{checkpoint.ManifestFile, checkpoint.DoneFile} {
		if _, err := os.Stat(filepath.Join(path, f)); err == nil {
			return true
		}
	}
	return false
}

// checkpointsUnder resolves PATH to the step directories it names: itself
// when it is one, else those of PATH or PATH/checkpoints.
func checkpointsUnder(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("verify: %s is not a directory: name a checkpoint (step_<N>/), a checkpoints directory or a run directory", path)
	}
	if isStepDir(path) {
		return []string{path}, nil
	}
	for _, dir := range []string{path, filepath.Join(path, "checkpoints")} {
		ents, err := checkpoint.List(dir)
		if err != nil || len(ents) == 0 {
			continue
		}
		out := make([]string, len(ents))
		for i, e := range ents {
			out[i] = e.Path
		}
		return out, nil
	}
	return nil, fmt.Errorf("verify: %s holds no checkpoint (no manifest.json, and no step_<N>/ in it or in its checkpoints/)", path)
}
