package cpu

import "unsafe"

// Float is the element type the generic kernels are written over: the Backend
// runs the float32 instantiation, and the tests finite-difference-check the
// float64 one and compare the two.
type Float interface {
	~float32 | ~float64
}

// elemGrain is the number of elements one grain of an elementwise op covers.
const elemGrain = 1 << 14

// Scratch slots: each names one per-worker buffer that an op reuses across
// calls.
const (
	slotPackA = iota
	slotPackB
	slotTile
	slotAttnS
	slotAttnP
	slotAttnAux
	slotLogits
	slotRow
	slotTreeK  // TreeAttention's gathered context keys
	slotTreeV  // and values
	slotAttnKT // attention's keys packed as op(B) of Q·Kᵀ (attnPacks)
	slotAttnV  // its values packed as op(B) of P·V, or in the backward of dO·Vᵀ
	slotAttnK  // the backward's keys packed as op(B) of dS·K
	numSlots
)

// scratch holds per-worker float32 buffers that grow on first use and are
// reused afterwards, plus shared buffers for reductions.
type scratch struct {
	w        []wscratch
	partials []float64
	shared   [numShared][]float32
}

// Shared buffer slots: one per concurrent use within an op.
const (
	sharedPackB = iota // parallelGemm's packed op(B)
	sharedPackA        // parallelGemm's packed op(A)
	sharedDZ           // TokenLogprobBackward's dz chunk
	sharedRMS          // RMSNormBackward's dweight partial sums
	sharedAttnD        // TreeAttentionBackward's rowsum(dout∘out)
	numShared
)

func (s *scratch) init(threads int) {
	s.w = make([]wscratch, threads)
}

// wscratch is one worker's set of reusable buffers.
type wscratch struct {
	bufs [numSlots][]float32
	// attnKey names the keys and values packed in slotAttnKT and slotAttnV
	// (attnPacks), attnKT and attnV describe them.
	attnKey       attnPackKey
	attnKT, attnV prepacked
}

// get returns the buffer for slot, at least n elements long (contents
// unspecified).
func (s *wscratch) get(slot, n int) []float32 {
	b := s.bufs[slot]
	if cap(b) < n {
		b = make([]float32, n+n/4)
		s.bufs[slot] = b
	}
	return b[:n]
}

// scratchOf returns n elements of scratch of type F: worker memory for
// float32, a fresh slice for float64 (used only by tests).
func scratchOf[F Float](ws *wscratch, slot, n int) []F {
	var zero F
	if _, ok := any(zero).(float32); ok && ws != nil {
		b := ws.get(slot, n)
		return unsafe.Slice((*F)(unsafe.Pointer(unsafe.SliceData(b))), n)
	}
	return make([]F, n)
}

// isF32 reports whether F is float32.
func isF32[F Float]() bool {
	var zero F
	_, ok := any(zero).(float32)
	return ok
}

// asF32 reinterprets a []F known to be []float32.
func asF32[F Float](x []F) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(x))), len(x))
}

// getPartials returns a shared float64 buffer of n elements.
func (s *scratch) getPartials(n int) []float64 {
	if cap(s.partials) < n {
		s.partials = make([]float64, n)
	}
	return s.partials[:n]
}

// getShared returns shared float32 buffer slot, n elements long.
func (s *scratch) getShared(slot, n int) []float32 {
	if cap(s.shared[slot]) < n {
		s.shared[slot] = make([]float32, n)
	}
	return s.shared[slot][:n]
}

// unsafeSlice views n float32s starting at p.
func unsafeSlice(p *float32, n int) []float32 { return unsafe.Slice(p, n) }
