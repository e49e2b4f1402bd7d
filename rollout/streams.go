package rollout

import "math/rand/v2"

// Streams derives every random stream of the built-in rollouts from the
// run's seed and the coordinates of what the stream decides:
//
//	Instance(step, group)              the problem a task group plays
//	CallIDs(step, group, gen)          a rollout's model call ids
//	Sampling(step, group, gen, call)   the tokens of one model call
//
// A stream never depends on which other rollouts run beside it, in which
// process or in which order, so data-parallel ranks sample exactly the
// rollouts one process would, and a resumed run needs no random state from
// its checkpoint: step N's streams are the same whenever step N runs.
type Streams struct{ Seed uint64 }

// Stream purposes, mixed into every key so that no two purposes share a
// stream.
const (
	purposeInstance uint64 = 0x696e7374616e6365 // "instance"
	purposeCallIDs  uint64 = 0x63616c6c5f696473 // "call_ids"
	purposeSampling uint64 = 0x73616d706c696e67 // "sampling"
)

// splitmix64 is Steele et al.'s 64-bit finalizer: a bijection whose output
// bits each depend on every input bit.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// stream returns the PCG keyed by the seed, the purpose and the coordinates.
func (s Streams) stream(purpose uint64, coords ...int) *rand.Rand {
	h := splitmix64(s.Seed ^ purpose)
	for _, c := range coords {
		h = splitmix64(h ^ uint64(int64(c)))
	}
	return rand.New(rand.NewPCG(h, splitmix64(h^purpose)))
}

// Instance is the stream that draws task group group's problem at step.
func (s Streams) Instance(step, group int) *rand.Rand {
	return s.stream(purposeInstance, step, group)
}

// CallIDs is the stream of rollout (group, gen)'s model call ids at step.
func (s Streams) CallIDs(step, group, gen int) *rand.Rand {
	return s.stream(purposeCallIDs, step, group, gen)
}

// Sampling is the stream of the tokens of call number call (0-based, in
// the episode's call order) of rollout (group, gen) at step.
func (s Streams) Sampling(step, group, gen, call int) *rand.Rand {
	return s.stream(purposeSampling, step, group, gen, call)
}
