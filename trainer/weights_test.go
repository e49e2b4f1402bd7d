package trainer

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestRanksCatchOneDivergedWeight: the ranks' weights check sees a
// difference of one bit in any single weight, wherever it lies in the
// parameter arena: the first, either side of a boundary between the
// hash's 64 KiB chunks, and in the last, partial chunk (dropping that
// chunk left the last 4,480 of the built-in model's 102,784 weights
// unhashed, and TestRanksCatchDivergedWeights changes every weight).
func TestRanksCatchOneDivergedWeight(t *testing.T) {
	const n = 2
	const chunk = 64 << 10 / 4 // weights per hashed chunk
	type result struct {
		at           string
		same, differ error
	}
	results := make([][]result, n)
	errs, logs := eachLocalRank(t, n, trainArgs(t.TempDir(), 1), nil, func(r int, tr *Trainer) error {
		w, ok := tr.hostView(tr.model.Params())
		if !ok {
			return fmt.Errorf("the CPU backend's weights are not in host memory")
		}
		N := len(w)
		full := N / chunk * chunk
		if N%chunk == 0 {
			return fmt.Errorf("%d weights fill whole chunks: the test needs a partial last chunk", N)
		}
		for _, i := range []int{0, chunk - 1, chunk, full - 1, full, N - 1} {
			old := w[i]
			if r == 1 {
				w[i] = math.Float32frombits(math.Float32bits(old) ^ 1) // the last bit
				tr.model.ParamsChanged()
			}
			at := fmt.Sprintf("weight %d of %d", i, N)
			differ := tr.checkSameWeights(at)
			w[i] = old
			tr.model.ParamsChanged()
			results[r] = append(results[r], result{at: at, differ: differ, same: tr.checkSameWeights(at)})
		}
		return nil
	})
	for r := range n {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v\n%s", r, errs[r], logs[r])
		}
		for _, res := range results[r] {
			if res.same != nil {
				t.Errorf("rank %d, %s restored: %v", r, res.at, res.same)
			}
			if res.differ == nil || !Agreed(res.differ) || !strings.Contains(res.differ.Error(), "rank 1's weights differ") {
				t.Errorf("rank %d: rank 1's %s differs in its last bit: %v; want an agreed error naming rank 1", r, res.at, res.differ)
			}
		}
	}
}
