package trainer

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/tracegrpo/tracegrpo/internal/tfevents"
)

// The recipe's logger: TensorBoard event files of the metrics under
// logger.log_dir when logger.tensorboard_enabled (NeMo RL writes them in
// <log_dir>/tensorboard; a relative log_dir is under the run directory
// here), and one note for each other back end switched on, which tracegrpo
// does not write.

// openLoggers opens the TensorBoard event file (rank 0) and notes the
// back ends not written.
func (t *Trainer) openLoggers() error {
	for _, n := range t.loaded.OtherLoggers() {
		t.logf("note: %s", n)
	}
	lg := t.cfg.Logger
	if !lg.TensorboardEnabled || t.rank != 0 {
		return nil
	}
	dir := t.logDir()
	if err := mkdirUnder(dir, t.out, "logger.log_dir"); err != nil {
		return err
	}
	tb := filepath.Join(dir, "tensorboard")
	if err := os.MkdirAll(tb, 0o755); err != nil {
		return fmt.Errorf("logger.tensorboard_enabled: %w", err)
	}
	w, err := tfevents.Create(tb)
	if err != nil {
		return fmt.Errorf("logger.tensorboard_enabled: %w", err)
	}
	t.tb = w
	t.logf("TensorBoard: %s (logger.tensorboard_enabled)", w.Path())
	return nil
}

// logDir is the directory the TensorBoard files go under (logger.log_dir,
// under the run directory when relative), or "" when they are off.
func (t *Trainer) logDir() string {
	lg := t.cfg.Logger
	if !lg.TensorboardEnabled {
		return ""
	}
	dir := string(lg.LogDir)
	if dir == "" {
		dir = "logs"
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(t.out, dir)
	}
	return dir
}

// tbLog adds a step's metrics to the event file: every number of the
// metrics line, tagged train/<name> (nested ones train/<name>/<key>).
func (t *Trainer) tbLog(m Metrics, sync bool) error {
	if t.tb == nil {
		return nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	vals := metricScalars("train", raw)
	if err := t.tb.Add(int64(m.Step), vals); err != nil {
		return fmt.Errorf("logger.tensorboard_enabled: %w", err)
	}
	return t.tb.Flush(sync)
}

// metricScalars flattens a metrics object into sorted scalars (the step
// itself is the event's step; strings other than the non-finite markers
// are skipped).
func metricScalars(prefix string, m map[string]any) []tfevents.Scalar {
	var out []tfevents.Scalar
	for k, v := range m {
		tag := prefix + "/" + k
		switch x := v.(type) {
		case float64:
			if k != "step" {
				out = append(out, tfevents.Scalar{Tag: tag, Value: float32(x)})
			}
		case bool:
			f := float32(0)
			if x {
				f = 1
			}
			out = append(out, tfevents.Scalar{Tag: tag, Value: f})
		case string: // Num's non-finite values
			f, ok := map[string]float64{"NaN": math.NaN(), "+Inf": math.Inf(1), "-Inf": math.Inf(-1)}[x]
			if ok {
				out = append(out, tfevents.Scalar{Tag: tag, Value: float32(f)})
			}
		case map[string]any:
			out = append(out, metricScalars(tag, x)...)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tag < out[j].Tag })
	return out
}

// mkdirUnder creates dir when it lies under the run directory out; a
// directory outside it is never created implicitly: it must exist (key
// names the setting that named it).
func mkdirUnder(dir, out, key string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	root, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	if rel, err := filepath.Rel(root, abs); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return os.MkdirAll(abs, 0o755)
	}
	st, err := os.Stat(abs)
	if err != nil {
		return fmt.Errorf("%s %s: %w; it is outside the run directory %s, and train creates no directory outside --out: create it first (or give a path under --out)", key, dir, err, out)
	}
	if !st.IsDir() {
		return fmt.Errorf("%s %s: not a directory", key, dir)
	}
	return nil
}
