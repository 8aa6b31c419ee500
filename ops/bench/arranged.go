package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// ArrangedOptions runs every policy at every edge count on the same
// arrangements of a workload (paired), and the references: one ideal edge
// (tether with the sequencer log at one edge) and tether with the
// sequencer at every edge count (the log's latency, paired).
type ArrangedOptions struct {
	Replay ReplayOptions
	// Load builds the workload of one arrangement (a fresh copy each call).
	Load         func(arrangement uint64) (*Workload, error)
	Arrangements []uint64
	// Label names the condition in the report (e.g. "kv-events none").
	Label string
	// LogCheck adds tether with the sequencer log at every edge count.
	LogCheck bool
}

// Stat is a median over arrangements with a distribution-free interval
// (order statistics of the sign test, ≥ 95 % where n ≥ 6; the range below).
type Stat struct {
	Median float64 `json:"median"`
	Lo     float64 `json:"lo"`
	Hi     float64 `json:"hi"`
	N      int     `json:"n"`
}

// MedianInterval computes xs' median and its interval.
func MedianInterval(xs []float64) Stat {
	n := len(xs)
	if n == 0 {
		return Stat{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	// The largest k with P(Bin(n, ½) < k) ≤ 2.5 %: [x(k), x(n+1−k)].
	k, cum := 1, 0.0
	for j := 0; j < n; j++ {
		cum += binom(n, j) / math.Pow(2, float64(n))
		if cum > 0.025 {
			break
		}
		k = j + 1
	}
	k = min(k, (n+1)/2)
	return Stat{Median: med, Lo: s[k-1], Hi: s[n-k], N: n}
}

func binom(n, k int) float64 {
	r := 1.0
	for i := 1; i <= k; i++ {
		r = r * float64(n-k+i) / float64(i)
	}
	return r
}

// ArrangedRow is one policy at one edge count over the arrangements.
type ArrangedRow struct {
	Name     string `json:"name"`
	Edges    int    `json:"edges"`
	Hit      Stat   `json:"hit_rate"`
	SubHit   Stat   `json:"subagent_hit_rate"`
	P50      Stat   `json:"ttft_p50_ms"`
	P95      Stat   `json:"ttft_p95_ms"`
	P99      Stat   `json:"ttft_p99_ms"`
	Makespan Stat   `json:"makespan_s"`
	// Reuse: the medians of each Reuse class's share and hit rate.
	Reuse *ReuseStats `json:"reuse,omitempty"`
	// Paired against tether at the same edge count: tether − this, per
	// arrangement (hit rates), and this ÷ tether (TTFT p95).
	VsHit    *Stat `json:"tether_minus_hit,omitempty"`
	VsSubHit *Stat `json:"tether_minus_subagent_hit,omitempty"`
	VsP95    *Stat `json:"p95_ratio_to_tether,omitempty"`
	hits     []float64
	subs     []float64
	p95s     []float64
}

// ArrangedReport is the comparison over arrangements.
type ArrangedReport struct {
	Label        string        `json:"label"`
	Arrangements []uint64      `json:"arrangements"`
	Rows         []ArrangedRow `json:"rows"`
	// IdealRatio: tether's hit rate ÷ the one ideal edge's, per edge
	// count (paired); LogGap: tether with the virtual log − with the
	// sequencer, hit-rate points, per edge count (paired).
	IdealRatio map[int]Stat `json:"ideal_ratio"`
	LogGap     map[int]Stat `json:"log_gap_points"`
	SubLogGap  map[int]Stat `json:"subagent_log_gap_points"`
}

type arrangedJob struct {
	arr   int
	name  string
	pol   Policy
	log   LogKind
	edges int
}

// Sequencer row names: the references.
const (
	idealName     = "one ideal edge"
	sequencerName = "tether (sequencer)"
)

// ReplayArranged runs the comparison.
func ReplayArranged(ctx context.Context, opts ArrangedOptions) (*ArrangedReport, error) {
	ro := opts.Replay
	if len(ro.Policies) == 0 || len(ro.Edges) == 0 || len(opts.Arrangements) == 0 || opts.Load == nil {
		return nil, errors.New("bench: arranged replay: no policies, edge counts or arrangements")
	}
	ws := make([]*Workload, len(opts.Arrangements))
	var perRun int64
	for i, a := range opts.Arrangements {
		w, err := opts.Load(a)
		if err != nil {
			return nil, err
		}
		ws[i] = w
		if i == 0 {
			w.WalkRequests(func(*Agent, *Request) { perRun++ })
		}
	}
	jobs := arrangedJobs(ro, len(ws), opts.LogCheck)
	sums, err := runArrangedJobs(ctx, ro, ws, opts.Arrangements, jobs, perRun)
	if err != nil {
		return nil, err
	}
	return buildArranged(opts, jobs, sums), nil
}

func arrangedJobs(ro ReplayOptions, arrs int, logCheck bool) []arrangedJob {
	var jobs []arrangedJob
	for a := 0; a < arrs; a++ {
		for _, p := range ro.Policies {
			for _, e := range ro.Edges {
				jobs = append(jobs, arrangedJob{a, string(p), p, ro.Base.Log, e})
			}
		}
		if slices.Contains(ro.Policies, PolicyTether) {
			jobs = append(jobs, arrangedJob{a, idealName, PolicyTether, LogSequencer, 1})
			for _, e := range ro.Edges {
				if !logCheck {
					break
				}
				jobs = append(jobs, arrangedJob{a, sequencerName, PolicyTether, LogSequencer, e})
			}
		}
	}
	return jobs
}

func runArrangedJobs(ctx context.Context, ro ReplayOptions, ws []*Workload, arrs []uint64, jobs []arrangedJob, perRun int64) ([]Summary, error) {
	total := perRun * int64(len(jobs))
	var done atomic.Int64
	par := ro.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	sums := make([]Summary, len(jobs))
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			cfg := ro.Base
			cfg.Policy, cfg.Edges, cfg.Log = j.pol, j.edges, j.log
			cfg.Seed = arrs[j.arr]
			last := 0
			cfg.Progress = func(d, _ int) {
				if ro.Progress != nil && (d-last >= 256 || int64(d) == perRun) {
					ro.Progress(done.Add(int64(d-last)), total)
					last = d
				}
			}
			r, err := Simulate(ctx, ws[j.arr], cfg)
			if err != nil {
				errs[i] = fmt.Errorf("arrangement %d, %s with %d edges: %w", arrs[j.arr], j.name, j.edges, err)
				cancel()
				return
			}
			sums[i] = Summarize(r)
		}()
	}
	wg.Wait()
	return sums, errors.Join(errs...)
}

func buildArranged(opts ArrangedOptions, jobs []arrangedJob, sums []Summary) *ArrangedReport {
	rep := &ArrangedReport{Label: opts.Label, Arrangements: opts.Arrangements,
		IdealRatio: map[int]Stat{}, LogGap: map[int]Stat{}, SubLogGap: map[int]Stat{}}
	type key struct {
		name  string
		edges int
	}
	by := map[key][]Summary{} // per arrangement, in order
	var order []key
	for i, j := range jobs {
		k := key{j.name, j.edges}
		if _, ok := by[k]; !ok {
			order = append(order, k)
		}
		by[k] = append(by[k], sums[i])
	}
	col := func(ss []Summary, f func(Summary) float64) []float64 {
		out := make([]float64, len(ss))
		for i, s := range ss {
			out[i] = f(s)
		}
		return out
	}
	for _, k := range order {
		ss := by[k]
		row := ArrangedRow{Name: k.name, Edges: k.edges,
			hits: col(ss, func(s Summary) float64 { return s.HitRate }),
			subs: col(ss, func(s Summary) float64 { return s.SubagentHitRate }),
			p95s: col(ss, func(s Summary) float64 { return s.TTFTP95Ms })}
		row.Hit, row.SubHit, row.P95 = MedianInterval(row.hits), MedianInterval(row.subs), MedianInterval(row.p95s)
		row.P50 = MedianInterval(col(ss, func(s Summary) float64 { return s.TTFTP50Ms }))
		row.P99 = MedianInterval(col(ss, func(s Summary) float64 { return s.TTFTP99Ms }))
		row.Makespan = MedianInterval(col(ss, func(s Summary) float64 { return s.MakespanMs / 1000 }))
		row.Reuse = reuseStats(ss)
		rep.Rows = append(rep.Rows, row)
	}
	pairs(rep, by[key{idealName, 1}])
	return rep
}

// pairs fills the paired differences against tether and the references.
func pairs(rep *ArrangedReport, ideal []Summary) {
	find := func(name string, edges int) *ArrangedRow {
		for i := range rep.Rows {
			if rep.Rows[i].Name == name && rep.Rows[i].Edges == edges {
				return &rep.Rows[i]
			}
		}
		return nil
	}
	diff := func(a, b []float64, f func(x, y float64) float64) *Stat {
		d := make([]float64, len(a))
		for i := range a {
			d[i] = f(a[i], b[i])
		}
		s := MedianInterval(d)
		return &s
	}
	minus := func(x, y float64) float64 { return x - y }
	for i := range rep.Rows {
		r := &rep.Rows[i]
		if r.Name == string(PolicyTether) && len(ideal) == len(r.hits) {
			rep.IdealRatio[r.Edges] = *diff(r.hits, col2(ideal), func(x, y float64) float64 { return x / math.Max(y, 1e-9) })
		}
		t := find(string(PolicyTether), r.Edges)
		if t == nil || r.Name == string(PolicyTether) || r.Name == idealName {
			continue
		}
		r.VsHit, r.VsSubHit = diff(t.hits, r.hits, minus), diff(t.subs, r.subs, minus)
		r.VsP95 = diff(r.p95s, t.p95s, func(x, y float64) float64 { return x / math.Max(y, 1e-9) })
		if r.Name == sequencerName {
			rep.LogGap[r.Edges] = *diff(t.hits, r.hits, func(x, y float64) float64 { return 100 * (x - y) })
			rep.SubLogGap[r.Edges] = *diff(t.subs, r.subs, func(x, y float64) float64 { return 100 * (x - y) })
		}
	}
}

func col2(ss []Summary) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = s.HitRate
	}
	return out
}

// Verdict reads a paired difference (tether − other): a lead only where
// the interval excludes zero.
func Verdict(d *Stat) string {
	switch {
	case d == nil:
		return ""
	case d.Lo > 0:
		return "tether leads"
	case d.Hi < 0:
		return "tether trails"
	}
	return "no difference shown"
}

func (s Stat) fmt(prec int) string {
	if s.N == 0 {
		return "—"
	}
	return fmt.Sprintf("%.*f [%.*f–%.*f]", prec, s.Median, prec, s.Lo, prec, s.Hi)
}

// WriteText prints the rows and the paired verdicts.
func (rep *ArrangedReport) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: medians over %d arrangements %v [interval]\n", rep.Label, len(rep.Arrangements), rep.Arrangements)
	fmt.Fprintf(&b, "%-22s %5s  %-22s %-22s %-10s %-10s %-10s %-9s  %s\n", "policy", "edges", "hit rate", "sub-agent hit", "p50 ms", "p95 ms", "p99 ms", "makespan", "paired vs tether (hit; sub-agent hit)")
	for _, r := range rep.Rows {
		vs := ""
		if r.VsHit != nil {
			vs = fmt.Sprintf("%+.3f [%+.3f, %+.3f] %s; %+.3f [%+.3f, %+.3f] %s", r.VsHit.Median, r.VsHit.Lo, r.VsHit.Hi, Verdict(r.VsHit),
				r.VsSubHit.Median, r.VsSubHit.Lo, r.VsSubHit.Hi, Verdict(r.VsSubHit))
		}
		fmt.Fprintf(&b, "%-22s %5d  %-22s %-22s %-10.0f %-10.0f %-10.0f %-9.0f  %s\n", r.Name, r.Edges, r.Hit.fmt(3), r.SubHit.fmt(3),
			r.P50.Median, r.P95.Median, r.P99.Median, r.Makespan.Median, vs)
	}
	for _, e := range sortedKeys(rep.IdealRatio) {
		fmt.Fprintf(&b, "tether ÷ one ideal edge at %d edges: %s\n", e, rep.IdealRatio[e].fmt(3))
	}
	for _, e := range sortedKeys(rep.LogGap) {
		fmt.Fprintf(&b, "virtual log − sequencer at %d edges: hit %s points, sub-agent hit %s points\n", e, rep.LogGap[e].fmt(2), rep.SubLogGap[e].fmt(2))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func sortedKeys(m map[int]Stat) []int {
	var ks []int
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// WriteMarkdown prints one table: per policy, each figure at every edge
// count (medians), then the paired verdicts at each edge count above one.
func (rep *ArrangedReport) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	var names []string
	edges := map[int]bool{}
	for _, r := range rep.Rows {
		if !slices.Contains(names, r.Name) {
			names = append(names, r.Name)
		}
		edges[r.Edges] = true
	}
	var es []int
	for e := range edges {
		es = append(es, e)
	}
	slices.Sort(es)
	get := func(name string, e int) *ArrangedRow {
		for i := range rep.Rows {
			if rep.Rows[i].Name == name && rep.Rows[i].Edges == e {
				return &rep.Rows[i]
			}
		}
		return nil
	}
	cell := func(name string, f func(*ArrangedRow) string) string {
		var parts []string
		for _, e := range es {
			if r := get(name, e); r != nil {
				parts = append(parts, f(r))
			} else {
				parts = append(parts, "")
			}
		}
		return strings.Join(parts, " / ")
	}
	ed := make([]string, len(es))
	for i, e := range es {
		ed[i] = fmt.Sprint(e)
	}
	fmt.Fprintf(&b, "| policy | hit %[1]s edges | sub-agent hit %[1]s | TTFT p50 ms %[1]s | p95 s %[1]s | p99 s %[1]s | makespan s %[1]s |\n|---|---|---|---|---|---|---|\n", strings.Join(ed, " / "))
	for _, n := range names {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", n,
			cell(n, func(r *ArrangedRow) string { return fmt.Sprintf("%.3f", r.Hit.Median) }),
			cell(n, func(r *ArrangedRow) string { return fmt.Sprintf("%.3f", r.SubHit.Median) }),
			cell(n, func(r *ArrangedRow) string { return fmt.Sprintf("%.0f", r.P50.Median) }),
			cell(n, func(r *ArrangedRow) string { return fmt.Sprintf("%.1f", r.P95.Median/1000) }),
			cell(n, func(r *ArrangedRow) string { return fmt.Sprintf("%.1f", r.P99.Median/1000) }),
			cell(n, func(r *ArrangedRow) string { return fmt.Sprintf("%.0f", r.Makespan.Median) }))
	}
	fmt.Fprintf(&b, "\nPaired, tether − policy per arrangement, median [interval] (hit; sub-agent hit), at %s edges:\n\n", strings.Join(ed[min(1, len(ed)-1):], " / "))
	fmt.Fprintf(&b, "| policy | edges | hit | sub-agent hit | p95 ÷ tether's |\n|---|---:|---|---|---|\n")
	for _, r := range rep.Rows {
		if r.VsHit == nil || r.Edges == 1 && len(es) > 1 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %+.3f [%+.3f, %+.3f] %s | %+.3f [%+.3f, %+.3f] %s | %.2f [%.2f–%.2f] |\n", r.Name, r.Edges,
			r.VsHit.Median, r.VsHit.Lo, r.VsHit.Hi, Verdict(r.VsHit), r.VsSubHit.Median, r.VsSubHit.Lo, r.VsSubHit.Hi, Verdict(r.VsSubHit),
			r.VsP95.Median, r.VsP95.Lo, r.VsP95.Hi)
	}
	writeReuse(&b, rep.Rows)
	b.WriteString("\n")
	for _, e := range sortedKeys(rep.IdealRatio) {
		fmt.Fprintf(&b, "tether ÷ one ideal edge, %d edges: %s. ", e, rep.IdealRatio[e].fmt(3))
	}
	for _, e := range sortedKeys(rep.LogGap) {
		fmt.Fprintf(&b, "Virtual log − sequencer, %d edges: %s points (sub-agents %s). ", e, rep.LogGap[e].fmt(2), rep.SubLogGap[e].fmt(2))
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}
