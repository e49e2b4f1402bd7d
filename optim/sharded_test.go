package optim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// shardedAtol and shardedRtol bound a sharded step's difference from the
// whole arena's: the sharded gradient norm sums each group's squares in
// parts (per rank, then over ranks), reassociating a float32 sum (~1e-7
// relative); with clipping on, the clip scale moves by as much, and
// AdamW's update, ≲ lr per element, by ~1e-7·lr = 1e-9 at lr 1e-2; the
// weight then rounds to float32, which can flip its last bit (2^-23
// relative). Two ulps plus 1e-9, while a rank stepping with its local
// norm moves an element by ~lr.
const (
	shardedAtol = 1e-9
	shardedRtol = 1.0 / (1 << 22)
)

// TestShardedMatchesWhole: W ranks, each stepping a random shard of a
// random arena (the groups' parts, padding between them), end every step
// with exactly their part of the whole arena's update (within shardedTol):
// the norm, the clip and the non-finite skip are global; a NaN on one rank
// makes every rank skip, and abort names the group's ID.
func TestShardedMatchesWhole(t *testing.T) {
	for _, world := range []int{2, 3} {
		for _, bad := range []bool{false, true} {
			t.Run(fmt.Sprintf("W=%d/nan=%v", world, bad), func(t *testing.T) {
				checkShardedStep(t, world, bad)
			})
		}
	}
}

func checkShardedStep(t *testing.T, world int, nan bool) {
	r := rand.New(rand.NewPCG(uint64(world), 3))
	// The whole arena: groups of random sizes.
	var groups []Group
	n := 0
	for range 7 {
		sz := 1 + r.IntN(40)
		groups = append(groups, Group{Off: n, N: sz, Decay: r.IntN(2) == 0})
		n += sz
	}
	param, grads := make([]float32, n), make([][]float32, 3)
	for i := range param {
		param[i] = float32(r.NormFloat64())
	}
	for s := range grads {
		grads[s] = make([]float32, n)
		for i := range grads[s] {
			grads[s][i] = float32(r.NormFloat64())
		}
	}
	badAt := r.IntN(n)
	if nan {
		grads[1][badAt] = float32(math.NaN())
	}
	cfg := Config{Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, MaxGradNorm: 1}
	step := func(o *AdamW) (Result, error) { return o.Step(1e-2, 0.1) }
	// One whole arena.
	cb := cpu.New(1)
	defer cb.Close()
	pb, _ := cb.Alloc(kernels.F32, n)
	gb, _ := cb.Alloc(kernels.F32, n)
	cb.UploadF32(pb, param)
	whole, err := New(cb, pb, gb, groups, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var want [][]float32
	var wantRes []Result
	for _, g := range grads {
		cb.UploadF32(gb, g)
		res, err := step(whole)
		if err != nil {
			t.Fatal(err)
		}
		h := make([]float32, n)
		cb.DownloadF32(h, pb)
		want, wantRes = append(want, h), append(wantRes, res)
	}
	// Each rank owns a contiguous block of every group (some none), laid
	// out with a gap of padding after each part.
	mems := make([]kernels.Backend, world)
	for i := range mems {
		b := cpu.New(1)
		defer b.Close()
		mems[i] = b
	}
	comms := collective.Local(mems)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for rk := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[rk] = func() error {
				b := mems[rk]
				var mine []Group
				var ids, src []int // group IDs, and the whole arena's offset of each part
				at := 0
				for id, g := range groups {
					lo, hi := collective.Block(g.N, rk, world)
					if hi > lo {
						mine = append(mine, Group{Off: at, N: hi - lo, Decay: g.Decay})
						ids, src = append(ids, id), append(src, g.Off+lo)
					}
					at += hi - lo + 2 // padding
				}
				p, _ := b.Alloc(kernels.F32, at)
				gr, _ := b.Alloc(kernels.F32, at)
				b.Fill(p, 0)
				load := func(dst kernels.Buf, whole []float32) {
					b.Fill(dst, 7) // padding holds garbage: it must be neither stepped nor counted
					for i, g := range mine {
						b.UploadF32(dst.Slice(g.Off, g.N), whole[src[i]:src[i]+g.N])
					}
				}
				load(p, param)
				o, err := NewSharded(b, p, gr, mine, cfg, Sharded{Comm: comms[rk], IDs: len(groups), GroupID: ids})
				if err != nil {
					return err
				}
				defer o.Close()
				for s, g := range grads {
					load(gr, g)
					res, err := step(o)
					if err != nil {
						return err
					}
					if res.Skipped != wantRes[s].Skipped || math.Abs(res.GradNorm-wantRes[s].GradNorm) > 1e-6*wantRes[s].GradNorm {
						return fmt.Errorf("step %d: norm %v skipped %v, the whole arena's %v %v", s, res.GradNorm, res.Skipped, wantRes[s].GradNorm, wantRes[s].Skipped)
					}
					h := make([]float32, at)
					b.DownloadF32(h, p)
					for i, g := range mine {
						for k := range g.N {
							w := float64(want[s][src[i]+k])
							if d := math.Abs(float64(h[g.Off+k]) - w); d > shardedAtol+shardedRtol*math.Abs(w) || d != d {
								return fmt.Errorf("step %d: element %d of the arena is %g, the whole arena's %g", s, src[i]+k, h[g.Off+k], want[s][src[i]+k])
							}
						}
					}
				}
				if nan {
					cfgAbort := cfg
					cfgAbort.NonFinite = AbortNonFinite
					o2, err := NewSharded(b, p, gr, mine, cfgAbort, Sharded{Comm: comms[rk], IDs: len(groups), GroupID: ids})
					if err != nil {
						return err
					}
					defer o2.Close()
					load(gr, grads[1])
					if _, err := step(o2); !errors.Is(err, ErrNonFiniteGrad) {
						return fmt.Errorf("abort on a NaN on one rank: %v", err)
					}
				}
				return nil
			}()
			if errs[rk] != nil {
				comms[rk].Abort(1)
			}
		}()
	}
	wg.Wait()
	for rk, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", rk, err)
		}
	}
}
