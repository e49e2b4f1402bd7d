package trainer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/model"
)

// stepTensors reads every parameter and moment of run directory out's
// checkpoint of step, whatever its layout (through checkpoint.Tensors),
// after checking every file's sha256.
func stepTensors(t *testing.T, out string, step int) [checkpoint.NumKinds]map[string][]float32 {
	t.Helper()
	path := filepath.Join(out, "checkpoints", checkpoint.StepDir(int64(step)))
	if _, err := checkpoint.Verify(path); err != nil {
		t.Fatal(err)
	}
	tens, err := checkpoint.OpenTensors(path)
	if err != nil {
		t.Fatal(err)
	}
	defer tens.Close()
	var res [checkpoint.NumKinds]map[string][]float32
	for k := range checkpoint.NumKinds {
		res[k] = map[string][]float32{}
		for name := range checkpointWeightsHF(t, path) {
			shape, ok := tens.Shape(name)
			if !ok {
				t.Fatalf("%s: no tensor %s", path, name)
			}
			n := 1
			for _, d := range shape {
				n *= d
			}
			v := make([]float32, n)
			if err := tens.Read(name, k, 0, v); err != nil {
				t.Fatal(err)
			}
			res[k][name] = v
		}
	}
	return res
}

// checkpointWeightsHF reads a checkpoint's model.safetensors (the HF
// weights, in either layout).
func checkpointWeightsHF(t *testing.T, path string) map[string][]float32 {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(path, checkpoint.ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]float32{}
	for _, ti := range f.Tensors() {
		v := make([]float32, ti.NumElements())
		if err := f.ReadF32(ti.Name, v); err != nil {
			t.Fatal(err)
		}
		out[ti.Name] = v
	}
	return out
}

// TestShardedRanksTrainLikeOneProcess: the built-in job fully sharded over
// 1, 2 and 3 in-process ranks (3 does not divide the model's flats: the
// padding is exercised) samples the same rollouts as one unsharded process
// (same metrics), ends every step with its weights and Adam moments within
// rankTol of it, writes HF weights in its checkpoints equal to its shards,
// and twice the same run is bit-identical.
func TestShardedRanksTrainLikeOneProcess(t *testing.T) {
	const steps = 3
	args := func(out string, extra ...string) []string {
		return append(trainArgs(out, steps, sameUpdateSets...), append([]string{"--set", "checkpointing.save_period=1"}, extra...)...)
	}
	ref := t.TempDir()
	mustTrain(t, args(ref)...)
	want := metricsNoTimes(t, ref)
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("%d ranks", n), func(t *testing.T) {
			outs := []string{t.TempDir(), t.TempDir()}
			for _, out := range outs {
				mustRanks(t, n, args(out, "--shard", "full")...)
			}
			got := metricsNoTimes(t, outs[0])
			sameData(t, want, got)
			checkCommBytes(t, n, got)
			for s := 1; s <= steps; s++ {
				w, g := stepTensors(t, ref, s), stepTensors(t, outs[0], s)
				for k := range checkpoint.NumKinds {
					d, where := maxAbsDiff(w[k], g[k])
					if d > rankTol || math.IsNaN(d) {
						t.Errorf("step %d: %s differ from one process by %.3g at %s", s, kindName(k), d, where)
					}
					if k == checkpoint.KindWeights {
						t.Logf("step %d: largest weight difference from one process %.3g (bound %g)", s, d, rankTol)
					}
				}
				hf := checkpointWeightsHF(t, filepath.Join(outs[0], "checkpoints", checkpoint.StepDir(int64(s))))
				if d, where := maxAbsDiff(g[checkpoint.KindWeights], hf); d != 0 {
					t.Errorf("step %d: the HF weights differ from the shards by %g at %s", s, d, where)
				}
			}
			dir := func(out string) string { return filepath.Join(out, "checkpoints", checkpoint.StepDir(steps)) }
			ents, _ := os.ReadDir(dir(outs[0]))
			shards := 0
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), "shard-") {
					shards++
				}
				a, _ := os.ReadFile(filepath.Join(dir(outs[0]), e.Name()))
				b, _ := os.ReadFile(filepath.Join(dir(outs[1]), e.Name()))
				if e.Name() != checkpoint.TrainerStateFile && e.Name() != checkpoint.ManifestFile && e.Name() != checkpoint.DoneFile && !bytes.Equal(a, b) {
					t.Errorf("two runs on %d ranks: %s differs", n, e.Name())
				}
			}
			if shards != n {
				t.Errorf("%d shard files in %s, want %d", shards, dir(outs[0]), n)
			}
		})
	}
}

func kindName(k int) string { return [...]string{"weights", "exp_avg", "exp_avg_sq"}[k] }

// sameData fails when two runs trained other data: rewards, rollouts, rows,
// tokens, and a loss within 1e-6.
func sameData(t *testing.T, want, got []Metrics) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d metric lines, want %d", len(got), len(want))
	}
	for i := range got {
		w, g := want[i], got[i]
		if g.RewardMean != w.RewardMean || g.LogicalRollouts != w.LogicalRollouts || g.EligibleTokens != w.EligibleTokens ||
			g.Traces != w.Traces || g.PhysicalRows != w.PhysicalRows || g.PaddingRows != w.PaddingRows || g.TrainTokens != w.TrainTokens {
			t.Errorf("step %d: trained other data than one process:\n got %+v\nwant %+v", i+1, g, w)
		}
		if d := math.Abs(float64(g.Loss - w.Loss)); d > 1e-6*math.Max(1, math.Abs(float64(w.Loss))) {
			t.Errorf("step %d: loss %v, one process %v", i+1, g.Loss, w.Loss)
		}
	}
}

// TestShardedResumeAcrossLayouts: a checkpoint resumes at another world
// size and in the other sharding mode, each continuing as if uninterrupted
// (same data, weights and moments within rankTol of one unsharded process
// running straight through): sharded on 2 ranks then on 3; sharded on 3
// then one process (unsharded); unsharded then sharded on 2; sharded on 2
// then unsharded on 2.
func TestShardedResumeAcrossLayouts(t *testing.T) {
	const steps = 4
	lr := []string{"--set", "policy.megatron_cfg.scheduler.lr_decay_iters=4", "--set", "checkpointing.save_period=1"}
	args := func(out string, extra ...string) []string {
		return append(trainArgs(out, steps, sameUpdateSets...), append(lr, extra...)...)
	}
	ref := t.TempDir()
	mustTrain(t, args(ref)...)
	want := metricsNoTimes(t, ref)
	run := func(t *testing.T, n int, args ...string) {
		if n == 1 {
			mustTrain(t, args...)
		} else {
			mustRanks(t, n, args...)
		}
	}
	for _, c := range []struct {
		name           string
		first, second  int
		shard1, shard2 string
	}{
		{"sharded 2 then sharded 3", 2, 3, "full", "full"},
		{"sharded 3 then one process", 3, 1, "full", "none"},
		{"unsharded then sharded 2", 1, 2, "none", "full"},
		{"sharded 2 then unsharded 2", 2, 2, "full", "none"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := t.TempDir()
			run(t, c.first, args(out, "--shard", c.shard1, "--steps", "2")...)
			before, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
			run(t, c.second, args(out, "--shard", c.shard2, "--resume")...)
			after, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
			if len(before) == 0 || !bytes.HasPrefix(after, before) || bytes.Count(after, []byte{'\n'}) != steps {
				t.Fatalf("the resumed run did not continue after step 2 (metrics before:\n%s\nafter:\n%s)", before, after)
			}
			sameData(t, want, metricsNoTimes(t, out))
			w, g := stepTensors(t, ref, steps), stepTensors(t, out, steps)
			for k := range checkpoint.NumKinds {
				if d, where := maxAbsDiff(w[k], g[k]); d > rankTol || math.IsNaN(d) {
					t.Errorf("%s after %d steps differ from one uninterrupted process by %.3g at %s", kindName(k), steps, d, where)
				}
			}
		})
	}
}

// checkCommBytes checks each step's counted collectives against the
// schedule's arithmetic: the gradients are reduce-scattered once per
// micro-batch (M times the padded fp32 model), and the weights gathered
// once for the sampler's copy plus, per micro-batch, at most for the
// old-policy forward, the training forward and the backward, and at least
// once a step (the update invalidates every gathered group; a group still
// in its slot is not gathered again, so a model of two layers, which its
// two layer slots hold, is gathered once): between 2 and 1+3M padded
// models (everything is fp32 on the CPU).
func checkCommBytes(t *testing.T, world int, ms []Metrics) {
	t.Helper()
	cfg, err := model.ParseConfig(builtinModelConfig, "builtin")
	if err != nil {
		t.Fatal(err)
	}
	tab := model.NewParamTable(cfg)
	sh, err := model.NewSharding(&tab, world, 0)
	if err != nil {
		t.Fatal(err)
	}
	var padded int64
	for g := range tab.Groups {
		for f := range model.NumFlats {
			padded += 4 * int64(sh.Padded(g, f))
		}
	}
	for _, m := range ms {
		mbs := m.CommReduceScatterBytes / padded
		if mbs < 1 || m.CommReduceScatterBytes != mbs*padded {
			t.Errorf("step %d: %d bytes reduce-scattered, not a whole number of padded models (%d bytes)", m.Step, m.CommReduceScatterBytes, padded)
			continue
		}
		lo, hi := 2*padded, (1+3*mbs)*padded
		if m.CommGatherBytes < lo || m.CommGatherBytes > hi {
			t.Errorf("step %d: %d bytes gathered over %d micro-batches, want [%d, %d]", m.Step, m.CommGatherBytes, mbs, lo, hi)
		}
		t.Logf("step %d: %d micro-batches; gathered %.2f padded models, reduce-scattered %d", m.Step, mbs, float64(m.CommGatherBytes)/float64(padded), mbs)
	}
}

// TestShardChoice: --shard wins; otherwise a recipe's FSDP2 switch shards
// on more than one rank only, and Megatron's distributed optimizer (ZeRO-1,
// not built) is refused by name on more than one rank and is the plain
// optimizer on one; a cluster that does not hold the launched ranks names
// both numbers.
func TestShardChoice(t *testing.T) {
	cfg := func(dtensor, megatron, dist bool) *config.Config {
		var c config.Config
		c.Policy.DtensorCfg.Enabled = dtensor
		c.Policy.MegatronCfg.Enabled = megatron
		c.Policy.MegatronCfg.Optimizer.UseDistributedOptimizer = dist
		return &c
	}
	for _, c := range []struct {
		name                    string
		dtensor, megatron, dist bool
		flag                    string
		world                   int
		full                    bool
		err                     string
	}{
		{"fsdp2 recipe, 1 rank", true, false, false, "", 1, false, ""},
		{"fsdp2 recipe, 8 ranks", true, false, false, "", 8, true, ""},
		{"megatron recipe", false, true, false, "", 8, false, ""},
		{"zero-1 on 8 ranks", false, true, true, "", 8, false, "use_distributed_optimizer=true"},
		{"zero-1 on 1 rank", false, true, true, "", 1, false, ""},
		{"zero-1, --shard full", false, true, true, "full", 8, true, ""},
		{"fsdp2, --shard none", true, false, false, "none", 8, false, ""},
		{"--shard full on 1 rank", false, false, false, "full", 1, true, ""},
		{"bad flag", false, false, false, "half", 2, false, "--shard \"half\""},
	} {
		t.Run(c.name, func(t *testing.T) {
			full, _, err := ShardChoice(cfg(c.dtensor, c.megatron, c.dist), c.flag, c.world)
			if (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) || full != c.full {
				t.Errorf("ShardChoice = %v, %v; want full %v, error %q", full, err, c.full, c.err)
			}
		})
	}
	var c config.Config
	c.Cluster.NumNodes, c.Cluster.GPUsPerNode = 2, 8
	if err := checkCluster(&c, 16); err != nil {
		t.Errorf("2 × 8 on 16 ranks: %v", err)
	}
	if err := checkCluster(&c, 4); err == nil || !strings.Contains(err.Error(), "= 16 ranks, but the launcher started 4") {
		t.Errorf("2 × 8 on 4 ranks: %v", err)
	}
}

// TestShardedSignalStopCheckpoints: a stop request on one rank of a
// sharded run of two ends both after the step in progress with a
// checkpoint of that step written by both (a shard file each) and sealed
// by rank 0, which resumes the run (the stop's checkpoint was rank 0's
// unsharded save, which read the shard arena as a whole model's).
func TestShardedSignalStopCheckpoints(t *testing.T) {
	out := t.TempDir()
	args := trainArgs(out, 4, "--shard", "full", "--set", "checkpointing.save_period=100")
	errs, logs := eachLocalRank(t, 2, args, nil, func(r int, tr *Trainer) error {
		if r == 1 {
			sigs := make(chan os.Signal, 1)
			sigs <- syscall.SIGTERM
			tr.o.Signals = sigs
			tr.watchSignals()
			for tr.interrupted() == nil {
				runtime.Gosched()
			}
		}
		return tr.Run()
	})
	for r, err := range errs {
		if !errors.Is(err, errInterrupted) || !strings.Contains(err.Error(), "after step 1") || !Agreed(err) {
			t.Fatalf("rank %d: %v, want a stop after step 1 that every rank agrees on\n%s", r, err, logs[r])
		}
	}
	dir := filepath.Join(out, "checkpoints", checkpoint.StepDir(1))
	man, err := checkpoint.Verify(dir)
	if err != nil || !man.Sharded() {
		t.Fatalf("the stop's checkpoint: sharded %v, %v", man.Sharded(), err)
	}
	mustRanks(t, 2, append(args, "--resume")...)
	if ms := metricsNoTimes(t, out); len(ms) != 4 {
		t.Errorf("%d metric lines after resuming from the stop's checkpoint, want 4", len(ms))
	}
}

// TestShardedCheckpointRefusesNonFiniteWeights: a rank whose shard holds a
// non-finite weight makes every rank refuse the checkpoint, naming the
// parameter, and nothing is published.
func TestShardedCheckpointRefusesNonFiniteWeights(t *testing.T) {
	out := t.TempDir()
	saveErrs := make([]error, 2)
	errs, logs := eachLocalRank(t, 2, trainArgs(out, 1, "--shard", "full"), nil, func(r int, tr *Trainer) error {
		if err := tr.Run(); err != nil {
			return err
		}
		if r == 1 {
			host, ok := tr.hostView(tr.model.Params())
			if !ok {
				return errors.New("the CPU backend has no host view")
			}
			pc := tr.model.Sharding().Pieces(tr.model.Table())
			host[pc[len(pc)-1].At] = float32(math.NaN())
		}
		tr.step++
		_, saveErrs[r] = tr.prepareSharded()
		return nil
	})
	for r := range 2 {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v\n%s", r, errs[r], logs[r])
		}
		if e := saveErrs[r]; e == nil || !Agreed(e) || !strings.Contains(e.Error(), "rank 1") || !strings.Contains(e.Error(), "not finite") || !strings.Contains(e.Error(), "model.") {
			t.Errorf("rank %d: %v, want every rank to refuse, naming rank 1 and the parameter", r, e)
		}
	}
	ents, _ := checkpoint.List(filepath.Join(out, "checkpoints"))
	if len(ents) != 1 || ents[0].Step != 1 {
		t.Errorf("checkpoints after the refusal: %v, want step 1's alone", ents)
	}
}

// TestShardedChimeraRefusedAtResumeAndExport (issue 34; issue 33, item 5):
// a sharded checkpoint of 2 ranks whose rank 1 shard comes from another
// run (another seed), or whose two shard files were swapped, with its
// manifest and DONE rewritten to match, is refused by --resume on every
// rank, by export and by verify, naming the shard file; untouched, the
// same checkpoint resumes.
func TestShardedChimeraRefusedAtResumeAndExport(t *testing.T) {
	dir := t.TempDir()
	args := func(out string, steps int, extra ...string) []string {
		return append(trainArgs(out, steps, "--shard", "full", "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=4"), extra...)
	}
	ours, theirs := filepath.Join(dir, "ours"), filepath.Join(dir, "theirs")
	mustRanks(t, 2, args(ours, 2)...)
	mustRanks(t, 2, args(theirs, 2, "--set", "grpo.seed=7")...)
	s0, s1 := checkpoint.ShardFile(0, 2), checkpoint.ShardFile(1, 2)
	be := cpu.New(1)
	defer be.Close()
	for _, c := range []struct {
		name, names string
		edit        func(t *testing.T, ckpt string)
	}{
		{"rank 1's shard from a run of seed 7", s1, func(t *testing.T, ckpt string) {
			b, err := os.ReadFile(filepath.Join(theirs, "checkpoints", "step_2", s1))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(ckpt, s1), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"the shard files swapped", s0, func(t *testing.T, ckpt string) {
			for _, mv := range [][2]string{{s0, "x"}, {s1, s0}, {"x", s1}} {
				if err := os.Rename(filepath.Join(ckpt, mv[0]), filepath.Join(ckpt, mv[1])); err != nil {
					t.Fatal(err)
				}
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "run")
			if err := os.CopyFS(out, os.DirFS(ours)); err != nil {
				t.Fatal(err)
			}
			os.Remove(filepath.Join(out, lockFile))
			ckpt := filepath.Join(out, "checkpoints", "step_2")
			c.edit(t, ckpt)
			resealCheckpoint(t, ckpt)
			if _, err := checkpoint.Verify(ckpt); !errors.Is(err, checkpoint.ErrInconsistent) || !strings.Contains(err.Error(), c.names) {
				t.Errorf("verify: %v; want ErrInconsistent naming %s", err, c.names)
			}
			if err := ExportHF(be, nil, ckpt, filepath.Join(t.TempDir(), "hf"), safetensors.F32); !errors.Is(err, checkpoint.ErrInconsistent) || !strings.Contains(err.Error(), c.names) {
				t.Errorf("export: %v; want ErrInconsistent naming %s", err, c.names)
			}
			errs, logs := runLocalRanks(t, 2, args(out, 4, "--resume")...)
			for r, err := range errs {
				if msg := fmt.Sprint(err); !strings.Contains(msg, "do not belong together") || !strings.Contains(msg, c.names) {
					t.Errorf("resume, rank %d: %v\n%s; want a refusal naming %s", r, err, logs[r], c.names)
				}
			}
		})
	}
	mustRanks(t, 2, args(ours, 4, "--resume")...)
	// The run's id is kept across the resume, and another seed's differs.
	runID := func(out string, step int) string {
		b, err := os.ReadFile(filepath.Join(out, "checkpoints", fmt.Sprintf("step_%d", step), checkpoint.TrainerStateFile))
		if err != nil {
			t.Fatal(err)
		}
		ts, err := checkpoint.ParseTrainerState(b)
		if err != nil {
			t.Fatal(err)
		}
		return ts.RunID
	}
	if a, b, c := runID(ours, 2), runID(ours, 4), runID(theirs, 2); a == "" || a != b || a == c {
		t.Errorf("run ids: %q before the resume, %q after, %q for seed 7; want one kept, the other different", a, b, c)
	}
}

// resealCheckpoint rewrites a checkpoint's manifest.json and DONE from its
// files, as a tool or a careless copy would after changing them.
func resealCheckpoint(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(path, checkpoint.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	man, err := checkpoint.ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range man.Files {
		if man.Files[i], err = checkpoint.HashFile(filepath.Join(path, f.Name)); err != nil {
			t.Fatal(err)
		}
	}
	mb, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	mb = append(mb, '\n')
	sum := sha256.Sum256(mb)
	for name, data := range map[string][]byte{checkpoint.ManifestFile: mb, checkpoint.DoneFile: []byte("sha256:" + hex.EncodeToString(sum[:]) + "\n")} {
		if err := os.WriteFile(filepath.Join(path, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := checkpoint.Structure(path); err != nil {
		t.Fatalf("after the reseal: %v", err)
	}
}
