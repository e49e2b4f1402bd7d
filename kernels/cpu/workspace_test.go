package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/model"
)

// TestPlanWorkspace runs a model's training step and a sampler on the CPU
// backend and checks the scratch its ops allocated against PlanWorkspace
// of the model's and the sampler's workloads: the shared buffers exactly,
// each worker's within its bound.
func TestPlanWorkspace(t *testing.T) {
	for _, v := range []string{"qwen3_untied", "qwen2_untied", "llama_tied"} {
		for _, T := range []int{40, 700} {
			t.Run(fmt.Sprintf("%s_T%d", v, T), func(t *testing.T) {
				b := New(2)
				defer b.Close()
				dir := "../../model/testdata/" + v
				cfg, err := model.LoadConfig(dir + "/config.json")
				if err != nil {
					t.Fatal(err)
				}
				opt := model.Options{MaxTokens: T, MaxSeqs: 8}
				m, err := model.New(b, cfg, opt)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				m.InitRandom(1)
				r := rand.New(rand.NewPCG(1, 2))
				tokens := make([]int32, T)
				for i := range tokens {
					tokens[i] = int32(r.IntN(cfg.VocabSize))
				}
				cu := []int32{0, int32(T / 3), int32(T)}
				if _, _, err := m.Forward(tokens, cu, 1); err != nil {
					t.Fatal(err)
				}
				dl := make([]float32, T)
				for i := range dl {
					dl[i] = 0.01
				}
				if err := m.Backward(dl); err != nil {
					t.Fatal(err)
				}
				out, _ := b.Alloc(kernels.F32, 1)
				b.SumSquares(out, m.Grads())
				const batch, maxLen = 3, 30
				s, err := model.NewSampler(m, batch, maxLen)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				prompts := [][]int32{tokens[:5], tokens[5:12], tokens[12:14]}
				if _, err := s.Sample(prompts, model.SampleOptions{Temperature: 1, MaxNewTokens: 8}, []*rand.Rand{r}); err != nil {
					t.Fatal(err)
				}
				w, err := model.PlanWorkload(cfg, opt)
				if err != nil {
					t.Fatal(err)
				}
				sw, err := model.SamplerWorkload(cfg, opt, batch, maxLen)
				if err != nil {
					t.Fatal(err)
				}
				w.GEMMs = append(w.GEMMs, sw.GEMMs...)
				w.Heads = append(w.Heads, sw.Heads...)
				w.RowNorms = append(w.RowNorms, sw.RowNorms...)
				w.Attention = append(w.Attention, sw.Attention...)
				w.Decode = append(w.Decode, sw.Decode...)
				w.SumSquares = []int{m.Table().Total}
				planShared, planWorker := planScratch(w)
				shared, worker := b.scratchBytes()
				if shared != planShared || worker > planWorker {
					t.Errorf("scratch: shared %d bytes (plan %d), largest worker %d (bound %d)", shared, planShared, worker, planWorker)
				}
				t.Logf("shared %d, worker %d of %d", shared, worker, planWorker)
			})
		}
	}
}
