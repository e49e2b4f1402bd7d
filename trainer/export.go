package trainer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/internal/atomicfile"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/model"
)

// ExportHF writes the Hugging Face weights (model.safetensors and
// config.json, in dtype) of the checkpoint at ckpt into out. Every rank of
// comm calls it: each reads only its part of every tensor (from a sharded
// checkpoint of any world size, or an unsharded one) into a model sharded
// over comm's ranks, and the ranks gather one group at a time while rank 0
// streams each tensor into its writer, so no rank holds the whole model.
// The file is the same, byte for byte, whatever the number of ranks.
func ExportHF(be kernels.Backend, comm collective.Comm, ckpt, out string, dtype safetensors.DType) error {
	if comm == nil {
		comm = collective.Single(be)
	}
	if err := checkExportOut(out); err != nil {
		return err
	}
	cfg, err := model.LoadConfig(filepath.Join(ckpt, checkpoint.ConfigFile))
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if _, err := checkpoint.LoadMeta(ckpt, checkpoint.LoadOptions{}); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	tens, err := checkpoint.OpenTensors(ckpt)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer tens.Close()
	if cfg, err = withCheckpointMTP(cfg, tens); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	m, err := model.NewSharded(be, cfg, model.Options{MaxTokens: 1}, model.ShardOptions{Comm: comm, ReshardAfterForward: true})
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer m.Close()
	host, inPlace := hostF32(be, m.Params())
	var stage []float32
	var rerr error
	if sharded, _ := tens.Sharded(); !sharded && comm.Rank() == 0 {
		// An unsharded checkpoint has no block checksums: rank 0 checks the
		// weights file's sha256, as a resume does (a bit changed in place
		// kept its size and exported silently).
		if err := checkpoint.VerifyFiles(ckpt, checkpoint.ModelFile); err != nil {
			rerr = fmt.Errorf("export: %w", err)
		}
	}
	for i, p := range m.Table().Params {
		if rerr != nil {
			break
		}
		if shape, ok := tens.Shape(p.Name); !ok || !equalInts(shape, p.Shape) {
			rerr = fmt.Errorf("export: %s: tensor %s has shape %v, config.json wants %v", ckpt, p.Name, shape, p.Shape)
			break
		}
		lo, hi, at := m.Owned(i)
		if hi <= lo {
			continue
		}
		var h []float32
		if inPlace {
			h = host[at : at+hi-lo]
		}
		if rerr = readOwned(be, tens, p.Name, checkpoint.KindWeights, lo, m.Params().Slice(at, hi-lo), h, &stage, kernels.Buf{}); rerr != nil {
			break
		}
	}
	// The ranks agree before the export's collectives.
	all, err := collective.GatherBytes(comm, be, []byte(errText(rerr)))
	if err != nil {
		return err
	}
	var failed []error
	for r, b := range all {
		if len(b) > 0 {
			failed = append(failed, fmt.Errorf("rank %d: %s", r, b))
		}
	}
	if len(failed) > 0 {
		return &agreedError{err: errors.Join(failed...)}
	}
	m.ParamsChanged()
	return m.SaveHFAs(out, dtype)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// hostF32 returns buf's elements in place when be keeps them in host
// memory (the CPU backend).
func hostF32(be kernels.Backend, buf kernels.Buf) ([]float32, bool) {
	if v, ok := be.(interface{ F32(kernels.Buf) []float32 }); ok {
		return v.F32(buf), true
	}
	return nil, false
}

// checkExportOut refuses an export's output directory that lies in a
// checkpoint or a run directory, by any path (symbolic links resolved in
// every part of out that exists): out itself, or any directory above it,
// holds a checkpoint's marks (checkpoint.Marks), checkpoints (step_<N>
// directories), or a run's files. An export into a checkpoint would
// change files its manifest lists (or add ones it does not), and the
// checkpoint would fail verify and refuse --resume; into a run directory
// it would sit among what the run writes and prunes. The input is itself a
// checkpoint, and so refused the same way.
func checkExportOut(out string) error {
	if st, err := os.Stat(out); err == nil && !st.IsDir() {
		return fmt.Errorf("%w: export: --out %s is a file: name a directory", ErrUsage, out)
	}
	ro, err := atomicfile.ResolveExisting(out)
	if err != nil {
		return fmt.Errorf("export: --out %s: %w", out, err)
	}
	for dir := ro; ; dir = filepath.Dir(dir) {
		what := checkpoint.Marks(dir)
		if what == "" {
			what = runDirMarks(dir)
		}
		if what != "" {
			where := "is"
			if dir != ro {
				where = "lies inside"
			}
			via := ""
			if abs, _ := filepath.Abs(out); abs != ro {
				via = " (" + ro + " with links resolved)"
			}
			return fmt.Errorf("%w: export: --out %s%s %s %s, which holds %s: an export never writes into a checkpoint or a run directory "+
				"(a checkpoint there would no longer verify, or its run would prune the export); choose a --out outside them",
				ErrUsage, out, via, where, dir, what)
		}
		if filepath.Dir(dir) == dir {
			return nil
		}
	}
}

// runDirMarks names what makes dir a run's directory or a run's
// checkpoints directory ("" when nothing does): a run's metrics.jsonl or
// lock, or checkpoints (step_<N> directories with a checkpoint's marks) in
// dir or in its checkpoints/.
func runDirMarks(dir string) string {
	for _, f := range []string{metricsFileName, lockFile} {
		if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
			return "a run's " + f
		}
	}
	for _, d := range []string{dir, filepath.Join(dir, "checkpoints")} {
		ents, _ := checkpoint.List(d)
		for _, e := range ents {
			if checkpoint.Marks(e.Path) != "" {
				return "checkpoints (" + filepath.Join(filepath.Base(d), filepath.Base(e.Path)) + ")"
			}
		}
	}
	return ""
}
