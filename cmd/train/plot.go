package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"strings"

	"github.com/tracegrpo/tracegrpo/internal/atomicfile"
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
	ms, torn, err := trainer.ReadMetrics(filepath.Join(*out, "metrics.jsonl"))
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	if torn != "" {
		fmt.Fprintf(stderr, "plot: skipped %s\n", torn)
	}
	if len(ms) == 0 {
		return fmt.Errorf("plot: %s has no steps", filepath.Join(*out, "metrics.jsonl"))
	}
	path := filepath.Join(*out, "curves.png")
	skipped, err := plotCurves(ms, path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	for _, s := range skipped {
		fmt.Fprintf(stderr, "plot: %s\n", s)
	}
	fmt.Fprintf(stdout, "wrote %s (%d steps)\n", path, len(ms))
	return nil
}

// plotCurves draws three stacked panels (reward, loss, tokens/s) into a PNG,
// written atomically. Non-finite values (a step whose loss overflowed) are
// left out of their panel; skipped says which, per panel.
func plotCurves(ms []trainer.Metrics, path string) (skipped []string, err error) {
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
		pts := make(plotter.XYs, 0, len(ms))
		var bad []int
		for _, m := range ms {
			y := s.y(m)
			if math.IsNaN(y) || math.IsInf(y, 0) {
				bad = append(bad, m.Step)
				continue
			}
			pts = append(pts, plotter.XY{X: float64(m.Step), Y: y})
		}
		if len(bad) > 0 {
			skipped = append(skipped, fmt.Sprintf("%s: %d non-finite values not drawn (steps %s)", s.title, len(bad), stepList(bad)))
		}
		p.Add(plotter.NewGrid())
		if len(pts) > 0 {
			line, err := plotter.NewLine(pts)
			if err != nil {
				return nil, err
			}
			line.Color = s.col
			line.Width = vg.Points(1.5)
			p.Add(line)
		}
		p.Draw(tiles.At(dc, 0, i))
	}
	f, err := atomicfile.Create(path)
	if err != nil {
		return nil, err
	}
	defer f.Abort()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		return nil, err
	}
	return skipped, f.Commit()
}

// stepList renders step numbers, the first ten and a count of the rest.
func stepList(steps []int) string {
	var b strings.Builder
	for i, s := range steps {
		if i == 10 {
			fmt.Fprintf(&b, " and %d more", len(steps)-10)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprint(&b, s)
	}
	return b.String()
}
