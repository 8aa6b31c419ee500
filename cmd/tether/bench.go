package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tether-project/tether/internal/progress"
	"github.com/tether-project/tether/ops/bench"
	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/worker/adp"
)

func init() {
	register("bench", "replay agentic traces and the agent patterns of docs/agent-workloads.md; compare routing policies and edge counts", runBench)
}

const benchUsage = `usage: tether bench <replay|agents|report> [flags]

  replay   replay trace files (sim: virtual time; e2e: a running deployment)
  agents   the agent patterns of docs/agent-workloads.md (react, supervisor, fanout, retry, tag)
  lora     agent types on their own LoRA adapters over a fleet with a few adapter slots per instance
  sessions a closed loop of multi-turn sessions (Dynamo's session-routing replay: 2,200 × 20 turns at concurrency 1,024)
  report   see tether-bench report (make bench-report): everything BENCHMARKS.md publishes

Run 'tether bench <command> -h' for its flags.
`

func runBench(ctx context.Context, args []string) error {
	if done, err := groupUsage(args, benchUsage, "missing bench command"); done {
		return err
	}
	switch args[0] {
	case "replay":
		return runBenchReplay(ctx, args[1:])
	case "agents":
		return runBenchAgents(ctx, args[1:])
	case "lora":
		return runBenchLoRA(ctx, args[1:])
	case "sessions":
		return runBenchSessions(ctx, args[1:])
	case "report":
		return fmt.Errorf("%w: the report is built by its own binary, which links the plotting libraries this one does not: make bench-report (or go run ./cmd/tether-bench)", errUsage)
	}
	return fmt.Errorf("%w: unknown bench command %q (want replay, agents, lora or report)", errUsage, args[0])
}

// simFlags are the fleet and harness flags shared by the bench commands.
type simFlags struct {
	mode          *string
	api           *string
	instances     *int
	ranks         *int
	capacity      *int
	edges         *string
	policies      *string
	timeScale     *float64
	seed          *uint64
	logKind       *string
	parallel      *int
	jsonOut       *bool
	edgeURLs      *string
	noBreaker     *bool
	commitFirst   *bool
	share         *string
	model         *string
	parentHeader  *string
	genWorkers    *int
	adpPlacement  *string
	ovfQueued     *int
	rebindAfter   *time.Duration
	cacheLost     *float64
	cacheLostIdle *time.Duration
	engineMetrics *string
	subagentOwn   *bool
	shedQueued    *int
	shedBacklog   *float64
	shedTPS       *float64
	kvEvents      *string
	edgeRestarts  *int
	refuseLarge   *bool
}

// addSimFlags registers the shared flags; external adds those that point
// e2e mode at a running deployment (--edge-urls, --model, --parent-header),
// which only bench replay accepts.
func addSimFlags(fs *flag.FlagSet, defEdges string, defCapacity, defRanks int, external bool) *simFlags {
	empty, model, header := "", devstack.DefaultModel, devstack.ParentHeader
	sf := &simFlags{edgeURLs: &empty, model: &model, parentHeader: &header}
	if external {
		sf.edgeURLs = fs.String("edge-urls", "", "e2e: comma-separated edge base URLs (default: start a local deployment)")
		sf.model = fs.String("model", devstack.DefaultModel, "e2e with --edge-urls: the model the deployment serves")
		sf.parentHeader = fs.String("parent-header", devstack.ParentHeader,
			"e2e with --edge-urls: the deployment's parent-session header (conversation_affinity_header_for_subagents)")
	}
	sf.add(fs, defEdges, defCapacity, defRanks)
	return sf
}

func (sf *simFlags) add(fs *flag.FlagSet, defEdges string, defCapacity, defRanks int) {
	*sf = simFlags{edgeURLs: sf.edgeURLs, model: sf.model, parentHeader: sf.parentHeader,
		mode:      fs.String("mode", "sim", "sim (virtual time, in-process) or e2e (HTTP against a running deployment)"),
		instances: fs.Int("instances", 8, "worker instances (sim)"),
		ranks:     fs.Int("ranks", defRanks, "ADP ranks per instance (sim)"),
		capacity:  fs.Int("capacity-blocks", defCapacity, "KV blocks per instance, split evenly over its ranks (sim)"),
		edges:     fs.String("edges", defEdges, "edge counts, comma-separated (e.g. 1,3,5)"),
		policies:  fs.String("policies", "all", "policies, comma-separated: random, round_robin, least_loaded, session_local, session, prefix, dynamo, dynamo_kv, llmd, smg, trtllm_conversation, tether_local, tether, the tether_* ablations (all: every one but dynamo_kv and the ablations)"),
		timeScale: fs.Float64("time-scale", 1, "multiply the workload's timing (0.5 = twice as fast)"),
		seed:      fs.Uint64("seed", 1, "seed for the load balancer's edge choice and the random policy"),
		logKind:   fs.String("log", "virtual", "affinity log in sim mode: virtual (virtual time, commit latency measured by BenchmarkBindCommit) or sequencer (zero commit latency)"),
		parallel:  fs.Int("parallel", 0, "concurrent runs in sim mode (0: one per CPU)"),
		jsonOut:   fs.Bool("json", false, "print one JSON object instead of tables"),
		api:       fs.String("api", "chat", "e2e: the API the requests are sent in: chat, messages (as Claude Code: its session header, the Messages shape) or responses (as Codex: prompt_cache_key)"),
		noBreaker: fs.Bool("no-breaker", false, "sim: disable the tether policy's cache circuit breaker"),
		share: fs.String("share", "",
			"sim: edge-local state the edges share, ~1 ms after an edge learns it: placements, dispatches, worksets and overload transitions (shipped), predictions, breakers and, without KV events, the shadow caches' routes (ablations), all or none (default: placements,dispatches,worksets,overload)"),
		commitFirst: fs.Bool("commit-first", false,
			"sim: a new conversation's first request waits for its Bind to commit (the edge's placement.commit_first) instead of being dispatched beside it"),
		genWorkers: fs.Int("generation-workers", 2, "e2e local deployment: generation workers"),
		adpPlacement: fs.String("adp-placement", "round_robin",
			"workers' kv_cache_routing_new_conv_placement: round_robin, least_tokens or least_queued"),
		ovfQueued: fs.Int("overflow-queued-requests", routing.DefaultConfig().Overflow.QueuedRequests,
			"sim: routing overflow.queued_requests of the tether policies (a saturation threshold; 0: none)"),
		rebindAfter: fs.Duration("rebind-after", routing.DefaultConfig().Overflow.RebindAfter,
			"sim: routing overflow.rebind_after of the tether policies (0: never rebind)"),
		cacheLost: fs.Float64("cache-lost-below", routing.DefaultConfig().Overflow.CacheLostBelow,
			"sim: routing overflow.cache_lost_below of the tether policies (0: no cache-lost rebind)"),
		cacheLostIdle: fs.Duration("cache-lost-min-idle", routing.DefaultConfig().Overflow.CacheLostMinIdle,
			"sim: routing overflow.cache_lost_min_idle of the tether policies (0: check at once)"),
		engineMetrics: fs.String("engine-metrics", "",
			"e2e with --edge-urls: comma-separated /metrics URLs of the deployment's vLLM engines; the report adds the prompt tokens they computed, found cached and received by KV transfer (vllm:prompt_tokens_by_source_total)"),
		subagentOwn: fs.Bool("subagent-cache-lost", routing.DefaultConfig().Overflow.SubAgentCacheLost,
			"sim: routing overflow.subagent_cache_lost of the tether policies (a sub-agent whose context its parent's instance lost is placed on its own)"),
		shedQueued: fs.Int("shed-max-queued-requests", routing.DefaultConfig().Shed.MaxQueuedRequests,
			"sim: routing shed.max_queued_requests of the routing policies (a hard limit in queued requests; 0: none)"),
		shedBacklog: fs.Float64("shed-max-backlog-seconds", routing.DefaultConfig().Shed.MaxBacklogSeconds,
			"sim: routing shed.max_backlog_seconds of the routing policies (a hard limit in seconds of prefill queued ahead; an instance at or above it sheds when every other is too; 0: none)"),
		shedTPS: fs.Float64("shed-prefill-tokens-per-sec", 0,
			"sim: routing shed.prefill_tokens_per_second of the routing policies (0: routing's default; bench sessions: the engines' --prefill-tokens-per-sec when given)"),
		kvEvents: fs.String("kv-events", "exact",
			"sim: what the edges hear of the workers' caches, for every policy alike: exact, lag=DUR (each batch DUR late) or none (no engine events)"),
		edgeRestarts: fs.Int("edge-restarts", 0,
			"sim: restart edges N times, spread over the replay; a restarted edge keeps only what its policy persists"),
		refuseLarge: fs.Bool("refuse-oversized", false,
			"sim: the engines refuse a prompt larger than a rank's KV cache at once (context_length_exceeded, as vLLM and e2e mode do) instead of computing it in full without the cache"),
	}
}

func (f *simFlags) replayOptions() (bench.ReplayOptions, error) {
	var ro bench.ReplayOptions
	if !slices.Contains(bench.APIs, *f.api) {
		return ro, fmt.Errorf("%w: --api: unknown value %q (allowed: %s)", errUsage, *f.api, strings.Join(bench.APIs, ", "))
	}
	if *f.mode != "sim" && *f.mode != "e2e" {
		return ro, fmt.Errorf("%w: --mode: unknown value %q (allowed: sim, e2e)", errUsage, *f.mode)
	}
	pols, err := bench.ParsePolicies(*f.policies)
	if err != nil {
		return ro, fmt.Errorf("%w: %v", errUsage, err)
	}
	edges, err := parseIntList("--edges", *f.edges)
	if err != nil {
		return ro, err
	}
	lk, err := bench.ParseLogKind(*f.logKind)
	if err != nil {
		return ro, fmt.Errorf("%w: %v", errUsage, err)
	}
	cfg := bench.DefaultSimConfig()
	cfg.Instances, cfg.Ranks, cfg.CapacityBlocks = *f.instances, *f.ranks, *f.capacity
	cfg.TimeScale, cfg.Seed, cfg.Log, cfg.NoBreaker = *f.timeScale, *f.seed, lk, *f.noBreaker
	cfg.CommitFirst = *f.commitFirst
	if *f.share != "" {
		if cfg.Share, err = bench.ParseShare(*f.share); err != nil {
			return ro, fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	if cfg.ADPPlacement, err = adp.ParsePlacement(*f.adpPlacement); err != nil {
		return ro, fmt.Errorf("%w: --adp-placement: %v", errUsage, err)
	}
	cfg.Routing.Overflow.QueuedRequests, cfg.Routing.Overflow.RebindAfter = *f.ovfQueued, *f.rebindAfter
	cfg.Routing.Overflow.CacheLostBelow, cfg.Routing.Overflow.CacheLostMinIdle = *f.cacheLost, *f.cacheLostIdle
	cfg.Routing.Overflow.SubAgentCacheLost = *f.subagentOwn
	cfg.Routing.Shed.MaxQueuedRequests, cfg.Routing.Shed.MaxBacklogSeconds = *f.shedQueued, *f.shedBacklog
	if *f.shedTPS != 0 {
		cfg.Routing.Shed.PrefillTokensPerSecond = *f.shedTPS
	}
	if err := cfg.Routing.Validate(); err != nil {
		return ro, fmt.Errorf("%w: %v", errUsage, err)
	}
	if cfg.KVEvents, err = bench.ParseKVEvents(*f.kvEvents); err != nil {
		return ro, fmt.Errorf("%w: %v", errUsage, err)
	}
	if *f.edgeRestarts < 0 || *f.edgeRestarts > 1000 {
		return ro, fmt.Errorf("%w: --edge-restarts must be 0..1000, got %d", errUsage, *f.edgeRestarts)
	}
	cfg.EdgeRestarts, cfg.RefuseOversized = *f.edgeRestarts, *f.refuseLarge
	if *f.parallel < 0 {
		return ro, fmt.Errorf("%w: --parallel must be >= 0, got %d", errUsage, *f.parallel)
	}
	return bench.ReplayOptions{Base: cfg, Policies: pols, Edges: edges, Parallel: *f.parallel}, nil
}

func parseIntList(name, s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%w: %s: %q is not a positive integer", errUsage, name, p)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s: empty list", errUsage, name)
	}
	return out, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func runBenchReplay(ctx context.Context, args []string) error {
	fs := newFlagSet("bench replay")
	traces := fs.String("traces", "", "directory of trace files (*.json, *.json.gz) (required)")
	shared := fs.Int("shared-prefix-blocks", 0, "prepend this many blocks common to every trace (a fleet-wide system prompt)")
	limit := fs.Int("limit", 0, "replay only the first N traces (0: all)")
	smallest := fs.Int("smallest", 0, "replay only the N traces with the fewest prompt tokens (0: all; a cheap subset for e2e)")
	maxDuration := fs.Duration("max-duration", 0, "replay only traces whose last request starts within this long (0: all)")
	stagger := fs.Duration("stagger", 0, "start each conversation at an offset in [0, stagger) derived from its trace id (0: all at once)")
	half := fs.String("half", "", "keep one half of the traces: tuning or validation (sorted by id, alternating; empty: all)")
	arrangements := fs.Int("arrangements", 0,
		"sim: run every policy on arrangements 1..N of the workload (start offsets within --stagger and sub-agent jitter drawn from each; paired) and report medians with intervals (0: one run, offsets from the trace ids)")
	burst := fs.Bool("burst", false, "sibling sub-agents start within 10 ms of each other, their first requests through different edges")
	markdown := fs.Bool("markdown", false, "with --arrangements: print the Markdown tables BENCHMARKS.md uses")
	logCheck := fs.Bool("log-check", false, "with --arrangements: also run tether with the sequencer log at every edge count (the log's latency, paired)")
	sf := addSimFlags(fs, "3", 6000, 1, true)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: tether bench replay --traces DIR [flags]\n\ne2e mode scales the workload's timing and the simulated workers' engine time by --time-scale alike\n(e.g. --time-scale 0.05); the sim comparison it prints runs at scale 1.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *traces == "" {
		return fmt.Errorf("%w: --traces is required", errUsage)
	}
	if *limit < 0 || *shared < 0 || *smallest < 0 || *maxDuration < 0 || *stagger < 0 || *arrangements < 0 || *arrangements > 1000 {
		return fmt.Errorf("%w: --limit, --smallest, --max-duration, --stagger and --shared-prefix-blocks must be >= 0, --arrangements 0..1000", errUsage)
	}
	ro, err := sf.replayOptions()
	if err != nil {
		return err
	}
	topts := bench.TraceOptions{SharedPrefixBlocks: *shared, Limit: *limit, Smallest: *smallest, MaxDuration: *maxDuration, Half: *half}
	load := func(arr uint64) (*bench.Workload, error) {
		w, err := bench.LoadTraces(*traces, topts)
		if err != nil {
			return nil, err
		}
		return w, bench.Arrangement{Seed: arr, Stagger: *stagger, Burst: *burst}.Arrange(w)
	}
	if *arrangements > 0 {
		if *sf.mode != "sim" {
			return fmt.Errorf("%w: --arrangements is a sim-mode comparison", errUsage)
		}
		return runArranged(ctx, load, ro, *arrangements, *logCheck, *sf.jsonOut, *markdown)
	}
	w, err := load(0)
	if err != nil {
		return err
	}
	if *sf.mode == "e2e" {
		return runReplayE2E(ctx, w, sf, ro)
	}
	if !*sf.jsonOut {
		bench.Describe(os.Stdout, w, ro.Base)
	}
	ro.Progress = progress.New(os.Stderr, "replay").Count
	rep, err := bench.Replay(ctx, w, ro)
	if err != nil {
		return err
	}
	if *sf.jsonOut {
		return printJSON(rep)
	}
	return rep.WriteText(os.Stdout)
}

func runArranged(ctx context.Context, load func(uint64) (*bench.Workload, error), ro bench.ReplayOptions, n int, logCheck, jsonOut, markdown bool) error {
	arrs := make([]uint64, n)
	for i := range arrs {
		arrs[i] = uint64(i + 1)
	}
	label := fmt.Sprintf("kv-events %s, edge restarts %d", ro.Base.KVEvents, ro.Base.EdgeRestarts)
	p := progress.New(os.Stderr, "replay")
	ro.Progress = p.Count
	rep, err := bench.ReplayArranged(ctx, bench.ArrangedOptions{Replay: ro, Load: load, Arrangements: arrs, Label: label, LogCheck: logCheck})
	if err != nil {
		return err
	}
	switch {
	case jsonOut:
		return printJSON(rep)
	case markdown:
		return rep.WriteMarkdown(os.Stdout)
	}
	return rep.WriteText(os.Stdout)
}

func runBenchSessions(ctx context.Context, args []string) error {
	fs := newFlagSet("bench sessions")
	d := bench.DynamoSessionOptions
	sessions := fs.Int("sessions", d.Sessions, "conversations")
	turns := fs.Int("turns", d.Turns, "turns per conversation")
	conc := fs.Int("concurrency", d.Concurrency, "conversations at once (a closed loop: each client starts its next when one ends)")
	in := fs.Int("input-tokens", d.InputTokens, "new tokens each turn (the conversation so far is resent)")
	out := fs.Int("output-tokens", d.OutputTokens, "tokens answered each turn")
	sys := fs.Int("shared-prefix-tokens", 0, "a system prompt common to every session")
	prefill := fs.Float64("prefill-tokens-per-sec", 0,
		"the simulated engines' prefill speed, and the routing policies' shed.prefill_tokens_per_second unless --shed-prefill-tokens-per-sec is given, as an operator sets it (0: the simulator's default, 5,500 tokens/s)")
	sf := addSimFlags(fs, "3", 6000, 1, false)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *prefill < 0 || *prefill > 1e9 {
		return fmt.Errorf("%w: --prefill-tokens-per-sec must be in [0, 1e9], got %v", errUsage, *prefill)
	}
	if *sf.mode != "sim" {
		return fmt.Errorf("%w: bench sessions runs in sim mode only", errUsage)
	}
	ro, err := sf.replayOptions()
	if err != nil {
		return err
	}
	if *prefill > 0 {
		ro.Base.Engine.PrefillTokensPerSec = *prefill
		if *sf.shedTPS == 0 {
			ro.Base.Routing.Shed.PrefillTokensPerSecond = *prefill
		}
	}
	w, err := bench.SessionWorkload(bench.SessionOptions{Sessions: *sessions, Turns: *turns, Concurrency: *conc,
		InputTokens: *in, OutputTokens: *out, BlockSize: d.BlockSize, SharedPrefixTokens: *sys})
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if !*sf.jsonOut {
		bench.Describe(os.Stdout, w, ro.Base)
	}
	p := progress.New(os.Stderr, "sessions")
	ro.Progress = p.Count
	rep, err := bench.Replay(ctx, w, ro)
	if err != nil {
		return err
	}
	if *sf.jsonOut {
		return printJSON(rep)
	}
	return bench.WriteSessionTable(os.Stdout, rep)
}

func runBenchAgents(ctx context.Context, args []string) error {
	fs := newFlagSet("bench agents")
	pattern := fs.String("pattern", "", "react, supervisor, fanout, retry or tag (required)")
	executions := fs.Int("executions", 1, "executions of the pattern (same agent type, own contexts)")
	interval := fs.Duration("interval", 0, "start offset between executions")
	sf := addSimFlags(fs, "3", 16384, 2, false)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	p, err := bench.ParsePattern(*pattern)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	ro, err := sf.replayOptions()
	if err != nil {
		return err
	}
	opts := bench.AgentOptions{Pattern: p, Executions: *executions, Interval: *interval}
	var rep *bench.AgentsReport
	if *sf.mode == "e2e" {
		rep, err = runAgentsE2E(ctx, opts, sf, ro)
	} else {
		rep, err = bench.RunAgents(ctx, opts, ro)
	}
	if err != nil {
		return err
	}
	if *sf.jsonOut {
		return printJSON(rep)
	}
	return rep.WriteText(os.Stdout)
}

func runReplayE2E(ctx context.Context, w *bench.Workload, sf *simFlags, ro bench.ReplayOptions) error {
	if len(ro.Edges) > 1 {
		return fmt.Errorf("%w: --edges: e2e mode takes one edge count, got %v", errUsage, ro.Edges)
	}
	var out *bench.E2EComparison
	if *sf.edgeURLs != "" {
		if len(ro.Policies) != 1 {
			return fmt.Errorf("%w: with --edge-urls the deployment's configuration decides the policy: pass exactly one --policies name to label the run", errUsage)
		}
		urls := splitList(*sf.edgeURLs)
		metrics := splitList(*sf.engineMetrics)
		var before bench.EngineWork
		if len(metrics) > 0 {
			var err error
			if before, err = bench.ScrapeEngineWork(ctx, http.DefaultClient, metrics); err != nil {
				return fmt.Errorf("--engine-metrics: %w", err)
			}
		}
		p := progress.New(os.Stderr, "e2e "+string(ro.Policies[0]))
		r, err := bench.ReplayE2E(ctx, w, bench.E2EOptions{
			EdgeURLs: urls, Model: *sf.model, ParentHeader: *sf.parentHeader, TimeScale: ro.Base.TimeScale, Seed: ro.Base.Seed,
			Label: ro.Policies[0], RouteHeader: "x-tether-route", API: *sf.api,
			Progress: func(d, t int) { p.Count(int64(d), int64(t)) },
		})
		if err != nil {
			return err
		}
		out = &bench.E2EComparison{Mode: "e2e", UpperBound: bench.UpperBound(w), Policies: []bench.Summary{bench.Summarize(r)}}
		if len(metrics) > 0 {
			after, err := bench.ScrapeEngineWork(ctx, http.DefaultClient, metrics)
			if err != nil {
				return fmt.Errorf("--engine-metrics: %w", err)
			}
			work := after.Since(before, r)
			out.EngineWork = &work
		}
	} else {
		if *sf.engineMetrics != "" {
			return fmt.Errorf("%w: --engine-metrics needs --edge-urls (the deployment whose engines it scrapes)", errUsage)
		}
		p := progress.New(os.Stderr, "e2e")
		local := localOptions(sf, ro)
		local.Progress = func(d, t int) { p.Count(int64(d), int64(t)) }
		local.Stage = p.Stage
		var err error
		if out, err = bench.CompareE2E(ctx, w, ro.Policies, local, ro); err != nil {
			return err
		}
	}
	if *sf.jsonOut {
		return printJSON(out)
	}
	if len(out.Skipped) > 0 {
		fmt.Printf("skipped in e2e (not expressible by a deployment's configuration): %s\n", strings.Join(out.Skipped, ", "))
	}
	fmt.Println("e2e (times in engine units: wall time ÷ --time-scale):")
	if err := (&bench.Report{Mode: "e2e", UpperBound: out.UpperBound, Policies: out.Policies}).WriteText(os.Stdout); err != nil {
		return err
	}
	fmt.Println(bench.TTFTScaleNote(ro.Base.TimeScale))
	if out.EngineWork != nil {
		if err := out.EngineWork.WriteText(os.Stdout); err != nil {
			return err
		}
	}
	if out.Sim != nil {
		fmt.Println("sim (same workload and fleet shape, time scale 1):")
		if err := out.Sim.WriteText(os.Stdout); err != nil {
			return err
		}
		out.Ranking.WriteText(os.Stdout)
	}
	return nil
}

func localOptions(sf *simFlags, ro bench.ReplayOptions) bench.LocalE2EOptions {
	return bench.LocalE2EOptions{
		Edges: ro.Edges[0], ContextWorkers: ro.Base.Instances, GenerationWorkers: *sf.genWorkers, Ranks: ro.Base.Ranks,
		CapacityBlocks: ro.Base.CapacityBlocks, TimeScale: ro.Base.TimeScale, Seed: ro.Base.Seed,
		ADPPlacement: ro.Base.ADPPlacement, Overflow: ro.Base.Routing.Overflow, API: *sf.api,
	}
}

func runAgentsE2E(ctx context.Context, opts bench.AgentOptions, sf *simFlags, ro bench.ReplayOptions) (*bench.AgentsReport, error) {
	w, err := bench.Agents(opts)
	if err != nil {
		return nil, err
	}
	var runs []*bench.RunResult
	for _, pol := range ro.Policies {
		if !bench.ExpressibleE2E(pol) {
			fmt.Fprintf(os.Stderr, "skipping %s: not expressible by a deployment's configuration\n", pol)
			continue
		}
		r, err := bench.ReplayLocalE2E(ctx, w, pol, localOptions(sf, ro))
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
	}
	return bench.SummarizeAgents(opts.Pattern, w, "e2e", runs), nil
}
