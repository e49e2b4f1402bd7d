package rollout

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestPlanCyclesTasksAcrossSteps: the task groups of consecutive steps go
// on through the tasks where the last step left off, so that over any
// len(tasks) consecutive groups every task is played once, even when a
// step holds fewer groups than there are tasks (a step of one group played
// the same task at every step).
func TestPlanCyclesTasksAcrossSteps(t *testing.T) {
	tasks := allTasks(t)
	n := len(tasks)
	for _, prompts := range []int{1, 2, n - 1, n, n + 1} {
		var played []string
		for step := 1; step <= 2*n; step++ {
			specs := Plan(tasks, step, prompts, 2, Streams{Seed: 1})
			for p := range prompts {
				played = append(played, specs[p*2].Task)
			}
		}
		for i := 0; i+n <= len(played); i++ {
			seen := slices.Clone(played[i : i+n])
			slices.Sort(seen)
			if len(slices.Compact(seen)) != n {
				t.Fatalf("%d groups a step: groups %d..%d play %v, not each of the %d tasks once", prompts, i, i+n-1, played[i:i+n], n)
			}
		}
	}
}

// continuation is a task of two calls: the second claims the first as its
// parent, with a prompt of the first's prompt and generation, then extra.
// Its reward is reward.
type continuation struct {
	extra  []int32
	reward float64
}

type continuationEpisode struct {
	continuation
	gens [][]int32
}

func (c continuation) Name() string                    { return "continuation" }
func (c continuation) NewInstance(*rand.Rand) Instance { return c }
func (c continuation) NewEpisode() Episode             { return &continuationEpisode{continuation: c} }

func (e *continuationEpisode) Observe(gens [][]int32) { e.gens = append(e.gens, gens...) }
func (e *continuationEpisode) Reward() float64        { return e.reward }

func (e *continuationEpisode) Next() []Call {
	first := []int32{1, 2, 3}
	switch len(e.gens) {
	case 0:
		return []Call{{Prompt: first, Parent: -1}}
	case 1:
		return []Call{{Prompt: slices.Concat(first, e.gens[0], e.extra), Parent: 0}}
	}
	return nil
}

// TestContinuationMustExtendItsParent: a call that claims a parent is
// accepted when its prompt is the parent's prompt and generation followed
// by new tokens, and refused, naming the parent, when nothing follows
// (a continuation that adds no tokens is no model turn).
func TestContinuationMustExtendItsParent(t *testing.T) {
	for _, c := range []struct {
		extra []int32
		ok    bool
	}{{[]int32{7}, true}, {[]int32{7, 8, 9}, true}, {nil, false}} {
		specs := Plan([]Task{continuation{extra: c.extra}}, 1, 1, 1, Streams{Seed: 2})
		_, err := Run(randomPolicy{}, newMemRecorder(t), specs, Streams{Seed: 2})
		switch {
		case c.ok && err != nil:
			t.Errorf("a continuation adding %d tokens: %v", len(c.extra), err)
		case !c.ok && (err == nil || !strings.Contains(err.Error(), "does not extend the parent's tokens")):
			t.Errorf("a continuation adding no tokens: %v; want it refused", err)
		}
	}
}

// TestContextLimitIsExact: a prompt of exactly the policy's context leaves
// it no token to generate, so the episode ends there as an overflow
// (reward 0) before that call is dispatched; one token less is dispatched.
func TestContextLimitIsExact(t *testing.T) {
	// The second prompt: 3 tokens, the first call's 2 generated, 1 more.
	const second = 3 + 2 + 1
	for _, c := range []struct {
		max      int
		overflow bool
	}{{second, true}, {second + 1, false}, {second - 1, true}} {
		specs := Plan([]Task{continuation{extra: []int32{7}, reward: 1}}, 1, 1, 1, Streams{Seed: 4})
		res, err := Run(longPolicy{n: 2, max: c.max}, newMemRecorder(t), specs, Streams{Seed: 4})
		if err != nil {
			t.Fatal(err)
		}
		r := res[0]
		calls := 2
		if c.overflow {
			calls = 1
		}
		if r.ContextOverflow != c.overflow || len(r.Calls) != calls || (c.overflow && r.Reward != 0) {
			t.Errorf("context %d, second prompt %d tokens: overflow %v after %d calls (reward %v); want overflow %v after %d",
				c.max, second, r.ContextOverflow, len(r.Calls), r.Reward, c.overflow, calls)
		}
	}
}

// TestRewardOutsideTheUnitIntervalIsRefused: an episode reward outside
// [0, 1] stops the step naming the rollout and the task, never trained;
// the interval's ends are rewards.
func TestRewardOutsideTheUnitIntervalIsRefused(t *testing.T) {
	for _, c := range []struct {
		reward float64
		ok     bool
	}{{0, true}, {1, true}, {0.25, true}, {1.0000001, false}, {1.5, false}, {-0.5, false}, {-1e-9, false}} {
		specs := Plan([]Task{continuation{extra: []int32{7}, reward: c.reward}}, 1, 1, 1, Streams{Seed: 5})
		res, err := Run(randomPolicy{}, newMemRecorder(t), specs, Streams{Seed: 5})
		switch {
		case c.ok && (err != nil || res[0].Reward != c.reward):
			t.Errorf("reward %v: %v, %+v", c.reward, err, res)
		case !c.ok && (err == nil || !strings.Contains(err.Error(), "outside [0, 1]") || !strings.Contains(err.Error(), specs[0].RolloutID)):
			t.Errorf("reward %v: %v; want it refused naming the rollout", c.reward, err)
		}
	}
}

// TestCallIDsAreUUID4Hex: every model call id is shaped as NeMo Gym's
// uuid4().hex: 32 lowercase hex digits, version 4 (the 13th digit) and the
// RFC 4122 variant (the 17th is 8, 9, a or b), all distinct.
func TestCallIDsAreUUID4Hex(t *testing.T) {
	st := Streams{Seed: 9}
	rec := newMemRecorder(t)
	res, err := Run(randomPolicy{}, rec, Plan(allTasks(t), 1, 6, 4, st), st)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range res {
		for _, c := range r.Calls {
			id := c.CallID
			if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" || id[12] != '4' || !strings.ContainsRune("89ab", rune(id[16])) || seen[id] {
				t.Fatalf("%s: call id %q is not a fresh uuid4().hex", r.RolloutID, id)
			}
			seen[id] = true
		}
	}
	if len(seen) < 24 {
		t.Fatalf("%d call ids: too few to tell", len(seen))
	}
}
