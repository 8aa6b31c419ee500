package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/tether-project/tether/worker/adp"
)

// ReportOptions configure `tether-bench report`: the full comparison whose
// figures and plots BENCHMARKS.md publishes.
type ReportOptions struct {
	Traces    string   // trace directory
	Markdown  string   // BENCHMARKS.md to rewrite ("" = do not write)
	PlotDir   string   // where the PNGs go (docs/bench)
	Plotter   Plotter  // draws them (ops/bench/plots); nil: no plots
	PlotLink  string   // how the markdown links the plot directory (relative to the markdown file)
	MicroFile string   // `go test -bench` output to publish ("" = none)
	Seeds     []uint64 // medians over these seeds (default 1–5)
	Log       LogKind
	Parallel  int
	Progress  io.Writer // progress lines ("" = none)
	Command   string    // how this report was produced, quoted in the file
	Module    string    // module path, trimmed from package names
	// E2E also replays the e2e subset (E2ESubset) against local
	// deployments and compares the ranking with sim mode.
	E2E bool
}

// E2ESubset is the report's e2e setup: the 11 traces that end within
// 1,000 s (4 sub-agents among them), 4 context workers of 4,500 blocks, 3
// edges, everything 20× faster than real time.
var E2ESubset = struct {
	MaxDuration    time.Duration
	Instances      int
	CapacityBlocks int
	Edges          int
	TimeScale      float64
}{1000 * time.Second, 4, 4500, 3, 0.05}

// ReferenceStagger spreads the conversations' starts over 10 minutes (by
// trace id): 50 conversations starting in the same instant would make the
// first placement of every key one burst that no telemetry can describe.
// The report also shows the all-at-once case.
const ReferenceStagger = 10 * time.Minute

// Reference setups of the published figures.
func referenceSim() SimConfig {
	c := DefaultSimConfig()
	c.Instances, c.Ranks, c.CapacityBlocks = 8, 1, 6000
	return c
}

func referenceAgents() SimConfig {
	c := DefaultSimConfig()
	c.Instances, c.Ranks, c.CapacityBlocks = 8, 2, 16384
	return c
}

// Sections is the report's generated markdown, by section name.
type Sections map[string]string

// BuildReport runs every benchmark of the report and returns the sections.
// It writes the plots to opts.PlotDir.
func BuildReport(ctx context.Context, opts ReportOptions) (Sections, error) {
	if len(opts.Seeds) == 0 {
		opts.Seeds = []uint64{1, 2, 3, 4, 5}
	}
	if opts.Log == "" {
		opts.Log = LogVirtual
	}
	if opts.PlotLink == "" {
		opts.PlotLink = opts.PlotDir
	}
	started := time.Now()
	sec := Sections{"machine": machineSection(started)}
	rb := &reportBuild{ctx: ctx, opts: opts, edgeCounts: []int{1, 3, 5}}
	for _, step := range []func() error{rb.headline, rb.sensitivity, rb.runAgents, rb.drawPlots, rb.endToEnd} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	sec["policy-comparison"] = policySection(opts, rb.w, rb.base, rb.head, rb.sens, rb.plots, rb.e2e, rb.e2eW)
	sec["agents"] = agentsSection(opts, rb.abase, rb.agents)
	stickyBound := -1.0
	for _, r := range rb.headRuns {
		if r.Policy == PolicyTether {
			stickyBound = StickyBalanceBound(r, rb.base.Instances)
		}
	}
	sec["targets"] = targetsSection(rb.head, rb.agents, stickyBound)
	if opts.MicroFile != "" {
		micro, err := microSection(opts)
		if err != nil {
			return nil, err
		}
		sec["micro"] = micro
	}
	rb.logf("report: done in %v", time.Since(started).Round(time.Second))
	return sec, nil
}

// reportBuild is one BuildReport run: its steps fill the figures in order.
type reportBuild struct {
	ctx        context.Context
	opts       ReportOptions
	edgeCounts []int

	w        *Workload // the validation half, staggered
	base     SimConfig
	head     []Summary
	headRuns []*RunResult
	sens     []sensitivity
	abase    SimConfig
	agents   []*AgentsReport
	plots    []string
	e2e      *E2EComparison
	e2eW     *Workload
}

func (rb *reportBuild) logf(format string, args ...any) {
	if rb.opts.Progress != nil {
		fmt.Fprintf(rb.opts.Progress, format+"\n", args...)
	}
}

// headline replays every policy at 1, 3 and 5 edges over the seeds. The
// published figures are the validation half's: every parameter was chosen
// on the tuning half (TraceOptions.Half).
func (rb *reportBuild) headline() (err error) {
	if rb.w, err = LoadTraces(rb.opts.Traces, TraceOptions{Stagger: ReferenceStagger, Half: HalfValidation}); err != nil {
		return err
	}
	rb.base = referenceSim()
	rb.base.Log = rb.opts.Log
	rb.logf("report: replaying %d traces: %d policies × edges %v × seeds %v", len(rb.w.Agents), len(AllPolicies), rb.edgeCounts, rb.opts.Seeds)
	rb.head, rb.headRuns, err = replaySeeds(rb.ctx, rb.w, rb.base, AllPolicies, rb.edgeCounts, rb.opts, rb.logf)
	return err
}

// reportVariant is one ablation or sensitivity run.
type reportVariant struct {
	label    string
	w        *Workload
	cfg      SimConfig
	policies []Policy
	edges    []int // default 3
}

// sensitivity runs the ablations and sensitivities: which mechanism costs
// or buys what, and how the ordering moves with cache capacity, ADP ranks
// (and the workers' rank placement) and a fleet-wide shared prefix.
func (rb *reportBuild) sensitivity() error {
	variants, err := rb.variants()
	if err != nil {
		return err
	}
	for _, v := range variants {
		rb.logf("report: %s", v.label)
		edges := v.edges
		if edges == nil {
			edges = []int{3}
		}
		rows, _, err := replaySeeds(rb.ctx, v.w, v.cfg, v.policies, edges, ReportOptions{Seeds: rb.opts.Seeds[:1], Parallel: rb.opts.Parallel}, rb.logf)
		if err != nil {
			return err
		}
		rb.sens = append(rb.sens, sensitivity{label: v.label, upper: UpperBound(v.w), rows: rows})
	}
	return nil
}

func (rb *reportBuild) variants() ([]reportVariant, error) {
	w, base := rb.w, rb.base
	ablations := []Policy{PolicySession, PolicyPrefix, PolicyTether, PolicyTetherNoParent, PolicyTetherNoOverflow, PolicyTetherParentFirst, PolicyTetherNoCacheRebind}
	sensPolicies := []Policy{PolicyLeastLoaded, PolicySessionLocal, PolicySession, PolicyPrefix, PolicyTether, PolicyTetherNoCacheRebind}
	variants := []reportVariant{{label: "ablations at the reference setup (C = 6000)", w: w, cfg: base, policies: ablations}}
	burst, err := LoadTraces(rb.opts.Traces, TraceOptions{Half: HalfValidation})
	if err != nil {
		return nil, err
	}
	variants = append(variants, reportVariant{label: "all conversations of the validation half starting in the same instant (no stagger)", w: burst, cfg: base,
		policies: []Policy{PolicySessionLocal, PolicySession, PolicyPrefix, PolicyTether, PolicyTetherNoCacheRebind}, edges: rb.edgeCounts})
	for _, c := range []int{12000, 24000} {
		v := base
		v.CapacityBlocks = c
		variants = append(variants, reportVariant{label: fmt.Sprintf("C = %d blocks per instance", c), w: w, cfg: v, policies: sensPolicies})
	}
	r2 := base
	r2.Ranks = 2
	variants = append(variants, reportVariant{label: "2 ADP ranks per instance (3,000 blocks each), workers place new conversations round_robin", w: w, cfg: r2, policies: sensPolicies})
	r2lt := r2
	r2lt.ADPPlacement = adp.LeastTokens
	variants = append(variants, reportVariant{label: "2 ADP ranks per instance, workers place new conversations least_tokens", w: w, cfg: r2lt, policies: sensPolicies})
	agg := base
	agg.Aggregated = true
	variants = append(variants, reportVariant{label: "aggregated workers (prefill and decode on one worker: blocks stay referenced while decoding)", w: w, cfg: agg,
		policies: []Policy{PolicySession, PolicyPrefix, PolicyTether, PolicyTetherNoParent, PolicyTetherParentFirst, PolicyTetherNoCacheRebind}})
	shared, err := LoadTraces(rb.opts.Traces, TraceOptions{SharedPrefixBlocks: 32, Stagger: ReferenceStagger, Half: HalfValidation})
	if err != nil {
		return nil, err
	}
	return append(variants, reportVariant{label: "--shared-prefix-blocks 32 (a 2,048-token fleet-wide system prompt)", w: shared, cfg: base, policies: sensPolicies}), nil
}

// runAgents runs every agent pattern over the seeds (medians).
func (rb *reportBuild) runAgents() error {
	rb.abase = referenceAgents()
	rb.abase.Log = rb.opts.Log
	for _, p := range AllPatterns {
		rb.logf("report: agents pattern %s", p)
		var perSeed []*AgentsReport
		for _, seed := range rb.opts.Seeds {
			cfg := rb.abase
			cfg.Seed = seed
			ar, err := RunAgents(rb.ctx, AgentOptions{Pattern: p}, ReplayOptions{Base: cfg, Policies: AllPolicies, Edges: []int{3}, Parallel: rb.opts.Parallel})
			if err != nil {
				return err
			}
			perSeed = append(perSeed, ar)
		}
		rb.agents = append(rb.agents, medianAgents(perSeed))
	}
	return nil
}

// drawPlots writes the report's figures (when a plot directory and a
// plotter are given).
func (rb *reportBuild) drawPlots() error {
	opts := rb.opts
	if opts.PlotDir == "" || opts.Plotter == nil {
		return nil
	}
	if err := opts.Plotter.HitRateByPolicy(filepath.Join(opts.PlotDir, "hit_rate_by_policy.png"),
		fmt.Sprintf("Hit rate by policy (validation half, 8 instances, C=6000, 3 edges)"), UpperBound(rb.w), rowsAt(rb.head, 3)); err != nil {
		return err
	}
	var series []Series
	for _, p := range []Policy{PolicySessionLocal, PolicySession, PolicyTether} {
		s := Series{Name: string(p)}
		for _, e := range rb.edgeCounts {
			for _, r := range rb.head {
				if r.Name == string(p) && r.Edges == e {
					s.Points = append(s.Points, Point{X: float64(e), Y: r.HitRate})
				}
			}
		}
		series = append(series, s)
	}
	if err := opts.Plotter.Lines(filepath.Join(opts.PlotDir, "hit_rate_vs_edges.png"), "Hit rate versus number of edges",
		"edges", "prompt-token cache hit rate", 0, 1, series); err != nil {
		return err
	}
	if err := opts.Plotter.TTFTCDF(filepath.Join(opts.PlotDir, "ttft_by_policy.png"), "TTFT distribution by policy (3 edges, seed 1)", rb.headRuns); err != nil {
		return err
	}
	rb.plots = []string{"hit_rate_by_policy.png", "hit_rate_vs_edges.png", "ttft_by_policy.png"}
	return nil
}

// endToEnd runs the e2e subset against local deployments (opts.E2E).
func (rb *reportBuild) endToEnd() (err error) {
	if !rb.opts.E2E {
		return nil
	}
	rb.logf("report: e2e subset against local deployments (one per policy)")
	if rb.e2eW, err = LoadTraces(rb.opts.Traces, TraceOptions{MaxDuration: E2ESubset.MaxDuration, Stagger: ReferenceStagger}); err != nil {
		return err
	}
	local := LocalE2EOptions{Edges: E2ESubset.Edges, ContextWorkers: E2ESubset.Instances, GenerationWorkers: 2, Ranks: 1,
		CapacityBlocks: E2ESubset.CapacityBlocks, TimeScale: E2ESubset.TimeScale, Seed: rb.opts.Seeds[0], ADPPlacement: rb.base.ADPPlacement}
	cfg := rb.base
	cfg.Seed = rb.opts.Seeds[0]
	rb.e2e, err = CompareE2E(rb.ctx, rb.e2eW, AllPolicies, local, ReplayOptions{Base: cfg, Parallel: rb.opts.Parallel})
	return err
}

// microSection is the micro-benchmark table from opts.MicroFile.
func microSection(opts ReportOptions) (string, error) {
	f, err := os.Open(opts.MicroFile)
	if err != nil {
		return "", fmt.Errorf("bench: micro-benchmarks: %w", err)
	}
	res, err := ParseGoBench(f)
	f.Close()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("Command: `make bench-report` (runs `go test -run '^$' -bench . -benchmem -count=N ./...`; medians over the N runs). %d benchmarks.\n\n%s",
		len(res), MicroTable(res, opts.Module)), nil
}

type sensitivity struct {
	label string
	upper float64
	rows  []Summary
}

// replaySeeds runs policies × edges for every seed and returns the medians
// (one Summary per policy and edge count, in policy order) and, for the
// first seed at 3 edges (or the first edge count), the runs with records.
func replaySeeds(ctx context.Context, w *Workload, base SimConfig, policies []Policy, edges []int, opts ReportOptions, logf func(string, ...any)) ([]Summary, []*RunResult, error) {
	var perSeed [][]Summary
	var keep []*RunResult
	for i, seed := range opts.Seeds {
		cfg := base
		cfg.Seed = seed
		started := time.Now()
		rep, err := Replay(ctx, w, ReplayOptions{Base: cfg, Policies: policies, Edges: edges, Parallel: opts.Parallel, KeepRecords: i == 0})
		if err != nil {
			return nil, nil, err
		}
		logf("report:   seed %d: %d runs in %v", seed, len(rep.Runs), time.Since(started).Round(time.Second))
		perSeed = append(perSeed, rep.Policies)
		if i == 0 {
			want := edges[0]
			if slices.Contains(edges, 3) {
				want = 3
			}
			for _, r := range rep.Runs {
				if r.Edges == want {
					keep = append(keep, r)
				} else {
					r.Records = nil
				}
			}
		}
	}
	return medianSummaries(perSeed), keep, nil
}

// medianSummaries takes, field by field, the median over seeds.
func medianSummaries(perSeed [][]Summary) []Summary {
	out := make([]Summary, len(perSeed[0]))
	for i := range out {
		col := func(f func(Summary) float64) float64 {
			vs := make([]float64, len(perSeed))
			for s := range perSeed {
				vs[s] = f(perSeed[s][i])
			}
			return median(vs)
		}
		s := perSeed[0][i]
		s.HitRate = col(func(x Summary) float64 { return x.HitRate })
		s.SubagentHitRate = col(func(x Summary) float64 { return x.SubagentHitRate })
		s.PrefillTokens = int64(col(func(x Summary) float64 { return float64(x.PrefillTokens) }))
		s.TTFTP50Ms = col(func(x Summary) float64 { return x.TTFTP50Ms })
		s.TTFTP90Ms = col(func(x Summary) float64 { return x.TTFTP90Ms })
		s.MakespanMs = col(func(x Summary) float64 { return x.MakespanMs })
		s.TTFTP99Ms = col(func(x Summary) float64 { return x.TTFTP99Ms })
		s.LoadCoV = col(func(x Summary) float64 { return x.LoadCoV })
		s.Overflows = int(col(func(x Summary) float64 { return float64(x.Overflows) }))
		s.Commits = int(col(func(x Summary) float64 { return float64(x.Commits) }))
		s.PrefillMs = col(func(x Summary) float64 { return x.PrefillMs })
		s.Rebinds = int(col(func(x Summary) float64 { return float64(x.Rebinds) }))
		s.RankOverflows = int(col(func(x Summary) float64 { return float64(x.RankOverflows) }))
		s.Shed = int(col(func(x Summary) float64 { return float64(x.Shed) }))
		s.WallMs = col(func(x Summary) float64 { return x.WallMs })
		s.SubagentFirstCallHitRate = col(func(x Summary) float64 { return x.SubagentFirstCallHitRate })
		s.MaxInstancePrefillTokens = int64(col(func(x Summary) float64 { return float64(x.MaxInstancePrefillTokens) }))
		lo, hi := s.HitRate, s.HitRate
		for _, ps := range perSeed {
			lo, hi = min(lo, ps[i].HitRate), max(hi, ps[i].HitRate)
		}
		s.hitLo, s.hitHi = lo, hi
		out[i] = s
	}
	return out
}

func medianAgents(perSeed []*AgentsReport) *AgentsReport {
	out := *perSeed[0]
	out.Policies = slices.Clone(perSeed[0].Policies)
	for i := range out.Policies {
		col := func(f func(AgentSummary) float64) float64 {
			vs := make([]float64, len(perSeed))
			for s := range perSeed {
				vs[s] = f(perSeed[s].Policies[i])
			}
			return median(vs)
		}
		p := &out.Policies[i]
		p.PrefillMs = col(func(x AgentSummary) float64 { return x.PrefillMs })
		p.HitRate = col(func(x AgentSummary) float64 { return x.HitRate })
		p.TTFTP50Ms = col(func(x AgentSummary) float64 { return x.TTFTP50Ms })
		p.TTFTP99Ms = col(func(x AgentSummary) float64 { return x.TTFTP99Ms })
		p.Reduction = col(func(x AgentSummary) float64 { return x.Reduction })
		p.FirstCallHitRate = col(func(x AgentSummary) float64 { return x.FirstCallHitRate })
		p.SubagentFirstCallHitRate = col(func(x AgentSummary) float64 { return x.SubagentFirstCallHitRate })
		p.Commits = int(col(func(x AgentSummary) float64 { return float64(x.Commits) }))
	}
	return &out
}

func rowsAt(rows []Summary, edges int) []Summary {
	var out []Summary
	for _, r := range rows {
		if r.Edges == edges {
			out = append(out, r)
		}
	}
	return out
}

func find(rows []Summary, p Policy, edges int) (Summary, bool) {
	for _, r := range rows {
		if r.Name == string(p) && r.Edges == edges {
			return r, true
		}
	}
	return Summary{}, false
}

func machineSection(at time.Time) string {
	var b strings.Builder
	cpu := "unknown"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	load := "unknown"
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(data)); len(f) >= 3 {
			load = strings.Join(f[:3], " ")
		}
	}
	fmt.Fprintf(&b, "| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| date | %s |\n", at.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "| cores | %d (GOMAXPROCS %d) |\n", runtime.NumCPU(), runtime.GOMAXPROCS(0))
	fmt.Fprintf(&b, "| CPU | %s |\n", cpu)
	fmt.Fprintf(&b, "| Go | %s %s/%s |\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "| load average at start | %s (the machine is shared: wall times are indicative only; the simulated figures do not depend on it) |\n", load)
	return b.String()
}

func policySection(opts ReportOptions, w *Workload, base SimConfig, head []Summary, sens []sensitivity, plots []string, e2e *E2EComparison, e2eW *Workload) string {
	var b strings.Builder
	st := w.Stats()
	fmt.Fprintf(&b, "Command: `%s` (the replay part alone: `tether bench replay --traces %s --mode sim --instances %d --ranks %d --capacity-blocks %d --stagger %v --half validation --edges 1,3,5 --policies all --seed N`).\n\n",
		opts.Command, opts.Traces, base.Instances, base.Ranks, base.CapacityBlocks, ReferenceStagger)
	fmt.Fprintf(&b, "Workload: %d conversations with %d sub-agents, %d requests (%d by sub-agents), %s prompt tokens; largest prompt %d blocks. "+
		"Conversations start within %v (offsets derived from the trace ids). "+
		"Fleet: %d instances × %d rank, %d KV blocks per instance (the context fleet; decode runs on the generation hop), workers report load every %v, affinity log `%s`, time scale 1. "+
		"Figures are medians over seeds %v (load balancer's edge choice, random policy); hit-rate range over seeds in brackets.\n\n",
		st.Conversations, st.SubAgents, st.Requests, st.SubRequests, thousands(st.PromptTokens), st.MaxBlocks, ReferenceStagger,
		base.Instances, base.Ranks, base.CapacityBlocks, base.TelemetryInterval, base.Log, opts.Seeds)
	fmt.Fprintf(&b, "Traces: the validation half (TraceOptions.Half: sorted by id, every second trace; parameters were chosen on the other half). "+
		"Upper bound (one infinite cache): **%.3f**; without credit for prompts larger than an instance's cache: %.3f.\n\n",
		UpperBound(w), UpperBoundFitting(w, base.CapacityBlocks/max(base.Ranks, 1)))
	b.WriteString("**3 edges**\n\n")
	b.WriteString("| policy | hit rate | sub-agent hit rate | sub-agent first-call hit | prefill tokens | busiest instance | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | makespan s | load CoV | overflows | commits |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rowsAt(head, 3) {
		fmt.Fprintf(&b, "| %s | %.3f [%.3f–%.3f] | %.3f | %.3f | %s | %s | %.0f | %.0f | %.0f | %.0f | %.3f | %d | %d |\n", r.Name, r.HitRate, r.hitLo, r.hitHi, r.SubagentHitRate,
			r.SubagentFirstCallHitRate, thousands(r.PrefillTokens), thousands(r.MaxInstancePrefillTokens), r.TTFTP50Ms, r.TTFTP90Ms, r.TTFTP99Ms, r.MakespanMs/1000, r.LoadCoV, r.Overflows, r.Commits)
	}
	b.WriteString("\n*busiest instance*: prompt tokens computed by the most loaded instance; *commits*: events committed to the affinity log during the replay (Bind, Link, Touch batches, Overflow).\n")
	b.WriteString("\n**Hit rate by number of edges** (requests spread over the edges like a non-sticky load balancer)\n\n| policy | 1 edge | 3 edges | 5 edges | 5 vs 1 |\n|---|---:|---:|---:|---:|\n")
	for _, p := range AllPolicies {
		r1, _ := find(head, p, 1)
		r3, _ := find(head, p, 3)
		r5, _ := find(head, p, 5)
		fmt.Fprintf(&b, "| %s | %.3f | %.3f | %.3f | %+.3f |\n", p, r1.HitRate, r3.HitRate, r5.HitRate, r5.HitRate-r1.HitRate)
	}
	for _, s := range sens {
		fmt.Fprintf(&b, "\n**%s**, seed %d, upper bound %.3f\n\n| policy | edges | hit rate | sub-agent hit rate | sub-agent first-call hit | TTFT p50 ms | TTFT p99 ms | load CoV | overflows |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
			strings.ToUpper(s.label[:1])+s.label[1:], opts.Seeds[0], s.upper)
		for _, r := range s.rows {
			fmt.Fprintf(&b, "| %s | %d | %.3f | %.3f | %.3f | %.0f | %.0f | %.3f | %d |\n", r.Name, r.Edges, r.HitRate, r.SubagentHitRate, r.SubagentFirstCallHitRate, r.TTFTP50Ms, r.TTFTP99Ms, r.LoadCoV, r.Overflows)
		}
	}
	if e2e != nil {
		st := e2eW.Stats()
		fmt.Fprintf(&b, "\n**e2e versus sim** — command: `tether bench replay --traces %s --mode e2e --max-duration %v --stagger %v --instances %d --capacity-blocks %d --edges %d --time-scale %g --policies all` "+
			"(the traces ending within %v: %d conversations, %d sub-agents, %d requests; one local deployment per policy: embedded NATS, %d edges on loopback Raft, %d context and 2 generation simulated workers, "+
			"the workload's timing and the engines' time both at %g× real time; prompts synthesised from the hash ids; hits from `usage.prompt_tokens_details.cached_tokens`). Sim at time scale 1, same fleet shape, seed %d.\n\n",
			opts.Traces, E2ESubset.MaxDuration, ReferenceStagger, E2ESubset.Instances, E2ESubset.CapacityBlocks, E2ESubset.Edges, E2ESubset.TimeScale,
			E2ESubset.MaxDuration, st.Conversations, st.SubAgents, st.Requests, E2ESubset.Edges, E2ESubset.Instances, E2ESubset.TimeScale, opts.Seeds[0])
		b.WriteString(e2e.Markdown())
	}
	if len(plots) > 0 {
		b.WriteString("\n")
		for _, p := range plots {
			fmt.Fprintf(&b, "![%s](%s/%s)\n", strings.TrimSuffix(p, ".png"), opts.PlotLink, p)
		}
	}
	return b.String()
}

func agentsSection(opts ReportOptions, base SimConfig, reps []*AgentsReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Command: `tether bench agents --pattern P --mode sim --instances %d --ranks %d --capacity-blocks %d --edges 3 --policies all --seed N` for each pattern (part of `%s`). "+
		"One execution of each pattern; medians over seeds %v. Prefill ms is the simulated prefill compute summed over the pattern's calls (5,500 tokens/s plus 10 ms per prefill, the worked example's rate: docs/agent-workloads.md).\n",
		base.Instances, base.Ranks, base.CapacityBlocks, opts.Command, opts.Seeds)
	for _, r := range reps {
		fmt.Fprintf(&b, "\n**%s** (%s, %d calls)\n\n| policy | prefill ms | vs round robin | hit rate | first-call hit | sub-agent first-call hit | TTFT p50 ms |\n|---|---:|---:|---:|---:|---:|---:|\n",
			r.Pattern, plural(r.Agents, "agent"), r.Requests)
		for _, p := range r.Policies {
			fmt.Fprintf(&b, "| %s | %.0f | %s | %.3f | %.3f | %.3f | %.0f |\n", p.Name, p.PrefillMs, pct(-p.Reduction), p.HitRate, p.FirstCallHitRate, p.SubagentFirstCallHitRate, p.TTFTP50Ms)
		}
		if r.SpecRandomMs > 0 {
			fmt.Fprintf(&b, "| *worked example: random* | *%.0f* | | | | | |\n| *worked example: cache-aware* | *%.0f* | *%s vs random* | | | | |\n",
				r.SpecRandomMs, r.SpecCacheAwareMs, pct(r.SpecCacheAwareMs/r.SpecRandomMs-1))
		}
	}
	return b.String()
}

func targetsSection(head []Summary, agents []*AgentsReport, stickyBound float64) string {
	var b strings.Builder
	b.WriteString("| target | measured | met |\n|---|---|---|\n")
	verdict := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "**no**"
	}
	t3, _ := find(head, PolicyTether, 3)
	var beaten []string
	for _, r := range rowsAt(head, 3) {
		if r.Name != string(PolicyTether) && r.HitRate > t3.HitRate {
			beaten = append(beaten, fmt.Sprintf("%s %.3f", r.Name, r.HitRate))
		}
	}
	m := fmt.Sprintf("tether %.3f", t3.HitRate)
	if len(beaten) > 0 {
		m += "; higher: " + strings.Join(beaten, ", ")
	}
	fmt.Fprintf(&b, "| tether hit rate ≥ every other policy (3 edges) | %s | %s |\n", m, verdict(len(beaten) == 0))
	t1, _ := find(head, PolicyTether, 1)
	t5, _ := find(head, PolicyTether, 5)
	d3, d5 := t3.HitRate-t1.HitRate, t5.HitRate-t1.HitRate
	fmt.Fprintf(&b, "| tether with 3 and 5 edges within 1%% of 1 edge | 1: %.3f, 3: %.3f (%+.3f), 5: %.3f (%+.3f) | %s |\n",
		t1.HitRate, t3.HitRate, d3, t5.HitRate, d5, verdict(abs(d3) <= 0.01 && abs(d5) <= 0.01))
	ll, _ := find(head, PolicyLeastLoaded, 3)
	bound := ""
	if stickyBound >= 0 {
		bound = fmt.Sprintf("; a hindsight packing heuristic (LPT: whole conversations packed largest first on tether's own per-conversation work, seed 1; not a bound): %.3f", stickyBound)
	}
	fmt.Fprintf(&b, "| load CoV of tether ≤ 1.5 × least_loaded (3 edges) | tether %.3f, least_loaded %.3f (ratio %.2f); busiest instance: tether %s, least_loaded %s prompt tokens%s | %s |\n",
		t3.LoadCoV, ll.LoadCoV, ratioF(t3.LoadCoV, ll.LoadCoV), thousands(t3.MaxInstancePrefillTokens), thousands(ll.MaxInstancePrefillTokens), bound, verdict(t3.LoadCoV <= 1.5*ll.LoadCoV))
	sl3, _ := find(head, PolicySessionLocal, 3)
	sl5, _ := find(head, PolicySessionLocal, 5)
	fmt.Fprintf(&b, "| (claim) tether with several edges far above independent replicas | tether 3/5 edges %.3f/%.3f vs session_local %.3f/%.3f | %s |\n",
		t3.HitRate, t5.HitRate, sl3.HitRate, sl5.HitRate, verdict(t3.HitRate > sl3.HitRate && t5.HitRate > sl5.HitRate))
	if tl3, ok := find(head, PolicyTetherLocal, 3); ok {
		tl5, _ := find(head, PolicyTetherLocal, 5)
		fmt.Fprintf(&b, "| (claim) the shared log beats per-edge state for tether's own decision | tether 3/5 edges %.3f/%.3f vs tether_local %.3f/%.3f | %s |\n",
			t3.HitRate, t5.HitRate, tl3.HitRate, tl5.HitRate, verdict(t3.HitRate > tl3.HitRate && t5.HitRate > tl5.HitRate))
	}
	for _, a := range agents {
		var t, rr, rnd AgentSummary
		for _, p := range a.Policies {
			switch p.Name {
			case string(PolicyTether):
				t = p
			case string(PolicyRoundRobin):
				rr = p
			case string(PolicyRandom):
				rnd = p
			}
		}
		switch a.Pattern {
		case PatternReAct:
			fmt.Fprintf(&b, "| agents: 8-call agent prefill reduction vs round robin ≥ 70%% | tether %.0f ms vs round robin %.0f ms: %s | %s |\n",
				t.PrefillMs, rr.PrefillMs, pct(-t.Reduction), verdict(t.Reduction >= 0.70))
			if rnd.PrefillMs > 0 {
				red := 1 - t.PrefillMs/rnd.PrefillMs
				fmt.Fprintf(&b, "| agents: 8-call agent prefill vs random, as the contract measures it (worked example: %.0f → %.0f ms) | tether %.0f ms vs random %.0f ms: %s | %s |\n",
					SpecReAct.RandomMs, SpecReAct.CacheAwareMs, t.PrefillMs, rnd.PrefillMs, pct(-red), verdict(red >= 1-SpecReAct.CacheAwareMs/SpecReAct.RandomMs))
			}
		case PatternSupervisor:
			fmt.Fprintf(&b, "| agents: supervisor's sibling sub-agents share their tool prefix (first-call hit > 0) | tether %.3f (round robin %.3f) | %s |\n",
				t.SubagentFirstCallHitRate, rr.SubagentFirstCallHitRate, verdict(t.SubagentFirstCallHitRate > 0))
		}
	}
	return b.String()
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func ratioF(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// Plotter draws the report's figures as PNG files. ops/bench/plots
// implements it with gonum/plot; the interface keeps that stack out of
// every binary but the report's (cmd/tether-bench).
type Plotter interface {
	HitRateByPolicy(path, title string, upper float64, rows []Summary) error
	Lines(path, title, xLabel, yLabel string, yMin, yMax float64, series []Series) error
	TTFTCDF(path, title string, runs []*RunResult) error
}

// Series is one line of a plot.
type Series struct {
	Name   string
	Points []Point
}

// Point is one point of a Series.
type Point struct{ X, Y float64 }
