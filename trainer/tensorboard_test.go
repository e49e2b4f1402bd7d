package trainer

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/internal/tfevents"
)

// TestTensorBoardEventsOfTheMetrics: logger.tensorboard_enabled writes a
// TensorBoard event file under <out>/<log_dir>/tensorboard whose events
// are the steps of metrics.jsonl, each metric as a scalar (float32 of the
// line's value); every other back end switched on gets one note saying it
// is not written.
func TestTensorBoardEventsOfTheMetrics(t *testing.T) {
	out := t.TempDir()
	args := append(trainArgs(out, 3), "--set", "logger.tensorboard_enabled=true", "--set", "logger.log_dir=tb_logs",
		"--set", "logger.wandb_enabled=true", "--set", "logger.mlflow_enabled=true")
	args = slicesDelete(args, "--quiet")
	log := mustTrain(t, args...)
	for _, w := range []string{"note: logger.wandb_enabled is true: tracegrpo does not write that back end", "note: logger.mlflow_enabled is true"} {
		if strings.Count(log, w) != 1 {
			t.Errorf("the log says %q %d times, want once:\n%s", w, strings.Count(log, w), log)
		}
	}
	// The ignored keys are one count, not a list (a 5 KB line of 110 keys
	// drowned the warnings).
	if n := len(regexp.MustCompile(`(?m)^train: (1 key|([2-9]|[1-9][0-9]+) keys) ignored \(engines and services tracegrpo does not run, keys NeMo RL never reads\): train config --keys lists them and why$`).FindAllString(log, -1)); n != 1 || strings.Contains(log, "ignored:") {
		t.Errorf("the log has %d ignored-keys count lines, want one and no list:\n%s", n, log)
	}
	files, _ := filepath.Glob(filepath.Join(out, "tb_logs", "tensorboard", "events.out.tfevents.*"))
	if len(files) != 1 {
		t.Fatalf("event files %v", files)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	recs, err := tfevents.Records(data)
	if err != nil {
		t.Fatal(err)
	}
	ms, _, err := ReadMetrics(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(ms)+1 || len(ms) != 3 {
		t.Fatalf("%d events for %d metrics lines", len(recs), len(ms))
	}
	for i, m := range ms {
		e, err := tfevents.Decode(recs[i+1])
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float32{}
		for _, s := range e.Scalars {
			got[s.Tag] = s.Value
		}
		if e.Step != int64(m.Step) || got["train/loss"] != float32(m.Loss) || got["train/reward_mean"] != float32(m.RewardMean) ||
			got["train/eligible_tokens"] != float32(m.EligibleTokens) || got["train/phase_s/train"] != float32(m.Phases.Train) {
			t.Errorf("event %d: step %d, loss %v, reward %v, tokens %v; metrics line: step %d, loss %v, reward %v, tokens %d",
				i+1, e.Step, got["train/loss"], got["train/reward_mean"], got["train/eligible_tokens"], m.Step, m.Loss, m.RewardMean, m.EligibleTokens)
		}
	}
}

// TestNoDirectoryCreatedOutsideOut: a capture directory or a log_dir
// outside --out that does not exist stops the run naming the key; none is
// created. Under --out, they are created.
func TestNoDirectoryCreatedOutsideOut(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "shared", "gym-capture")
	for _, c := range []struct{ set, key string }{
		{"env.nemo_gym.token_id_capture.dir=" + outside, "env.nemo_gym.token_id_capture.dir"},
		{"logger.log_dir=" + outside, "logger.log_dir"},
	} {
		args := append(trainArgs(t.TempDir(), 1), "--set", c.set, "--set", "logger.tensorboard_enabled=true")
		msg := failTrain(t, args...)
		if !strings.Contains(msg, c.key+" "+outside) || !strings.Contains(msg, "creates no directory outside --out") {
			t.Errorf("--set %s: %s", c.set, msg)
		}
		if _, err := os.Stat(filepath.Dir(outside)); !os.IsNotExist(err) {
			t.Fatalf("--set %s created %s", c.set, filepath.Dir(outside))
		}
	}
	out := t.TempDir()
	mustTrain(t, append(trainArgs(out, 1), "--set", "env.nemo_gym.token_id_capture.dir="+filepath.Join(out, "caps"))...)
	if st, err := os.Stat(filepath.Join(out, "caps")); err != nil || !st.IsDir() {
		t.Errorf("a capture directory under --out was not created: %v", err)
	}
}

func slicesDelete(s []string, v string) []string {
	var out []string
	for _, e := range s {
		if e != v {
			out = append(out, e)
		}
	}
	return out
}
