package trainer

import (
	"fmt"
	"io"
	"math"
	"time"
)

// progressLine prints one line per step to stderr: the step, its reward and
// loss, the trained rows and tokens, the speed and the time left.
type progressLine struct {
	w       io.Writer
	quiet   bool
	total   int
	start   time.Time
	steps   int
	rewards []float64
}

func newProgressLine(w io.Writer, quiet bool, total int) *progressLine {
	return &progressLine{w: w, quiet: quiet, total: total, start: time.Now()}
}

func (p *progressLine) step(m Metrics) {
	p.steps++
	p.rewards = append(p.rewards, float64(m.RewardMean))
	if p.quiet {
		return
	}
	el := time.Since(p.start)
	eta := etaString(float64(el) / float64(p.steps) * float64(p.total-m.Step))
	skipped := ""
	if m.SkippedUpdate {
		skipped = " | UPDATE SKIPPED (non-finite gradient)"
	}
	fmt.Fprintf(p.w, "step %*d/%d | reward %.3f ± %.3f | loss %+.4f | grad %.3f | lr %.2e | rows %d+%d pad, %d traces, %d masked | %d tok, %.0f tok/s, reuse %.2fx | %.2fs, eta %v%s\n",
		len(fmt.Sprint(p.total)), m.Step, p.total, m.RewardMean, m.RewardStd, m.Loss, m.GradNorm, m.LR,
		m.PhysicalRows, m.PaddingRows, m.Traces, m.MaskedRollouts, m.EligibleTokens, m.TokensPerS, m.PrefixReuse, m.TimeS, eta, skipped)
}

// progressDone prints the run's summary.
func (t *Trainer) progressDone() {
	p := t.progress
	if p.quiet || p.steps == 0 {
		return
	}
	n, first, last := rewardEnds(p.rewards)
	fmt.Fprintf(p.w, "train: %d steps in %v; mean reward of the first %d steps %.3f, of the last %d %.3f; metrics in %s/metrics.jsonl\n",
		p.steps, time.Since(p.start).Round(time.Second), n, first, n, last, t.out)
}

// RewardEnds returns the mean reward of a run's first n and last n steps,
// n = min(10, len(ms)): what the run's summary line prints and the learning
// guards compare.
func RewardEnds(ms []Metrics) (n int, first, last float64) {
	r := make([]float64, len(ms))
	for i, m := range ms {
		r[i] = float64(m.RewardMean)
	}
	return rewardEnds(r)
}

func rewardEnds(rewards []float64) (n int, first, last float64) {
	n = min(10, len(rewards))
	first, _ = meanStd(rewards[:n])
	last, _ = meanStd(rewards[len(rewards)-n:])
	return n, first, last
}

// etaString renders a remaining time of ns nanoseconds, rounded to the
// second; beyond what a time.Duration holds (292 years) it says so rather
// than overflowing to a negative time.
func etaString(ns float64) string {
	if !(ns < float64(math.MaxInt64)) {
		return ">292y"
	}
	return time.Duration(ns).Round(time.Second).String()
}
