package trainer

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strings"

	"github.com/tracegrpo/tracegrpo/grpo"
)

// Data parallelism. Every rank runs the same loop on its own share of each
// step: a contiguous block of the step's task groups (groups never split,
// since advantages need whole groups). The ranks meet three times a step:
//
//	after building their rows: they gather what each holds (its G_tok,
//	the rollouts' rewards, masks and advantages, an error or a stop
//	request), so that every rank divides its loss by the step's global
//	G_tok, and all agree to stop or to fail;
//	after backward: one all-reduce sums the gradients (sum, never mean: the
//	ranks hold unequal token counts), so clipping, the non-finite check and
//	AdamW give every rank the same weights;
//	after the update: they gather their loss sums for the metrics line.
//
// Rank 0 alone writes files (metrics.jsonl, config.yaml, checkpoints); the
// others wait at a barrier while it prepares a checkpoint.

// shard is one rank's share of a step, as the other ranks need it.
type shard struct {
	Err  rankError // this rank could not build its share: every rank fails
	Stop bool      // a stop request reached this rank
	// Input names the step file this rank read and its sha256 (external
	// step files): every rank must have read the same bytes.
	Input string

	// Per logical rollout, in the rank's order.
	Groups    []int64
	Rewards   []float64
	Zeroed    []bool   // loss multiplier 0 (a mask of any kind)
	Traces    []int    // traces delivered
	Reasons   []string // the mask reason (Gym's code, or the record's), "" when trained
	Valid     []bool   // the rollout has a trainable row (it votes)
	Advantage []float64

	Physical, Overlong, Invalid, Eligible int
	GTok                                  float64
	TrainTokens                           int
	MicroBatches                          int // the rank's packed micro-batches
	// MTPTargets counts the rank's multi-token prediction targets per
	// depth (mtp.go): every rank divides by the step's.
	MTPTargets []int
}

// post is one rank's loss sums, gathered after the update.
type post struct {
	Err          rankError // this rank's update failed: every rank fails
	Sums         grpo.LossSums
	EntSum, EntN float64
	MaxOldDiff   float64
	// FilteredOut counts the eligible tokens whose current log-probability
	// is −inf under policy.generation's top-k/top-p filter (masked to 0
	// with no gradient, as NeMo RL's mask_out_neg_inf_logprobs does).
	FilteredOut int
	// A sparse model's load-balancing loss: Σ over micro-batches of its
	// tokens times its loss, and those tokens.
	RouterLossSum  float64
	RouterTokens   int
	ComputedTokens int // tokens through the model: each shared prefix once under policy.shared_prefix=auto
	// MTPCE is each multi-token prediction depth's cross-entropy summed
	// over the rank's targets.
	MTPCE          []float64
	Logprob, Train float64 // this rank's phase seconds
}

// step is the whole step as every rank sees it after the exchanges.
type step struct {
	shards       []shard
	posts        []post
	gTok         float64 // the step's G_tok: every rank's eligible tokens
	logical      int     // logical rollouts of the step, over every rank
	microBatches int     // the most micro-batches of any rank

	commGather, commReduce int64 // this rank's collectives of the step (sharded)
	stop                   bool  // a rank got a stop request while waiting for rollouts
}

func encode(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(v); err != nil {
		return nil, fmt.Errorf("trainer: encode %T: %w", v, err)
	}
	return b.Bytes(), nil
}

// gather gives every rank every rank's v (in rank order) into out.
func gather[T any](t *Trainer, v T) ([]T, error) {
	if t.comm.Size() == 1 {
		return []T{v}, nil
	}
	b, err := encode(v)
	if err != nil {
		return nil, err
	}
	all, err := t.gatherer.Bytes(b)
	if err != nil {
		return nil, err
	}
	out := make([]T, len(all))
	for r, raw := range all {
		if err := gob.NewDecoder(bytes.NewReader(raw)).Decode(&out[r]); err != nil {
			return nil, fmt.Errorf("trainer: decode rank %d's %T: %w", r, v, err)
		}
	}
	return out, nil
}

// agreedError is an error every rank returns (they learned of it at the
// same exchange), so none waits for another: no abort is needed.
// It is a usage error (ErrUsage) when any rank's was, so that every rank
// exits as one process would.
type agreedError struct {
	err   error
	usage bool
}

func (e *agreedError) Error() string        { return e.err.Error() }
func (e *agreedError) Unwrap() error        { return e.err }
func (e *agreedError) Is(target error) bool { return e.usage && target == ErrUsage }

// rankError is one rank's error as the ranks exchange it: its text, and
// whether it is a usage error.
type rankError struct {
	Msg   string
	Usage bool
}

func rankErrorOf(err error) rankError {
	if err == nil {
		return rankError{}
	}
	return rankError{Msg: err.Error(), Usage: errors.Is(err, ErrUsage)}
}

// Agreed reports whether every rank of the run returned err together, so
// that nothing needs to abort the others.
func Agreed(err error) bool {
	var a *agreedError
	return errors.As(err, &a)
}

// agree makes every rank fail when any did: each passes its own error
// (nil for none) and gets the first failing rank's, named by rank.
func (t *Trainer) agree(err error) error {
	if t.comm.Size() == 1 {
		return err
	}
	all, gerr := gather(t, rankErrorOf(err))
	if gerr != nil {
		return gerr
	}
	return agreedOf(all)
}

// agreedOf is the error every rank returns for the ranks' errors (nil when
// none failed): each failing rank's text, named by rank.
// Ranks that failed with the same text are named together ("ranks 0 and
// 1: ..."), each text once.
func agreedOf(all []rankError) error {
	var msgs []string
	ranks := map[string][]int{}
	usage := false
	for r, e := range all {
		if e.Msg != "" {
			if _, ok := ranks[e.Msg]; !ok {
				msgs = append(msgs, e.Msg)
			}
			ranks[e.Msg] = append(ranks[e.Msg], r)
			usage = usage || e.Usage
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	failed := make([]string, len(msgs))
	for i, m := range msgs {
		failed[i] = fmt.Sprintf("%s: %s", rankList(ranks[m]), m)
	}
	return &agreedError{err: errors.New(strings.Join(failed, "\n")), usage: usage}
}

// rankList names ranks for people: "rank 1", "ranks 0 and 1", "ranks 0, 1
// and 2".
func rankList(rs []int) string {
	if len(rs) == 1 {
		return fmt.Sprintf("rank %d", rs[0])
	}
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprint(r)
	}
	return "ranks " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// myShard summarizes this rank's share of the step.
func myShard(logical []grpo.LogicalRollout, reasons []string, b *grpo.Batch) shard {
	s := shard{
		Groups: make([]int64, len(logical)), Rewards: make([]float64, len(logical)),
		Zeroed: make([]bool, len(logical)), Traces: make([]int, len(logical)),
		Reasons: make([]string, len(logical)), Valid: make([]bool, len(logical)),
		Advantage: make([]float64, len(logical)),
		Physical:  b.Metrics.Physical, Overlong: b.Metrics.Overlong, Invalid: b.Metrics.Invalid,
		Eligible: b.Metrics.EligibleTokens, GTok: b.GTok,
	}
	for i, lr := range logical {
		s.Groups[i], s.Rewards[i], s.Zeroed[i] = lr.TaskGroup, lr.Reward, lr.LossMultiplier == 0
		if lr.Envelope != nil {
			s.Traces[i] = len(lr.Envelope.Traces)
		}
		s.Reasons[i] = reasons[i]
		if i < len(b.Metrics.LogicalValid) {
			s.Valid[i] = b.Metrics.LogicalValid[i]
		}
		if i < len(b.Advantages.Advantage) {
			s.Advantage[i] = b.Advantages.Advantage[i]
		}
	}
	for _, r := range b.Rows {
		if r.Valid {
			s.TrainTokens += len(r.TokenIDs)
		}
	}
	return s
}

// paramsHash is a hash of the parameter arena's bits: ranks whose weights
// diverged (a bug, or a checkpoint that was not the same file on every
// node) are caught at the next checkpoint instead of training apart.
func (t *Trainer) paramsHash() ([]byte, error) {
	host := t.hostCopy(t.model.Params())
	if err := t.be.Sync(); err != nil {
		return nil, fmt.Errorf("weights hash: %w", err)
	}
	h := fnv.New64a()
	buf := make([]byte, 0, 64<<10)
	for _, x := range host {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(x))
		if len(buf) == cap(buf) {
			h.Write(buf)
			buf = buf[:0]
		}
	}
	h.Write(buf)
	return h.Sum(nil), nil
}

// checkSameWeights fails when the ranks' weights differ.
func (t *Trainer) checkSameWeights(when string) error {
	if t.comm.Size() == 1 || t.sharded() { // sharded: every rank holds other weights
		return nil
	}
	mine, err := t.paramsHash()
	if err := t.agree(err); err != nil { // every rank, so that none waits below
		return err
	}
	all, err := gather(t, mine)
	if err != nil {
		return err
	}
	for r := range all {
		if !bytes.Equal(all[r], all[0]) {
			return &agreedError{err: fmt.Errorf("%s: rank %d's weights differ from rank 0's %s", when, r, t.divergedWhy(when))}
		}
	}
	return nil
}

// divergedWhy says what ranks whose weights differ at when ("start" or a
// step) can mean, given that they agreed on the run's identity at start.
func (t *Trainer) divergedWhy(when string) string {
	if when == "start" {
		src := "the random initial weights (a tracegrpo bug: they come from grpo.seed)"
		if dir := t.initDir(); dir != "" {
			src = "the initial weights' directory " + dir
		}
		if t.resumeFrom != "" {
			src = "the checkpoint resumed (" + t.resumeFrom + ")"
		}
		return fmt.Sprintf("after loading them, although the ranks agreed on the run's flags, config and input paths: %s has other contents on that rank's node (is it on a file system every rank shares?)", src)
	}
	return "although every rank started from the same weights and applied the same updates to them: a rank computed another update (a faulty device or memory, or a tracegrpo bug); nothing of this step is saved, the previous checkpoint is intact"
}
