package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// samplerLogprobTol is the agreement required between the sampler's
// incremental (KV-cache) logprobs and the packed training forward.
const samplerLogprobTol = 1e-5

var testPrompts = [][]int32{{5, 17, 300, 2}, {42}, {7, 7, 7, 100, 200, 311, 12, 9}, {500, 1}}

// TestSamplerMatchesForward: without top-k/top-p, every sampled token's
// logprob equals the training forward's logprob at the same temperature.
// maxLen 14 makes the long prompt hit the cache limit first, so slots are
// retired and moved while others continue.
func TestSamplerMatchesForward(t *testing.T) {
	for _, v := range goldenVariants {
		t.Run(v, func(t *testing.T) {
			b := cpu.New(2)
			defer b.Close()
			m := loadTestModel(t, v, b, Options{MaxTokens: 64, MaxSeqs: 8})
			defer m.Close()
			s, err := NewSampler(m, 4, 14)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			const temp = 1.3
			out, err := s.Sample(testPrompts, SampleOptions{Temperature: temp, MaxNewTokens: 9, StopTokens: []int32{3, 4}}, []*rand.Rand{rand.New(rand.NewPCG(1, 2))})
			if err != nil {
				t.Fatal(err)
			}
			lengths := map[int]bool{}
			for i, o := range out {
				p := testPrompts[i]
				lengths[len(o.Tokens)] = true
				switch {
				case len(o.Tokens) == 0 || len(o.Tokens) != len(o.Logprobs):
					t.Fatalf("prompt %d: %d tokens, %d logprobs", i, len(o.Tokens), len(o.Logprobs))
				case !o.Stopped && len(o.Tokens) != 9 && len(p)+len(o.Tokens) != 14+1:
					t.Fatalf("prompt %d: ended after %d tokens without a stop token, MaxNewTokens or the cache limit", i, len(o.Tokens))
				}
				seq := append(slices.Clone(p), o.Tokens...)
				lp, _, err := m.Forward(seq, []int32{0, int32(len(seq))}, temp)
				if err != nil {
					t.Fatal(err)
				}
				compareClose(t, "sampler vs forward logprobs", o.Logprobs, lp[len(p):], samplerLogprobTol, 0)
			}
			if len(lengths) < 2 {
				t.Errorf("every sequence generated the same number of tokens %v: slot retirement not exercised", lengths)
			}
		})
	}
}

func TestSamplerDeterministic(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	m := loadTestModel(t, "qwen3_tied", b, Options{MaxTokens: 64, MaxSeqs: 8})
	defer m.Close()
	s, err := NewSampler(m, 4, 40)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	opt := SampleOptions{Temperature: 1.5, TopP: 0.95, TopK: 50, MaxNewTokens: 16}
	run := func(seed uint64) []Sample {
		out, err := s.Sample(testPrompts, opt, []*rand.Rand{rand.New(rand.NewPCG(seed, 9))})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	a, a2, c := run(7), run(7), run(8)
	if d := cmp.Diff(a, a2); d != "" {
		t.Errorf("same seed, different samples (-first +second):\n%s", d)
	}
	if cmp.Equal(a, c) {
		t.Errorf("seeds 7 and 8 gave identical samples")
	}
}

// nextDist returns log p(v | prompt) at temperature temp for every token v
// by packing prompt+v for all v into one forward.
func nextDist(t *testing.T, m *Model, prompt []int32, temp float32) []float64 {
	t.Helper()
	V := m.cfg.VocabSize
	var toks, cu []int32
	cu = append(cu, 0)
	for v := range V {
		toks = append(toks, prompt...)
		toks = append(toks, int32(v))
		cu = append(cu, int32(len(toks)))
	}
	lp, _, err := m.Forward(toks, cu, temp)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, V)
	for v := range V {
		out[v] = float64(lp[cu[v+1]-1])
	}
	return out
}

// TestSamplerTruncation checks top-k and top-p against the full next-token
// distribution from the forward pass: every sampled token is in the kept set
// and its logprob is the renormalised one over that set.
func TestSamplerTruncation(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	prompt := []int32{11, 250, 3}
	m := loadTestModel(t, "llama_untied", b, Options{MaxTokens: 512 * (len(prompt) + 1), MaxSeqs: 512})
	defer m.Close()
	s, err := NewSampler(m, 16, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const temp = 2.5
	full := nextDist(t, m, prompt, temp)
	order := make([]int, len(full))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return full[order[a]] > full[order[b]] })
	keptSet := func(topK int, topP float64) map[int]float64 {
		keep := len(order)
		if topK > 0 {
			keep = topK
		}
		var mass float64
		for _, i := range order[:keep] {
			mass += math.Exp(full[i])
		}
		if topP > 0 && topP < 1 {
			acc := 0.0
			for j, i := range order[:keep] {
				acc += math.Exp(full[i])
				if acc >= topP*mass {
					keep = j + 1
					break
				}
			}
		}
		var z float64
		for _, i := range order[:keep] {
			z += math.Exp(full[i])
		}
		out := map[int]float64{}
		for _, i := range order[:keep] {
			out[i] = full[i] - math.Log(z)
		}
		return out
	}
	prompts := make([][]int32, 16)
	for i := range prompts {
		prompts[i] = prompt
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct {
		name string
		topK int
		topP float64
	}{
		{"top-k 5", 5, 0},
		{"top-p 0.5", 0, 0.5},
		{"top-k 20 top-p 0.8", 20, 0.8},
		{"top-k 1 is greedy", 1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			kept := keptSet(c.topK, c.topP)
			if c.topK != 1 && len(kept) < 2 {
				t.Fatalf("kept set of %d tokens: the test distribution is too peaked to check truncation", len(kept))
			}
			seen := map[int32]bool{}
			for range 4 {
				out, err := s.Sample(prompts, SampleOptions{Temperature: temp, TopK: c.topK, TopP: c.topP, MaxNewTokens: 1}, []*rand.Rand{rng})
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range out {
					tok := o.Tokens[0]
					want, ok := kept[int(tok)]
					if !ok {
						t.Fatalf("sampled token %d outside the kept set of %d tokens", tok, len(kept))
					}
					if math.Abs(float64(o.Logprobs[0])-want) > samplerLogprobTol {
						t.Fatalf("token %d: logprob %.7g, renormalised forward logprob %.7g", tok, o.Logprobs[0], want)
					}
					seen[tok] = true
				}
			}
			if len(kept) >= 3 && len(seen) < 2 {
				t.Errorf("64 draws from a %d-token set gave only %v", len(kept), seen)
			}
		})
	}
	// Greedy decoding picks the forward's most likely token.
	out, err := s.Sample(prompts[:1], SampleOptions{Temperature: 0, MaxNewTokens: 1}, []*rand.Rand{rng})
	if err != nil {
		t.Fatal(err)
	}
	if got := int(out[0].Tokens[0]); got != order[0] {
		t.Errorf("greedy token %d, forward argmax %d", got, order[0])
	}
}

func TestSamplerRejects(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	m := loadTestModel(t, "qwen3_untied", b, Options{MaxTokens: 16, MaxSeqs: 4})
	defer m.Close()
	s, err := NewSampler(m, 2, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(1, 1))
	ok := SampleOptions{Temperature: 1, MaxNewTokens: 2}
	for _, c := range []struct {
		name    string
		prompts [][]int32
		opt     SampleOptions
	}{
		{"too many prompts", [][]int32{{1}, {2}, {3}}, ok},
		{"empty prompt", [][]int32{{}}, ok},
		{"prompt past maxLen", [][]int32{make([]int32, 9)}, ok},
		{"token outside vocab", [][]int32{{512}}, ok},
		{"no MaxNewTokens", [][]int32{{1}}, SampleOptions{Temperature: 1}},
		{"negative temperature", [][]int32{{1}}, SampleOptions{Temperature: -1, MaxNewTokens: 1}},
		{"top-p above 1", [][]int32{{1}}, SampleOptions{Temperature: 1, TopP: 1.5, MaxNewTokens: 1}},
	} {
		if _, err := s.Sample(c.prompts, c.opt, []*rand.Rand{rng}); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}

// TestSamplerPrefillChunks: prompts prefilled in several chunks (a model
// sized for 9 tokens) sample what one chunk gives.
func TestSamplerPrefillChunks(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	sample := func(maxTokens int) []Sample {
		m := loadTestModel(t, "qwen3_untied", b, Options{MaxTokens: maxTokens, MaxSeqs: 2})
		defer m.Close()
		s, err := NewSampler(m, 4, 30)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		out, err := s.Sample(testPrompts, SampleOptions{Temperature: 1, MaxNewTokens: 8}, []*rand.Rand{rand.New(rand.NewPCG(4, 4))})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	one, chunked := sample(64), sample(9)
	for i := range one {
		if !slices.Equal(one[i].Tokens, chunked[i].Tokens) {
			t.Fatalf("prompt %d: tokens %v in one chunk, %v in several", i, one[i].Tokens, chunked[i].Tokens)
		}
		compareClose(t, "chunked prefill logprobs", chunked[i].Logprobs, one[i].Logprobs, samplerLogprobTol, 0)
	}
}

// TestSamplerPerPromptStreams: with one random stream per prompt, a prompt's
// sample depends only on its prompt and its stream, not on which prompts
// share the batch or where it sits in it (so data-parallel ranks, which
// batch different rollouts, sample exactly what one process would).
func TestSamplerPerPromptStreams(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	m := loadTestModel(t, "llama_untied", b, Options{MaxTokens: 64, MaxSeqs: 8})
	defer m.Close()
	s, err := NewSampler(m, 4, 30)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	opt := SampleOptions{Temperature: 1.4, MaxNewTokens: 10, StopTokens: []int32{3, 4}}
	streams := func(idx ...int) []*rand.Rand {
		out := make([]*rand.Rand, len(idx))
		for j, i := range idx {
			out[j] = rand.New(rand.NewPCG(77, uint64(i)))
		}
		return out
	}
	sample := func(idx ...int) map[int]Sample {
		prompts := make([][]int32, len(idx))
		for j, i := range idx {
			prompts[j] = testPrompts[i]
		}
		out, err := s.Sample(prompts, opt, streams(idx...))
		if err != nil {
			t.Fatal(err)
		}
		got := map[int]Sample{}
		for j, i := range idx {
			got[i] = out[j]
		}
		return got
	}
	all := sample(0, 1, 2, 3)
	for _, idx := range [][]int{{3, 1}, {2}, {1, 0, 3, 2}, {0, 2}} {
		for i, got := range sample(idx...) {
			if d := cmp.Diff(all[i], got); d != "" {
				t.Errorf("prompt %d sampled in batch %v differs from the full batch (-full +batch):\n%s", i, idx, d)
			}
		}
	}
	// The streams matter: other seeds sample something else.
	out, err := s.Sample(testPrompts, opt, []*rand.Rand{rand.New(rand.NewPCG(1, 1))})
	if err != nil {
		t.Fatal(err)
	}
	same := 0
	for i := range out {
		if cmp.Equal(out[i], all[i]) {
			same++
		}
	}
	if same == len(out) {
		t.Error("a shared stream of another seed sampled exactly the same tokens")
	}
	if _, err := s.Sample(testPrompts, opt, streams(0, 1)); err == nil {
		t.Error("2 streams for 4 prompts accepted")
	}
}

// TestSamplerRefill: with SampleOptions.Refill, more prompts than slots are
// decoded in turn, each finished slot taking the next waiting prompt; with
// one stream per prompt every prompt's sample is what sampling it alone
// gives. Stop tokens and MaxNewTokens end sequences at different steps, so
// refills land while other slots are mid-sequence (and, once the prompts
// run out, slots are retired and moved). Under F32 and mixed precision (a
// bf16 KV cache).
func TestSamplerRefill(t *testing.T) {
	prompts := [][]int32{{5, 17, 300, 2}, {42}, {7, 7, 7, 100, 200, 311, 12, 9}, {500, 1}, {9, 8, 7}, {3}, {11, 250, 3, 4, 5}}
	for _, prec := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(prec.String(), func(t *testing.T) {
			b := cpu.New(2)
			defer b.Close()
			m := loadTestModel(t, "qwen3_tied", b, Options{MaxTokens: 64, MaxSeqs: 8, Precision: prec})
			defer m.Close()
			s, err := NewSampler(m, 2, 30)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			opt := SampleOptions{Temperature: 1.2, TopK: 40, MaxNewTokens: 9, StopTokens: []int32{3, 4, 5, 6, 7}, Refill: true}
			stream := func(i int) *rand.Rand { return rand.New(rand.NewPCG(31, uint64(i))) }
			rngs := make([]*rand.Rand, len(prompts))
			for i := range rngs {
				rngs[i] = stream(i)
			}
			all, err := s.Sample(prompts, opt, rngs)
			if err != nil {
				t.Fatal(err)
			}
			lengths := map[int]bool{}
			for i, p := range prompts {
				alone, err := s.Sample([][]int32{p}, opt, []*rand.Rand{stream(i)})
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(alone[0], all[i]); d != "" {
					t.Errorf("prompt %d decoded with refills differs from decoded alone (-alone +refilled):\n%s", i, d)
				}
				lengths[len(all[i].Tokens)] = true
			}
			if len(lengths) < 2 {
				t.Errorf("every sequence generated %v tokens: refills at different steps not exercised", lengths)
			}
			opt.Refill = false
			if _, err := s.Sample(prompts, opt, rngs); err == nil {
				t.Error("7 prompts on 2 slots accepted without Refill")
			}
		})
	}
}

// hideSampler hides the CPU backend's kernels.TokenSampler, so that the
// sampler draws on the host.
type hideSampler struct{ kernels.Backend }

// TestSamplerHostDrawMatchesBackend: the host draw (for backends without
// kernels.TokenSampler) and the CPU backend's SampleTokens both run
// kernels.SampleRow; this checks the plumbing around it (uniforms as float64
// bits through an I32 buffer, the logits downloaded, per-slot rows): the same
// tokens and logprobs, step by step, with top-k, top-p, both and neither.
func TestSamplerHostDrawMatchesBackend(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	for _, opt := range []SampleOptions{
		{Temperature: 1.5, MaxNewTokens: 8},
		{Temperature: 1.5, TopK: 7, MaxNewTokens: 8},
		{Temperature: 2, TopP: 0.6, MaxNewTokens: 8},
		{Temperature: 0.9, TopK: 30, TopP: 0.9, MaxNewTokens: 8},
	} {
		var got [2][]Sample
		for i, be := range []kernels.Backend{b, hideSampler{b}} {
			m := loadTestModel(t, "llama_untied", b, Options{MaxTokens: 64, MaxSeqs: 8})
			m.b = be
			s, err := NewSampler(m, 4, 30)
			if err != nil {
				t.Fatal(err)
			}
			if (s.device == nil) != (i == 1) {
				t.Fatalf("backend %d: device sampler %v", i, s.device)
			}
			got[i], err = s.Sample(testPrompts, opt, []*rand.Rand{rand.New(rand.NewPCG(8, 8))})
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			m.Close()
		}
		if d := cmp.Diff(got[0], got[1]); d != "" {
			t.Errorf("%+v: backend draw and host draw differ (-backend +host):\n%s", opt, d)
		}
	}
}

// TestSamplerBF16MatchesForward: under mixed precision the sampler (bf16
// cache, the bf16 weight copy) gives the logprobs the training forward
// gives for the sampled sequence, within what bf16 rounding flips can do
// (bf16FlipLogprobTol: the two sum in other orders).
func TestSamplerBF16MatchesForward(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	m := loadTestModel(t, "qwen3_untied", b, Options{MaxTokens: 64, MaxSeqs: 8, Precision: kernels.BF16})
	defer m.Close()
	s, err := NewSampler(m, 4, 30)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const temp = 1.3
	out, err := s.Sample(testPrompts, SampleOptions{Temperature: temp, MaxNewTokens: 9}, []*rand.Rand{rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, o := range out {
		p := testPrompts[i]
		seq := append(slices.Clone(p), o.Tokens...)
		lp, _, err := m.Forward(seq, []int32{0, int32(len(seq))}, temp)
		if err != nil {
			t.Fatal(err)
		}
		for j, x := range o.Logprobs {
			want := lp[len(p)+j]
			if d := math.Abs(float64(x - want)); d > bf16FlipLogprobTol*(1+math.Abs(float64(want))) {
				t.Errorf("prompt %d token %d: sampler logprob %g, forward %g", i, j, x, want)
			}
			n++
		}
	}
	if n < 20 {
		t.Fatalf("only %d tokens compared", n)
	}
}

// TestSamplerOnReference: a sampler over a KL reference model (which keeps
// no RoPE tables of its own: it reads its policy's) samples what a sampler
// over the policy samples, in fp32 and under mixed precision. Decoding read
// the model's own tables and panicked on a reference.
func TestSamplerOnReference(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	for _, prec := range []kernels.DType{kernels.F32, kernels.BF16} {
		m := loadTestModel(t, "qwen2_tied", b, Options{MaxTokens: 64, MaxSeqs: 8, Precision: prec})
		ref, err := NewReference(m)
		if err != nil {
			t.Fatal(err)
		}
		var got [2][]Sample
		for i, mm := range []*Model{m, ref} {
			s, err := NewSampler(mm, 4, 30)
			if err != nil {
				t.Fatal(err)
			}
			got[i], err = s.Sample(testPrompts, SampleOptions{Temperature: 1.2, TopP: 0.9, MaxNewTokens: 8}, []*rand.Rand{rand.New(rand.NewPCG(3, 3))})
			s.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		if d := cmp.Diff(got[0], got[1]); d != "" {
			t.Errorf("%s: the reference's sampler differs from the policy's (-policy +reference):\n%s", prec, d)
		}
		ref.Close()
		m.Close()
	}
}
