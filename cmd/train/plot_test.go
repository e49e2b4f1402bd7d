package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/trainer"
)

func TestPlotWritesCurves(t *testing.T) {
	dir := t.TempDir()
	var buf bytes.Buffer
	for i := 1; i <= 12; i++ {
		m := trainer.Metrics{Step: i, RewardMean: trainer.Num(float64(i) / 12), Loss: trainer.Num(1 / float64(i)), TokensPerS: 100}
		b, _ := json.Marshal(m)
		buf.Write(append(b, '\n'))
	}
	if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"plot", "--out", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	f, err := os.Open(filepath.Join(dir, "curves.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("curves.png is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 400 || b.Dy() < 400 {
		t.Errorf("curves.png is %dx%d", b.Dx(), b.Dy())
	}
}

func TestPlotBadMetricsNamesLine(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "metrics.jsonl"), []byte("{\"step\":1}\n{\"step\":\"two\"}\n"), 0o644)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"plot", "--out", dir}, &stdout, &stderr); code == 0 {
		t.Fatal("bad metrics accepted")
	}
	if !strings.Contains(stderr.String(), "metrics.jsonl:2") {
		t.Errorf("error does not name the line: %s", stderr.String())
	}
}

func TestPlotNeedsOut(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"plot"}, &stdout, &stderr); code != 2 {
		t.Fatalf("exit %d, want 2 (usage)", code)
	}
}

// TestPlotNonFiniteAndTornLine: a run with a NaN loss and an infinite
// gradient step, whose last line was torn by a crash, plots its finite
// points and names what it left out (it failed with "plotter: NaN data
// point" before, and on the torn line without naming it).
func TestPlotNonFiniteAndTornLine(t *testing.T) {
	dir := t.TempDir()
	var buf bytes.Buffer
	for i := 1; i <= 8; i++ {
		m := trainer.Metrics{Step: i, RewardMean: trainer.Num(float64(i) / 8), Loss: trainer.Num(0.5), TokensPerS: 100}
		if i == 4 {
			m.Loss = trainer.Num(math.NaN())
		}
		if i == 5 {
			m.Loss = trainer.Num(math.Inf(1))
		}
		b, _ := json.Marshal(m)
		buf.Write(append(b, '\n'))
	}
	buf.WriteString(`{"step": 9, "reward_me`) // torn: no newline
	os.WriteFile(filepath.Join(dir, "metrics.jsonl"), buf.Bytes(), 0o644)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"plot", "--out", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, w := range []string{"metrics.jsonl:9 (a torn last line", "loss: 2 non-finite values not drawn (steps 4, 5)"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
		}
	}
	if !strings.Contains(stdout.String(), "(8 steps)") {
		t.Errorf("stdout %q: want 8 steps plotted", stdout.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "curves.png")); err != nil {
		t.Fatal(err)
	}
}
