package cpu

// Embedding lookup and its scatter-add backward.
//
//	forward:  out (T,C) = wte (V,C) [tokens (T)]          =
//	backward: dwte (V,C) += Σ_t onehot(tokens[t]) ⊗ dout[t]  +=
//
// A token outside [0, V) is a data error: the forward writes a zero row and
// records a sticky error; the backward skips the row. The forward splits rows;
// the backward splits columns, so each dwte element sums its rows in token
// order for every thread count: both are thread-count invariant.

import (
	"github.com/tracegrpo/tracegrpo/kernels"
)

func embeddingRows[F Float](out, wte []F, tokens []int32, lo, hi, C int) (bad int) {
	V := len(wte) / C
	bad = -1
	for t := lo; t < hi; t++ {
		o := out[t*C : (t+1)*C]
		id := int(tokens[t])
		if id < 0 || id >= V {
			clear(o)
			if bad < 0 {
				bad = t
			}
			continue
		}
		copy(o, wte[id*C:(id+1)*C])
	}
	return bad
}

func embeddingBackwardCols[F Float](dwte, dout []F, tokens []int32, T, C, c0, c1 int) {
	V := len(dwte) / C
	for t := 0; t < T; t++ {
		id := int(tokens[t])
		if id < 0 || id >= V {
			continue
		}
		d := dwte[id*C+c0 : id*C+c1]
		s := dout[t*C+c0 : t*C+c1]
		for i := range d {
			d[i] += s[i]
		}
	}
}

type embeddingTask struct {
	out, wte []float32 // (T,C), (V,C)
	tokens   []int32   // (T)
	C, T     int
	bwd      bool
	bad      []int // per worker: first bad row, -1 if none
}

const embedColGrain = 64

func (t *embeddingTask) run(w, lo, hi int) {
	if t.bwd {
		embeddingBackwardCols(t.wte, t.out, t.tokens, t.T, t.C, lo, hi)
		return
	}
	if bad := embeddingRows(t.out, t.wte, t.tokens, lo, hi, t.C); bad >= 0 && (t.bad[w] < 0 || bad < t.bad[w]) {
		t.bad[w] = bad
	}
}

// Embedding implements kernels.Ops.
// Shapes: out (T,C), wte (V,C), tokens (T) I32.
func (b *Backend) Embedding(out, wte, tokens kernels.Buf, T, C int) {
	if C <= 0 || wte.N%C != 0 {
		panic("cpu: Embedding: wte length is not a multiple of C")
	}
	t := &b.tasks.embedding
	*t = embeddingTask{
		out: b.f32n(out, T*C, "Embedding out"), wte: b.F32(wte),
		tokens: b.i32n(tokens, T, "Embedding tokens"), C: C, T: T, bad: b.badRows(),
	}
	b.pool.parallel(t, T, max(1, 4096/C))
	b.reportBad("Embedding", t.bad, t.tokens, wte.N/C)
	*t = embeddingTask{}
}

// EmbeddingBackward implements kernels.Ops.
// Shapes: dwte (V,C), dout (T,C), tokens (T) I32.
func (b *Backend) EmbeddingBackward(dwte, dout, tokens kernels.Buf, T, C int) {
	if C <= 0 || dwte.N%C != 0 {
		panic("cpu: EmbeddingBackward: dwte length is not a multiple of C")
	}
	t := &b.tasks.embedding
	*t = embeddingTask{
		out: b.f32n(dout, T*C, "EmbeddingBackward dout"), wte: b.F32(dwte),
		tokens: b.i32n(tokens, T, "EmbeddingBackward tokens"), C: C, T: T, bwd: true,
	}
	b.pool.parallel(t, C, embedColGrain)
	*t = embeddingTask{}
}

// badRows returns a per-worker slice of first-bad-row markers, all -1.
func (b *Backend) badRows() []int {
	if len(b.tasks.bad) != b.threads {
		b.tasks.bad = make([]int, b.threads)
	}
	for i := range b.tasks.bad {
		b.tasks.bad[i] = -1
	}
	return b.tasks.bad
}

// reportBad records a sticky error naming the first out-of-range index.
func (b *Backend) reportBad(op string, bad []int, idx []int32, limit int) {
	first := -1
	for _, r := range bad {
		if r >= 0 && (first < 0 || r < first) {
			first = r
		}
	}
	if first >= 0 {
		b.fail("%s: index %d at row %d is outside [0, %d)", op, idx[first], first, limit)
	}
}
