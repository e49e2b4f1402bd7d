package kernels

// Workload describes the ops a model runs at its largest shapes, so that a
// backend can size the scratch its ops allocate for themselves (each
// backend's PlanWorkspace): the memory plan counts it without running
// anything.
type Workload struct {
	GEMMs      []GEMM     // Matmul shapes
	Heads      []Head     // TokenLogprob shapes
	RowNorms   []RowNorm  // RMSNorm shapes
	Biases     []GEMM     // BiasBackward (T, OC); C unused
	Attention  []Attn     // Attention shapes
	Trees      []TreeAttn // TreeAttention shapes
	Decode     []Decode   // AttentionDecode shapes
	SumSquares []int      // SumSquares lengths
	// Grouped are GroupedMatmul shapes (sparse layers); Routes are the
	// routers' ExpertRoute shapes.
	Grouped []GroupedGEMM
	Routes  []Route
	// Scans are the Mamba-2 mixers' SSMScan shapes (kernels.Mamba); Convs
	// their Conv1D shapes.
	Scans []ScanShape
	Convs []ConvShape
	// QKRopes are QKNormRopeBackward shapes (QKNormRopeBackwarder).
	QKRopes []QKRope
}

// QKRope is a QKNormRopeBackward over T tokens of NH query and NKV key
// and value heads of HD; Norm: with q/k norms.
type QKRope struct {
	T, NH, NKV, HD int
	Norm           bool
}

// ScanShape is an SSMScan of T packed tokens in at most MaxSegs segments
// (sequences or tree segments) of at most MaxLen tokens, a context of at
// most MaxCtx; Backward: its SSMScanBackward runs too.
type ScanShape struct {
	T, MaxSegs, MaxLen, MaxCtx int
	Scan                       Scan
	Backward                   bool
}

// ConvShape is a Conv1D of T packed tokens of CD channels over a window of
// KW; Backward: its Conv1DBackward runs too.
type ConvShape struct {
	T, CD, KW int
	Backward  bool
}

// GroupedGEMM is a GroupedMatmul of N rows of width C into OC among E
// experts (any expert may own all N rows); Backward: its
// GroupedMatmulBackward runs too.
type GroupedGEMM struct {
	N, C, OC, E int
	Backward    bool
}

// Route is a sparse layer's routing of T tokens to K of E experts.
type Route struct {
	T, K, E int
}

// GEMM is a Matmul of (T,C)·(OC,C)ᵀ; Backward: its MatmulBackward runs too.
type GEMM struct {
	T, C, OC int
	Backward bool
}

// Head is a TokenLogprob over T rows of width C and a vocabulary of V;
// Backward: its TokenLogprobBackward runs too. Filtered: the head runs
// under a top-k/top-p filter (FilteredHead), on BF16 operands if BF16.
type Head struct {
	T, C, V  int
	Backward bool
	Filtered bool
	BF16     bool
}

// RowNorm is an RMSNorm of N rows of C; Backward: its backward runs too.
type RowNorm struct {
	N, C     int
	Backward bool
}

// Attn is an Attention of T packed tokens, sequences of at most MaxLen;
// Backward: its AttentionBackward runs too; BF16: on bf16 operands.
type Attn struct {
	T, NH, NKV, HD, MaxLen int
	Backward, BF16         bool
}

// TreeAttn is a TreeAttention of T packed tokens in segments of at most
// MaxLen tokens and contexts of at most MaxCtx; Backward: its
// TreeAttentionBackward runs too.
type TreeAttn struct {
	T, NH, NKV, HD, MaxLen, MaxCtx int
	Backward                       bool
}

// Decode is an AttentionDecode of B sequences over a cache of Tmax rows.
type Decode struct {
	B, Tmax, NH, NKV, HD int
}
