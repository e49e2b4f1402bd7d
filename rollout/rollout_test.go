package rollout

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// oracle answers every turn of every built-in task correctly, reading only
// the prompt, as a perfect policy would.
type oracle struct{}

func (oracle) Sample(prompts [][]int32, _ []*rand.Rand) ([]Completion, error) {
	out := make([]Completion, len(prompts))
	for i, p := range prompts {
		n := len(p)
		var want int32
		switch {
		case p[n-3] == RESULT:
			want = p[n-2]
		case p[n-3] == ASK:
			d, _ := DigitOf(p[n-2])
			want = p[2+d] // <s> USER x y …
		case p[1] == USER && n == 7: // compact: <s> USER w x y z ASSIST
			want = p[5]
		default: // calc, branch and the compacted context all call the tool
			want = TOOL
		}
		out[i] = Completion{Tokens: []int32{want, EOS}, Logprobs: []float64{-0.5, -0.25}}
	}
	return out, nil
}

// randomPolicy samples 1–3 tokens uniformly from the vocabulary, from each
// call's own stream.
type randomPolicy struct{}

func (randomPolicy) Sample(prompts [][]int32, rngs []*rand.Rand) ([]Completion, error) {
	out := make([]Completion, len(prompts))
	for i := range prompts {
		rng := rngs[i]
		n := 1 + rng.IntN(3)
		for j := 0; j < n; j++ {
			tok := int32(rng.IntN(VocabSize))
			out[i].Tokens = append(out[i].Tokens, tok)
			out[i].Logprobs = append(out[i].Logprobs, -3.4657359)
			if tok == EOS {
				break
			}
		}
	}
	return out, nil
}

// memRecorder keeps what a capture store would receive and checks the
// protocol: Begin before Record, nothing after Finish.
type memRecorder struct {
	t        *testing.T
	begun    map[string]bool
	finished map[string]bool
	calls    map[string][]RecordedCall
}

func newMemRecorder(t *testing.T) *memRecorder {
	return &memRecorder{t: t, begun: map[string]bool{}, finished: map[string]bool{}, calls: map[string][]RecordedCall{}}
}

func (m *memRecorder) Begin(rid, id string) error {
	if m.finished[rid] {
		m.t.Errorf("Begin(%s, %s) after Finish", rid, id)
	}
	m.begun[id] = true
	return nil
}

func (m *memRecorder) Record(c RecordedCall) error {
	if !m.begun[c.CallID] {
		m.t.Errorf("Record(%s) without Begin", c.CallID)
	}
	if m.finished[c.RolloutID] {
		m.t.Errorf("Record(%s) after Finish", c.CallID)
	}
	m.calls[c.RolloutID] = append(m.calls[c.RolloutID], c)
	return nil
}

func (m *memRecorder) Finish(rid string) error {
	if m.finished[rid] {
		m.t.Errorf("Finish(%s) twice", rid)
	}
	m.finished[rid] = true
	return nil
}

func allTasks(t *testing.T) []Task {
	t.Helper()
	tasks, err := LookupTasks(TaskNames())
	if err != nil {
		t.Fatal(err)
	}
	return tasks
}

func TestOracleEarnsFullReward(t *testing.T) {
	st := Streams{Seed: 1}
	specs := Plan(allTasks(t), 0, 9, 2, st)
	rec := newMemRecorder(t)
	res, err := Run(oracle{}, rec, specs, Streams{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	wantCalls := map[string]int{"calc": 2, "branch": 3, "compact": 3}
	for _, r := range res {
		if r.Reward != 1 {
			t.Errorf("%s (%s): oracle reward %v, want 1", r.RolloutID, r.Task, r.Reward)
		}
		if len(r.Calls) != wantCalls[r.Task] {
			t.Errorf("%s (%s): %d calls, want %d", r.RolloutID, r.Task, len(r.Calls), wantCalls[r.Task])
		}
		if !rec.finished[r.RolloutID] {
			t.Errorf("%s never finished", r.RolloutID)
		}
	}
}

// TestCallGraphShapes checks the parent structure each task promises, which is
// what makes the two builders produce different trace counts.
func TestCallGraphShapes(t *testing.T) {
	st := Streams{Seed: 5}
	specs := Plan(allTasks(t), 0, 3, 1, st)
	res, err := Run(oracle{}, newMemRecorder(t), specs, Streams{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		parents := make([]string, len(r.Calls))
		index := map[string]int{}
		for i, c := range r.Calls {
			index[c.CallID] = i
			parents[i] = "root"
			if c.ParentCallID != "" {
				parents[i] = "call" + string(rune('0'+index[c.ParentCallID]))
			}
		}
		want := map[string][]string{
			"calc":    {"root", "call0"},
			"branch":  {"root", "call0", "call0"},
			"compact": {"root", "root", "call1"},
		}[r.Task]
		if !slices.Equal(parents, want) {
			t.Errorf("%s: parents %v, want %v", r.Task, parents, want)
		}
	}
}

// TestRandomPolicyProperties plays many random episodes and checks the
// invariants every capture must satisfy, and that rewards are in range and
// not all perfect.
func TestRandomPolicyProperties(t *testing.T) {
	for seed := uint64(0); seed < 20; seed++ {
		st := Streams{Seed: seed}
		specs := Plan(allTasks(t), int(seed), 6, 4, st)
		rec := newMemRecorder(t)
		res, err := Run(randomPolicy{}, rec, specs, Streams{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		sum := 0.0
		for _, r := range res {
			sum += r.Reward
			if r.Reward < 0 || r.Reward > 1 {
				t.Fatalf("reward %v out of range", r.Reward)
			}
			byID := map[string]RecordedCall{}
			for _, c := range r.Calls {
				if ids[c.CallID] || len(c.CallID) != 32 {
					t.Fatalf("call id %q duplicated or malformed", c.CallID)
				}
				ids[c.CallID] = true
				byID[c.CallID] = c
				if c.ParentCallID != "" && !isContinuation(byID[c.ParentCallID], c.Prompt) {
					t.Fatalf("%s: call %s does not continue its parent", r.RolloutID, c.CallID)
				}
				if c.Prompt[len(c.Prompt)-1] != ASSIST {
					t.Fatalf("%s: prompt %s does not end with ASSIST", r.RolloutID, Render(c.Prompt))
				}
			}
		}
		if mean := sum / float64(len(res)); mean > 0.5 {
			t.Errorf("seed %d: random policy mean reward %.3f; the tasks are too easy to show learning", seed, mean)
		}
	}
}

func TestRunIsDeterministic(t *testing.T) {
	play := func() []Result {
		st := Streams{Seed: 11}
		specs := Plan(allTasks(t), 3, 6, 4, st)
		res, err := Run(randomPolicy{}, newMemRecorder(t), specs, Streams{Seed: 15})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a, b := play(), play()
	for i := range a {
		if a[i].Reward != b[i].Reward || len(a[i].Calls) != len(b[i].Calls) {
			t.Fatalf("rollout %d differs between identical runs", i)
		}
		for j := range a[i].Calls {
			ca, cb := a[i].Calls[j], b[i].Calls[j]
			if ca.CallID != cb.CallID || !slices.Equal(ca.Generation, cb.Generation) || !slices.Equal(ca.Prompt, cb.Prompt) {
				t.Fatalf("rollout %d call %d differs between identical runs", i, j)
			}
		}
	}
}

func TestPlanIDsUniqueAcrossSteps(t *testing.T) {
	st := Streams{Seed: 1}
	seen := map[string]bool{}
	for step := 0; step < 5; step++ {
		for _, s := range Plan(allTasks(t), step, 4, 3, st) {
			if seen[s.RolloutID] {
				t.Fatalf("rollout id %s reused at step %d", s.RolloutID, step)
			}
			seen[s.RolloutID] = true
		}
	}
	// Every rollout of a task group plays the same instance.
	specs := Plan(allTasks(t), 0, 3, 4, st)
	for i := range specs {
		g := specs[i].TaskIndex * 4
		if specs[i].Instance != specs[g].Instance {
			t.Errorf("rollout %s plays another instance than its group", specs[i].RolloutID)
		}
	}
}

func TestLookupUnknownTask(t *testing.T) {
	if _, err := LookupTasks([]string{"calc", "chess"}); err == nil {
		t.Fatal("unknown task accepted")
	}
}

func TestTurnScore(t *testing.T) {
	tests := []struct {
		name string
		gen  []int32
		want int
	}{
		{"exact", []int32{TOOL, EOS}, 100},
		{"right token, no stop", []int32{TOOL, TOOL}, 70},
		{"right token, long", []int32{TOOL, EOS, EOS}, 70},
		{"wrong token, stops", []int32{USER, EOS}, 30},
		{"alone", []int32{TOOL}, 70},
		{"empty", nil, 0},
	}
	for _, tc := range tests {
		if got := turnScore(tc.gen, TOOL); got != tc.want {
			t.Errorf("%s: turnScore(%s) = %v, want %v", tc.name, Render(tc.gen), got, tc.want)
		}
	}
}

// TestEqualEpisodesHaveBitIdenticalRewards: whatever order the turn scores
// add up in, equal scores give the same float64, so GRPO sees no spurious
// variance.
func TestEqualEpisodesHaveBitIdenticalRewards(t *testing.T) {
	seen := map[[3]int]float64{}
	for a := 0; a <= 100; a += 10 {
		for b := 0; b <= 100; b += 10 {
			for c := 0; c <= 100; c += 10 {
				r1 := reward(20, a, 40, b, 40, c)
				r2 := reward(40, c, 20, a, 40, b)
				if r1 != r2 {
					t.Fatalf("reward depends on the order of its terms: %v vs %v", r1, r2)
				}
				seen[[3]int{a, b, c}] = r1
			}
		}
	}
	if reward(30, 100, 30, 100, 40, 100) != 1 || reward(40, 70, 60, 30) != 0.46 {
		t.Fatal("reward arithmetic")
	}
}

// TestRunDoesNotDependOnTheBatch: a rollout's calls, ids, generations and
// reward depend on its spec, the policy and the streams only, not on which
// other rollouts run with it or in which order, so data-parallel ranks that
// each run a block of task groups play exactly one process's rollouts.
func TestRunDoesNotDependOnTheBatch(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		st := Streams{Seed: seed}
		specs := Plan(allTasks(t), int(seed), 6, 4, st)
		whole, err := Run(randomPolicy{}, newMemRecorder(t), specs, st)
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]Result{}
		for _, r := range whole {
			byID[r.RolloutID] = r
		}
		rng := rand.New(rand.NewPCG(seed, 99))
		for range 4 {
			// A random contiguous block, and the specs shuffled.
			lo := rng.IntN(len(specs))
			hi := lo + 1 + rng.IntN(len(specs)-lo)
			part := slices.Clone(specs[lo:hi])
			rng.Shuffle(len(part), func(i, j int) { part[i], part[j] = part[j], part[i] })
			res, err := Run(randomPolicy{}, newMemRecorder(t), part, st)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res {
				w := byID[r.RolloutID]
				if r.Reward != w.Reward || len(r.Calls) != len(w.Calls) {
					t.Fatalf("seed %d: %s run with specs [%d,%d) shuffled: reward %v with %d calls, alone in the whole batch %v with %d",
						seed, r.RolloutID, lo, hi, r.Reward, len(r.Calls), w.Reward, len(w.Calls))
				}
				for j := range r.Calls {
					a, b := r.Calls[j], w.Calls[j]
					if a.CallID != b.CallID || !slices.Equal(a.Generation, b.Generation) || !slices.Equal(a.Prompt, b.Prompt) {
						t.Fatalf("seed %d: %s call %d differs when run in another batch", seed, r.RolloutID, j)
					}
				}
			}
		}
	}
}

// TestStreamsAreDistinct: the keyed streams of different coordinates and
// purposes start differently, and the same key gives the same stream.
func TestStreamsAreDistinct(t *testing.T) {
	st := Streams{Seed: 42}
	seen := map[uint64]string{}
	add := func(name string, r *rand.Rand) {
		t.Helper()
		v := r.Uint64()
		if prev, ok := seen[v]; ok {
			t.Fatalf("streams %s and %s start with the same value", prev, name)
		}
		seen[v] = name
	}
	for step := 0; step < 4; step++ {
		for g := 0; g < 4; g++ {
			add(fmt.Sprintf("instance(%d,%d)", step, g), st.Instance(step, g))
			for r := 0; r < 4; r++ {
				add(fmt.Sprintf("ids(%d,%d,%d)", step, g, r), st.CallIDs(step, g, r))
				for c := 0; c < 3; c++ {
					add(fmt.Sprintf("sampling(%d,%d,%d,%d)", step, g, r, c), st.Sampling(step, g, r, c))
				}
			}
		}
	}
	if st.Sampling(3, 2, 1, 0).Uint64() != st.Sampling(3, 2, 1, 0).Uint64() {
		t.Error("the same key gave two different streams")
	}
	if (Streams{Seed: 43}).Instance(0, 0).Uint64() == st.Instance(0, 0).Uint64() {
		t.Error("the seed does not change the streams")
	}
}

// longPolicy generates n copies of a token, never stopping.
type longPolicy struct {
	n, max int
}

func (p longPolicy) Sample(prompts [][]int32, _ []*rand.Rand) ([]Completion, error) {
	out := make([]Completion, len(prompts))
	for i := range prompts {
		for j := 0; j < p.n; j++ {
			out[i].Tokens = append(out[i].Tokens, TOOL)
			out[i].Logprobs = append(out[i].Logprobs, -1)
		}
	}
	return out, nil
}

func (p longPolicy) MaxContext() int { return p.max }

// TestContextOverflowEndsTheEpisode: a call whose prompt leaves a bounded
// policy no room ends its episode with reward 0 (the agent's context
// overflowed) instead of failing the whole step, as it did when the built-in
// job ran with a short max_total_sequence_length.
func TestContextOverflowEndsTheEpisode(t *testing.T) {
	st := Streams{Seed: 3}
	specs := Plan(allTasks(t), 0, 3, 2, st)
	rec := newMemRecorder(t)
	res, err := Run(longPolicy{n: 9, max: 14}, rec, specs, st)
	if err != nil {
		t.Fatal(err)
	}
	overflowed := 0
	for _, r := range res {
		if r.ContextOverflow {
			overflowed++
			if r.Reward != 0 || r.Record()["context_overflow"] != true {
				t.Errorf("%s: overflowed with reward %v, record %v", r.RolloutID, r.Reward, r.Record())
			}
			if len(r.Calls) == 0 {
				t.Errorf("%s: overflowed before its first call", r.RolloutID)
			}
		}
		if !rec.finished[r.RolloutID] {
			t.Errorf("%s never finished", r.RolloutID)
		}
		for _, c := range r.Calls {
			if len(c.Prompt) >= 14 {
				t.Errorf("%s: a call with a %d-token prompt was dispatched past the limit", r.RolloutID, len(c.Prompt))
			}
		}
	}
	if overflowed == 0 {
		t.Fatal("no episode overflowed: the test shows nothing")
	}
}
