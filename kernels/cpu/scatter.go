package cpu

// ScatterRows: dst[idx[i], :] = src[i, :] for src (N,W), idx (N) I32, dst (R,W) =.
// dst and src are F32|BF16, converted as Convert does (the bf16 path runs
// on one thread, rows in index order).
//
// Rows are written in index order i = 0..N−1, so with repeated indices the
// last row wins. The work is split over columns, which keeps that order for
// every thread count: thread-count invariant. An index outside [0, R) is a data
// error: the row is skipped and a sticky error recorded.

import "github.com/tracegrpo/tracegrpo/kernels"

type scatterTask struct {
	dst, src []float32 // (R,W), (N,W)
	idx      []int32   // (N)
	N, W     int
}

func (t *scatterTask) run(_, c0, c1 int) {
	scatterRowsCols(t.dst, t.src, t.idx, t.N, t.W, c0, c1)
}

func scatterRowsCols[F Float](dst, src []F, idx []int32, N, W, c0, c1 int) {
	R := len(dst) / W
	for i := 0; i < N; i++ {
		r := int(idx[i])
		if r < 0 || r >= R {
			continue
		}
		copy(dst[r*W+c0:r*W+c1], src[i*W+c0:i*W+c1])
	}
}

// ScatterRows implements kernels.Ops.
// Shapes: dst (R,W), src (N,W), idx (N) I32.
func (b *Backend) ScatterRows(dst, src, idx kernels.Buf, N, W int) {
	if W <= 0 || dst.N%W != 0 {
		panic("cpu: ScatterRows: dst length is not a multiple of W")
	}
	R := dst.N / W
	ix := b.i32n(idx, N, "ScatterRows idx")
	for i, r := range ix {
		if r < 0 || int(r) >= R {
			b.fail("ScatterRows: index %d at row %d is outside [0, %d)", r, i, R)
			break
		}
	}
	if dst.DType == kernels.BF16 || src.DType == kernels.BF16 {
		s := b.in(src, N*W, "ScatterRows src")
		for i, r := range ix {
			if r < 0 || int(r) >= R {
				continue
			}
			row := s[i*W : (i+1)*W]
			if dst.DType == kernels.BF16 {
				d := b.BF16(dst)[int(r)*W : (int(r)+1)*W]
				for c, x := range row {
					d[c] = F32ToBF16(x)
				}
			} else {
				copy(b.F32(dst)[int(r)*W:(int(r)+1)*W], row)
			}
		}
		return
	}
	t := &b.tasks.scatter
	*t = scatterTask{dst: b.F32(dst), src: b.f32n(src, N*W, "ScatterRows src"), idx: ix, N: N, W: W}
	b.pool.parallel(t, W, embedColGrain)
	*t = scatterTask{}
}
