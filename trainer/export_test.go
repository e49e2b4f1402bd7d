package trainer

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// treeDigest is a digest of every file's name, mode and bytes under dir
// (links as their targets' names), to see that nothing in it changed.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %v\n", rel, d.Type())
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			fmt.Fprintf(h, "-> %s\n", target)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// TestExportNeverWritesIntoACheckpoint (issue 34): an export whose --out
// lies in its own checkpoint, names another checkpoint (the newest), is a
// link to a checkpoint (with another dtype, which would have replaced the
// only fp32 weights), or lies in a run directory or its checkpoints
// directory, by any path, is refused as a usage error naming where it
// would have written; nothing of the run changes, every checkpoint still
// verifies and the run still resumes. An --out outside them is written.
func TestExportNeverWritesIntoACheckpoint(t *testing.T) {
	dir := t.TempDir()
	runDir := filepath.Join(dir, "run")
	mustTrain(t, trainArgs(runDir, 4)...)
	ckpts := filepath.Join(runDir, "checkpoints")
	step2, step4 := filepath.Join(ckpts, "step_2"), filepath.Join(ckpts, "step_4")
	link := func(name, target string) string {
		p := filepath.Join(dir, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	toStep4, toRun := link("latest", step4), link("runlink", runDir)
	before := treeDigest(t, runDir)
	be := cpu.New(1)
	defer be.Close()
	for _, c := range []struct {
		name, out, where string
		dtype            safetensors.DType
	}{
		{"inside its own checkpoint", filepath.Join(step2, "sub"), step2, safetensors.F32},
		{"its own checkpoint", step2, step2, safetensors.F32},
		{"another checkpoint, the newest", step4, step4, safetensors.F32},
		{"a link to a checkpoint, in bf16", toStep4, step4, safetensors.BF16},
		{"inside a link to a checkpoint", filepath.Join(toStep4, "hf"), step4, safetensors.BF16},
		{"the checkpoints directory", ckpts, ckpts, safetensors.F32},
		{"the run directory", runDir, runDir, safetensors.F32},
		{"inside the run directory, through a link", filepath.Join(toRun, "exports", "hf"), runDir, safetensors.F16},
		{"another spelling", runDir + "/checkpoints/../checkpoints/step_4/./x", step4, safetensors.F32},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := ExportHF(be, nil, step2, c.out, c.dtype)
			if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), c.where) || !strings.Contains(err.Error(), "never writes into a checkpoint or a run directory") {
				t.Fatalf("export to %s: %v; want a usage error naming %s", c.out, err, c.where)
			}
			if got := treeDigest(t, runDir); got != before {
				t.Fatalf("export to %s changed the run directory", c.out)
			}
		})
	}
	for _, p := range []string{step2, step4} {
		if _, err := checkpoint.Verify(p); err != nil {
			t.Errorf("after the refused exports: %v", err)
		}
	}
	out := filepath.Join(dir, "exports", "step_2-hf")
	if err := ExportHF(be, nil, step2, out, safetensors.BF16); err != nil {
		t.Fatalf("export outside the run: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, checkpoint.ModelFile)); err != nil {
		t.Fatalf("export outside the run wrote no weights: %v", err)
	}
	if log := mustTrain(t, append([]string{"--out", runDir, "--steps", "4", "--resume"}, small[1:]...)...); !strings.Contains(log, "resumed from") {
		t.Errorf("the run did not resume after the refused exports:\n%s", log)
	}
}

// deviceLike is a backend (the CPU's underneath) without a host view, as
// the CUDA backend is: a checkpoint reaches its buffers only through
// UploadF32, whose calls it counts.
type deviceLike struct {
	kernels.Backend
	uploads int
}

func (d *deviceLike) UploadF32(dst kernels.Buf, src []float32) {
	d.uploads++
	d.Backend.UploadF32(dst, src)
}

// arenas returns a trainer's weights and Adam moments as the host sees them.
func arenas(t *testing.T, tr *Trainer) [checkpoint.NumKinds][]float32 {
	t.Helper()
	m, v := tr.opt.Moments()
	var out [checkpoint.NumKinds][]float32
	for k, b := range []kernels.Buf{tr.model.Params(), m, v} {
		out[k] = make([]float32, b.N)
		tr.be.DownloadF32(out[k], b)
	}
	if err := tr.be.Sync(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestStagedReadsOfLargeTensors (issue 33, item 8): a backend without a
// host view (a device's, as the CUDA backend) reads a checkpoint through a
// staging slice, one chunk at a time, each chunk uploaded to its own
// offset. With a chunk of 7 floats, smaller than every matrix and dividing
// none of them, a resume (sharded on 2 ranks, and one process from the
// sharded checkpoint) holds exactly the weights and moments of a resume on
// the CPU's host view, and an export writes the same bytes.
func TestStagedReadsOfLargeTensors(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "run")
	mustRanks(t, 2, trainArgs(out, 2, "--shard", "full")...)
	defer func(n int) { stageChunk = n }(stageChunk)
	resumed := func(t *testing.T, ranks int, chunk int, device bool) ([][checkpoint.NumKinds][]float32, int) {
		stageChunk = chunk
		got := make([][checkpoint.NumKinds][]float32, ranks)
		devs := make([]*deviceLike, ranks)
		var wrap func(int, kernels.Backend) kernels.Backend
		if device {
			wrap = func(r int, b kernels.Backend) kernels.Backend { devs[r] = &deviceLike{Backend: b}; return devs[r] }
		}
		shard := "none"
		if ranks > 1 {
			shard = "full"
		}
		errs, logs := eachLocalRank(t, ranks, trainArgs(out, 2, "--resume", "--shard", shard), wrap, func(r int, tr *Trainer) error {
			got[r] = arenas(t, tr)
			return nil
		})
		uploads := 0
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v\n%s", r, err, logs[r])
			}
			if devs[r] != nil {
				uploads += devs[r].uploads
			}
		}
		return got, uploads
	}
	for _, ranks := range []int{2, 1} {
		t.Run(fmt.Sprint(ranks, " ranks"), func(t *testing.T) {
			want, _ := resumed(t, ranks, 1<<20, false)
			got, uploads := resumed(t, ranks, 7, true)
			elems := 0
			for r := range got {
				for k := range checkpoint.NumKinds {
					elems += len(want[r][k])
					if i := firstDiff(want[r][k], got[r][k]); i >= 0 {
						t.Fatalf("rank %d: %s element %d is %v staged in chunks of 7, %v read in place", r, kindName(k), i, got[r][k][i], want[r][k][i])
					}
				}
			}
			if uploads < elems/7 {
				t.Fatalf("%d uploads for %d elements: the resume did not stage in chunks of 7", uploads, elems)
			}
		})
	}
	ckpt := filepath.Join(out, "checkpoints", "step_2")
	export := func(chunk int, be kernels.Backend) []byte {
		stageChunk = chunk
		hf := filepath.Join(t.TempDir(), "hf")
		if err := ExportHF(be, nil, ckpt, hf, safetensors.F32); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(hf, checkpoint.ModelFile))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	be := cpu.New(1)
	defer be.Close()
	dev := &deviceLike{Backend: be}
	want, got := export(1<<20, be), export(7, dev)
	if !bytes.Equal(want, got) {
		t.Fatalf("export staged in chunks of 7 wrote %d bytes that differ from the in-place export's %d", len(got), len(want))
	}
	f, err := safetensors.NewFile(bytes.NewReader(want), int64(len(want)), "export")
	if err != nil {
		t.Fatal(err)
	}
	elems := 0
	for _, ti := range f.Tensors() {
		elems += ti.NumElements()
	}
	if dev.uploads < elems/7 {
		t.Fatalf("%d uploads for %d elements: the export did not stage in chunks of 7", dev.uploads, elems)
	}
}

// firstDiff is the first index where a and b differ in bits (-1: none).
func firstDiff(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// TestExportRefusesChangedWeights (QA round): an unsharded checkpoint has
// no block checksums, so an export checks its model.safetensors' sha256
// against the manifest, as a resume does. A byte changed in place (the size
// kept) exported silently: the generator would serve weights the run never
// trained.
func TestExportRefusesChangedWeights(t *testing.T) {
	dir := t.TempDir()
	runDir := filepath.Join(dir, "run")
	mustTrain(t, trainArgs(runDir, 1)...)
	src := filepath.Join(runDir, "checkpoints", "step_1")
	ckpt := filepath.Join(dir, "copy", "step_1")
	if err := os.MkdirAll(ckpt, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == checkpoint.ModelFile {
			b[len(b)-5] ^= 1 // a weight's low bit, inside the data
		}
		if err := os.WriteFile(filepath.Join(ckpt, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	be := cpu.New(1)
	defer be.Close()
	out := filepath.Join(dir, "hf")
	err = ExportHF(be, nil, ckpt, out, safetensors.F32)
	if err == nil || !strings.Contains(err.Error(), "does not match its manifest") || !strings.Contains(err.Error(), "sha256") || !strings.Contains(err.Error(), checkpoint.ModelFile) {
		t.Fatalf("export of a checkpoint with a changed weight: %v, want a sha256 mismatch naming %s", err, checkpoint.ModelFile)
	}
	if _, err := os.Stat(filepath.Join(out, checkpoint.ModelFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused export wrote %s: %v", checkpoint.ModelFile, err)
	}
	if err := ExportHF(be, nil, src, out, safetensors.F32); err != nil {
		t.Fatalf("export of the intact checkpoint: %v", err)
	}
}
