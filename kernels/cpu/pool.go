package cpu

import (
	"sync"
	"sync/atomic"
)

// task is one parallel-for body: run processes items [lo, hi) on worker w
// (0 ≤ w < threads), which indexes per-worker scratch. Ops keep their task
// values inside the Backend, so passing one to the pool allocates nothing.
type task interface {
	run(w, lo, hi int)
}

// pool is a fixed set of worker goroutines that execute parallel-for loops.
// Items are handed out in fixed grains from an atomic counter, so which worker
// runs a grain varies, but the grain boundaries never depend on the thread
// count: an op whose grains write disjoint outputs, each in a fixed order, is
// bit-identical for every thread count.
type pool struct {
	threads int
	wake    []chan struct{}
	wg      sync.WaitGroup

	t     task
	n     int
	grain int
	next  atomic.Int64
}

func newPool(threads int) *pool {
	p := &pool{threads: threads}
	for w := 1; w < threads; w++ {
		ch := make(chan struct{}, 1)
		p.wake = append(p.wake, ch)
		go p.worker(w, ch)
	}
	return p
}

func (p *pool) worker(w int, ch chan struct{}) {
	for range ch {
		p.drain(w)
		p.wg.Done()
	}
}

func (p *pool) drain(w int) {
	g := int64(p.grain)
	n := int64(p.n)
	for {
		lo := p.next.Add(g) - g
		if lo >= n {
			return
		}
		p.t.run(w, int(lo), int(min(lo+g, n)))
	}
}

// parallel runs t over items [0, n) in grains of grain items and returns when
// all are done. It is not reentrant: ops call it from the single goroutine
// that drives the Backend.
func (p *pool) parallel(t task, n, grain int) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	if p.threads == 1 || n <= grain {
		for lo := 0; lo < n; lo += grain {
			t.run(0, lo, min(lo+grain, n))
		}
		return
	}
	p.t, p.n, p.grain = t, n, grain
	p.next.Store(0)
	workers := min(p.threads-1, (n+grain-1)/grain-1)
	p.wg.Add(workers)
	for w := 0; w < workers; w++ {
		p.wake[w] <- struct{}{}
	}
	p.drain(0)
	p.wg.Wait()
	p.t = nil
}

// close stops the workers.
func (p *pool) close() {
	for _, ch := range p.wake {
		close(ch)
	}
	p.wake = nil
}
