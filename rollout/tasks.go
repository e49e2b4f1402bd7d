package rollout

import (
	"fmt"
	"math/rand/v2"
	"sort"
)

// Call is one model request of an episode.
type Call struct {
	// Prompt is the full token context the model is conditioned on.
	Prompt []int32
	// Parent is the index, in the episode's call order, of the call whose
	// prompt and generation this prompt continues, or -1 for a root (a fresh
	// context, such as the first call or a call after context compaction).
	Parent int
}

// Episode is one agent episode, driven in rounds by the runner: Next returns
// the calls to make now (several for a branch), Observe receives their
// generations in the same order, and the episode is over when Next returns
// none. Calls are numbered in the order Next returns them, across rounds.
type Episode interface {
	Next() []Call
	Observe(gens [][]int32)
	// Reward scores the finished episode in [0, 1].
	Reward() float64
}

// Instance is one drawn problem; every rollout of a task group plays the same
// instance.
type Instance interface {
	NewEpisode() Episode
}

// Task is a built-in agentic task.
type Task interface {
	Name() string
	// NewInstance draws one problem from rng.
	NewInstance(rng *rand.Rand) Instance
}

// Tasks returns the built-in tasks by name.
func Tasks() map[string]Task {
	return map[string]Task{
		"calc":    calcTask{},
		"branch":  branchTask{},
		"compact": compactTask{},
	}
}

// TaskNames returns the built-in task names, sorted.
func TaskNames() []string {
	names := make([]string, 0, 3)
	for n := range Tasks() {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupTasks resolves task names; an unknown name is an error listing the known ones.
func LookupTasks(names []string) ([]Task, error) {
	all := Tasks()
	out := make([]Task, 0, len(names))
	for _, n := range names {
		t, ok := all[n]
		if !ok {
			return nil, fmt.Errorf("rollout: unknown task %q (built-in tasks: %v)", n, TaskNames())
		}
		out = append(out, t)
	}
	return out, nil
}

// turnScore grades one model turn that should be exactly [want, EOS], in
// points: 70 for the right first token and 30 for stopping right after it.
func turnScore(gen []int32, want int32) int {
	s := 0
	if len(gen) >= 1 && gen[0] == want {
		s += 70
	}
	if len(gen) == 2 && gen[1] == EOS {
		s += 30
	}
	return s
}

// reward turns weighted turn points (weights in percent, summing to 100)
// into a reward in [0, 1]. Scores are summed as integers and divided once,
// so equal episodes get bit-identical rewards: GRPO's std would otherwise
// see rounding noise (~1e-17) as variation and divide by it.
func reward(weighted ...int) float64 {
	total := 0
	for i := 0; i+1 < len(weighted); i += 2 {
		total += weighted[i] * weighted[i+1]
	}
	return float64(total) / 10000
}

func cat(parts ...[]int32) []int32 {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	out := make([]int32, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// calc: a tool call followed by an answer that continues the same context.
//
//	call 0: <s> USER a + b ASSIST          → TOOL </s>
//	call 1: … TOOL </s> RESULT s ASSIST    → s </s>          (s = (a+b) mod 10)
//
// Without the tool call the first generation is graded as the answer.
// Reward: 0.4·turn(call 0, TOOL) + 0.6·turn(answer, s), turn ∈ {0, 0.3, 0.7, 1}.
type calcTask struct{}

func (calcTask) Name() string { return "calc" }

func (calcTask) NewInstance(rng *rand.Rand) Instance {
	return calcInstance{a: rng.IntN(10), b: rng.IntN(10)}
}

type calcInstance struct{ a, b int }

func (in calcInstance) NewEpisode() Episode { return &calcEpisode{in: in} }

type calcEpisode struct {
	in     calcInstance
	round  int
	prompt []int32
	gens   [][]int32
}

func (e *calcEpisode) sum() int32 { return Digit((e.in.a + e.in.b) % 10) }

func (e *calcEpisode) Next() []Call {
	switch {
	case e.round == 0:
		e.prompt = []int32{BOS, USER, Digit(e.in.a), PLUS, Digit(e.in.b), ASSIST}
		return []Call{{Prompt: e.prompt, Parent: -1}}
	case e.round == 1 && e.gens[0][0] == TOOL:
		return []Call{{Prompt: cat(e.prompt, e.gens[0], []int32{RESULT, e.sum(), ASSIST}), Parent: 0}}
	}
	return nil
}

func (e *calcEpisode) Observe(gens [][]int32) { e.gens = append(e.gens, gens...); e.round++ }

func (e *calcEpisode) Reward() float64 {
	if len(e.gens) == 0 {
		return 0
	}
	answer := e.gens[len(e.gens)-1]
	return reward(40, turnScore(e.gens[0], TOOL), 60, turnScore(answer, e.sum()))
}

// branch: one planning call, then two sub-questions that fork from its
// context (a verified parent with two different continuations).
//
//	call 0: <s> USER x y ASSIST                 → TOOL </s>
//	call 1: … TOOL </s> ASK 0 ASSIST            → x </s>
//	call 2: … TOOL </s> ASK 1 ASSIST            → y </s>
//
// Reward: 0.2·turn(call 0, TOOL) + 0.4·turn(call 1, x) + 0.4·turn(call 2, y).
type branchTask struct{}

func (branchTask) Name() string { return "branch" }

func (branchTask) NewInstance(rng *rand.Rand) Instance {
	return branchInstance{x: rng.IntN(10), y: rng.IntN(10)}
}

type branchInstance struct{ x, y int }

func (in branchInstance) NewEpisode() Episode { return &branchEpisode{in: in} }

type branchEpisode struct {
	in     branchInstance
	round  int
	prompt []int32
	gens   [][]int32
}

func (e *branchEpisode) Next() []Call {
	switch e.round {
	case 0:
		e.prompt = []int32{BOS, USER, Digit(e.in.x), Digit(e.in.y), ASSIST}
		return []Call{{Prompt: e.prompt, Parent: -1}}
	case 1:
		ctx := cat(e.prompt, e.gens[0])
		return []Call{
			{Prompt: cat(ctx, []int32{ASK, Digit(0), ASSIST}), Parent: 0},
			{Prompt: cat(ctx, []int32{ASK, Digit(1), ASSIST}), Parent: 0},
		}
	}
	return nil
}

func (e *branchEpisode) Observe(gens [][]int32) { e.gens = append(e.gens, gens...); e.round++ }

func (e *branchEpisode) Reward() float64 {
	if len(e.gens) < 3 {
		return 0
	}
	return reward(20, turnScore(e.gens[0], TOOL), 40, turnScore(e.gens[1], Digit(e.in.x)),
		40, turnScore(e.gens[2], Digit(e.in.y)))
}

// compact: the context is compacted to the model's own summary, and the
// episode goes on from a fresh context that is not a prefix continuation.
//
//	call 0: <s> USER w x y z ASSIST            → z </s>       (keep the last digit)
//	call 1: <s> SUMMARY g ASSIST               → TOOL </s>    (g = call 0's first token; a new root)
//	call 2: … TOOL </s> RESULT r ASSIST        → r </s>       (r = g+1 mod 10, 0 if g is no digit)
//
// Reward: 0.3·turn(call 0, z) + 0.3·turn(call 1, TOOL) + 0.4·turn(call 2, r).
type compactTask struct{}

func (compactTask) Name() string { return "compact" }

func (compactTask) NewInstance(rng *rand.Rand) Instance {
	var in compactInstance
	for i := range in.d {
		in.d[i] = rng.IntN(10)
	}
	return in
}

type compactInstance struct{ d [4]int }

func (in compactInstance) NewEpisode() Episode { return &compactEpisode{in: in} }

type compactEpisode struct {
	in      compactInstance
	round   int
	summary []int32
	gens    [][]int32
}

func (e *compactEpisode) result() int32 {
	if d, ok := DigitOf(e.gens[0][0]); ok {
		return Digit((d + 1) % 10)
	}
	return Digit(0)
}

func (e *compactEpisode) Next() []Call {
	switch {
	case e.round == 0:
		p := []int32{BOS, USER}
		for _, d := range e.in.d {
			p = append(p, Digit(d))
		}
		return []Call{{Prompt: append(p, ASSIST), Parent: -1}}
	case e.round == 1:
		e.summary = []int32{BOS, SUMMARY, e.gens[0][0], ASSIST}
		return []Call{{Prompt: e.summary, Parent: -1}}
	case e.round == 2 && e.gens[1][0] == TOOL:
		return []Call{{Prompt: cat(e.summary, e.gens[1], []int32{RESULT, e.result(), ASSIST}), Parent: 1}}
	}
	return nil
}

func (e *compactEpisode) Observe(gens [][]int32) { e.gens = append(e.gens, gens...); e.round++ }

func (e *compactEpisode) Reward() float64 {
	if len(e.gens) < 2 {
		return 0
	}
	last := 0
	if len(e.gens) == 3 {
		last = turnScore(e.gens[2], e.result())
	}
	return reward(30, turnScore(e.gens[0], Digit(e.in.d[3])), 30, turnScore(e.gens[1], TOOL), 40, last)
}
