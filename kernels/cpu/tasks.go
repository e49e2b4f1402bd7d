package cpu

// tasks holds one task value per op, reused across calls so that handing a
// task to the pool allocates nothing.
type tasks struct {
	fill       fillTask
	add        addTask
	adamw      adamwTask
	sumSquares sumSquaresTask
	embedding  embeddingTask
	scatter    scatterTask
	bad        []int
}
