//go:build cgo

package cuda

import (
	"embed"
	"fmt"
	"io/fs"
	"math"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/tracegrpo/tracegrpo/kernels"
)

//go:embed csrc/gen_*.ptx csrc/gen_*.sm_90.cubin
var ptxFiles embed.FS

var entryRE = regexp.MustCompile(`\.entry\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(`)

// Backend is the CUDA backend. It implements kernels.Backend; see the
// package doc for threads, errors and numerics.
type Backend struct {
	mu  sync.Mutex
	d   *device
	opt Options
	err error
	// logitsGiven: Options.LogitsScratch was set (SizeLogitsScratch keeps it).
	logitsGiven bool

	flags    uintptr // (1) I32: data-error bits set by kernels
	partials uintptr // (reduceBlocks) float64: SumSquares partials

	scratch map[string]scratchBuf // lazily grown work buffers, kept
	closed  bool
	modules []ModuleLoad // how each kernel file was loaded
	// lazy: a kernel file is loaded at the first launch of one of its
	// kernels (TRACEGRPO_CUDA_LOAD=lazy); pending maps each entry point of
	// a file not loaded yet to the file.
	lazy    bool
	pending map[string]string

	led ledger // the launch ledger (StartLedger)
	// A timed ledger's events, one before each launch, and the first
	// error recording one (StartTimedLedger).
	marks   []event
	markErr error
}

type scratchBuf struct {
	p     uintptr
	bytes int
}

const threads = 256

// Open loads the driver and cuBLAS, creates a context on opt.Device, and
// JIT-compiles the embedded kernels for it.
func Open(opt Options) (kernels.Backend, error) {
	b, err := OpenBackend(opt)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// OpenBackend is Open returning the concrete type (for Info, Close, Time).
func OpenBackend(opt Options) (*Backend, error) {
	mode, err := opt.Matmul.resolve()
	if err != nil {
		return nil, err
	}
	opt.Matmul = mode
	d, err := openDevice(opt)
	if err != nil {
		return nil, err
	}
	if d.lt == nil {
		opt.BlasLtLib = ltNone // the plan counts no cuBLASLt workspace
	}
	b := &Backend{d: d, opt: opt, scratch: map[string]scratchBuf{}, logitsGiven: opt.LogitsScratch > 0}
	if err := b.loadKernels(); err != nil {
		d.close()
		return nil, err
	}
	if b.flags, err = d.alloc(4); err != nil {
		d.close()
		return nil, err
	}
	if b.partials, err = d.alloc(8 * reduceBlocks); err != nil {
		d.close()
		return nil, err
	}
	return b, nil
}

var _ kernels.Experts = (*Backend)(nil)

// ModuleLoad says how one kernel file was loaded: from its sm_90 cubin
// (machine code assembled here, committed beside the PTX: nothing to
// compile at start), or from its PTX, which the driver compiles for the
// device (any other compute capability, or a cubin the driver refused:
// Err says why).
type ModuleLoad struct {
	File  string // csrc/gen_X.ptx
	Cubin bool
	Err   error // the cubin's load error, when the PTX was loaded instead
}

// cubinFile is the sm_90 cubin committed beside a PTX file.
func cubinFile(ptx string) string { return strings.TrimSuffix(ptx, ".ptx") + ".sm_90.cubin" }

// Modules says how each kernel file was loaded.
func (b *Backend) Modules() []ModuleLoad { return append([]ModuleLoad(nil), b.modules...) }

func (b *Backend) loadKernels() error {
	names, err := fs.Glob(ptxFiles, "csrc/gen_*.ptx")
	if err != nil {
		return err
	}
	sort.Strings(names)
	if b.opt.kernelFiles != nil {
		names = b.opt.kernelFiles
	} else if env := os.Getenv("TRACEGRPO_CUDA_MODULES"); env != "" {
		names = nil
		for _, m := range strings.Split(env, ",") {
			n := "csrc/gen_" + strings.TrimSpace(m) + ".ptx"
			if _, err := fs.Stat(ptxFiles, n); err != nil {
				return fmt.Errorf("cuda: $TRACEGRPO_CUDA_MODULES names %q: no kernel file %s", m, n)
			}
			names = append(names, n)
		}
	}
	switch env := os.Getenv(loadEnv); env {
	case "", "all":
	case "lazy":
		b.lazy, b.pending = true, map[string]string{}
	default:
		return fmt.Errorf("cuda: $%s=%q: want all (every kernel file at Open, the default) or lazy (each at its first launch)", loadEnv, env)
	}
	for _, n := range names {
		if b.lazy {
			text, err := ptxFiles.ReadFile(n)
			if err != nil {
				return err
			}
			for _, e := range ptxEntries(text) {
				b.pending[e] = n
			}
			continue
		}
		if err := b.loadFile(n); err != nil {
			return err
		}
	}
	return nil
}

// loadEnv chooses when the kernel files load: all at Open (the default: a
// device that refuses one fails at Open), or lazy, each at the first launch
// of one of its kernels (gpu-check's compute-sanitizer runs: the sanitizer
// instruments only the files the cases use, not the megabyte of attention
// PTX a sampling case never launches). A lazy file that fails to load fails
// its launch (the backend's sticky error).
const loadEnv = "TRACEGRPO_CUDA_LOAD"

// ptxEntries is the kernels' entry points of a PTX file.
func ptxEntries(text []byte) []string {
	var entries []string
	for _, m := range entryRE.FindAllSubmatch(text, -1) {
		entries = append(entries, string(m[1]))
	}
	return entries
}

// loadFile loads kernel file n (csrc/gen_X.ptx): its sm_90 cubin on a CC
// 9.0 device, else (or when the driver refuses the cubin) its PTX.
func (b *Backend) loadFile(n string) error {
	text, err := ptxFiles.ReadFile(n)
	if err != nil {
		return err
	}
	entries := ptxEntries(text)
	ml := ModuleLoad{File: n}
	if b.d.info.Major == 9 && b.d.info.Minor == 0 && !b.opt.PTXOnly {
		if cubin, err := ptxFiles.ReadFile(cubinFile(n)); err == nil {
			if ml.Err = b.d.loadModule(cubinFile(n), cubin, entries); ml.Err == nil {
				ml.Cubin = true
				b.modules = append(b.modules, ml)
				return nil
			}
		}
	}
	if err := b.d.loadModule(n, text, entries); err != nil {
		return err
	}
	b.modules = append(b.modules, ml)
	return nil
}

// ModulesLine says how many kernel files are loaded and how (gpu-check
// prints it): "modules: 24 of 24 loaded (24 from sm_90 cubins)".
func (b *Backend) ModulesLine() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	files, _ := fs.Glob(ptxFiles, "csrc/gen_*.ptx")
	cubins := 0
	var names []string
	for _, m := range b.modules {
		if m.Cubin {
			cubins++
		}
		names = append(names, strings.TrimSuffix(strings.TrimPrefix(m.File, "csrc/gen_"), ".ptx"))
	}
	s := fmt.Sprintf("modules: %d of %d loaded (%d from sm_90 cubins)", len(b.modules), len(files), cubins)
	if b.lazy {
		s += ", lazily: " + strings.Join(names, " ")
	}
	return s
}

// Info describes the device.
func (b *Backend) Info() DeviceInfo { return b.d.info }

// MemInfo returns the device memory free now and in all (cuMemGetInfo):
// a run checks its memory plan against free before allocating.
func (b *Backend) MemInfo() (free, total int64, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.d.memInfo()
}

// MatmulMode is the GEMM arithmetic the backend uses.
func (b *Backend) MatmulMode() MatmulMode { return b.opt.Matmul }

// Close frees the backend's own buffers and releases the context. Buffers
// from Alloc must be freed first.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	b.dropMarks()
	for _, s := range b.scratch {
		b.d.free(s.p)
	}
	b.d.free(b.flags)
	b.d.free(b.partials)
	return b.d.close()
}

// ReserveWorkspace allocates, now, every scratch buffer the ops of w will
// ask for, at the size PlanWorkspace counts: a run allocates all its
// device memory before its first step, and holds exactly its plan.
func (b *Backend) ReserveWorkspace(w kernels.Workload) error {
	b.mu.Lock()
	for name, n := range workspaceSizes(w, b.opt) {
		b.work(name, n)
	}
	b.mu.Unlock()
	return b.Sync()
}

// SizeLogitsScratch sizes the LM head's logits scratch from the memory a
// run's plan leaves free (LogitsScratchFor), unless Options.LogitsScratch
// was given, and reports whether the size changed (the plan, which counts
// the scratch, must then be made again). Call it before the first
// TokenLogprob.
func (b *Backend) SizeLogitsScratch(headroom int64) (elements int, changed bool) {
	if b.logitsGiven {
		return b.opt.LogitsScratch, false
	}
	el := LogitsScratchFor(headroom)
	cur := b.opt.LogitsScratch
	if cur == 0 {
		cur = defaultLogitsScratch
	}
	b.opt.LogitsScratch = el
	return el, el != cur
}

// PlanWorkspace is PlanWorkspace for this backend's options.
func (b *Backend) PlanWorkspace(w kernels.Workload) int64 { return PlanWorkspace(w, b.opt) }

// Allocated returns the device memory the backend holds now through its
// own allocations (buffers and its ops' scratch) and the most it held at
// once; what the driver and cuBLAS keep for themselves is not included.
// The memory plan's CUDA figures are checked against it.
func (b *Backend) Allocated() (live, peak int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.d.live, b.d.peak
}

// Name implements kernels.Memory.
func (b *Backend) Name() string { return "cuda" }

// fail records the first error since the last Sync.
func (b *Backend) fail(what string, code status) {
	if code != 0 && b.err == nil {
		b.err = fmt.Errorf("cuda: %s: %s", what, b.d.errText(code))
	}
}

func (b *Backend) failBlas(what string, code status) {
	if code != 0 && b.err == nil {
		b.err = fmt.Errorf("cuda: %s: %s", what, blasStatusText(code))
	}
}

// Alloc implements kernels.Memory.
func (b *Backend) Alloc(dt kernels.DType, n int) (kernels.Buf, error) {
	if n < 0 {
		panic(fmt.Sprintf("cuda: Alloc of %d elements", n))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	p, err := b.d.alloc(max(n*dt.Size(), 4))
	if err != nil {
		return kernels.Buf{}, err
	}
	return kernels.Buf{Handle: p, N: n, DType: dt}, nil
}

// Free implements kernels.Memory.
func (b *Backend) Free(buf kernels.Buf) {
	if buf.Off != 0 {
		panic(fmt.Sprintf("cuda: Free of a view (off %d, n %d)", buf.Off, buf.N))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail("cuMemFree", b.d.free(buf.Handle))
}

// ptr is the device address of a view's first element.
func ptr(b kernels.Buf) uintptr { return b.Handle + uintptr(b.Off*b.DType.Size()) }

func want(b kernels.Buf, dt kernels.DType, n int, what string) {
	if b.DType != dt || b.N != n {
		panic(fmt.Sprintf("cuda: %s is %d × %s, want %d × %s", what, b.N, b.DType, n, dt))
	}
}

// UploadF32 implements kernels.Memory.
func (b *Backend) UploadF32(dst kernels.Buf, src []float32) {
	want(dst, kernels.F32, len(src), "UploadF32 dst")
	b.upload(dst, unsafe.Pointer(unsafe.SliceData(src)), 4*len(src))
}

// UploadI32 implements kernels.Memory.
func (b *Backend) UploadI32(dst kernels.Buf, src []int32) {
	want(dst, kernels.I32, len(src), "UploadI32 dst")
	b.upload(dst, unsafe.Pointer(unsafe.SliceData(src)), 4*len(src))
}

// UploadBF16 copies raw bfloat16 bits into a BF16 buffer.
func (b *Backend) UploadBF16(dst kernels.Buf, src []uint16) {
	want(dst, kernels.BF16, len(src), "UploadBF16 dst")
	b.upload(dst, unsafe.Pointer(unsafe.SliceData(src)), 2*len(src))
}

func (b *Backend) upload(dst kernels.Buf, src unsafe.Pointer, bytes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail("upload", b.d.htod(ptr(dst), src, bytes))
}

// DownloadF32 implements kernels.Memory.
func (b *Backend) DownloadF32(dst []float32, src kernels.Buf) {
	want(src, kernels.F32, len(dst), "DownloadF32 src")
	b.download(unsafe.Pointer(unsafe.SliceData(dst)), src, 4*len(dst))
}

// DownloadI32 implements kernels.Memory.
func (b *Backend) DownloadI32(dst []int32, src kernels.Buf) {
	want(src, kernels.I32, len(dst), "DownloadI32 src")
	b.download(unsafe.Pointer(unsafe.SliceData(dst)), src, 4*len(dst))
}

// DownloadBF16 copies a BF16 buffer's raw bits to the host.
func (b *Backend) DownloadBF16(dst []uint16, src kernels.Buf) {
	want(src, kernels.BF16, len(dst), "DownloadBF16 src")
	b.download(unsafe.Pointer(unsafe.SliceData(dst)), src, 2*len(dst))
}

func (b *Backend) download(dst unsafe.Pointer, src kernels.Buf, bytes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail("download", b.d.dtoh(dst, ptr(src), bytes))
}

// flagNames names the data-error bits of csrc/common.cuh.
var flagNames = []struct {
	bit  int32
	text string
}{
	{1, "Embedding: a token id is outside [0, V) (its row was zeroed)"},
	{2, "ScatterRows: an index is outside the destination rows (that row was skipped)"},
	{4, "TokenLogprob: a target id is >= V (the row was treated as masked)"},
	{8, "AttentionDecode: a length is outside [1, Tmax] (that sequence got zeros)"},
	{16, "Attention: cu_seqlens does not run from 0 to T, or a sequence is longer than Seqs.MaxLen or negative (outputs unspecified)"},
	{32, "Rope: a position is outside the cos/sin tables (that row was left unchanged)"},
	{64, "ExpertRoute: an expert id is outside [0, E) (routed to expert 0)"},
	{128, "TreeAttention: the tree breaks a rule of kernels.Tree (offsets, parents, ends, MaxLen or MaxCtx; outputs unspecified)"},
}

// Sync implements kernels.Memory: it waits for the stream and returns the
// first error since the previous Sync, including data errors the kernels
// flagged, then clears it.
func (b *Backend) Sync() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail("cuStreamSynchronize", b.d.sync())
	var flags int32
	if code := b.d.dtoh(unsafe.Pointer(&flags), b.flags, 4); code != 0 {
		b.fail("read error flags", code)
	} else if flags != 0 {
		var msgs []string
		for _, f := range flagNames {
			if flags&f.bit != 0 {
				msgs = append(msgs, f.text)
			}
		}
		if b.err == nil {
			b.err = fmt.Errorf("cuda: data error found on the device: %s", strings.Join(msgs, "; "))
		}
		b.fail("clear error flags", b.d.memset32(b.flags, 0, 1))
	}
	err := b.err
	b.err = nil
	return err
}

// work returns a scratch buffer of at least bytes, growing it if needed
// (the old one is freed after the stream drains). The model sizes its
// shapes once, so this allocates only on the first steps.
func (b *Backend) work(name string, bytes int) uintptr {
	s := b.scratch[name]
	if s.bytes >= bytes {
		return s.p
	}
	if s.p != 0 {
		b.fail("cuStreamSynchronize", b.d.sync())
		b.d.free(s.p)
	}
	bytes = max(bytes, workMinBytes) // as PlanWorkspace sizes it
	p, err := b.d.alloc(bytes)
	if err != nil {
		if b.err == nil {
			b.err = fmt.Errorf("cuda: scratch %s: %w", name, err)
		}
		delete(b.scratch, name)
		return 0
	}
	b.scratch[name] = scratchBuf{p: p, bytes: bytes}
	return p
}

// Kernel argument slots.
func pa(b kernels.Buf) uint64 { return uint64(ptr(b)) }
func pu(p uintptr) uint64     { return uint64(p) }
func ia(v int) uint64 {
	if v > math.MaxInt32 || v < math.MinInt32 {
		panic(fmt.Sprintf("cuda: %d does not fit a kernel's int argument", v))
	}
	return uint64(uint32(int32(v)))
}
func la(v int) uint64     { return uint64(int64(v)) }
func fa(v float32) uint64 { return uint64(math.Float32bits(v)) }
func da(v float64) uint64 { return math.Float64bits(v) }

// launch queues kernel name on grid (gx,gy,gz) of 1-D blocks of bx threads;
// c is what it moves and computes, for the ledger. The caller holds b.mu.
func (b *Backend) launch(name string, c cost, gx, gy, gz, bx, smem int, args ...uint64) {
	fn, ok := b.d.fns[name]
	if !ok && b.lazy {
		if file, found := b.pending[name]; found {
			err := b.loadFile(file)
			for e, f := range b.pending {
				if f == file {
					delete(b.pending, e)
				}
			}
			if err != nil {
				if b.err == nil {
					b.err = err
				}
				return
			}
			fn, ok = b.d.fns[name]
		}
	}
	if !ok {
		panic("cuda: no kernel " + name + " in the embedded PTX")
	}
	if gx <= 0 || gy <= 0 || gz <= 0 {
		return
	}
	if gy > 65535 || gz > 65535 {
		panic(fmt.Sprintf("cuda: %s: grid (%d,%d,%d) exceeds the y/z limit 65535", name, gx, gy, gz))
	}
	b.led.record(Launch{Kernel: name, Kind: KindSIMT, Grid: [3]int{gx, gy, gz}, Block: bx, Smem: smem,
		Read: c.read, Write: c.write, FLOPs: c.flops, Inflight: c.inflight})
	b.fail("launch "+name, b.d.launch(fn, gx, gy, gz, bx, smem, args))
}

// copyDtoD queues a device-to-device copy of bytes (a ledger entry).
func (b *Backend) copyDtoD(dst, src uintptr, bytes int) {
	if bytes == 0 {
		return
	}
	b.led.record(Launch{Kernel: "memcpy", Kind: KindCopy, Read: int64(bytes), Write: int64(bytes), Inflight: 16})
	b.fail("cuMemcpyDtoDAsync", b.d.dtod(dst, src, bytes))
}

// StartLedger clears the launch ledger and records every launch from now
// on, until TakeLedger.
func (b *Backend) StartLedger() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.led = ledger{on: true}
}

// StartTimedLedger is StartLedger with every launch timed on the device:
// an event is recorded on the stream before each launch is queued, and
// TakeLedger sets each launch's Measured, the time from its event to the
// next (the last to an event after it). The events cost the host about a
// microsecond a launch and the device nothing measurable.
func (b *Backend) StartTimedLedger() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dropMarks()
	b.led = ledger{on: true}
	b.led.mark = func() {
		ev, err := b.d.newEvent()
		if err == nil {
			if err = b.d.record(ev); err != nil {
				b.d.destroyEvent(ev)
			}
		}
		if err != nil {
			if b.markErr == nil {
				b.markErr = err
			}
			ev = event{}
		}
		b.marks = append(b.marks, ev)
	}
}

// TakeLedger returns the launches recorded since StartLedger and stops
// recording. A timed ledger's launches get their Measured times (it waits
// for the device); an event that failed fails the ledger's times, reported
// by Sync.
func (b *Backend) TakeLedger() []Launch {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.led.entries
	if b.led.mark != nil && len(b.marks) == len(e) && len(e) > 0 && b.markErr == nil {
		last, err := b.d.newEvent()
		if err == nil {
			err = b.d.record(last)
		}
		if err == nil {
			for i := range e {
				next := last
				if i+1 < len(e) {
					next = b.marks[i+1]
				}
				ms, err2 := b.d.elapsed(b.marks[i], next)
				if err2 != nil {
					err = err2
					break
				}
				e[i].Measured = float64(ms) / 1e3
			}
			b.d.destroyEvent(last)
		}
		if err != nil && b.err == nil {
			b.err = fmt.Errorf("cuda: timed ledger: %w", err)
		}
	} else if b.markErr != nil && b.err == nil {
		b.err = fmt.Errorf("cuda: timed ledger: %w", b.markErr)
	}
	b.dropMarks()
	b.led = ledger{}
	return e
}

// dropMarks destroys a timed ledger's events (the caller holds b.mu).
func (b *Backend) dropMarks() {
	for _, ev := range b.marks {
		if ev.p != nil {
			b.d.destroyEvent(ev)
		}
	}
	b.marks, b.markErr = nil, nil
}

// blocks is the grid size of a grid-stride loop over n elements.
func (b *Backend) blocks(n int) int {
	return b.gridBlocks(max(1, min((n+threads-1)/threads, 32*b.d.info.SMs)))
}

// gridBlocks is a grid-stride kernel's grid of n blocks, capped at
// Options.maxBlocks when that is set (tests).
func (b *Backend) gridBlocks(n int) int {
	if b.opt.maxBlocks > 0 {
		return min(n, b.opt.maxBlocks)
	}
	return n
}

// elementwise launches a grid-stride kernel over n elements.
func (b *Backend) elementwise(name string, c cost, n int, args ...uint64) {
	if n == 0 {
		return
	}
	b.launch(name, c, b.blocks(n), 1, 1, threads, 0, args...)
}

func (b *Backend) lock() func() {
	b.mu.Lock()
	return b.mu.Unlock
}

// Elapsed queues f's ops between two CUDA events and returns the device
// time between them (it waits for the second event): per-op timing without
// a stream sync around every op.
func (b *Backend) Elapsed(f func()) (float32, error) {
	b.mu.Lock()
	start, err := b.d.newEvent()
	if err != nil {
		b.mu.Unlock()
		return 0, err
	}
	end, err := b.d.newEvent()
	if err != nil {
		b.d.destroyEvent(start)
		b.mu.Unlock()
		return 0, err
	}
	defer func() {
		b.mu.Lock()
		b.d.destroyEvent(start)
		b.d.destroyEvent(end)
		b.mu.Unlock()
	}()
	err = b.d.record(start)
	b.mu.Unlock()
	if err != nil {
		return 0, err
	}
	f()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.d.record(end); err != nil {
		return 0, err
	}
	return b.d.elapsed(start, end)
}
