package collective

import (
	"fmt"
	"sync"
	"time"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// Local returns n communicators of ranks that are goroutines of this
// process, one per backend of mems (host-memory backends, such as
// kernels/cpu): every collective moves data through the host. It exists to
// test data-parallel logic without a launcher; it is not a transport.
func Local(mems []kernels.Backend) []Comm {
	g := &localGroup{n: len(mems), slots: make([][]byte, len(mems)), arrived: make([]bool, len(mems)), read: make([]bool, len(mems))}
	g.cond = sync.NewCond(&g.mu)
	out := make([]Comm, len(mems))
	for r, m := range mems {
		out[r] = &localComm{g: g, rank: r, mem: m}
	}
	return out
}

type localGroup struct {
	n       int
	mu      sync.Mutex
	cond    *sync.Cond
	slots   [][]byte // each rank's contribution to the current collective
	op      string
	come    int    // ranks arrived at the current collective
	gen     uint64 // collectives completed
	left    int    // ranks yet to read the completed collective's slots
	abort   int    // the rank that aborted, +1 (0: none)
	timeout time.Duration
	failed  error  // a collective timed out: every later one fails with this
	arrived []bool // who deposited in the current collective
	read    []bool // who read the completed one's slots
}

// SetTimeout makes a collective that has waited d for the other ranks fail
// naming the ranks that did not come (0: wait forever); it applies to every
// rank of the group.
func (c *localComm) SetTimeout(d time.Duration) {
	c.g.mu.Lock()
	defer c.g.mu.Unlock()
	c.g.timeout = max(d, 0)
}

// wait waits on the group's condition while cond holds; after the timeout
// it fails the group naming the ranks missing (those missing reports true
// for). g.mu is held.
func (c *localComm) wait(op string, cond func() bool, missing func(r int) bool) error {
	g := c.g
	var deadline time.Time
	if g.timeout > 0 {
		deadline = time.Now().Add(g.timeout)
		t := time.AfterFunc(g.timeout, func() { g.mu.Lock(); g.cond.Broadcast(); g.mu.Unlock() })
		defer t.Stop()
	}
	for cond() && g.abort == 0 && g.failed == nil {
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			var silent []int
			for r := range g.n {
				if missing(r) {
					silent = append(silent, r)
				}
			}
			g.failed = SilentError(c.rank, g.timeout, op, silent, "did not reach it")
			g.cond.Broadcast()
			break
		}
		g.cond.Wait()
	}
	return g.failed
}

type localComm struct {
	g    *localGroup
	rank int
	mem  kernels.Backend
}

func (c *localComm) Rank() int    { return c.rank }
func (c *localComm) Size() int    { return c.g.n }
func (c *localComm) Name() string { return "local" }
func (c *localComm) Close() error { return nil }

// Abort makes every rank's pending and later collectives fail.
func (c *localComm) Abort(int) {
	g := c.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.abort == 0 {
		g.abort = c.rank + 1
	}
	g.cond.Broadcast()
}

// exchange deposits mine and returns every rank's contribution once all
// have arrived; op must match across ranks.
func (c *localComm) exchange(op string, mine []byte) ([][]byte, error) {
	g := c.g
	g.mu.Lock()
	defer g.mu.Unlock()
	aborted := func() error {
		if g.abort != 0 {
			return fmt.Errorf("dist: rank %d aborted the run", g.abort-1)
		}
		return nil
	}
	// The previous collective is still being read.
	if err := c.wait(op, func() bool { return g.left > 0 }, func(r int) bool { return !g.read[r] }); err != nil {
		return nil, err
	}
	if err := aborted(); err != nil {
		return nil, err
	}
	if g.come == 0 {
		g.op = op
	} else if g.op != op {
		return nil, fmt.Errorf("dist: rank %d called %s while other ranks called %s", c.rank, op, g.op)
	}
	g.slots[c.rank] = mine
	g.arrived[c.rank] = true
	g.come++
	gen := g.gen
	if g.come == g.n {
		g.come, g.left = 0, g.n
		clear(g.arrived)
		clear(g.read)
		g.gen++
		g.cond.Broadcast()
	}
	if err := c.wait(op, func() bool { return g.gen == gen }, func(r int) bool { return !g.arrived[r] }); err != nil {
		return nil, err
	}
	if err := aborted(); err != nil {
		return nil, err
	}
	out := make([][]byte, g.n)
	copy(out, g.slots)
	g.read[c.rank] = true
	g.left--
	if g.left == 0 {
		g.cond.Broadcast()
	}
	return out, nil
}

func (c *localComm) host(b kernels.Buf) ([]byte, error) {
	switch b.DType {
	case kernels.F32:
		v := make([]float32, b.N)
		c.mem.DownloadF32(v, b)
		return f32Bytes(v), c.mem.Sync()
	case kernels.I32:
		v := make([]int32, b.N)
		c.mem.DownloadI32(v, b)
		return i32Bytes(v), c.mem.Sync()
	case kernels.BF16:
		h, ok := c.mem.(interface{ BF16(kernels.Buf) []uint16 })
		if !ok {
			break
		}
		if err := c.mem.Sync(); err != nil {
			return nil, err
		}
		v := h.BF16(b)
		out := make([]byte, 2*len(v))
		for i, x := range v {
			out[2*i], out[2*i+1] = byte(x), byte(x>>8)
		}
		return out, nil
	}
	return nil, fmt.Errorf("dist: local: %s buffers", b.DType)
}

func (c *localComm) put(b kernels.Buf, data []byte) error {
	switch b.DType {
	case kernels.F32:
		c.mem.UploadF32(b, bytesF32(data))
	case kernels.I32:
		c.mem.UploadI32(b, bytesI32(data))
	case kernels.BF16:
		v := c.mem.(interface{ BF16(kernels.Buf) []uint16 }).BF16(b)
		for i := range v {
			v[i] = uint16(data[2*i]) | uint16(data[2*i+1])<<8
		}
	}
	return c.mem.Sync()
}

func (c *localComm) AllReduceSum(buf kernels.Buf) error {
	if buf.DType == kernels.BF16 {
		return fmt.Errorf("dist: local: all-reduce of bf16 (sums are F32 or I32)")
	}
	mine, err := c.host(buf)
	if err != nil {
		return err
	}
	all, err := c.exchange("AllReduceSum", mine)
	if err != nil {
		return err
	}
	return c.put(buf, sumBytes(buf.DType, all, 0, buf.N))
}

func (c *localComm) ReduceScatterSum(dst, src kernels.Buf) error {
	if src.N != dst.N*c.g.n || src.DType != dst.DType {
		return fmt.Errorf("dist: reduce-scatter of %d × %s into %d × %s over %d ranks", src.N, src.DType, dst.N, dst.DType, c.g.n)
	}
	if src.DType == kernels.BF16 {
		return fmt.Errorf("dist: local: reduce-scatter of bf16 (sums are F32 or I32)")
	}
	mine, err := c.host(src)
	if err != nil {
		return err
	}
	all, err := c.exchange("ReduceScatterSum", mine)
	if err != nil {
		return err
	}
	return c.put(dst, sumBytes(dst.DType, all, c.rank*dst.N, dst.N))
}

func (c *localComm) AllGather(dst, src kernels.Buf) error {
	if dst.N != src.N*c.g.n || src.DType != dst.DType {
		return fmt.Errorf("dist: all-gather of %d × %s into %d × %s over %d ranks", src.N, src.DType, dst.N, dst.DType, c.g.n)
	}
	mine, err := c.host(src)
	if err != nil {
		return err
	}
	all, err := c.exchange("AllGather", mine)
	if err != nil {
		return err
	}
	var out []byte
	for _, a := range all {
		out = append(out, a...)
	}
	return c.put(dst, out)
}

func (c *localComm) Broadcast(buf kernels.Buf, root int) error {
	if root < 0 || root >= c.g.n {
		return fmt.Errorf("dist: broadcast from rank %d of %d", root, c.g.n)
	}
	mine, err := c.host(buf)
	if err != nil {
		return err
	}
	all, err := c.exchange(fmt.Sprintf("Broadcast(%d)", root), mine)
	if err != nil {
		return err
	}
	return c.put(buf, all[root])
}

func (c *localComm) Barrier() error {
	_, err := c.exchange("Barrier", nil)
	return err
}

// sumBytes sums n elements from element off of every rank's bytes, in rank
// order (the same order, so the same bits, for every rank).
func sumBytes(dt kernels.DType, all [][]byte, off, n int) []byte {
	if dt == kernels.I32 {
		s := make([]int32, n)
		for _, a := range all {
			v := bytesI32(a)
			for i := range s {
				s[i] += v[off+i]
			}
		}
		return i32Bytes(s)
	}
	s := make([]float32, n)
	for _, a := range all {
		v := bytesF32(a)
		for i := range s {
			s[i] += v[off+i]
		}
	}
	return f32Bytes(s)
}
