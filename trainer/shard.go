package trainer

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/optim"
)

// Fully sharded data parallel (model.Sharding). With --shard full every
// rank holds 1/W of the weights, gradients and Adam moments: the model
// gathers each layer's weights before use and reduce-scatters its
// gradients after its backward (so the step has no gradient all-reduce),
// the optimizer steps the rank's shard with a global gradient norm, and a
// checkpoint is one shard file per rank, one index and the HF weights
// streamed through rank 0 (checkpoint's sharded layout). The ranks run the
// same number of forward and backward passes each step (a rank with fewer
// micro-batches runs empty ones), since every pass is a sequence of
// collectives.

// Values of --shard.
const (
	ShardFull = "full"
	ShardNone = "none"
)

// ShardChoice is the sharding mode a run with config c on world ranks uses
// (flag: --shard, "" for the recipe's), and the reason, for the setup line.
// The recipe asks for sharding through policy.dtensor_cfg.enabled (NeMo
// RL's FSDP2 path, when megatron_cfg is not enabled), which shards on more
// than one rank; Megatron's distributed optimizer (ZeRO-1) is not built and
// is refused by name on more than one rank unless --shard chooses a mode
// (on one it is the plain optimizer).
func ShardChoice(c *config.Config, flag string, world int) (full bool, why string, err error) {
	dist := c.Policy.MegatronCfg.Enabled && c.Policy.MegatronCfg.Optimizer.UseDistributedOptimizer
	switch flag {
	case ShardFull:
		return true, "--shard full", nil
	case ShardNone:
		return false, "--shard none", nil
	case "":
	default:
		return false, "", fmt.Errorf("%w: --shard %q: want full or none", ErrUsage, flag)
	}
	switch {
	case dist && world > 1: // on one rank it is the plain optimizer
		return false, "", fmt.Errorf("config: policy.megatron_cfg.optimizer.use_distributed_optimizer=true: Megatron's distributed optimizer " +
			"(ZeRO-1, optimizer state sharded) is not implemented by tracegrpo; pass --shard full to shard the weights, gradients and " +
			"optimizer state (ZeRO-3, FSDP), or --shard none to keep them whole on every rank")
	case c.Policy.DtensorCfg.Enabled && !c.Policy.MegatronCfg.Enabled && world > 1:
		return true, "policy.dtensor_cfg.enabled=true (FSDP2) on more than one rank", nil
	}
	return false, "", nil
}

// checkCluster refuses a recipe whose cluster does not hold the launched
// ranks.
func checkCluster(c *config.Config, world int) error {
	n := c.Cluster.NumNodes * c.Cluster.GPUsPerNode
	if n != world {
		return fmt.Errorf("config: cluster.num_nodes × cluster.gpus_per_node = %d × %d = %d ranks, but the launcher started %d: "+
			"launch %d ranks, or set cluster.num_nodes and cluster.gpus_per_node to match the launch",
			c.Cluster.NumNodes, c.Cluster.GPUsPerNode, n, world, n)
	}
	return nil
}

// sharded reports whether the run shards its model.
func (t *Trainer) sharded() bool { return t.model != nil && t.model.Sharding() != nil }

// shardedGroups are the optimizer's groups over this rank's shard: one per
// parameter part it owns, numbered by the parameter (none for a frozen
// router).
func shardedGroups(m *model.Model, frozenRouter bool) ([]optim.Group, []int) {
	tab := m.Table()
	var groups []optim.Group
	var ids []int
	for _, pc := range m.Sharding().Pieces(tab) {
		if frozenRouter && tab.Params[pc.Param].Router || tab.Params[pc.Param].Buffer {
			continue
		}
		groups = append(groups, optim.Group{Off: pc.At, N: pc.Hi - pc.Lo, Decay: tab.Params[pc.Param].Decay})
		ids = append(ids, pc.Param)
	}
	return groups, ids
}

// prepareSharded writes step_<N>/ of a sharded run under a temporary name:
// every rank takes part (the shard files, the HF export's gathers); rank 0
// returns the sealed checkpoint, which Run publishes after the metrics line.
func (t *Trainer) prepareSharded() (*checkpoint.Pending, error) {
	var pending *checkpoint.Pending
	var tmp string
	var err error
	if t.rank == 0 {
		keep := 0
		if k := t.cfg.Checkpointing.KeepTopK; k != nil {
			keep = *k
		}
		if pending, err = checkpoint.Begin(t.checkpointDir(), int64(t.step), checkpoint.SaveOptions{KeepTopK: keep}); err == nil {
			tmp = pending.Dir()
		}
	}
	discard := func(err error) (*checkpoint.Pending, error) {
		if pending != nil {
			pending.Discard()
		}
		return nil, err
	}
	if err := t.agree(err); err != nil {
		return discard(err)
	}
	type where struct{ Dir, Run string }
	dirs, err := gather(t, where{tmp, t.runID})
	if err != nil {
		return discard(err)
	}
	tmp = dirs[0].Dir
	// The HF weights first, gathered one group at a time (a collective),
	// so that every shard carries their digest: the shards of this save and
	// its model.safetensors then check each other on every load.
	werr := t.model.SaveHFWith(tmp, safetensors.F32, checkpoint.ModelMetadata(int64(t.step)))
	var hf checkpoint.FileEntry
	if werr == nil && t.rank == 0 {
		hf, werr = checkpoint.HashFile(filepath.Join(tmp, checkpoint.ModelFile))
	}
	type written struct {
		Entry checkpoint.FileEntry
		Err   rankError
	}
	agreeWritten := func(e checkpoint.FileEntry, werr error) ([]written, error) {
		all, err := gather(t, written{e, rankErrorOf(werr)})
		if err != nil {
			return nil, err
		}
		errs := make([]rankError, len(all))
		for r, w := range all {
			errs[r] = w.Err
		}
		return all, agreedOf(errs)
	}
	hfs, err := agreeWritten(hf, werr)
	if err != nil {
		return discard(err)
	}
	// Each rank's shard file.
	id := checkpoint.ShardID{Run: dirs[0].Run, Step: int64(t.step), World: t.comm.Size(), Weights: hfs[0].Entry.SHA256}
	entry, werr := t.writeShard(tmp, id)
	all, err := agreeWritten(entry, werr)
	if err != nil {
		return discard(err)
	}
	if t.rank == 0 {
		err = t.sealSharded(pending, id, hfs[0].Entry, func(r int) checkpoint.FileEntry { return all[r].Entry })
	}
	if err := t.agree(err); err != nil {
		return discard(err)
	}
	return pending, nil
}

// writeShard writes this rank's shard file into tmp: its part of every
// parameter, with the Adam moments.
func (t *Trainer) writeShard(tmp string, id checkpoint.ShardID) (checkpoint.FileEntry, error) {
	tab := t.model.Table()
	mBuf, vBuf := t.opt.Moments()
	host, m, v := t.hostCopy(t.model.Params()), t.hostCopy(mBuf), t.hostCopy(vBuf)
	if err := t.be.Sync(); err != nil {
		return checkpoint.FileEntry{}, err
	}
	if err := t.takeStageErr(); err != nil {
		return checkpoint.FileEntry{}, err
	}
	pieces := t.model.Sharding().Pieces(tab)
	if err := t.checkFinite(host, m, v, func(i int) string {
		for _, pc := range pieces {
			if i >= pc.At && i < pc.At+pc.Hi-pc.Lo {
				return fmt.Sprintf("%s (rank %d's shard)", tab.Params[pc.Param].Name, t.rank)
			}
		}
		return fmt.Sprintf("rank %d's shard padding", t.rank)
	}); err != nil {
		return checkpoint.FileEntry{}, err
	}
	var parts []checkpoint.ShardPart
	for _, pc := range pieces {
		n := pc.Hi - pc.Lo
		parts = append(parts, checkpoint.ShardPart{Name: tab.Params[pc.Param].Name, Lo: int64(pc.Lo), Hi: int64(pc.Hi),
			Values: [checkpoint.NumKinds][]float32{host[pc.At : pc.At+n], m[pc.At : pc.At+n], v[pc.At : pc.At+n]}})
		if !t.cfg.SavesOptimizer() { // checkpointing.save_optimizer false: weights only
			parts[len(parts)-1].Values[checkpoint.KindExpAvg], parts[len(parts)-1].Values[checkpoint.KindExpAvgSq] = nil, nil
		}
	}
	return checkpoint.WriteShard(tmp, t.rank, id, parts)
}

// sealSharded writes rank 0's files of a sharded checkpoint (the index,
// with the save's identity, and the trainer state; the HF export, hf, is
// already there) and seals it.
func (t *Trainer) sealSharded(p *checkpoint.Pending, id checkpoint.ShardID, hf checkpoint.FileEntry, shardEntry func(r int) checkpoint.FileEntry) error {
	p.Add(hf)
	if err := p.AddWritten(checkpoint.ConfigFile); err != nil {
		return err
	}
	sh, tab := t.model.Sharding(), t.model.Table()
	idx := checkpoint.ShardIndex{World: sh.World, Run: id.Run, Step: id.Step, Weights: id.Weights}
	for i, p := range tab.Params {
		st := checkpoint.ShardTensor{Name: p.Name, Shape: p.Shape}
		for r := range sh.World {
			if lo, hi, _ := sh.OwnedBy(tab, i, r); hi > lo {
				st.Pieces = append(st.Pieces, checkpoint.ShardPiece{Rank: r, Lo: int64(lo), Hi: int64(hi)})
			}
		}
		idx.Tensors = append(idx.Tensors, st)
	}
	b, err := idx.Marshal()
	if err != nil {
		return err
	}
	if err := p.WriteFile(checkpoint.ShardIndexFile, b); err != nil {
		return err
	}
	for r := range sh.World {
		p.Add(shardEntry(r))
	}
	ts, err := t.trainerState()
	if err != nil {
		return err
	}
	if err := p.WriteTrainerState(ts); err != nil {
		return err
	}
	return p.Seal()
}

// restoreRanges puts the run back where the checkpoint at path left it,
// reading only the ranges of every tensor this rank holds (all of them
// unsharded), whatever the checkpoint's layout and world size.
func (t *Trainer) restoreRanges(path string, st *checkpoint.State) error {
	if sharded, _ := checkpointSharded(path); !sharded && t.rank == 0 {
		// An unsharded checkpoint has no block checksums: rank 0 checks its
		// files' sha256 (one process wrote it, so one can read it).
		if _, err := checkpoint.Verify(path); err != nil {
			return fmt.Errorf("resume: %w", err)
		}
	}
	tens, err := checkpoint.OpenTensors(path)
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	defer tens.Close()
	tab := t.model.Table()
	mBuf, vBuf := t.opt.Moments()
	arenas := [checkpoint.NumKinds]kernels.Buf{t.model.Params(), mBuf, vBuf}
	var hosts [checkpoint.NumKinds][]float32
	var inPlace [checkpoint.NumKinds]bool
	for k, a := range arenas {
		hosts[k], inPlace[k] = t.hostView(a)
	}
	var stage []float32
	for i, p := range tab.Params {
		shape, ok := tens.Shape(p.Name)
		if !ok || !slices.Equal(shape, p.Shape) {
			return fmt.Errorf("resume: %s: tensor %s has shape %v, the model wants %v", path, p.Name, shape, p.Shape)
		}
		lo, hi, at := t.model.Owned(i)
		if hi <= lo {
			continue
		}
		for k := range checkpoint.NumKinds {
			if st.Trainer.NoOptimizer && k != checkpoint.KindWeights {
				continue // the fresh optimizer's zero moments
			}
			var host []float32
			if inPlace[k] {
				host = hosts[k][at : at+hi-lo]
			}
			if err := readOwned(t.be, tens, p.Name, k, lo, arenas[k].Slice(at, hi-lo), host, &stage, t.stage); err != nil {
				return fmt.Errorf("resume: %w", err)
			}
		}
	}
	t.restoreRead = tens.BytesRead()
	t.model.ParamsChanged()
	return t.be.Sync()
}

// stageChunk is how many floats a backend without a host view (a device)
// stages at a time when it reads a checkpoint (a variable for tests).
var stageChunk = 1 << 20

// readOwned reads elements [lo, lo+dst.N) of the named parameter's tensor
// of kind from tens into dst: straight into host, dst's elements, when the
// backend keeps them in host memory (the CPU), else through a staging
// slice (*stage, grown to stageChunk floats) uploaded a chunk at a time,
// each chunk to its own offset (a BF16 dst through the device staging
// buffer devStage). Resume and export share it.
func readOwned(be kernels.Backend, tens *checkpoint.Tensors, name string, kind, lo int, dst kernels.Buf, host []float32, stage *[]float32, devStage kernels.Buf) error {
	if host != nil {
		return tens.Read(name, kind, int64(lo), host)
	}
	for off := 0; off < dst.N; off += stageChunk {
		n := min(stageChunk, dst.N-off)
		if cap(*stage) < n {
			*stage = make([]float32, n)
		}
		if err := tens.Read(name, kind, int64(lo+off), (*stage)[:n]); err != nil {
			return err
		}
		if err := uploadHost(be, dst.Slice(off, n), (*stage)[:n], devStage); err != nil {
			return err
		}
		if err := be.Sync(); err != nil {
			return err
		}
	}
	return nil
}

// checkpointSharded reports whether the checkpoint at path is sharded.
func checkpointSharded(path string) (bool, error) {
	man, err := checkpoint.Structure(path)
	if err != nil {
		return false, err
	}
	for _, f := range man.Files {
		if f.Name == checkpoint.ShardIndexFile {
			return true, nil
		}
	}
	return false, nil
}

// trainerState is trainer_state.json of the step just finished.
func (t *Trainer) trainerState() (checkpoint.TrainerState, error) {
	var ts checkpoint.TrainerState
	var err error
	ts.Step, ts.ConsumedRollouts, ts.RunID = int64(t.step), t.consumed, t.runID
	ts.NoOptimizer = !t.cfg.SavesOptimizer()
	if ts.Optimizer, err = json.Marshal(t.opt.State()); err != nil {
		return ts, err
	}
	if ts.Scheduler, err = json.Marshal(t.sched.State()); err != nil {
		return ts, err
	}
	if ts.RolloutCursor, err = t.source.cursor(); err != nil {
		return ts, err
	}
	id, err := t.identity()
	if err != nil {
		return ts, err
	}
	ts.Config, err = json.Marshal(id)
	return ts, err
}
