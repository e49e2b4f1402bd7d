package main

import (
	"bytes"
	"encoding/json"
	"image/png"
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
