package cpu

// Rope: rotary position embedding, Hugging Face "rotate half" convention.
//
//	for each row (t,h) of x (T,H,HD) and i < HD/2, with a = x[i], b = x[i+HD/2],
//	θ = pos[t] · inv_freq[i], inv_freq[i] = 1 / theta^(2i/HD):
//	forward:  x[i] = a·cos θ − b·sin θ,  x[i+HD/2] = b·cos θ + a·sin θ     (in place, =)
//	backward: dx[i] = a·cos θ + b·sin θ, dx[i+HD/2] = b·cos θ − a·sin θ    (in place, =)
//
// pos (T) is I32. The float32 table follows Hugging Face's float32 arithmetic
// (inv_freq = 1/theta^(float32(2i)/HD) in float32, θ = float32(pos)·inv_freq
// rounded to float32, then cos/sin of that) so positions match PyTorch to the
// rounding of cos/sin. Rows are independent: thread-count invariant.

import (
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// ropeRows rotates rows [lo, hi) of x (T,H,HD) using tables cosT, sinT
// (P, HD/2) indexed by position.
func ropeRows[F Float](x []F, pos []int32, lo, hi, H, HD int, cosT, sinT []F, inverse bool) {
	half := HD / 2
	for t := lo; t < hi; t++ {
		p := int(pos[t])
		c := cosT[p*half : (p+1)*half]
		s := sinT[p*half : (p+1)*half]
		for h := 0; h < H; h++ {
			row := x[(t*H+h)*HD : (t*H+h+1)*HD]
			x1 := row[:half]
			x2 := row[half:HD]
			if inverse {
				for i := range x1 {
					a, b := x1[i], x2[i]
					x1[i] = a*c[i] + b*s[i]
					x2[i] = b*c[i] - a*s[i]
				}
			} else {
				for i := range x1 {
					a, b := x1[i], x2[i]
					x1[i] = a*c[i] - b*s[i]
					x2[i] = b*c[i] + a*s[i]
				}
			}
		}
	}
}

// ropeTable fills cos/sin tables (P, HD/2) for positions [0, P).
func ropeTable[F Float](cosT, sinT []F, P, HD int, theta float32) {
	half := HD / 2
	for i := 0; i < half; i++ {
		var inv float64
		if isF32[F]() {
			e := float32(2*i) / float32(HD)
			inv = float64(float32(1) / float32(math.Pow(float64(theta), float64(e))))
		} else {
			inv = 1 / math.Pow(float64(theta), float64(2*i)/float64(HD))
		}
		for p := 0; p < P; p++ {
			a := float64(p) * inv
			if isF32[F]() {
				a = float64(float32(float32(p) * float32(inv)))
			}
			cosT[p*half+i] = F(math.Cos(a))
			sinT[p*half+i] = F(math.Sin(a))
		}
	}
}

type ropeCache struct {
	theta      float32
	hd, p      int
	cosT, sinT []float32
}

type ropeTask struct {
	x          []float32 // (T,H,HD)
	pos        []int32   // (T)
	H, HD      int
	cosT, sinT []float32 // (P, HD/2)
	inverse    bool
}

func (t *ropeTask) run(_, lo, hi int) {
	ropeRows(t.x, t.pos, lo, hi, t.H, t.HD, t.cosT, t.sinT, t.inverse)
}

func (b *Backend) rope(x, pos kernels.Buf, T, H, HD int, theta float32, inverse bool) {
	if HD%2 != 0 {
		panic("cpu: Rope: odd head dimension")
	}
	xs := b.f32n(x, T*H*HD, "Rope x")
	ps := b.i32n(pos, T, "Rope pos")
	maxp := 0
	for i, p := range ps {
		if p < 0 {
			b.fail("Rope: position %d at row %d is negative", p, i)
			return
		}
		maxp = max(maxp, int(p))
	}
	rc := &b.tasks.ropeCache
	if rc.theta != theta || rc.hd != HD || rc.p <= maxp {
		P := max(maxp+1, 2*rc.p, 1024)
		if rc.theta != theta || rc.hd != HD {
			P = max(maxp+1, 1024)
		}
		*rc = ropeCache{theta: theta, hd: HD, p: P, cosT: make([]float32, P*HD/2), sinT: make([]float32, P*HD/2)}
		ropeTable(rc.cosT, rc.sinT, P, HD, theta)
	}
	t := &b.tasks.rope
	*t = ropeTask{x: xs, pos: ps, H: H, HD: HD, cosT: rc.cosT, sinT: rc.sinT, inverse: inverse}
	b.pool.parallel(t, T, max(1, 8192/(H*HD)))
	*t = ropeTask{}
}

// Rope implements kernels.Ops.
// Shapes: x (T,H,HD), pos (T) I32.
func (b *Backend) Rope(x, pos kernels.Buf, T, H, HD int, theta float32) {
	b.rope(x, pos, T, H, HD, theta, false)
}

// RopeBackward implements kernels.Ops.
// Shapes: dx (T,H,HD), pos (T) I32.
func (b *Backend) RopeBackward(dx, pos kernels.Buf, T, H, HD int, theta float32) {
	b.rope(dx, pos, T, H, HD, theta, true)
}
