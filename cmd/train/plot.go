package main

import (
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"

	"github.com/tracegrpo/tracegrpo/trainer"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

func init() {
	register(command{
		name:    "plot",
		summary: "draw reward, loss and tokens/s against step from a run's metrics.jsonl",
		run:     runPlot,
	})
}

func runPlot(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("plot", "train plot --out DIR\n\nReads DIR/metrics.jsonl and writes DIR/curves.png.", stdout)
	out := fs.String("out", "", "run directory holding metrics.jsonl (required)")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("%w: plot needs --out DIR", errUsage)
	}
	ms, err := trainer.ReadMetrics(filepath.Join(*out, "metrics.jsonl"))
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	if len(ms) == 0 {
		return fmt.Errorf("plot: %s has no steps", filepath.Join(*out, "metrics.jsonl"))
	}
	path := filepath.Join(*out, "curves.png")
	if err := plotCurves(ms, path); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	fmt.Fprintf(stdout, "wrote %s (%d steps)\n", path, len(ms))
	return nil
}

// plotCurves draws three stacked panels (reward, loss, tokens/s) into a PNG.
func plotCurves(ms []trainer.Metrics, path string) error {
	series := []struct {
		title string
		y     func(trainer.Metrics) float64
		col   color.Color
	}{
		{"reward (mean of the step's rollouts)", func(m trainer.Metrics) float64 { return float64(m.RewardMean) }, color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}},
		{"loss", func(m trainer.Metrics) float64 { return float64(m.Loss) }, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}},
		{"tokens/s", func(m trainer.Metrics) float64 { return float64(m.TokensPerS) }, color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}},
	}
	const w, h = 8 * vg.Inch, 9 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(series), Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	for i, s := range series {
		p := plot.New()
		p.Title.Text = s.title
		p.X.Label.Text = "step"
		pts := make(plotter.XYs, len(ms))
		for j, m := range ms {
			pts[j] = plotter.XY{X: float64(m.Step), Y: s.y(m)}
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		line.Color = s.col
		line.Width = vg.Points(1.5)
		p.Add(line, plotter.NewGrid())
		p.Draw(tiles.At(dc, 0, i))
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
