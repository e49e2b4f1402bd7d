package optim

import (
	"errors"
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels"
)

// Backend is the part of a kernels.Backend the optimizer uses.
type Backend interface {
	kernels.Memory
	// AdamW, SumSquares and Fill are the kernels.Ops methods of the same
	// names.
	AdamW(param, grad, m, v kernels.Buf, step kernels.AdamWStep)
	SumSquares(out, x kernels.Buf)
	Fill(x kernels.Buf, v float32)
}

// Group is a range [Off, Off+N) of the parameter arena; Decay says whether
// weight decay applies to it (norm weights and biases are exempt by default;
// the model's parameter table decides).
type Group struct {
	Off, N int
	Decay  bool
}

// ClipSets is the number of clip sets (Config.ClipSet).
const ClipSets = 2

// Sharded makes an optimizer step one rank's shard of the parameters
// (fully sharded data parallel): the gradient norm sums every rank's
// squared norms per group ID in one all-reduce of IDs floats, so clipping
// and the non-finite check are global and every rank skips the same step.
type Sharded struct {
	Comm collective.Comm
	IDs  int // group IDs run over [0, IDs)
	// GroupID numbers each of the rank's groups among every rank's: the
	// parts of one parameter on different ranks share an ID.
	GroupID []int
}

// NonFinite says what Step does when the gradient norm is NaN or ±Inf.
type NonFinite uint8

const (
	// SkipNonFinite leaves parameters, moments and the step counter alone,
	// counts the step in State.Skipped and returns a Result with Skipped set.
	SkipNonFinite NonFinite = iota
	// AbortNonFinite returns an error wrapping ErrNonFiniteGrad.
	AbortNonFinite
)

// ErrNonFiniteGrad is wrapped by Step's error when the gradient is not finite
// and the guard is AbortNonFinite.
var ErrNonFiniteGrad = errors.New("optim: non-finite gradient")

// ErrNonFiniteWeights is wrapped by Step's error when the update it applied
// made weights non-finite (an lr or a weight decay that overflows float32):
// whatever the NonFinite policy, the caller must not go on from, or save,
// those weights. (Undoing the update would need a second copy of the
// weights and moments; the run stops instead.)
var ErrNonFiniteWeights = errors.New("optim: the update made weights not finite (or too large to square in float32)")

// WeightsError is Step's error for weights the update made non-finite: the
// first group whose sum of squares is NaN or ±Inf.
type WeightsError struct {
	Group  int     // index into the groups given to New (its ID when sharded)
	Off, N int     // the group's elements
	SumSq  float64 // the group's sum of squares after the update
	Step   int64   // the optimizer step that made them
	LR     float64 // its learning rate
}

func (e *WeightsError) Error() string {
	return fmt.Sprintf("%v: step %d (lr %g): group %d (elements [%d, %d)) has sum of squares %v after the update",
		ErrNonFiniteWeights, e.Step, e.LR, e.Group, e.Off, e.Off+e.N, e.SumSq)
}

func (e *WeightsError) Unwrap() error { return ErrNonFiniteWeights }

// Config holds AdamW's hyperparameters (NeMo RL's optimizer keys).
type Config struct {
	// Rule is the optimizer whose arithmetic the update follows:
	// torch.optim.AdamW (the zero value) or TransformerEngine's FusedAdam.
	Rule kernels.AdamRule
	// Moments is the Adam moments' dtype: F32 (0 means F32), or BF16
	// (FusedAdam's exp_avg_dtype and exp_avg_sq_dtype torch.bfloat16).
	Moments      kernels.DType
	Beta1, Beta2 float64 // adam_beta1, adam_beta2
	Eps          float64 // adam_eps
	// MaxGradNorm is clip_grad / max_grad_norm; <= 0 disables clipping (the
	// norm is still computed and reported).
	MaxGradNorm float64
	NonFinite   NonFinite
	// ClipSet is the clip set of each group (each group ID when sharded,
	// over every rank's IDs); nil: all in set 0. Set 0 is the main
	// gradient norm (Result.GradNorm); set 1 is clipped by its own norm
	// with the same MaxGradNorm and left out of the main one:
	// Megatron-Core's separate grad_norm_group "mtp"
	// (megatron/core/optimizer/optimizer.py clip_grad_norm at
	// d98e8a64ddf34856e74b24714e3bedb2f5a39553), which tags the MTP
	// blocks' parameters when mtp_detach_heads.
	ClipSet []int
}

// State is the optimizer's host-side state (the moments live in the
// backend's moment arena).
type State struct {
	Step    int64 `json:"step"`    // updates applied (bias-correction step)
	Skipped int64 `json:"skipped"` // updates skipped for a non-finite gradient
}

// Result reports one Step.
type Result struct {
	GradNorm    float64 // global L2 norm of the gradient before clipping
	ClipScale   float64 // factor applied to the gradient (1 when not clipped)
	Skipped     bool    // the gradient was not finite and the update was skipped
	LR, WD      float64 // learning rate and weight decay the update used
	Step        int64   // optimizer step counter after the update
	GroupSumSqr []float64
	// SetNorms is each clip set's L2 norm before clipping (SetNorms[0] is
	// GradNorm) and SetScales its clip factor, when groups use a clip set
	// beyond 0 (nil otherwise).
	SetNorms, SetScales []float64
}

// AdamW is the optimizer over one parameter arena.
type AdamW struct {
	be      Backend
	cfg     Config
	groups  []Group
	runs    []Group // adjacent groups with the same Decay and clip set, merged
	runClip []int   // each run's clip set
	sets    bool    // a group (or an ID) is in a clip set beyond 0
	param   kernels.Buf
	grad    kernels.Buf
	moments kernels.Buf // (2N): m then v
	sums    kernels.Buf // (len(groups), or the IDs when sharded) per-group Σg²
	shard   *Sharded
	host    []float32
	st      State
	// The multi-tensor step (kernels.MultiAdamW, when the backend has it):
	// the chunk table, its flags (2 + groups: the skip, the clip factor,
	// then one per group) and their host copy.
	multi   kernels.MultiAdamW
	table   kernels.Buf
	nchunks int
	flags   kernels.Buf
	hflags  []int32
}

// multiChunk is the most elements of one chunk of the multi-tensor step.
const multiChunk = 1 << 16

// New allocates the moment arena (zeroed) and returns an optimizer for param
// and grad, two F32 buffers of the same length. Groups must be sorted,
// disjoint and inside the arena.
func New(be Backend, param, grad kernels.Buf, groups []Group, cfg Config) (*AdamW, error) {
	return newAdamW(be, param, grad, groups, cfg, nil)
}

// NewSharded is New over one rank's shard (see Sharded). Each group's ID
// must be in [0, sh.IDs) and unique on this rank; an arena element in no
// group (a shard's padding) is never updated nor counted.
func NewSharded(be Backend, param, grad kernels.Buf, groups []Group, cfg Config, sh Sharded) (*AdamW, error) {
	if sh.Comm == nil || sh.IDs < 1 {
		return nil, fmt.Errorf("optim: sharded optimizer needs a communicator and group IDs")
	}
	if len(sh.GroupID) != len(groups) {
		return nil, fmt.Errorf("optim: %d group IDs for %d groups", len(sh.GroupID), len(groups))
	}
	seen := make(map[int]bool, len(groups))
	for i, id := range sh.GroupID {
		if id < 0 || id >= sh.IDs || seen[id] {
			return nil, fmt.Errorf("optim: group %d: ID %d: want a unique ID in [0, %d)", i, id, sh.IDs)
		}
		seen[id] = true
	}
	return newAdamW(be, param, grad, groups, cfg, &sh)
}

func newAdamW(be Backend, param, grad kernels.Buf, groups []Group, cfg Config, sh *Sharded) (*AdamW, error) {
	if param.DType != kernels.F32 || grad.DType != kernels.F32 {
		return nil, fmt.Errorf("optim: param and grad must be f32, got %v and %v", param.DType, grad.DType)
	}
	if param.N != grad.N {
		return nil, fmt.Errorf("optim: param has %d elements, grad %d", param.N, grad.N)
	}
	if len(groups) == 0 && sh == nil {
		return nil, fmt.Errorf("optim: no parameter groups")
	}
	end := 0
	for i, g := range groups {
		if g.N <= 0 || g.Off < end || g.Off+g.N > param.N {
			return nil, fmt.Errorf("optim: group %d [%d, %d): want a non-empty range at or after %d inside the %d-element arena", i, g.Off, g.Off+g.N, end, param.N)
		}
		end = g.Off + g.N
	}
	if !(cfg.Beta1 >= 0 && cfg.Beta1 < 1) {
		return nil, fmt.Errorf("optim: adam_beta1: want in [0, 1), got %v", cfg.Beta1)
	}
	if !(cfg.Beta2 >= 0 && cfg.Beta2 < 1) {
		return nil, fmt.Errorf("optim: adam_beta2: want in [0, 1), got %v", cfg.Beta2)
	}
	if !(cfg.Eps >= 0) {
		return nil, fmt.Errorf("optim: adam_eps: want >= 0, got %v", cfg.Eps)
	}
	if math.IsNaN(cfg.MaxGradNorm) {
		return nil, fmt.Errorf("optim: max_grad_norm: want a number, got NaN")
	}
	if cfg.NonFinite != SkipNonFinite && cfg.NonFinite != AbortNonFinite {
		return nil, fmt.Errorf("optim: unknown non-finite policy %d", cfg.NonFinite)
	}
	if cfg.Moments == 0 {
		cfg.Moments = kernels.F32
	}
	switch {
	case cfg.Rule != kernels.TorchAdamW && cfg.Rule != kernels.FusedAdam:
		return nil, fmt.Errorf("optim: unknown update rule %v", cfg.Rule)
	case cfg.Moments == kernels.BF16 && cfg.Rule != kernels.FusedAdam:
		return nil, fmt.Errorf("optim: bf16 moments under %v: only FusedAdam keeps them (torch.optim.AdamW has no exp_avg_dtype)", cfg.Rule)
	case cfg.Moments != kernels.F32 && cfg.Moments != kernels.BF16:
		return nil, fmt.Errorf("optim: %v moments: want f32 or bf16", cfg.Moments)
	}
	o := &AdamW{be: be, cfg: cfg, groups: append([]Group(nil), groups...), param: param, grad: grad, shard: sh}
	if cfg.ClipSet != nil {
		want := len(groups)
		if sh != nil {
			want = sh.IDs
		}
		if len(cfg.ClipSet) != want {
			return nil, fmt.Errorf("optim: %d clip sets for %d groups (or group IDs)", len(cfg.ClipSet), want)
		}
		for i, c := range cfg.ClipSet {
			if c < 0 || c >= ClipSets {
				return nil, fmt.Errorf("optim: group %d: clip set %d: want 0 to %d", i, c, ClipSets-1)
			}
			o.sets = o.sets || c != 0
		}
	}
	for i, g := range groups {
		c := o.setOf(o.slot(i))
		if n := len(o.runs); n > 0 && o.runs[n-1].Decay == g.Decay && o.runClip[n-1] == c && o.runs[n-1].Off+o.runs[n-1].N == g.Off {
			o.runs[n-1].N += g.N
			continue
		}
		o.runs = append(o.runs, g)
		o.runClip = append(o.runClip, c)
	}
	var err error
	nsums := len(groups)
	if sh != nil {
		nsums = sh.IDs
	}
	moments, sums := sizes(param.N, nsums)
	if o.moments, err = be.Alloc(cfg.Moments, moments); err != nil {
		return nil, fmt.Errorf("optim: allocate moments (%d elements): %w", moments, err)
	}
	if o.sums, err = be.Alloc(kernels.F32, sums); err != nil {
		be.Free(o.moments)
		return nil, fmt.Errorf("optim: allocate norm scratch: %w", err)
	}
	o.host = make([]float32, nsums)
	mt, _ := be.(kernels.MultiAdamW) // nil: the per-run step (a wrapped backend)
	if o.sets {
		mt = nil // the multi-tensor step clips by one norm: clip sets take the per-run step
	}
	if err := o.initMulti(mt); err != nil {
		o.Close()
		return nil, err
	}
	return o, nil
}

// initMulti builds the multi-tensor step's chunk table: each group cut
// into chunks of at most multiChunk elements. The table and the flags are
// allocated whether or not the backend runs the step (mt nil), so that
// PlanBytes is the allocation on every backend.
func (o *AdamW) initMulti(mt kernels.MultiAdamW) error {
	var chunks []kernels.AdamChunk
	for i, g := range o.groups {
		for off := 0; off < g.N; off += multiChunk {
			chunks = append(chunks, kernels.AdamChunk{Off: int64(g.Off + off), N: int32(min(multiChunk, g.N-off)), Group: int32(i), Decay: g.Decay})
		}
	}
	words := kernels.EncodeAdamChunks(chunks)
	// Sized as PlanBytes counts them: a table for nsums + n/multiChunk
	// chunks (Σ_g ⌈N_g/multiChunk⌉ never exceeds it), flags for nsums
	// groups.
	nsums := len(o.host)
	tw, fw := multiSizes(o.param.N, nsums)
	if len(words) > tw || 2+len(o.groups) > fw {
		return fmt.Errorf("optim: %d chunk words and %d groups exceed the planned %d and %d", len(words), len(o.groups), tw, fw-2)
	}
	var err error
	if o.table, err = o.be.Alloc(kernels.I32, tw); err != nil {
		return fmt.Errorf("optim: allocate the chunk table: %w", err)
	}
	if o.flags, err = o.be.Alloc(kernels.I32, fw); err != nil {
		return fmt.Errorf("optim: allocate the update flags: %w", err)
	}
	if len(words) > 0 {
		o.be.UploadI32(o.table.Slice(0, len(words)), words)
	}
	o.multi, o.nchunks, o.hflags = mt, len(chunks), make([]int32, fw)
	return nil
}

// multiSizes are the I32 elements of the multi-tensor step's chunk table
// and flags for n parameters in groups groups (or group IDs).
func multiSizes(n, groups int) (table, flags int) {
	return kernels.AdamChunkWords * (groups + n/multiChunk), 2 + groups
}

// sizes are the elements New allocates for n parameters in groups
// groups: both moments (in their dtype), and one F32 gradient norm partial
// per group.
func sizes(n, groups int) (moments, sums int) { return 2 * n, groups }

// PlanBytes returns the bytes New allocates on its backend for n
// parameters in groups groups with moments of the given dtype (F32, or
// BF16: 2 bytes a moment), with the multi-tensor step's chunk table and
// flags (at the bound multiSizes gives).
func PlanBytes(n, groups int, moments kernels.DType) int64 {
	m, s := sizes(n, groups)
	tw, fw := multiSizes(n, groups)
	return int64(moments.Size())*int64(m) + 4*int64(s) + 4*int64(tw+fw)
}

// Close frees the moment arena.
func (o *AdamW) Close() {
	if o.be == nil {
		return
	}
	for _, b := range []kernels.Buf{o.moments, o.sums, o.table, o.flags} {
		if b.N > 0 {
			o.be.Free(b)
		}
	}
	o.be = nil
}

// Moments returns the first and second moment arenas, each of the parameter
// arena's length, as views of the single moment arena (Config.Moments'
// dtype).
func (o *AdamW) Moments() (m, v kernels.Buf) {
	n := o.param.N
	return o.moments.Slice(0, n), o.moments.Slice(n, n)
}

// MomentArena is the whole (2N) moment arena, m then v.
func (o *AdamW) MomentArena() kernels.Buf { return o.moments }

// Groups returns the parameter groups.
func (o *AdamW) Groups() []Group { return append([]Group(nil), o.groups...) }

// State returns the host-side state.
func (o *AdamW) State() State { return o.st }

// SetState restores the host-side state (the moments are restored by
// uploading into MomentArena).
func (o *AdamW) SetState(st State) error {
	if st.Step < 0 || st.Skipped < 0 {
		return fmt.Errorf("optim: restore: negative counter in %+v", st)
	}
	o.st = st
	return nil
}

// GradNorm computes the global gradient norm over the groups and the
// per-group sums of squares (one download; sharded: per ID, over every
// rank, after one all-reduce).
func (o *AdamW) GradNorm() (float64, []float64, error) {
	if err := o.groupSums(o.grad, true); err != nil {
		return 0, nil, fmt.Errorf("optim: gradient norm: %w", err)
	}
	per := make([]float64, len(o.host))
	total := 0.0
	for i, s := range o.host {
		per[i] = float64(s)
		total += float64(s)
	}
	return math.Sqrt(total), per, nil
}

// groupSums computes the sum of squares of buf over each of this rank's
// groups into o.sums and o.host (one download), at the group's slot: its
// index, or its ID when sharded (the other IDs' slots are 0, or, with
// overRanks, every rank's sums after one all-reduce).
func (o *AdamW) groupSums(buf kernels.Buf, overRanks bool) error {
	if err := o.queueSums(buf, overRanks); err != nil {
		return err
	}
	o.be.DownloadF32(o.host, o.sums)
	return o.be.Sync()
}

// queueSums is groupSums without the download: the sums stay in o.sums.
func (o *AdamW) queueSums(buf kernels.Buf, overRanks bool) error {
	if o.shard != nil {
		o.be.Fill(o.sums, 0)
	}
	for i, g := range o.groups {
		o.be.SumSquares(o.sums.Slice(o.slot(i), 1), buf.Slice(g.Off, g.N))
	}
	if o.shard != nil && overRanks {
		if err := o.shard.Comm.AllReduceSum(o.sums); err != nil {
			return err
		}
	}
	return nil
}

// slot is group i's place in the sums: i, or its ID when sharded.
func (o *AdamW) slot(i int) int {
	if o.shard != nil {
		return o.shard.GroupID[i]
	}
	return i
}

// Step clips and applies one AdamW update with learning rate lr and weight
// decay wd (applied to groups with Decay only). Take lr and wd from a
// Schedule before stepping it.
func (o *AdamW) Step(lr, wd float64) (Result, error) {
	if o.be == nil {
		panic("optim: Step after Close")
	}
	if o.multi != nil {
		return o.stepMulti(lr, wd)
	}
	norm, per, err := o.GradNorm()
	if err != nil {
		return Result{}, err
	}
	res := Result{GradNorm: norm, ClipScale: 1, LR: lr, WD: wd, Step: o.st.Step, GroupSumSqr: per}
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return o.nonFinite(res, norm, per)
	}
	scales := [ClipSets]float64{1, 1}
	if o.sets {
		// Megatron's clip_grad_norm: the main norm leaves the separate
		// set out, and each set is clipped by its own norm.
		var sq [ClipSets]float64
		for i, x := range per {
			sq[o.setOf(i)] += x
		}
		res.SetNorms, res.SetScales = make([]float64, ClipSets), make([]float64, ClipSets)
		for k := range sq {
			res.SetNorms[k], res.SetScales[k] = math.Sqrt(sq[k]), 1
			if o.cfg.MaxGradNorm > 0 {
				res.SetScales[k] = kernels.ClipScale(res.SetNorms[k], o.cfg.MaxGradNorm)
			}
			scales[k] = res.SetScales[k]
		}
		res.GradNorm, res.ClipScale = res.SetNorms[0], res.SetScales[0]
	} else if o.cfg.MaxGradNorm > 0 {
		// torch.nn.utils.clip_grad_norm_: coef = max/(norm+1e-6), clamped to 1.
		res.ClipScale = kernels.ClipScale(norm, o.cfg.MaxGradNorm)
		scales[0] = res.ClipScale
	}
	o.st.Step++
	res.Step = o.st.Step
	m, v := o.Moments()
	for ri, r := range o.runs {
		s := kernels.NewAdamWStep(o.cfg.Rule, lr, o.cfg.Beta1, o.cfg.Beta2, o.cfg.Eps, 0, o.st.Step, scales[o.runClip[ri]])
		if r.Decay {
			s.WeightDecay = float32(wd)
		}
		o.be.AdamW(o.param.Slice(r.Off, r.N), o.grad.Slice(r.Off, r.N), m.Slice(r.Off, r.N), v.Slice(r.Off, r.N), s)
	}
	// The new weights: an update can overflow where the gradient did not.
	if err := o.groupSums(o.param, false); err != nil {
		return res, fmt.Errorf("optim: AdamW step %d: %w", o.st.Step, err)
	}
	for i, g := range o.groups {
		if x := float64(o.host[o.slot(i)]); math.IsNaN(x) || math.IsInf(x, 0) {
			return res, &WeightsError{Group: o.slot(i), Off: g.Off, N: g.N, SumSq: x, Step: o.st.Step, LR: lr}
		}
	}
	return res, nil
}

// stepMulti is Step on a backend with kernels.MultiAdamW: the groups'
// sums of squares and the update queued back to back (the clip factor and
// the skip decided on the device from the same float64 sums the host then
// reads), and one download of the sums and the flags for the result.
func (o *AdamW) stepMulti(lr, wd float64) (Result, error) {
	if err := o.queueSums(o.grad, true); err != nil {
		return Result{}, fmt.Errorf("optim: gradient norm: %w", err)
	}
	next := o.st.Step + 1
	step := kernels.NewAdamWStep(o.cfg.Rule, lr, o.cfg.Beta1, o.cfg.Beta2, o.cfg.Eps, wd, next, 1)
	m, v := o.Moments()
	o.multi.AdamWMulti(o.param, o.grad, m, v, o.sums, o.table.Slice(0, kernels.AdamChunkWords*o.nchunks), o.flags, len(o.host), o.nchunks, step, o.cfg.MaxGradNorm)
	o.be.DownloadF32(o.host, o.sums)
	o.be.DownloadI32(o.hflags, o.flags)
	if err := o.be.Sync(); err != nil {
		return Result{}, fmt.Errorf("optim: AdamW step %d: %w", next, err)
	}
	per := make([]float64, len(o.host))
	total := 0.0
	for i, s := range o.host {
		per[i] = float64(s)
		total += float64(s)
	}
	norm := math.Sqrt(total)
	res := Result{GradNorm: norm, ClipScale: 1, LR: lr, WD: wd, Step: o.st.Step, GroupSumSqr: per}
	if math.IsNaN(norm) || math.IsInf(norm, 0) || o.hflags[0] != 0 {
		return o.nonFinite(res, norm, per) // the device updated nothing
	}
	res.ClipScale = kernels.ClipScale(norm, o.cfg.MaxGradNorm)
	o.st.Step = next
	res.Step = next
	for i, g := range o.groups {
		if o.hflags[2+i] == 0 {
			continue
		}
		// The error's sum of squares, computed only here.
		o.be.SumSquares(o.sums.Slice(0, 1), o.param.Slice(g.Off, g.N))
		o.be.DownloadF32(o.host[:1], o.sums.Slice(0, 1))
		if err := o.be.Sync(); err != nil {
			return res, fmt.Errorf("optim: AdamW step %d: %w", next, err)
		}
		return res, &WeightsError{Group: o.slot(i), Off: g.Off, N: g.N, SumSq: float64(o.host[0]), Step: next, LR: lr}
	}
	return res, nil
}

// setOf is the clip set of sums slot i (a group's index, or its ID when
// sharded).
func (o *AdamW) setOf(i int) int {
	if o.cfg.ClipSet == nil {
		return 0
	}
	return o.cfg.ClipSet[i]
}

// nonFinite handles a non-finite gradient norm: the step is skipped
// (counted) or refused, as configured; nothing was updated.
func (o *AdamW) nonFinite(res Result, norm float64, per []float64) (Result, error) {
	{
		first := 0
		for i, s := range per {
			if math.IsNaN(s) || math.IsInf(s, 0) {
				first = i
				break
			}
		}
		if o.cfg.NonFinite == AbortNonFinite {
			if o.shard != nil {
				return res, fmt.Errorf("%w: norm %v; first non-finite group ID %d has sum of squares %v (over every rank)", ErrNonFiniteGrad, norm, first, per[first])
			}
			g := o.groups[first]
			return res, fmt.Errorf("%w: norm %v; first non-finite group %d (elements [%d, %d)) has sum of squares %v", ErrNonFiniteGrad, norm, first, g.Off, g.Off+g.N, per[first])
		}
		o.st.Skipped++
		res.Skipped = true
		return res, nil
	}
}
