package cpu

// The host's fp32 FMA peak, measured: what the profile of `train bench
// --profile` divides each op's FLOP rate by.
//
// The peak loops (gen_kernels_amd64.s, fmaPeakAVX512 and fmaPeakAVX2) run
// independent register FMAs with no memory access, more chains than latency
// × throughput on any x86 core, so they run at the FMA units' throughput and
// at the clock the core holds under that load. Each width is timed alone on
// one locked OS thread and on threads locked threads started together, in
// trials of about 2 ms, and the best trial counts: on a shared machine other
// processes steal some trials, and no trial can run faster than the
// hardware.

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
)

// Peak is the measured fp32 FMA throughput of one vector width.
type Peak struct {
	Width      string  // "avx512" (16 lanes) or "avx2" (8 lanes)
	Threads    int     // threads of the concurrent measurement
	PerThread  float64 // GFLOP/s of one thread running alone
	Concurrent float64 // GFLOP/s of Threads threads running at once, summed
}

// GFLOPS is the peak of Threads threads: the larger of the concurrent
// measurement and Threads × PerThread (a loaded machine lowers the first, so
// a fraction of it is never flattered).
func (p Peak) GFLOPS() float64 { return max(p.Concurrent, float64(p.Threads)*p.PerThread) }

// peakLoop is one width's peak loop and the FLOPs of one of its iterations.
type peakLoop struct {
	width string
	run   func(n int)
	flops float64
}

func peakLoops(f CPUFacts) []peakLoop {
	var l []peakLoop
	if hasAsm && f.AVX512 {
		l = append(l, peakLoop{"avx512", fmaPeakAVX512, 2 * 16 * peakChainsAVX512})
	}
	if hasAsm && f.AVX2 {
		l = append(l, peakLoop{"avx2", fmaPeakAVX2, 2 * 8 * peakChainsAVX2})
	}
	return l
}

// Chains per iteration of the generated peak loops (asmgen.PeakChains*).
const (
	peakChainsAVX512 = 16
	peakChainsAVX2   = 12
)

// MeasurePeak measures every vector width this CPU can run, widest first,
// with trials trials per measurement (about 2 ms each). It returns nothing
// on a build without the assembly kernels.
func MeasurePeak(threads, trials int) []Peak {
	threads, trials = max(threads, 1), max(trials, 1)
	var out []Peak
	for _, l := range peakLoops(simd.CPU) {
		n := peakIters(l, 2*time.Millisecond)
		p := Peak{Width: l.width, Threads: threads}
		for i := 0; i < trials; i++ {
			p.PerThread = max(p.PerThread, timePeak(l, n, 1))
			p.Concurrent = max(p.Concurrent, timePeak(l, n, threads))
		}
		out = append(out, p)
	}
	return out
}

// peakIters is the iteration count that runs l for about d.
func peakIters(l peakLoop, d time.Duration) int {
	n := 1 << 12
	for {
		t0 := time.Now()
		l.run(n)
		if el := time.Since(t0); el >= d/8 || n >= 1<<30 {
			return max(1, int(float64(n)*float64(d)/float64(max(el, 1))))
		}
		n *= 2
	}
}

// timePeak runs l for n iterations on each of threads locked OS threads,
// started together, and returns their summed GFLOP/s (the slowest thread's
// time for all).
func timePeak(l peakLoop, n, threads int) float64 {
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	el := make([]time.Duration, threads)
	ready.Add(threads)
	done.Add(threads)
	for i := range threads {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			ready.Done()
			<-start
			t0 := time.Now()
			l.run(n)
			el[i] = time.Since(t0)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	slowest := time.Duration(0)
	for _, d := range el {
		slowest = max(slowest, d)
	}
	return float64(threads) * float64(n) * l.flops / max(slowest.Seconds(), 1e-9) / 1e9
}

// PeakSummary measures the host's fp32 FMA peak for threads threads (the
// fastest vector width's, MeasurePeak with 20 trials) and says how, for a
// profile's header. It returns a zero Peak and the reason on a build or CPU
// without the peak loops.
func PeakSummary(threads int) (peak Peak, how string) {
	const trials = 20
	peaks := MeasurePeak(threads, trials)
	if len(peaks) == 0 {
		return Peak{}, fmt.Sprintf("no FMA peak: this build (%s) or CPU has no vector peak loop", goTarget)
	}
	best := peaks[0]
	for _, p := range peaks[1:] {
		if p.GFLOPS() > best.GFLOPS() {
			best = p
		}
	}
	lanes, reg := 16, "zmm"
	if best.Width == "avx2" {
		lanes, reg = 8, "ymm"
	}
	chains := peakChainsAVX512
	if best.Width == "avx2" {
		chains = peakChainsAVX2
	}
	var others []string
	for _, p := range peaks {
		if p.Width != best.Width {
			others = append(others, fmt.Sprintf("%s %.1f", p.Width, p.GFLOPS()))
		}
	}
	how = fmt.Sprintf("fp32 FMA peak %.1f GFLOP/s on %d threads of %s: the %s peak loop (%d independent FMA chains of %d lanes in %s registers, no memory operands), best of %d trials of ~2 ms, the larger of %d threads at once (%.1f) and %d × one thread alone (%.1f)",
		best.GFLOPS(), threads, simd.CPU, best.Width, chains, lanes, reg, trials, threads, best.Concurrent, threads, best.PerThread)
	if len(others) > 0 {
		how += "; other widths: " + strings.Join(others, ", ")
	}
	return best, how
}
