package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestAttentionPacksFollowTheirCall: the keys and values a worker packed
// for one Attention call are never reused by the next, even with the same
// shapes and sequences and another k and v (with one sequence and one
// key/value head every work item shares one pack), nor after a backward,
// which packs other layouts in the same scratch. Each call equals, bit for
// bit, the same call on a fresh backend.
func TestAttentionPacksFollowTheirCall(t *testing.T) {
	for _, c := range []struct {
		lens        []int
		NH, NKV, HD int
	}{{[]int{70, 30, 100}, 4, 2, 16}, {[]int{100}, 2, 1, 16}} {
		t.Run(fmt.Sprintf("lens%v_NKV%d", c.lens, c.NKV), func(t *testing.T) {
			NH, NKV, HD := c.NH, c.NKV, c.HD
			T := sum(c.lens)
			r := rand.New(rand.NewPCG(60, 60))
			q, dout := randVec(r, T*NH*HD, 1), randVec(r, T*NH*HD, 1)
			var kvs [][2][]float64
			for range 3 {
				kvs = append(kvs, [2][]float64{randVec(r, T*NKV*HD, 1), randVec(r, T*NKV*HD, 1)})
			}
			fwd := func(e *env, kv [2][]float64, bwd bool) []float32 {
				seqs := e.seqs(c.lens)
				qb, kb, vb := e.f32(q), e.f32(kv[0]), e.f32(kv[1])
				out, lse := e.zeros(T*NH*HD), e.zeros(T*NH)
				e.b.Attention(out, lse, qb, kb, vb, seqs, NH, NKV, HD)
				if bwd {
					e.b.AttentionBackward(e.zeros(T*NH*HD), e.zeros(T*NKV*HD), e.zeros(T*NKV*HD), e.f32(dout), out, lse, qb, kb, vb, seqs, NH, NKV, HD)
				}
				e.sync()
				return copyOf(e, out)
			}
			shared := newEnv(t, 2)
			for i, kv := range kvs {
				got := fwd(shared, kv, i == 1) // the second call runs a backward after it
				want := fwd(newEnv(t, 2), kv, false)
				sameBits(t, fmt.Sprintf("call %d: out", i+1), got, want)
			}
		})
	}
}
