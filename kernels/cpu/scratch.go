package cpu

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
	numSlots
)

// scratch holds per-worker float32 buffers that grow on first use and are
// reused afterwards, plus shared buffers for reductions.
type scratch struct {
	w        [][numSlots][]float32
	partials []float64
	shared   []float32
}

func (s *scratch) init(threads int) {
	s.w = make([][numSlots][]float32, threads)
}

// get returns worker w's buffer for slot, at least n elements long (contents
// unspecified).
func (s *scratch) get(w, slot, n int) []float32 {
	b := s.w[w][slot]
	if cap(b) < n {
		b = make([]float32, n+n/4)
		s.w[w][slot] = b
	}
	return b[:n]
}

// getPartials returns a shared float64 buffer of n elements.
func (s *scratch) getPartials(n int) []float64 {
	if cap(s.partials) < n {
		s.partials = make([]float64, n)
	}
	return s.partials[:n]
}

// getShared returns a shared float32 buffer of n elements.
func (s *scratch) getShared(n int) []float32 {
	if cap(s.shared) < n {
		s.shared = make([]float32, n)
	}
	return s.shared[:n]
}
