package cpu

// tasks holds one task value per op, reused across calls so that handing a
// task to the pool allocates nothing.
type tasks struct {
	fill       fillTask
	add        addTask
	copyCols   copyColsTask
	adamw      adamwTask
	adamwMulti adamwMultiTask
	sumSquares sumSquaresTask
	embedding  embeddingTask
	scatter    scatterTask
	gemm       gemmTask
	rmsnorm    rmsnormTask
	swiglu     swigluTask
	rope       ropeTask
	bias       biasTask
	attn       attnTask
	attnBlocks []attnBlock
	attnGen    callCounter
	tree       treeTask
	treeItems  []treeItem
	treeChains [][]int32 // per worker
	treeAnc    []int32
	treePos    []int32
	decode     decodeTask
	tlp        tlpTask
	tlpFilter  tlpFilterTask
	router     routerTask
	gather     gatherTask
	combine    combineTask
	bad        []int
	conv       convTask
	convPrev   []int32     // Conv1D's context links (T)
	convIdx    [][]int32   // per worker: a token's taps (KW)
	convAcc    [][]float32 // per worker: a channel block's dweight and dbias sums (convChanBlock·(KW+1))
	relu2      relu2Task
	gatedNorm  gatedNormTask
	ssm        ssmTask
}

// callCounter numbers an op's calls from 1 (0 names none).
type callCounter uint64

func (c *callCounter) next() uint64 {
	*c++
	return uint64(*c)
}
