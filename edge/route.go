package edge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/routing/hintauth"
)

// Decision outcomes (metric label and span attribute).
const (
	outcomeSticky   = "sticky"
	outcomeNewBind  = "new_bind"
	outcomeOverflow = "overflow"
	outcomeDegraded = "degraded"
	outcomeShed     = "shed"
	outcomeUnbound  = "unbound"
	// outcomeRefused: the log could not commit and this edge's state was
	// not known to be current, so it did not guess (503, retry).
	outcomeRefused = "refused"
)

// retryHint is the Retry-After of a request refused because the log could
// not commit: about one election.
func (e *Edge) retryHint() time.Duration {
	et := e.cfg.Cluster.Raft.ElectionTimeout
	if et <= 0 {
		et = 500 * time.Millisecond
	}
	return max(et, 250*time.Millisecond)
}

// viewsEntry caches the routing views until the fleet view or the log
// changes, or viewsMaxAge passes (health depends on time).
type viewsEntry struct {
	version uint64
	state   *fsm.State
	built   time.Time
	views   *routing.Views
}

const viewsMaxAge = 20 * time.Millisecond

// views returns the routing views at now: the fleet view's instances merged
// with the log's instance records (down → unhealthy, draining → draining).
// exclude marks instances unhealthy for this decision (failed hops).
func (e *Edge) views(now time.Time, exclude []string) *routing.Views {
	st := e.node.State()
	ver := e.fleet.Version()
	if len(exclude) == 0 {
		if c := e.viewsCache.Load(); c != nil && c.version == ver && c.state == st && now.Sub(c.built) < viewsMaxAge && !now.Before(c.built) {
			return c.views
		}
	}
	vs := e.fleet.Views(now, make([]routing.InstanceView, 0, 16))
	for i := range vs {
		v := &vs[i]
		if rec, ok := st.Instance(v.ID); ok {
			switch rec.Status {
			case fsm.InstanceDown, fsm.InstanceRemoved:
				v.Healthy = false
			case fsm.InstanceDraining:
				v.Draining = true
			}
		}
		for _, x := range exclude {
			if x == v.ID {
				v.Healthy = false
			}
		}
		if len(exclude) == 0 {
			e.overload.Observe(v.ID, e.routers[v.Fleet].Condition(v) != 0, now)
		}
	}
	views, err := routing.NewViews(vs)
	if err != nil {
		// Ids are unique and fleets valid by construction; an error here
		// is a bug, and an empty view set answers 503 rather than panic.
		e.log.Error("build routing views", "err", err)
		views, _ = routing.NewViews(nil)
	}
	if len(exclude) == 0 {
		e.viewsCache.Store(&viewsEntry{version: ver, state: st, built: now, views: views})
	}
	return views
}

// hop is where one fleet's part of a request goes.
type hop struct {
	fleet    fsm.Fleet
	key      string
	instance string
	url      string
	rank     int // believed rank (-1 unknown); the worker's answer wins
	cached   int // prompt tokens believed cached on the instance
	outcome  string
	policy   string
	reason   fsm.OverflowReason
	bound    bool // the key is bound (sticky, new bind, overflow, degraded)
	binding  fsm.Binding
	excluded []string
}

// routeError turns a routing failure into the client's answer.
func routeError(f fsm.Fleet, rt routing.Route, err error) *apiError {
	if err != nil {
		if errors.Is(err, routing.ErrNoInstances) {
			return newAPIError(http.StatusServiceUnavailable, "server_error", "no_healthy_instance", "",
				"no healthy %s instance is available: %v", f, err)
		}
		return newAPIError(http.StatusServiceUnavailable, "server_error", "routing_failed", "", "%s routing failed: %v", f, err)
	}
	e := newAPIError(http.StatusTooManyRequests, "rate_limit_error", "overloaded", "",
		"every %s instance is over its load limit; retry after %s", f, rt.RetryAfter)
	e.retryAfter = rt.RetryAfter
	return e
}

// routeFleet decides where fleet f's part of rq goes: sticky to the key's
// committed binding (or an overflow), a new placement proposed through the
// log (the committed winner is used), a degraded placement when the log
// cannot commit, or an unbound placement for unkeyed requests and routers
// that do not bind.
func (e *Edge) routeFleet(ctx context.Context, rq *request, f fsm.Fleet, prev *hop) (*hop, *apiError) {
	ctx, span := e.tracer.Start(ctx, "tether.edge route "+f.String(), trace.WithSpanKind(trace.SpanKindInternal))
	defer span.End()
	h, aerr := e.decide(ctx, rq, f, prev)
	keyKind := "none"
	switch {
	case rq.id.Key(f) == "":
	case rq.id.SubAgent() && rq.id.Key(f) == rq.id.Root:
		keyKind = "parent_root"
	default:
		keyKind = "conversation"
	}
	span.SetAttributes(attrFleet.String(f.String()), attrKeyKind.String(keyKind))
	if aerr != nil {
		span.SetAttributes(attribute.String("tether.error", aerr.Message))
		if aerr.Status == http.StatusTooManyRequests {
			e.metrics.decisions.WithLabelValues(f.String(), routing.PolicyShed, outcomeShed).Inc()
			span.SetAttributes(attrOutcome.String(outcomeShed))
		}
		return nil, aerr
	}
	e.metrics.decisions.WithLabelValues(f.String(), h.policy, h.outcome).Inc()
	span.SetAttributes(attrPolicy.String(h.policy), attrOutcome.String(h.outcome), attrInstance.String(h.instance),
		attrRank.Int(h.rank), attrCachedTokens.Int(h.cached))
	if h.reason != 0 {
		span.SetAttributes(attrOverflow.String(h.reason.String()))
	}
	// The prompt now counts as cached there until the worker's own KV
	// event arrives, so a burst sharing the prefix lands together.
	e.fleet.Index().Predict(h.instance, rq.blocks, rq.now)
	return h, nil
}

func (e *Edge) decide(ctx context.Context, rq *request, f fsm.Fleet, prev *hop) (*hop, *apiError) {
	router := e.routers[f]
	now := rq.now
	h := &hop{fleet: f, key: rq.id.Key(f), rank: -1}
	if prev != nil {
		h.excluded = append(h.excluded, prev.excluded...)
		h.excluded = append(h.excluded, prev.instance)
	}
	views := e.views(now, h.excluded)
	st := e.node.State()
	req := routing.Request{
		Fleet: f, Key: h.key, ConversationID: rq.id.ConversationID, RequestID: rq.requestID, Edge: e.nodeID,
		Priority: rq.priority, PromptTokens: rq.promptTokens, Blocks: rq.blocks,
		Spread: routing.SpreadFor(rq.requestID), RoundRobin: e.rr[f].Add(1) - 1, Now: now,
	}
	in := routing.Inputs{Views: views, Bindings: st, Prefix: e.fleet.Index(), Overload: e.overload}
	set := func(rt routing.Route, outcome string) {
		h.instance, h.url, h.rank, h.cached, h.outcome = rt.Instance, rt.URL, rt.Rank, rt.CachedTokens, outcome
		h.policy = rt.Decision.Policy
		h.reason = rt.Reason
		if h.url == "" {
			if v, ok := views.Lookup(rt.Instance); ok {
				h.url = v.URL
			} else if rec, ok := st.Instance(rt.Instance); ok {
				h.url = rec.URL
			}
		}
	}

	if h.key == "" || !router.Config().Type.Binds() {
		rt, err := router.Place(req, in)
		if err != nil || rt.Action == routing.ActionShed {
			return nil, routeError(f, rt, err)
		}
		set(rt, outcomeUnbound)
		return h, nil
	}

	// A key placed while the log could not commit stays where it went
	// until its Bind is recorded.
	if b, ok := e.recorder.degradedBinding(f, h.key); ok {
		if _, bound := st.Lookup(f, h.key); !bound {
			rt, err := router.RouteBound(req, b, in)
			if err == nil && rt.Action == routing.ActionSticky {
				set(rt, outcomeDegraded)
				h.policy, h.bound, h.binding = routing.PolicyDegraded, true, b
				return h, nil
			}
		}
	}

	if b, ok := st.Lookup(f, h.key); ok {
		return e.routeBound(ctx, rq, h, router, req, in, b, set)
	}

	rt, err := router.Place(req, in)
	if err != nil || rt.Action == routing.ActionShed {
		return nil, routeError(f, rt, err)
	}
	if rt.Action != routing.ActionBind {
		set(rt, outcomeUnbound)
		return h, nil
	}
	if e.logDown() {
		return e.placeDegraded(rq, h, router, req, in, set)
	}
	res, err := e.propose(ctx, rt.BindEvent(req))
	switch {
	case errors.Is(err, cluster.ErrUnavailable):
		if b, ok := e.boundAfterTimeout(ctx, f, h.key); ok {
			return e.routeBound(ctx, rq, h, router, req, in, b, set)
		}
		return e.placeDegraded(rq, h, router, req, in, set)
	case err != nil:
		return nil, newAPIError(http.StatusServiceUnavailable, "server_error", "affinity_log_unavailable", "",
			"recording the %s placement of %q failed: %v", f, h.key, err)
	case res.Status == fsm.StatusRejected || !res.Found:
		// The log refused the instance (it went down meanwhile): route
		// by what the log says now.
		if b, ok := e.node.State().Lookup(f, h.key); ok {
			return e.routeBound(ctx, rq, h, router, req, in, b, set)
		}
		return nil, newAPIError(http.StatusServiceUnavailable, "server_error", "placement_rejected", "",
			"the affinity log rejected placing %s key %q on %s: %s", f, h.key, rt.Instance, res.Reason)
	}
	won := res.Binding
	if won.Instance != rt.Instance {
		// Another edge bound the key first: its placement is the one
		// every edge uses.
		return e.routeBound(ctx, rq, h, router, req, in, won, set)
	}
	set(rt, outcomeNewBind)
	h.bound, h.binding = true, won
	return h, nil
}

// routeBound routes a key bound to b: sticky, or an overflow recorded in
// the log (a rebind moves the binding for every edge).
func (e *Edge) routeBound(ctx context.Context, rq *request, h *hop, router *routing.Router, req routing.Request, in routing.Inputs,
	b fsm.Binding, set func(routing.Route, string)) (*hop, *apiError) {
	if e.unheardAtStartup(req.Now, h.fleet, b.Instance, h.excluded, in.Views) {
		set(routing.Route{Action: routing.ActionSticky, Instance: b.Instance, Rank: -1}, outcomeSticky)
		h.policy, h.bound, h.binding = "bound", true, b
		e.touches.add(fsm.FleetKey{Fleet: h.fleet, Key: h.key})
		return h, nil
	}
	rt, err := router.RouteBound(req, b, in)
	if err != nil || rt.Action == routing.ActionShed {
		return nil, routeError(h.fleet, rt, err)
	}
	h.bound, h.binding = true, b
	switch rt.Action {
	case routing.ActionOverflow:
		set(rt, outcomeOverflow)
		ev := rt.OverflowEvent(req)
		if ev.Reason == fsm.OverflowCacheLost && e.node.State().FeatureLevel() < fsm.FeatureLevelRanks {
			// The reason is new at level 2; an older voter would record it
			// unnamed. Its nearest older name: the cache stopped paying.
			ev.Reason = fsm.OverflowCircuitOpen
		}
		if len(h.excluded) > 0 {
			// A retry after a failed hop: record the overflow before
			// sending (the brief's rule for retrying a bound key).
			pctx, cancel := context.WithTimeout(ctx, e.cfg.Cluster.ProposeTimeout)
			if _, err := e.propose(pctx, ev); err != nil {
				e.log.Warn("recording an overflow failed; retrying anyway", "fleet", h.fleet, "key", h.key, "err", err)
			}
			cancel()
		} else {
			e.recorder.add(ev, nil)
		}
		if rt.Rebind {
			h.binding.Instance = rt.Instance
		}
	default:
		set(rt, outcomeSticky)
		if h.policy == "" {
			h.policy = "bound"
		}
		e.touches.add(fsm.FleetKey{Fleet: h.fleet, Key: h.key})
	}
	return h, nil
}

// unheardAtStartup reports whether inst, a key's bound instance, is one
// this edge has not heard from since it (re)started, while the startup gate
// is open (readiness) and the log records it up. Such an instance is not
// known to be unhealthy, only not yet heard: the key stays on it (at the
// log's URL) instead of detouring. Without this, a restarted edge that gets
// traffic before the workers' telemetry reaches it detoured every bound
// conversation it served, and lost the detours' records when it was killed
// again (the soak caught it). An instance that is really gone fails the
// hop, and the retry overflows as usual, recorded before it is sent.
func (e *Edge) unheardAtStartup(now time.Time, f fsm.Fleet, inst string, excluded []string, views *routing.Views) bool {
	if slices.Contains(excluded, inst) {
		return false
	}
	if views != nil {
		if _, ok := views.Lookup(inst); ok {
			return false
		}
	}
	if seen, ok := e.fleet.Instance(inst, now); (ok && !seen.LastSeen.IsZero()) || !e.ready.inStartupGate(now) {
		return false
	}
	rec, ok := e.node.State().Instance(inst)
	return ok && rec.Fleet == f && rec.Status == fsm.InstanceUp && rec.URL != ""
}

// boundAfterTimeout looks for a binding of key after its Bind timed out.
// A timed-out Bind may still commit, and another edge may have bound the
// key first; under load both are the common case, not a dead log. So this
// edge applies what its log already knows committed (waiting at most
// propose_timeout) and serves the key from the binding it then finds, as
// for any bound key, instead of refusing it for lack of a fresh state
// (issue 13, D1). ok is false when the key is still unbound.
func (e *Edge) boundAfterTimeout(ctx context.Context, f fsm.Fleet, key string) (fsm.Binding, bool) {
	if b, ok := e.node.State().Lookup(f, key); ok {
		return b, true
	}
	// Committed entries apply shortly; entries held but not known committed
	// (no quorum) may never be, so they are not waited for.
	s := e.node.Status()
	if target := s.CommitIndex; target > s.AppliedIndex {
		wctx, cancel := context.WithTimeout(ctx, e.cfg.Cluster.ProposeTimeout)
		_ = e.node.WaitApplied(wctx, target)
		cancel()
	}
	return e.node.State().Lookup(f, key)
}

// placeDegraded places a new key by rendezvous over the instances the log
// last agreed on, serves it, and remembers to record the Bind.
//
// Only an edge whose state is known to be current guesses (freshness): a
// lagging one may not know that the log already bound the key elsewhere,
// so it answers 503 with Retry-After instead; the client's retry (here once
// the log commits or the state catches up, or on another edge) is placed
// correctly.
func (e *Edge) placeDegraded(rq *request, h *hop, router *routing.Router, req routing.Request, in routing.Inputs,
	set func(routing.Route, string)) (*hop, *apiError) {
	if ok, why := e.fresh.degradedAllowed(e.now()); !ok {
		e.metrics.decisions.WithLabelValues(h.fleet.String(), routing.PolicyDegraded, outcomeRefused).Inc()
		aerr := newAPIError(http.StatusServiceUnavailable, "server_error", "affinity_state_unknown", "",
			"the affinity log cannot commit right now and this edge cannot place %s key %q without it: %s; retry shortly (another edge, or this one once the log recovers, will place it)",
			h.fleet, truncate(h.key, 200), why)
		aerr.retryAfter = e.retryHint()
		return nil, aerr
	}
	rt, err := router.PlaceDegraded(req, e.node.State().Instances(), in)
	if err != nil {
		return nil, routeError(h.fleet, rt, err)
	}
	set(rt, outcomeDegraded)
	bind := rt.BindEvent(req)
	e.recorder.addDegraded(bind)
	h.bound = true
	h.binding = fsm.Binding{Fleet: bind.Fleet, Key: bind.Key, ConversationID: bind.ConversationID, Instance: bind.Instance, Decision: bind.Decision}
	e.log.Debug("degraded placement", "fleet", h.fleet, "key", h.key, "instance", rt.Instance)
	return h, nil
}

// reroute picks another instance after a failed hop: a bound key overflows
// (recorded as unhealthy), an unbound request is placed again, both
// excluding every instance that failed.
func (e *Edge) reroute(ctx context.Context, rq *request, failed *hop) (*hop, *apiError) {
	rq.now = e.now()
	if !failed.bound {
		return e.routeFleet(ctx, rq, failed.fleet, failed)
	}
	router := e.routers[failed.fleet]
	excluded := append(append([]string(nil), failed.excluded...), failed.instance)
	views := e.views(rq.now, excluded)
	st := e.node.State()
	req := routing.Request{
		Fleet: failed.fleet, Key: failed.key, ConversationID: rq.id.ConversationID, RequestID: rq.requestID, Edge: e.nodeID,
		Priority: rq.priority, PromptTokens: rq.promptTokens, Blocks: rq.blocks, Spread: routing.SpreadFor(rq.requestID), Now: rq.now,
	}
	in := routing.Inputs{Views: views, Bindings: st, Prefix: e.fleet.Index(), Overload: e.overload}
	h := &hop{fleet: failed.fleet, key: failed.key, rank: -1, excluded: excluded}
	b := failed.binding
	b.Instance = failed.instance
	set := func(rt routing.Route, outcome string) {
		h.instance, h.url, h.rank, h.cached, h.outcome, h.policy, h.reason = rt.Instance, rt.URL, rt.Rank, rt.CachedTokens, outcome, rt.Decision.Policy, rt.Reason
	}
	out, aerr := e.routeBound(ctx, rq, h, router, req, in, b, set)
	if aerr != nil {
		return nil, aerr
	}
	if out.instance == failed.instance {
		return nil, newAPIError(http.StatusBadGateway, "server_error", "upstream_unavailable", "",
			"%s instance %s failed and no other instance can take the request", failed.fleet, failed.instance)
	}
	e.metrics.decisions.WithLabelValues(failed.fleet.String(), out.policy, out.outcome).Inc()
	e.fleet.Index().Predict(out.instance, rq.blocks, rq.now)
	return out, nil
}

// observeRank records, off the request path, the attention-DP rank a worker
// reported (x-tether-adp-rank) for the binding a hop followed, once the
// cluster runs feature level 2 (RankObserved) and only when the log does
// not already say so. Only hops that went to the binding's own instance
// count, and only when the rank belongs to the key: the key's own
// conversation, or a sub-agent whose hint put it on its parent's rank.
func (e *Edge) observeRank(rq *request, h *hop, role hintauth.Role, rankHeader string) {
	if h == nil || !h.bound || !rq.hint || h.binding.Epoch == 0 || h.instance != h.binding.Instance ||
		(h.outcome != outcomeSticky && h.outcome != outcomeNewBind) {
		return
	}
	if rq.id.ConversationID != h.key && !e.sendHint(rq, h, role) {
		return
	}
	if e.featureLevel() < fsm.FeatureLevelRanks {
		return
	}
	st := e.node.State()
	if st.FeatureLevel() < fsm.FeatureLevelRanks {
		return // an older edge may still be a voter: it could not apply the event
	}
	rank, err := strconv.ParseUint(rankHeader, 10, 32)
	if err != nil {
		return
	}
	b, ok := st.Lookup(h.fleet, h.key)
	if !ok || b.Epoch != h.binding.Epoch || b.Instance != h.instance || (b.HasRank && b.Rank == uint32(rank)) {
		return
	}
	e.recorder.addRank(fsm.RankObserved{Fleet: h.fleet, Key: h.key, Epoch: b.Epoch, Rank: uint32(rank)})
}

// hopLabel renders a hop for x-tether-route.
func hopLabel(h *hop, rank string) string {
	if h == nil {
		return "-"
	}
	if rank == "" {
		rank = "-"
	}
	return fmt.Sprintf("%s/%s", h.instance, rank)
}
