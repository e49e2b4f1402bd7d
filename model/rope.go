package model

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// RopeInvFreq returns the rotary inverse frequencies inv_freq (HD/2) of cfg
// with Hugging Face's float32 arithmetic: inv_freq[i] =
// 1/theta^(float32(2i)/HD), the power rounded to float32 and the reciprocal
// taken in float32, as transformers' _compute_default_rope_parameters does
// in torch float32.
func RopeInvFreq(cfg Config) []float32 {
	HD := cfg.HeadDim
	inv := make([]float32, HD/2)
	for i := range inv {
		e := float32(2*i) / float32(HD)
		inv[i] = float32(1) / float32(math.Pow(float64(cfg.RopeTheta), float64(e)))
	}
	return inv
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
		row := p * half
		for i, f := range inv {
			a := float64(float32(float32(p) * f))
			cos[row+i] = float32(math.Cos(a))
			sin[row+i] = float32(math.Sin(a))
		}
	}
	return cos, sin
}

// ensureRope makes the model's cos/sin tables cover positions [0, P),
// computing and uploading them when they do not yet. Called at setup (New,
// NewSampler), never inside a step.
func (m *Model) ensureRope(P int) error {
	if P <= m.ropeP {
		return nil
	}
	half := m.cfg.HeadDim / 2
	buf, err := m.b.Alloc(kernels.F32, 2*P*half)
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
