package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/worker"
	"github.com/tether-project/tether/worker/adp"
)

// E2EPolicies are the policies a deployment can express through its edge
// configuration (context fleet router type, parent header, KV weight,
// overflow). random has no router type; session_local needs edges that do
// not share a log, which a tether deployment never has.
var E2EPolicies = []Policy{PolicyRoundRobin, PolicyLeastLoaded, PolicySession, PolicyPrefix, PolicyTether}

// ExpressibleE2E reports whether a local deployment can run policy p.
func ExpressibleE2E(p Policy) bool {
	for _, q := range E2EPolicies {
		if q == p {
			return true
		}
	}
	return false
}

func (o LocalE2EOptions) stage(what string) {
	if o.Stage != nil {
		o.Stage(what)
	}
}

// LocalE2EOptions configure e2e runs against local deployments started by
// the harness (ops/devstack: embedded NATS, edges on loopback Raft,
// simulated context and generation workers), one per policy.
type LocalE2EOptions struct {
	Edges             int
	ContextWorkers    int // the fleet whose cache the hit rate measures
	GenerationWorkers int
	Ranks             int
	CapacityBlocks    int     // per context worker, split over its ranks
	TimeScale         float64 // engine wall time per engine second, and the workload's timing scale
	Seed              uint64
	ADPPlacement      adp.Placement // the workers' new-conversation rank placement
	// Overflow is the tether policy's routing overflow configuration
	// (zero: the edge's default).
	Overflow routing.OverflowConfig
	Progress func(done, total int)
	// Stage, when set, is told what the harness does between replays
	// (starting a deployment, replaying, stopping it), so a progress
	// display says what it waits for.
	Stage func(what string)
	// EdgeFor, when set, picks each request's edge (E2EOptions.EdgeFor).
	EdgeFor func(agent string, call int) int
	// ReadyTimeout bounds the deployment's start (default 60s).
	ReadyTimeout time.Duration
	// Inspect, when set, is called after the replay, before the deployment
	// stops (diagnostics: the edges' and workers' /metrics).
	Inspect func(ctx context.Context, s *devstack.Stack)
	// GenerationCapacityBlocks, when > 0, is each generation worker's KV
	// capacity (split over its ranks) instead of CapacityBlocks. The sim
	// models the context fleet only; a generation worker holds a prompt's
	// blocks while it decodes, so its capacity can add KV waits to the
	// client's first token that sim mode does not have.
	GenerationCapacityBlocks int
	// API is the dialect of the requests (E2EOptions.API).
	API string
}

// policyEdgeConfig sets the edge configuration that expresses p.
func policyEdgeConfig(p Policy, c *edge.Config) {
	c.ContextServers.Router.Type = routing.RouterConversation
	switch p {
	case PolicyRoundRobin:
		c.ContextServers.Router.Type = routing.RouterRoundRobin
		c.ParentHeader = ""
	case PolicyLeastLoaded:
		c.ContextServers.Router.Type = routing.RouterLoadBalancing
		c.ParentHeader = ""
	case PolicyPrefix:
		c.ContextServers.Router.Type = routing.RouterKVCacheAware
		c.ParentHeader = ""
	case PolicySession:
		// Sticky sessions by load: no parent affinity, no cache credit,
		// no overflow.
		c.ParentHeader = ""
		c.Placement.Weights.Cache = 0
		c.Placement.Overflow = routing.OverflowConfig{}
	case PolicyTether:
		c.ParentHeader = devstack.ParentHeader
	}
}

// scaleEngineDurations rescales the edge settings whose meaning is engine
// time (the sim's values) to a deployment running at timeScale: the edge's
// durations are wall time. cache_lost_min_idle and touch_interval go
// together: the cache-lost check judges idleness from the committed last use,
// which a Touch batch advances once per touch_interval, so a wall-time touch
// interval longer than the scaled idle threshold would make every busy
// binding look idle.
func scaleEngineDurations(c *edge.Config, timeScale float64) {
	scale := func(d *time.Duration) {
		if *d > 0 {
			*d = max(time.Duration(float64(*d)*timeScale), time.Millisecond)
		}
	}
	scale(&c.Placement.PredictTTL)
	scale(&c.Placement.Overflow.RebindAfter)
	scale(&c.Placement.Overflow.CacheLostMinIdle)
	scale(&c.Placement.Breaker.Window)
	scale(&c.Placement.Breaker.Cooldown)
	scale(&c.SessionTTL)
	scale(&c.TouchInterval)
	if c.Placement.Breaker.Window/time.Duration(max(c.Placement.Breaker.Buckets, 1)) < time.Millisecond {
		c.Placement.Breaker.Buckets = 1
	}
}

// ReplayLocalE2E starts a local deployment configured for policy p,
// replays w against it and stops it.
func ReplayLocalE2E(ctx context.Context, w *Workload, p Policy, o LocalE2EOptions) (_ *RunResult, err error) {
	if !ExpressibleE2E(p) {
		return nil, fmt.Errorf("bench: e2e: policy %s cannot be expressed by a deployment's configuration (e2e runs: %v)", p, E2EPolicies)
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 60 * time.Second
	}
	if o.Ranks < 1 || o.CapacityBlocks < o.Ranks {
		return nil, fmt.Errorf("bench: e2e: need at least one rank and one block per rank (ranks %d, capacity %d)", o.Ranks, o.CapacityBlocks)
	}
	perRank := o.CapacityBlocks / o.Ranks
	stack, err := devstack.Start(ctx, devstack.Options{
		Edges: o.Edges, ContextWorkers: o.ContextWorkers, GenerationWorkers: o.GenerationWorkers, Ranks: o.Ranks,
		TimeScale: o.TimeScale,
		EdgeConfig: func(_ int, c *edge.Config) {
			policyEdgeConfig(p, c)
			if p == PolicyTether && o.Overflow != (routing.OverflowConfig{}) {
				c.Placement.Overflow = o.Overflow
			}
			scaleEngineDurations(c, o.TimeScale)
		},
		WorkerConfig: func(name string, c *worker.Config) {
			c.Engine.CapacityBlocks = perRank
			if o.GenerationCapacityBlocks > 0 && strings.HasPrefix(name, "gen-") {
				c.Engine.CapacityBlocks = max(o.GenerationCapacityBlocks/o.Ranks, 1)
			}
			c.Engine.BlockSize = w.BlockSize
			c.ADP.AttentionDP.NewConvPlacement = o.ADPPlacement.String()
		},
	})
	if err != nil {
		return nil, fmt.Errorf("bench: e2e %s: start deployment: %w", p, err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = errors.Join(err, stack.Close(cctx))
	}()
	o.stage(fmt.Sprintf("waiting for the %s deployment to be ready", p))
	defer o.stage(fmt.Sprintf("stopping the %s deployment", p))
	rctx, cancel := context.WithTimeout(ctx, o.ReadyTimeout)
	err = stack.WaitReady(rctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("bench: e2e %s: deployment not ready: %w (%s)", p, err, stack.NotReady())
	}
	var urls []string
	for _, e := range stack.Edges() {
		urls = append(urls, e.URL())
	}
	before, err := commitIndex(ctx, stack)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	o.stage(fmt.Sprintf("replaying through the %s deployment", p))
	res, err := ReplayE2E(ctx, w, E2EOptions{
		EdgeURLs: urls, Model: stack.Model(), ParentHeader: devstack.ParentHeader, TimeScale: o.TimeScale, Seed: o.Seed,
		Client: &http.Client{Transport: tr}, Label: p, Progress: o.Progress, RouteHeader: edge.HeaderRoute, EdgeFor: o.EdgeFor,
		API: o.API,
	})
	if err != nil {
		return nil, err
	}
	if o.Inspect != nil {
		o.Inspect(ctx, stack)
	}
	after, err := commitIndex(ctx, stack)
	if err != nil {
		return nil, err
	}
	// Log entries committed during the replay (an entry may batch events).
	res.Commits = int(after - before)
	return res, nil
}

// commitIndex reads the log's commit index from the leader (any edge while
// an election is under way: a follower's commit index trails by at most the
// entries in flight).
func commitIndex(ctx context.Context, s *devstack.Stack) (uint64, error) {
	var errs []error
	nodes := s.Edges()
	if l := s.Leader(); l != nil {
		nodes = append([]*devstack.EdgeNode{l}, nodes...)
	}
	for _, n := range nodes {
		if !n.Running() {
			continue
		}
		ci, err := n.Cluster(ctx)
		if err == nil {
			return ci.CommitIndex, nil
		}
		errs = append(errs, err)
	}
	return 0, fmt.Errorf("bench: e2e: read commit index: %w", errors.Join(errs...))
}
