// Package plots draws the benchmark report's figures with gonum/plot. It
// lives apart from ops/bench so that only the report's binary
// (cmd/tether-bench) links the plotting stack (fonts, LaTeX, PDF), not the
// production tether binary.
package plots

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/tether-project/tether/ops/bench"
)

const (
	plotWidth  = 16 * vg.Centimeter
	plotHeight = 10 * vg.Centimeter
)

// Plotter implements bench.Plotter.
type Plotter struct{}

var _ bench.Plotter = Plotter{}

// HitRateByPolicy draws a bar per policy (hit rate and sub-agent hit
// rate) with the upper bound as a line, and saves it as a PNG.
func (Plotter) HitRateByPolicy(path, title string, upper float64, rows []bench.Summary) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "prompt-token cache hit rate"
	p.Y.Min, p.Y.Max = 0, 1.25 // room for the legend above the bars
	all := make(plotter.Values, len(rows))
	sub := make(plotter.Values, len(rows))
	names := make([]string, len(rows))
	for i, r := range rows {
		all[i], sub[i], names[i] = r.HitRate, r.SubagentHitRate, r.Name
	}
	w := vg.Points(14)
	b1, err := plotter.NewBarChart(all, w)
	if err != nil {
		return fmt.Errorf("bench: plot %s: %w", path, err)
	}
	b1.Color = plotutil.Color(0)
	b1.LineStyle.Width = 0
	b1.Offset = -w / 2
	b2, err := plotter.NewBarChart(sub, w)
	if err != nil {
		return fmt.Errorf("bench: plot %s: %w", path, err)
	}
	b2.Color = plotutil.Color(2)
	b2.LineStyle.Width = 0
	b2.Offset = w / 2
	ub, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: upper}, {X: float64(len(rows)) - 0.5, Y: upper}})
	if err != nil {
		return fmt.Errorf("bench: plot %s: %w", path, err)
	}
	ub.Color = color.Black
	ub.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(plotter.NewGrid(), b1, b2, ub)
	p.Legend.Add("all requests", b1)
	p.Legend.Add("sub-agent requests", b2)
	p.Legend.Add(fmt.Sprintf("upper bound %.3f", upper), ub)
	p.Legend.Top = true
	p.NominalX(names...)
	return save(p, path)
}

// Lines draws named series with points.
func (Plotter) Lines(path, title, xLabel, yLabel string, yMin, yMax float64, series []bench.Series) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Y.Min, p.Y.Max = yMin, yMax
	p.Add(plotter.NewGrid())
	for i, s := range series {
		xys := make(plotter.XYs, len(s.Points))
		for i, pt := range s.Points {
			xys[i] = plotter.XY{X: pt.X, Y: pt.Y}
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return fmt.Errorf("bench: plot %s: %w", path, err)
		}
		l.Color = plotutil.Color(i)
		pts.Color = plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		p.Add(l, pts)
		p.Legend.Add(s.Name, l, pts)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return save(p, path)
}

// TTFTCDF draws each run's TTFT distribution (empirical CDF, log time
// axis).
func (Plotter) TTFTCDF(path, title string, runs []*bench.RunResult) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "time to first token (s, log scale)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	const floor = 0.01 // seconds: the log axis needs positive values
	for i, r := range runs {
		ts := make([]time.Duration, len(r.Records))
		for j, rec := range r.Records {
			ts[j] = rec.TTFT
		}
		slices.Sort(ts)
		if len(ts) == 0 {
			continue
		}
		// At most 400 points per curve, evenly spaced in rank.
		step := max(1, len(ts)/400)
		var xys plotter.XYs
		for j := 0; j < len(ts); j += step {
			xys = append(xys, plotter.XY{X: math.Max(ts[j].Seconds(), floor), Y: float64(j+1) / float64(len(ts))})
		}
		xys = append(xys, plotter.XY{X: math.Max(ts[len(ts)-1].Seconds(), floor), Y: 1})
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("bench: plot %s: %w", path, err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / len(plotutil.DefaultColors))
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(string(r.Policy), l)
	}
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.XOffs = -vg.Points(4)
	p.Legend.YOffs = vg.Points(4)
	return save(p, path)
}

func save(p *plot.Plot, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("bench: plot %s: %w", path, err)
	}
	if err := p.Save(plotWidth, plotHeight, path); err != nil {
		return fmt.Errorf("bench: plot %s: %w", path, err)
	}
	return nil
}
