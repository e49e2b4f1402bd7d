package trainer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/collective"
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
	if err := sameDir(ckpt, out); err != nil {
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
	m, err := model.NewSharded(be, cfg, model.Options{MaxTokens: 1}, model.ShardOptions{Comm: comm, ReshardAfterForward: true})
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer m.Close()
	host, inPlace := hostF32(be, m.Params())
	var stage []float32
	var rerr error
	for i, p := range m.Table().Params {
		if shape, ok := tens.Shape(p.Name); !ok || !equalInts(shape, p.Shape) {
			rerr = fmt.Errorf("export: %s: tensor %s has shape %v, config.json wants %v", ckpt, p.Name, shape, p.Shape)
			break
		}
		lo, hi, at := m.Owned(i)
		if hi <= lo {
			continue
		}
		if inPlace {
			if rerr = tens.Read(p.Name, checkpoint.KindWeights, int64(lo), host[at:at+hi-lo]); rerr != nil {
				break
			}
			continue
		}
		for off := lo; off < hi && rerr == nil; off += restoreChunk {
			n := min(restoreChunk, hi-off)
			if cap(stage) < n {
				stage = make([]float32, n)
			}
			if rerr = tens.Read(p.Name, checkpoint.KindWeights, int64(off), stage[:n]); rerr == nil {
				be.UploadF32(m.Params().Slice(at+off-lo, n), stage[:n])
				rerr = be.Sync()
			}
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

// sameDir refuses an output directory that is the input.
func sameDir(in, out string) error {
	a, err1 := filepath.Abs(in)
	b, err2 := filepath.Abs(out)
	if err1 == nil && err2 == nil && filepath.Clean(a) == filepath.Clean(b) {
		return fmt.Errorf("%w: export: --out %s is the checkpoint itself: write the export elsewhere", ErrUsage, out)
	}
	if st, err := os.Stat(out); err == nil && !st.IsDir() {
		return fmt.Errorf("%w: export: --out %s is a file", ErrUsage, out)
	}
	return nil
}
