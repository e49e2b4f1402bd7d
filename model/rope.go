package model

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// RopeInvFreq returns the rotary inverse frequencies inv_freq (HD/2) of cfg
// with Hugging Face's float32 arithmetic, so that the angles match
// transformers' bit for bit:
//
//	default:  inv_freq[i] = 1/theta^(float32(2i)/HD), the power rounded to
//	          float32 and the reciprocal taken in float32
//	          (_compute_default_rope_parameters);
//	llama3:   each of those scaled by its wavelength λ = 2π/inv_freq
//	          (_compute_llama3_parameters): kept where λ < L/high_freq_factor,
//	          divided by factor where λ > L/low_freq_factor, and in between
//	          interpolated, (1−s)·inv/factor + s·inv with
//	          s = (L/λ − low_freq_factor)/(high_freq_factor − low_freq_factor),
//	          L = original_max_position_embeddings.
//
// Every step is one float32 operation in torch's order (torch computes
// "x / tensor" as reciprocal(tensor)·x); the explicit conversions keep the
// compiler from fusing a multiply and an add.
func RopeInvFreq(cfg Config) []float32 {
	HD := cfg.HeadDim
	inv := make([]float32, HD/2)
	for i := range inv {
		e := float32(2*i) / float32(HD)
		inv[i] = float32(1) / float32(math.Pow(float64(cfg.RopeTheta), float64(e)))
	}
	if cfg.RopeScaling.Type == RopeLlama3 {
		llama3Scale(inv, cfg.RopeScaling)
	}
	return inv
}

// llama3Scale rescales default inverse frequencies in place as
// _compute_llama3_parameters does (see RopeInvFreq).
func llama3Scale(inv []float32, s RopeScaling) {
	factor, lo := float32(s.Factor), float32(s.LowFreqFactor)
	old := float32(s.OriginalMaxPositionEmbeddings)
	lowWavelen := float32(float64(s.OriginalMaxPositionEmbeddings) / s.LowFreqFactor)
	highWavelen := float32(float64(s.OriginalMaxPositionEmbeddings) / s.HighFreqFactor)
	twoPi := float32(2 * math.Pi)
	for i, f := range inv {
		wavelen := float32(float32(1/f) * twoPi)
		scaled := f
		if wavelen > lowWavelen {
			scaled = f / factor
		}
		if !(wavelen < highWavelen) && !(wavelen > lowWavelen) {
			smooth := float32(float32(float32(1/wavelen)*old) - lo)
			smooth = smooth / float32(s.HighFreqFactor-s.LowFreqFactor)
			a := float32(float32(float32(1-smooth)*scaled) / factor)
			b := float32(smooth * scaled)
			scaled = a + b
		}
		inv[i] = scaled
	}
}

// RopeTables returns the cos and sin tables (P, HD/2) of positions [0, P)
// that kernels.Ops.Rope reads: angle[p][i] = float32(p)·inv_freq[i] rounded
// to float32 (transformers forms the angles as a float32 product), then its
// cosine and sine rounded once to float32.
func RopeTables(cfg Config, P int) (cos, sin []float32) {
	inv := RopeInvFreq(cfg)
	half := len(inv)
	cos, sin = make([]float32, P*half), make([]float32, P*half)
	for p := 0; p < P; p++ {
		ropeRow(cos[p*half:(p+1)*half], sin[p*half:(p+1)*half], inv, p)
	}
	return cos, sin
}

// ropeRow fills one position's row of the tables.
func ropeRow(cos, sin, inv []float32, p int) {
	for i, f := range inv {
		a := float64(float32(float32(p) * f))
		cos[i] = float32(math.Cos(a))
		sin[i] = float32(math.Sin(a))
	}
}

// ensureRope makes the model's cos/sin tables cover positions [0, P),
// computing and uploading them when they do not yet. Called at setup (New,
// NewSampler), never inside a step.
func (m *Model) ensureRope(P int) error {
	if m.owner != nil {
		return m.owner.ensureRope(P)
	}
	if P <= m.ropeP {
		return nil
	}
	if ropeElems(m.cfg, P) == 0 { // no RoPE (a hybrid model): P only bounds the positions
		m.ropeP = P
		return nil
	}
	half := m.cfg.HeadDim / 2
	buf, err := m.b.Alloc(kernels.F32, ropeElems(m.cfg, P))
	if err != nil {
		return fmt.Errorf("model: RoPE tables for %d positions: %w", P, err)
	}
	cos, sin := RopeTables(m.cfg, P)
	m.b.UploadF32(buf.Slice(0, P*half), cos)
	m.b.UploadF32(buf.Slice(P*half, P*half), sin)
	if m.rope.N > 0 {
		if err := m.b.Sync(); err != nil { // queued ops may still read the old tables
			m.b.Free(buf)
			return fmt.Errorf("model: RoPE tables: %w", err)
		}
		m.b.Free(m.rope)
	}
	m.rope, m.ropeP = buf, P
	m.ropeCos, m.ropeSin = buf.Slice(0, P*half), buf.Slice(P*half, P*half)
	return nil
}

// ropeElems is the size of the cos and sin tables for P positions.
// A hybrid model has none (Nemotron-H's attention has no positional
// embedding).
func ropeElems(c Config, P int) int {
	if c.Hybrid() {
		return 0
	}
	return 2 * P * (c.HeadDim / 2)
}

// ropeTables returns the RoPE tables a forward uses: the model's own, or
// those of the policy a reference borrows them from.
func (m *Model) ropeTables() (cos, sin kernels.Buf, P int) {
	if m.owner != nil {
		return m.owner.ropeTables()
	}
	return m.ropeCos, m.ropeSin, m.ropeP
}
