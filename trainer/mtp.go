package trainer

// Multi-token prediction: the MTP loss NeMo RL's Megatron policy worker adds
// to the GRPO loss (nemo_rl/models/policy/workers/megatron_policy_worker.py
// at NVIDIA-NeMo/RL 7ea279abfbeb698b092856d0dab61e7cf39bc909, over
// Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553), read as follows.
//
//   - Which tokens: NeMo RL passes mtp_loss_mask = token_mask · sample_mask
//     (megatron_policy_worker.py:837-841) as Megatron's loss_mask, and no
//     labels, so process_mtp_loss (multi_token_prediction.py:981-1008)
//     derives labels by rolling the input ids and rolls the mask with them:
//     depth k's target at position i is token i+k+1 of the same sequence,
//     counted when that token's mask is 1. Here: a trace's tokens whose
//     training mask is on in a trainable row (spec §5: the envelope's
//     loss_mask, so a token owned by an earlier trace — masked in the later
//     one — is no target there; inert and padding rows are not run), at
//     positions t ≥ k+1 of their trace.
//   - Which loss: the cross-entropy of the depth's logits at temperature 1
//     (compute_language_model_loss; the sampling temperature divides only
//     the main head's logits, in NeMo RL's loss post-processing), with no
//     advantage: MTP is a next-tokens objective on the rollouts' tokens.
//   - Which normaliser: under calculate_per_token_loss (NeMo RL's
//     setup.py:1322) depth k's term is
//     mtp_loss_scaling_factor/mtp_num_layers · Σ mask·CE · N0/max(N_k, 1)
//     (multi_token_prediction.py:1047-1061), its gradient scaled by
//     1/global_valid_toks (the worker's mtp_grad_scale_func,
//     megatron_policy_worker.py:895; schedules.py:370-376), where N0 and
//     N_k are the micro-batch's own mask sums — the code says itself
//     (:1049-1051) that exact parity across ranks and micro-batches would
//     need all-reduced counts. With N0 = global_valid_toks (both are Σ of
//     the mask past each sequence's first token) the term is
//     s/D · Σ mask·CE / N_k for one micro-batch on one rank. tracegrpo uses
//     the step's N_k (every micro-batch of every rank): that value, and
//     the same under any packing and world size, as the main loss's G_tok.
//   - Detached or not: mtp_detach_heads as Megatron detaches (model/mtp.go),
//     and its parameters then clipped by their own gradient norm
//     (Megatron's grad_norm_group "mtp", multi_token_prediction.py:1913-1916;
//     optimizer.py clip_grad_norm), the main grad_norm leaving them out.
//   - NeMo RL's use_fused_linear_logprobs passes labels = the unshifted ids
//     (nemo_rl/models/megatron/train.py:175-177), so process_mtp_loss would
//     not derive them and every depth would predict one token less ahead;
//     that path is not this reading (it is off in every recipe).
//   - The recipe keys: _apply_mtp_config (nemo_rl/models/megatron/setup.py:
//     1026-1039) sets each only when the recipe states it; otherwise
//     Megatron-Bridge's provider_bridge (nemotron_h_bridge.py:324-330)
//     takes mtp_num_layers from config.json's num_nextn_predict_layers,
//     mtp_use_repeated_layer (default true) and mtp_loss_scaling_factor
//     (default 0.3) from config.json too, and Megatron's default
//     mtp_detach_heads is false. Without policy.megatron_cfg.enabled NeMo
//     RL trains through DTensor (transformers), which has no MTP.

import (
	"fmt"
	"math"
	"strings"

	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/model"
)

// mtpKey is the recipe key that turns multi-token prediction on.
const mtpKey = "policy.megatron_cfg.mtp_num_layers"

// mtpShape is a run's multi-token prediction as the recipe and the
// checkpoint decide it: the model's training shape and the loss's scale.
type mtpShape struct {
	t     model.MTPTraining
	scale float64 // mtp_loss_scaling_factor
	notes []string
}

// mtpShapeOf reads the recipe's MTP keys over the model's defaults.
func mtpShapeOf(c *config.Config, mc model.Config) (mtpShape, error) {
	var s mtpShape
	mg := &c.Policy.MegatronCfg
	stated := mg.MTPNumLayers != nil || mg.MTPLossScalingFactor != nil || mg.MTPUseRepeatedLayer != nil || mg.MTPDetachHeads != nil
	if !mg.Enabled {
		if stated && mg.MTPNumLayers != nil && *mg.MTPNumLayers > 0 {
			s.notes = append(s.notes, fmt.Sprintf("%s=%d has no effect without policy.megatron_cfg.enabled: NeMo RL then trains through DTensor (transformers), which has no multi-token prediction", mtpKey, *mg.MTPNumLayers))
		}
		return s, nil
	}
	s.t.Depths, s.t.Repeated, s.scale = mc.MTP.Blocks, mc.MTP.RepeatedDefault, mc.MTP.ScaleDefault
	if !mc.Hybrid() {
		s.t.Depths = 0
	}
	from := "config.json's num_nextn_predict_layers (the recipe states no " + mtpKey + ")"
	if mg.MTPNumLayers != nil {
		s.t.Depths, from = *mg.MTPNumLayers, ""
	}
	if mg.MTPUseRepeatedLayer != nil {
		s.t.Repeated = *mg.MTPUseRepeatedLayer
	}
	if mg.MTPLossScalingFactor != nil {
		s.scale = *mg.MTPLossScalingFactor
	}
	if mg.MTPDetachHeads != nil {
		s.t.Detach = *mg.MTPDetachHeads
	}
	if s.t.Depths < 0 || s.t.Depths > model.MaxMTPDepths {
		return s, &config.Refusal{Key: mtpKey, Value: fmt.Sprint(s.t.Depths), Why: fmt.Sprintf("the number of multi-token prediction depths: expected 0 to %d", model.MaxMTPDepths)}
	}
	if !(s.scale >= 0) || math.IsInf(s.scale, 0) {
		return s, &config.Refusal{Key: "policy.megatron_cfg.mtp_loss_scaling_factor", Value: fmt.Sprint(s.scale), Why: "the MTP loss's weight: expected a finite number ≥ 0"}
	}
	if s.t.Depths > 0 && from != "" {
		s.notes = append(s.notes, fmt.Sprintf("multi-token prediction: %d depths from %s, as Megatron-Bridge's provider sets them", s.t.Depths, from))
	}
	if s.t.Depths > 0 && s.scale == 0 {
		s.notes = append(s.notes, "policy.megatron_cfg.mtp_loss_scaling_factor=0: the MTP blocks get no gradient (they are loaded and saved, and weight decay applies to them, as in Megatron); their depths are not computed")
	}
	return s, nil
}

// withMTP applies the recipe's multi-token prediction to the model's
// configuration: a refusal naming the capability when the checkpoint
// cannot train it.
func withMTP(c *config.Config, mc model.Config) (model.Config, error) {
	s, err := mtpShapeOf(c, mc)
	if err != nil {
		return mc, err
	}
	out, err := mc.WithMTP(s.t)
	if err != nil {
		return mc, &config.Refusal{Key: mtpKey, Value: fmt.Sprint(s.t.Depths), Why: err.Error()}
	}
	out.Notes = append(out.Notes, s.notes...)
	if n := out.MTPNote(); n != "" {
		out.Notes = append(out.Notes, n)
	}
	return out, nil
}

// mtpState is a run's MTP loss state.
type mtpRun struct {
	depths int
	scale  float64
	run    bool // the depths are computed: MTP on and its weight nonzero
	detach bool
}

func newMTPRun(c *config.Config, mc model.Config) mtpRun {
	s, _ := mtpShapeOf(c, mc) // checked by withMTP
	r := mtpRun{depths: mc.MTP.Depths, scale: s.scale, detach: mc.MTP.Detach}
	r.run = r.depths > 0 && r.scale > 0
	return r
}

// mtpTargets counts depth k's targets (k = 1..D) in the batch's trainable
// rows: the eligible tokens at positions t ≥ k+1 of their rows.
func mtpTargets(b *grpo.Batch, D int) []int {
	if D == 0 {
		return nil
	}
	n := make([]int, D)
	for _, r := range b.Rows {
		if !r.Valid || r.SampleMask <= 0 {
			continue
		}
		for t, m := range r.TokenMask {
			if m == 0 {
				continue
			}
			for k := 1; k <= D && t >= k+1; k++ {
				n[k-1]++
			}
		}
	}
	return n
}

// mtpWeights are each depth's coefficient of a target's cross-entropy in
// the step's loss: scale/D/max(N_k, 1) with N_k over every rank.
func (r mtpRun) weights(st *step) []float64 {
	w := make([]float64, r.depths)
	for k := range w {
		n := 0
		for _, s := range st.shards {
			if k < len(s.MTPTargets) {
				n += s.MTPTargets[k]
			}
		}
		w[k] = r.scale / float64(r.depths) / float64(max(n, 1))
	}
	return w
}

// mtpTargetsOf sums every rank's targets per depth.
func mtpTargetsOf(st *step, D int) []int {
	n := make([]int, D)
	for _, s := range st.shards {
		for k := range min(D, len(s.MTPTargets)) {
			n[k] += s.MTPTargets[k]
		}
	}
	return n
}

// noTrees reports whether a model's traces are packed alone under
// policy.shared_prefix=auto: a sparse model's load-balancing loss counts
// every trace's tokens; multi-token prediction reads each trace's next
// tokens, which differ across a branch point. Nemotron-H's sparse blocks
// have no load-balancing loss (transformers' NemotronH computes none, and
// the recipes' moe_router_load_balancing_type is none), so a Nemotron-H
// model without MTP runs tries: its Mamba blocks hand each child its
// state and conv window (kernels.Mamba).
func noTrees(mc model.Config) bool { return mc.Sparse() && !mc.Hybrid() || mc.MTP.Depths > 0 }

// mtpBuffers are the trainer's per-step MTP buffers.
type mtpBuffers struct {
	w      []float64   // the step's weight per depth
	rowCE  [][]float64 // (rows, D) each row's cross-entropy per depth
	out    [][]float32 // the last ForwardMTP's log-probabilities
	dmtp   [][]float32 // (D, T) a micro-batch's gradients
	counts []int       // the step's targets per depth
}

// mtpStep readies the step's MTP loss: each depth's weight from every
// rank's target counts, the rows' sums cleared.
func (t *Trainer) mtpStep(st *step, b *grpo.Batch, out *post) {
	if !t.mtp.run {
		return
	}
	D := t.mtp.depths
	t.mtpBuf.w = t.mtp.weights(st)
	t.mtpBuf.counts = mtpTargetsOf(st, D)
	if cap(t.mtpBuf.rowCE) < len(b.Rows) {
		t.mtpBuf.rowCE = make([][]float64, len(b.Rows))
	}
	t.mtpBuf.rowCE = t.mtpBuf.rowCE[:len(b.Rows)]
	for r := range t.mtpBuf.rowCE {
		if len(t.mtpBuf.rowCE[r]) != D {
			t.mtpBuf.rowCE[r] = make([]float64, D)
		}
		clear(t.mtpBuf.rowCE[r])
	}
	out.MTPCE = make([]float64, D)
}

// forwardTrain is the training forward of a micro-batch: with MTP, the
// depths' log-probabilities too.
func (t *Trainer) forwardTrain(mb microBatch) error {
	if !t.mtp.run {
		return t.forward(t.model, mb, t.rowLP, t.rowEnt)
	}
	l, e, mtp, err := t.model.ForwardMTP(mb.tokens, mb.cu, t.temp, mb.need)
	if err != nil {
		return err
	}
	scatter(t.rowLP, mb, l)
	scatter(t.rowEnt, mb, e)
	t.mtpBuf.out = mtp
	return nil
}

// mtpMicroBatch sums each row's MTP cross-entropies of the micro-batch (a
// depth-k target: an eligible token at position ≥ k+1 of its row) and
// gives the model their gradients: −w_k per target.
func (t *Trainer) mtpMicroBatch(mb microBatch, b *grpo.Batch) error {
	if !t.mtp.run {
		return nil
	}
	D, T := t.mtp.depths, len(mb.tokens)
	buf := &t.mtpBuf
	if len(buf.dmtp) != D {
		buf.dmtp = make([][]float32, D)
	}
	for d := range buf.dmtp {
		if cap(buf.dmtp[d]) < T {
			buf.dmtp[d] = make([]float32, T)
		}
		buf.dmtp[d] = buf.dmtp[d][:T]
		clear(buf.dmtp[d])
	}
	for j, r := range mb.rows {
		off := int(mb.cu[j])
		ce := buf.rowCE[r]
		for i := range b.Rows[r].TokenIDs {
			if !mb.need[off+i] {
				continue
			}
			for d := 0; d < D && i >= d+2; d++ {
				ce[d] -= float64(buf.out[d][off+i])
				buf.dmtp[d][off+i] = float32(-buf.w[d])
			}
		}
	}
	return t.model.SetMTPGradients(buf.dmtp)
}

// mtpSums adds the rows' MTP cross-entropies to the rank's post, in row
// order (so they do not depend on the packing).
func (t *Trainer) mtpSums(out *post) {
	if !t.mtp.run {
		return
	}
	for _, ce := range t.mtpBuf.rowCE {
		for d, x := range ce {
			out.MTPCE[d] += x
		}
	}
}

// mtpMetrics sets the step's MTP metrics: each depth's mean
// cross-entropy over its targets, and (detached) the MTP blocks' own
// gradient norm.
func (t *Trainer) mtpMetrics(m *Metrics, st *step, setNorms []float64) {
	if !t.mtp.run {
		return
	}
	D := t.mtp.depths
	ce := make([]float64, D)
	for _, p := range st.posts {
		for d := range min(D, len(p.MTPCE)) {
			ce[d] += p.MTPCE[d]
		}
	}
	n := mtpTargetsOf(st, D)
	m.MTPLoss = make([]Num, D)
	for d := range ce {
		m.MTPLoss[d] = Num(ce[d] / float64(max(n[d], 1)))
	}
	if t.mtp.detach && len(setNorms) > 1 {
		v := Num(setNorms[1])
		m.MTPGradNorm = &v
	}
}

// mtpClipSets are the optimizer's clip sets (optim.Config.ClipSet) with
// detached MTP heads: the MTP blocks' parameters (mtp.*) in set 1, the
// rest in set 0; nil otherwise. ids is each group's parameter (unsharded;
// or nil, and one set per parameter ID, n of them).
func mtpClipSets(tab *model.ParamTable, detach bool, n int, ids []int) []int {
	if !detach {
		return nil
	}
	set := func(i int) int {
		if strings.HasPrefix(tab.Params[i].Name, "mtp.") {
			return 1
		}
		return 0
	}
	if ids == nil {
		out := make([]int, n)
		for i := range out {
			out[i] = set(i)
		}
		return out
	}
	out := make([]int, len(ids))
	for g, i := range ids {
		out[g] = set(i)
	}
	return out
}

// WithRecipeModel returns a model configuration read from a config.json
// as the recipe trains it (its multi-token prediction): what ModelConfig
// does after reading the file.
func WithRecipeModel(c *config.Config, mc model.Config) (model.Config, error) { return withMTP(c, mc) }

// mtpPlanNote says what a plan's multi-token prediction takes: its
// parameters and its share of the activations (the plan without it).
func mtpPlanNote(mc model.Config, opt model.Options, f model.Footprint) (string, error) {
	if mc.MTP.Depths == 0 {
		return "", nil
	}
	base, err := mc.WithMTP(model.MTPTraining{})
	if err != nil {
		return "", err
	}
	f0, err := model.PlanModel(base, opt)
	if err != nil {
		return "", err
	}
	n := model.NewParamTable(mc).Total - model.NewParamTable(base).Total
	return fmt.Sprintf("multi-token prediction: %d depths of %q, %s parameters (in every part above with the rest); activations %s of the %s",
		mc.MTP.Depths, model.Pattern(mc.MTP.Pattern), commas(int64(n)), Bytes(f.Activations-f0.Activations), Bytes(f.Activations)), nil
}

// withCheckpointMTP is cfg holding the MTP blocks a checkpoint stores
// (a run that trained them saved mtp.layers.*): its config.json's
// num_nextn_predict_layers of them, so that an export keeps them.
func withCheckpointMTP(cfg model.Config, tens interface {
	Shape(name string) ([]int, bool)
}) (model.Config, error) {
	if cfg.MTP.Blocks == 0 || len(cfg.MTP.Pattern) == 0 {
		return cfg, nil
	}
	if _, ok := tens.Shape("mtp.layers.0.eh_proj.weight"); !ok {
		return cfg, nil // trained without MTP: the blocks were not saved
	}
	return cfg.WithMTP(model.MTPTraining{Depths: cfg.MTP.Blocks})
}
