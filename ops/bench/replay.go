package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// ReplayOptions is one comparison: every policy at every edge count.
type ReplayOptions struct {
	Base     SimConfig // Policy and Edges are set per run
	Policies []Policy
	Edges    []int
	// Parallel bounds concurrent runs (0: GOMAXPROCS). Runs are
	// independent and each is deterministic, so parallelism changes only
	// the wall time.
	Parallel int
	// Progress, when set, receives the requests completed over all runs.
	Progress func(done, total int64)
	// KeepRecords keeps every run's per-request records in the report.
	KeepRecords bool
}

// Report is a comparison's outcome.
type Report struct {
	Mode       string  `json:"mode"`
	UpperBound float64 `json:"upper_bound_hit_rate"`
	// FittingBound is the infinite-cache bound without credit for prompts
	// larger than a rank's cache; PooledBound the capacity-aware reference
	// (one cache of the fleet's total capacity, in the admission order of
	// the first tether run, else the first run).
	FittingBound float64   `json:"fitting_bound_hit_rate,omitempty"`
	PooledBound  float64   `json:"pooled_bound_hit_rate,omitempty"`
	Policies     []Summary `json:"policies"`
	// Runs hold the raw results (records only with KeepRecords), in the
	// order of Policies.
	Runs []*RunResult `json:"-"`
}

// Replay runs every (policy, edges) combination of opts over w.
func Replay(ctx context.Context, w *Workload, opts ReplayOptions) (*Report, error) {
	if len(opts.Policies) == 0 || len(opts.Edges) == 0 {
		return nil, errors.New("bench: replay: no policies or no edge counts")
	}
	type job struct {
		policy Policy
		edges  int
	}
	var jobs []job
	for _, p := range opts.Policies {
		for _, e := range opts.Edges {
			jobs = append(jobs, job{p, e})
		}
	}
	var perRun int64
	w.WalkRequests(func(*Agent, *Request) { perRun++ })
	total := perRun * int64(len(jobs))
	var done atomic.Int64
	par := opts.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	results := make([]*RunResult, len(jobs))
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
			cfg := opts.Base
			cfg.Policy, cfg.Edges = j.policy, j.edges
			last := 0
			cfg.Progress = func(d, _ int) {
				if opts.Progress != nil && (d-last >= 64 || int64(d) == perRun) {
					opts.Progress(done.Add(int64(d-last)), total)
					last = d
				}
			}
			r, err := Simulate(ctx, w, cfg)
			if err != nil {
				errs[i] = fmt.Errorf("%s with %d edges: %w", j.policy, j.edges, err)
				cancel()
				return
			}
			results[i] = r
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	maxBlocks := opts.Base.CapacityBlocks / max(opts.Base.Ranks, 1)
	rep := &Report{Mode: "sim", UpperBound: UpperBound(w), FittingBound: UpperBoundFitting(w, maxBlocks)}
	ref := results[0]
	for _, r := range results {
		if r.Policy == PolicyTether {
			ref = r
			break
		}
	}
	rep.PooledBound = PooledBound(w, ref, opts.Base.CapacityBlocks*opts.Base.Instances, maxBlocks)
	for _, r := range results {
		rep.Policies = append(rep.Policies, Summarize(r))
		if !opts.KeepRecords {
			r.Records = nil
		}
		rep.Runs = append(rep.Runs, r)
	}
	return rep, nil
}
