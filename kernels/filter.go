package kernels

import (
	"math"
)

// TopKTopP is NeMo RL's top-k/top-p filter of a next-token distribution
// (policy.generation.top_k and top_p), which NeMo RL applies to the
// training log-probabilities as vLLM applies it to sampling:
// nemo_rl/algorithms/logits_sampling_utils.py apply_top_k_top_p at
// NVIDIA-NeMo/RL 7ea279abfbeb (lines 70-209), called on the
// temperature-scaled logits by
// nemo_rl/models/policy/workers/dtensor_policy_worker.py (lines 564-578,
// 1259-1271) and by DistributedLogprobWithSampling in
// nemo_rl/distributed/model_utils.py (lines 383-505, the Megatron path).
//
// On a row of logits z (temperature already applied), in this order:
//
//	top-k  (1 ≤ TopK < V): keep z_i ≥ the TopK-th largest z; every logit
//	       equal to that threshold is kept (torch.topk, then >=), so more
//	       than TopK may survive.
//	top-p  (0 < TopP < 1): over the top-k survivors, sorted ascending
//	       (equal logits in id order: torch.sort on a GPU is a stable
//	       radix sort), with p their softmax, keep position j where
//	       Σ_{i ≤ j} p_i > float32(1 − TopP); the last (largest, highest
//	       id) is always kept. Of a tie group straddling that boundary the
//	       higher ids survive.
//
// TopK ≤ 0 or ≥ V and TopP ≤ 0 or ≥ 1 switch that half off (NeMo RL
// raises for TopK > V; config refuses it, and TopP outside (0, 1]). The
// sums of the top-p rule are taken in exact arithmetic over
// probabilities in 2⁻⁴⁰ fixed point (uint64 weights, summed exactly:
// deterministic in any order, and within V·2⁻⁴⁰ of the real sum, where
// torch's float32 softmax and cumsum are within about √V·2⁻²⁴), so a row
// whose cumulative probability lands within that distance of
// float32(1 − TopP) may keep one token more or less than torch. The
// comparisons are exact integer ones against ⌊float32(1 − TopP)·S⌋.
//
// The kept set is described by a Cut; the selection is a radix select
// over the logits' order-preserving 32-bit keys, 8 bits a pass: counts
// for top-k, fixed-point masses for top-p (FilterCut, the reference of
// the device kernels in kernels/cuda/csrc/filter.cuh).
type TopKTopP struct {
	TopK int
	TopP float64
}

// On reports whether the filter removes anything from a vocabulary of V.
func (f TopKTopP) On(V int) bool { return f.topK(V) || f.topP() }

func (f TopKTopP) topK(V int) bool { return f.TopK > 0 && f.TopK < V }
func (f TopKTopP) topP() bool      { return f.TopP > 0 && f.TopP < 1 }

// Threshold is float32(1 − TopP), the value torch compares the cumulative
// probability with (the Python scalar is cast to the tensor's float32).
func (f TopKTopP) Threshold() float32 { return float32(1 - f.TopP) }

// FixedOne is the fixed-point unit of the top-p masses: a probability
// weight w_i = ⌊exp(z_i − max z)·FixedOne⌋ (at most 2⁴⁰, so 2²⁴ of them
// sum in a uint64).
const FixedOne = 1 << 40

// FixedWeight is a logit's top-p weight, given the row's largest logit.
func FixedWeight(z, zmax float32) uint64 {
	return uint64(math.Exp(float64(z)-float64(zmax)) * FixedOne)
}

// Cut describes a row's kept set: token i survives the filter when
// Key(z_i) > Key, or Key(z_i) == Key and i ≥ ID. {0, 0} keeps every
// token.
type Cut struct {
	Key uint32
	ID  int32
}

// Keeps reports whether token i with logit z survives.
func (c Cut) Keeps(i int, z float32) bool {
	k := Key(z)
	return k > c.Key || (k == c.Key && int32(i) >= c.ID)
}

// Key maps a float32 to a uint32 with the same order (−0 and +0 share
// one key, as they compare equal).
func Key(x float32) uint32 {
	b := math.Float32bits(x)
	if b == 1<<31 {
		b = 0
	}
	if b&(1<<31) != 0 {
		return ^b
	}
	return b | 1<<31
}

// KeyValue is the float32 whose key is k (the inverse of Key).
func KeyValue(k uint32) float32 {
	if k&(1<<31) != 0 {
		return math.Float32frombits(k &^ (1 << 31))
	}
	return math.Float32frombits(^k)
}

// FilterScratch is FilterCut's histogram space, reused across rows.
type FilterScratch struct {
	count [256]int
	mass  [256]uint64
}

// FilterCut returns the kept set of z under f (see TopKTopP).
func FilterCut(z []float32, f TopKTopP, sc *FilterScratch) Cut {
	V := len(z)
	if V == 0 || !f.On(V) {
		return Cut{}
	}
	maxKey := uint32(0)
	for _, x := range z {
		maxKey = max(maxKey, Key(x))
	}
	// Top-k: the TopK-th largest key tk; K1 = {key ≥ tk}.
	tk := uint32(0)
	if f.topK(V) {
		need := f.TopK
		var prefix, mask uint32
		for shift := 24; shift >= 0; shift -= 8 {
			clear(sc.count[:])
			for _, x := range z {
				if k := Key(x); k&mask == prefix {
					sc.count[k>>shift&0xff]++
				}
			}
			d := 255
			for ; d > 0 && sc.count[d] < need; d-- {
				need -= sc.count[d]
			}
			prefix |= uint32(d) << shift
			mask |= 0xff << shift
		}
		tk = prefix
	}
	if !f.topP() {
		return Cut{Key: tk}
	}
	// Top-p over K1: the lowest level b whose cumulative weight from below
	// exceeds thr·S, then the first tie at b that takes it there.
	zmax := KeyValue(maxKey)
	var S uint64
	for _, x := range z {
		if Key(x) >= tk {
			S += FixedWeight(x, zmax)
		}
	}
	// An integer sum exceeds Threshold·S exactly when it exceeds its floor.
	thr := uint64(float64(f.Threshold()) * float64(S))
	var below uint64 // weight of K1 strictly below the prefix
	var prefix, mask uint32
	for shift := 24; shift >= 0; shift -= 8 {
		clear(sc.mass[:])
		for _, x := range z {
			if k := Key(x); k >= tk && k&mask == prefix {
				sc.mass[k>>shift&0xff] += FixedWeight(x, zmax)
			}
		}
		d := 0
		for ; d < 256 && !(below+sc.mass[d] > thr); d++ {
			below += sc.mass[d]
		}
		if d == 256 { // the whole of K1 is at most thr·S (rounding, or TopP ≤ 0): keep the last
			return Cut{Key: maxKey, ID: lastID(z, maxKey)}
		}
		prefix |= uint32(d) << shift
		mask |= 0xff << shift
	}
	return Cut{Key: prefix, ID: tieCut(z, prefix, below, FixedWeight(KeyValue(prefix), zmax), thr)}
}

// lastID is the highest id whose key is k.
func lastID(z []float32, k uint32) int32 {
	for i := len(z) - 1; i >= 0; i-- {
		if Key(z[i]) == k {
			return int32(i)
		}
	}
	return 0
}

// tieCut is the first token with key k, in id order, at which below plus
// w per token with key k so far exceeds thr (the last one if none does).
func tieCut(z []float32, k uint32, below, w, thr uint64) int32 {
	last := int32(0)
	for i, x := range z {
		if Key(x) == k {
			if below += w; below > thr {
				return int32(i)
			}
			last = int32(i)
		}
	}
	return last
}

// HeadOut are the outputs of FilteredHead's forward, each (T) F32 but Cut
// (2T) I32. Logprob, Entropy and LSE are the filtered distribution's;
// LogprobFull and LSEFull the unfiltered one's (NeMo RL's KL term reads
// the unfiltered current log-probabilities).
type HeadOut struct {
	Logprob     Buf // (T) log p_K(target), −Inf when the target is filtered out
	Entropy     Buf // (T) −Σ_K p log p
	LSE         Buf // (T) log Σ_K e^z
	LogprobFull Buf // (T) log p(target), unfiltered
	LSEFull     Buf // (T) log Σ_v e^z
	Cut         Buf // (2T) I32: row t's Cut as {Key, ID}
}

// FilteredHead is the LM head under NeMo RL's top-k/top-p filter
// (TopKTopP). It is not a fast path: a model with a filter refuses a
// backend without it. kernels/cpu and kernels/cuda implement it.
type FilteredHead interface {
	// TokenLogprobFiltered: for each row t of hidden (T,C) with
	// targets[t] ≥ 0, z = hidden[t]·weight (V,C)ᵀ·invTemp, and K_t the
	// tokens f keeps of z (FilterCut):
	//
	//	o.Logprob[t] = z[tg] − o.LSE[t] if tg ∈ K_t, else −Inf      =
	//	o.LSE[t]     = log Σ_{v∈K_t} e^{z_v}                        =
	//	o.Entropy[t] = −Σ_{v∈K_t} p_v log p_v,  p = e^{z−LSE}       =
	//	o.LogprobFull[t], o.LSEFull[t]: TokenLogprob's logprob, lse  =
	//	o.Cut[2t], o.Cut[2t+1] = K_t's Cut                          =
	//
	// Rows with targets[t] < 0 get 0 everywhere (and Cut {0, 0}); a
	// target ≥ V is a data error (sticky, the row treated as masked). The
	// logits are formed a block of whole rows at a time (never all T×V),
	// and TokenLogprobFilteredBackward forms the same blocks, so the
	// backward sees the forward's logits bit for bit. hidden and weight
	// are F32|BF16, same.
	TokenLogprobFiltered(o HeadOut, hidden, weight, targets Buf, T, C, V int, invTemp float32, f TopKTopP)
	// TokenLogprobFilteredBackward: dhidden (T,C) += and dweight (V,C) +=
	// the gradient of Σ_t dlogprob[t]·Logprob[t] + dlogprobFull[t]·
	// LogprobFull[t], from the forward's o (LSE, LSEFull, Cut):
	//
	//	dz_v = dlogprob·k_v·(1[v = tg] − e^{z_v−LSE})
	//	     + dlogprobFull·(1[v = tg] − e^{z_v−LSEFull}),   k_v = 1[v ∈ K_t]
	//
	// (NeMo RL's _ApplyTopKTopP.backward masks the gradient of filtered
	// logits). dlogprobFull may be empty (no KL term), as may dhidden or
	// dweight (that half skipped). hidden and weight are F32|BF16, same;
	// dhidden and dweight are F32.
	TokenLogprobFilteredBackward(dhidden, dweight, dlogprob, dlogprobFull, hidden, weight, targets Buf, o HeadOut, T, C, V int, invTemp float32)
}
