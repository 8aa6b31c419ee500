package route

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/catalog"
	"github.com/tether-project/tether/edge/kvshadow"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/httpjson"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/routing/kvindex"
)

// Decision outcomes (metric label and span attribute; routing/decide).
const (
	outcomeSticky   = routing.OutcomeSticky
	outcomeNewBind  = routing.OutcomeNewBind
	outcomeOverflow = routing.OutcomeOverflow
	outcomeDegraded = routing.OutcomeDegraded
	outcomeShed     = routing.OutcomeShed
	outcomeUnbound  = routing.OutcomeUnbound
	outcomeRefused  = routing.OutcomeRefused
)

// RetryHint is the Retry-After of a request refused because the log could
// not commit: about one election.
func (e *Router) RetryHint() time.Duration {
	return max(e.cfg.Cluster.Raft.ElectionTimeout, 250*time.Millisecond)
}

// viewsMaxAge bounds how long a model's routing views are cached
// (catalog.Model.Views): health depends on time.
const viewsMaxAge = 20 * time.Millisecond

// views returns the routing views at now: the fleet view's instances merged
// with the log's instance records (down → unhealthy, draining → draining,
// drained by an operator → draining and drained).
// exclude marks instances unhealthy for this decision (failed hops).
// With several models the views are model m's (nil: the first): other
// models' instances are unhealthy in them, so no decision — placement,
// overflow or degraded rendezvous over the log's records — picks one.
func (e *Router) views(m *catalog.Model, now time.Time, exclude []string) *routing.Views {
	if m == nil {
		m = e.catalogue.First()
	}
	st := e.edge.Node().State()
	ver := e.edge.Fleet().Version()
	placed := e.placed.Load()
	if len(exclude) == 0 {
		if c := m.Views.Load(); c != nil && c.Version == ver && c.State == st && c.Placed == placed &&
			now.Sub(c.Built) < viewsMaxAge && !now.Before(c.Built) {
			return c.Views
		}
	}
	vs := e.edge.Fleet().Views(now, make([]routing.InstanceView, 0, 16))
	for i := range vs {
		v := &vs[i]
		if e.catalogue.InstanceModel(v) != m {
			v.Healthy = false
			continue
		}
		if rec, ok := st.Instance(v.ID); ok {
			switch rec.Status {
			case fsm.InstanceDown, fsm.InstanceRemoved:
				v.Healthy, v.Silent = false, false
			case fsm.InstanceDraining:
				v.Draining = true
			}
			if rec.Drained {
				v.Draining, v.Drained = true, true
			}
		}
		for _, x := range exclude {
			if x == v.ID {
				v.Healthy, v.Silent = false, false
			}
		}
		if len(exclude) == 0 {
			e.observeStrain(v, m.Routers[v.Fleet].Condition(v) != 0, now)
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
		m.Views.Store(&catalog.CachedViews{Version: ver, State: st, Placed: placed, Built: now, Views: views})
	}
	return views
}

// FreshViews are model m's routing views at now built afresh, never from
// the cache: the load of each instance counts every request sent to it
// until this moment (flow control's headroom: edge/flow).
func (e *Router) FreshViews(m *catalog.Model, now time.Time) *routing.Views {
	return e.views(m, now, noExclusion)
}

// noExclusion excludes nothing, and is not empty: views built with it
// bypass the cache.
var noExclusion = []string{""}

// Hop is where one fleet's part of a request goes: the decision's
// (routing/routing.Hop) and what the request path adds to it.
type Hop struct {
	routing.Hop
	// Shadow: where the prompt was modelled in a static engine's Shadow
	// cache (edge/Shadow.go; nil: not modelled).
	Shadow *kvshadow.Placement
	// RequestID is the request's id in the log's decisions.
	RequestID string
}

func hopOf(d *routing.Hop, requestID string) *Hop { return &Hop{Hop: *d, RequestID: requestID} }

// Decided is a copy of h's decision, for the decider to re-route from.
func (h *Hop) Decided() *routing.Hop {
	if h == nil {
		return nil
	}
	d := h.Hop
	return &d
}

// failureError turns a decision's failure into the client's answer.
func (e *Router) failureError(f *routing.Failure) *api.Error {
	switch f.Kind {
	case routing.FailNoInstances:
		return api.NewError(http.StatusServiceUnavailable, "server_error", "no_healthy_instance", "",
			"no healthy %s instance is available: %v", f.Fleet, f.Err)
	case routing.FailRouting:
		return api.NewError(http.StatusServiceUnavailable, "server_error", "routing_failed", "", "%s routing failed: %v", f.Fleet, f.Err)
	case routing.FailShed:
		ae := api.NewError(http.StatusTooManyRequests, "rate_limit_error", "overloaded", "",
			"every %s instance is over its load limit; retry after %s", f.Fleet, f.RetryAfter)
		ae.RetryAfter = f.RetryAfter
		return ae
	case routing.FailLog:
		return api.NewError(http.StatusServiceUnavailable, "server_error", "affinity_log_unavailable", "",
			"recording the %s placement of %q failed: %v", f.Fleet, f.Key, f.Err)
	case routing.FailRejected:
		return api.NewError(http.StatusServiceUnavailable, "server_error", "placement_rejected", "",
			"the affinity log rejected placing %s key %q on %s: %s", f.Fleet, f.Key, f.Instance, f.Detail)
	case routing.FailStateUnknown:
		e.metrics.Decisions.WithLabelValues(f.Fleet.String(), routing.PolicyPending, outcomeRefused).Inc()
		ae := api.NewError(http.StatusServiceUnavailable, "server_error", "affinity_state_unknown", "",
			"%s key %q needs its placement committed in the affinity log, which this edge cannot confirm right now: %s; retry shortly",
			f.Fleet, httpjson.Clip(f.Key, 200), f.Detail)
		ae.RetryAfter = e.RetryHint()
		return ae
	case routing.FailDetourUnrecorded:
		e.metrics.Decisions.WithLabelValues(f.Fleet.String(), "bound", outcomeRefused).Inc()
		ae := api.NewError(http.StatusServiceUnavailable, "server_error", "affinity_log_unavailable", "",
			"%s key %q must leave its unhealthy instance %s and the affinity log cannot record the move right now: %v; retry shortly",
			f.Fleet, httpjson.Clip(f.Key, 200), f.Instance, f.Err)
		ae.RetryAfter = e.RetryHint()
		return ae
	case routing.FailNoAlternative:
		return api.NewError(http.StatusBadGateway, "server_error", "upstream_unavailable", "",
			"%s instance %s failed and no other instance can take the request", f.Fleet, f.Instance)
	}
	return api.NewError(http.StatusServiceUnavailable, "server_error", "routing_failed", "", "%s routing failed: %v", f.Fleet, f)
}

// Route decides where fleet f's part of rq goes (routing.Decider: sticky
// to the key's committed binding or an overflow, a new placement proposed
// through the log, a degraded placement when the log cannot commit, or an
// unbound placement; the decision predicts the prompt there).
func (e *Router) Route(ctx context.Context, rq *Request, f fsm.Fleet, prev *Hop) (*Hop, *api.Error) {
	ctx, span := e.tracer.Start(ctx, "tether.edge route "+f.String(), trace.WithSpanKind(trace.SpanKindInternal))
	defer span.End()
	defer e.metrics.ObserveRoute(f, time.Now())
	h, aerr := e.decide(ctx, rq, f, prev)
	keyKind := "none"
	switch {
	case rq.ID.Key(f) == "":
	case rq.ID.SubAgent() && rq.ID.Key(f) == rq.ID.Root:
		keyKind = "parent_root"
	default:
		keyKind = "conversation"
	}
	span.SetAttributes(observe.AttrFleet.String(f.String()), observe.AttrKeyKind.String(keyKind))
	if aerr != nil {
		span.SetAttributes(attribute.String("tether.error", aerr.Message))
		if aerr.Status == http.StatusTooManyRequests {
			e.metrics.Decisions.WithLabelValues(f.String(), routing.PolicyShed, outcomeShed).Inc()
			span.SetAttributes(observe.AttrOutcome.String(outcomeShed))
		}
		return nil, aerr
	}
	e.countDecision(f, h)
	e.observeRouted(rq, f, h)
	e.recordEvidence(rq, f, h)
	span.SetAttributes(observe.AttrPolicy.String(h.Policy), observe.AttrOutcome.String(h.Outcome), observe.AttrInstance.String(h.Instance),
		observe.AttrRank.Int(h.Rank), observe.AttrCachedTokens.Int(h.Cached))
	if h.Reason != 0 {
		span.SetAttributes(observe.AttrOverflow.String(h.Reason.String()))
	}
	e.catalogue.AdapterPlaced(rq.Model, rq.Adapter, h.Fleet, h.Instance, rq.Now) // the adapter counts as loaded there (edge/catalog)
	return h, nil
}

// routingRequest is rq as routing sees it on fleet f: its keys, and its
// conversation id, in its model's namespace (routing compares the two to
// tell a key's own conversation from a sub-agent routed by its parent's).
func (e *Router) routingRequest(rq *Request, f fsm.Fleet, rr uint64) routing.Request {
	return routing.Request{
		Fleet: f, Key: rq.Model.Key(rq.ID.Key(f)), ConversationID: rq.Model.Key(rq.ID.ConversationID), RequestID: rq.RequestID, Edge: e.nodeID,
		Priority: rq.Priority, PromptTokens: rq.Prompts[f].Tokens, Blocks: rq.Prompts[f].Blocks,
		Spread: routing.SpreadFor(rq.RequestID), RoundRobin: rr, Now: rq.Now, Adapter: rq.Adapter,
	}
}

// decide is the shared decision (routing) for fleet f's part of rq.
func (e *Router) decide(ctx context.Context, rq *Request, f fsm.Fleet, prev *Hop) (*Hop, *api.Error) {
	req := e.routingRequest(rq, f, rq.Model.RR[f].Add(1)-1)
	d, fail := rq.Model.Decider.Decide(ctx, rq.Model.Routers[f], req, prev.Decided())
	if fail != nil {
		return nil, e.failureError(fail)
	}
	if d.Speculative {
		e.placements.Served(d.Fleet, d.Key)
	}
	// The request is about to be dispatched: the next decision's views
	// must count it (a new key no longer waits for a commit, which used
	// to renew them).
	e.placed.Add(1)
	return hopOf(d, rq.RequestID), nil
}

// Reroute picks another instance after a failed hop: a bound key overflows
// (recorded as unhealthy), an unbound request is placed again, both
// excluding every instance that failed.
func (e *Router) Reroute(ctx context.Context, rq *Request, failed *Hop) (*Hop, *api.Error) {
	rq.Now = e.now()
	if !failed.Bound {
		return e.Route(ctx, rq, failed.Fleet, failed)
	}
	d, fail := rq.Model.Decider.Decide(ctx, rq.Model.Routers[failed.Fleet], e.routingRequest(rq, failed.Fleet, 0), failed.Decided())
	if fail != nil {
		return nil, e.failureError(fail)
	}
	e.placed.Add(1)
	out := hopOf(d, rq.RequestID)
	e.countDecision(failed.Fleet, out)
	e.recordEvidence(rq, failed.Fleet, out)
	return out, nil
}

// countDecision counts a routed hop's decision (degraded, its cause; made
// among instances whose telemetry was late, that too).
func (e *Router) countDecision(f fsm.Fleet, h *Hop) {
	e.metrics.Decisions.WithLabelValues(f.String(), h.Policy, h.Outcome).Inc()
	if h.Degraded != "" {
		e.metrics.Degraded.WithLabelValues(f.String(), h.Degraded).Inc()
	}
	if h.TelemetryLate {
		e.metrics.TelemetryLate.WithLabelValues(f.String()).Inc()
	}
}

// edgeLog is the affinity log as the decision reads it (routing/routing.Log).
type edgeLog struct{ e *Router }

func (l edgeLog) State() *fsm.State { return l.e.edge.Node().State() }

func (l edgeLog) Propose(ctx context.Context, ev fsm.Event) (fsm.Result, error) {
	res, err := l.e.proposer.Propose(ctx, ev)
	switch {
	case errors.Is(err, cluster.ErrNotApplied):
		err = fmt.Errorf("%w: %w", routing.ErrCommitted, err)
	case errors.Is(err, cluster.ErrUnavailable):
		err = fmt.Errorf("%w: %w", routing.ErrUnavailable, err)
	}
	return res, err
}

func (l edgeLog) Down(time.Time) bool { return l.e.proposer.Down() }

// edgeRecorder is the recorder and touch batcher (edge/proposals) as the
// decision uses them (routing/routing.Recorder).
type edgeRecorder struct{ e *Router }

func (r edgeRecorder) Record(ev fsm.Event) { r.e.recorder.Add(ev, nil) }

func (r edgeRecorder) Touch(k fsm.FleetKey)   { r.e.touches.Add(k) }
func (r edgeRecorder) TouchLink(child string) { r.e.touches.AddLink(child) }

// edgeFleet is this edge's fleet view of model m's fleets (nil: the
// first model's) as the decision reads it (routing/routing.FleetView).
type edgeFleet struct {
	e *Router
	m *catalog.Model
}

func (f edgeFleet) Views(now time.Time, exclude []string) *routing.Views {
	return f.e.views(f.m, now, exclude)
}

func (f edgeFleet) UnheardAtStartup(now time.Time, inst string) bool {
	if seen, ok := f.e.edge.Fleet().Instance(inst, now); ok && !seen.LastSeen.IsZero() {
		return false
	}
	return f.e.edge.InStartupGate(now)
}

// StateCurrent judges freshness at the edge's clock (the request's Now may
// be a little older).
func (f edgeFleet) StateCurrent(time.Time) (bool, string) {
	return f.e.fresh.StateCurrent(f.e.now())
}

// Evidence renders the request id and the state indexes of the hops'
// decisions for x-tether-route.
func Evidence(ctxHop, genHop *Hop) string {
	var b strings.Builder
	for _, h := range []*Hop{ctxHop, genHop} {
		if h != nil && h.RequestID != "" {
			b.WriteString("; request=" + h.RequestID)
			break
		}
	}
	for _, x := range []struct {
		name string
		h    *Hop
	}{{"context", ctxHop}, {"generation", genHop}} {
		if x.h != nil {
			b.WriteString("; " + x.name + "_state=" + strconv.FormatUint(x.h.StateIndex, 10))
			if x.h.OwnKey {
				// A sub-agent routed by its own conversation id, not its
				// parent's root.
				b.WriteString("; " + x.name + "_key=own")
			}
		}
	}
	return b.String()
}

// Label renders a hop for x-tether-route.
func Label(h *Hop, rank string) string {
	if h == nil {
		return "-"
	}
	if rank == "" {
		rank = "-"
	}
	return fmt.Sprintf("%s/%s", h.Instance, rank)
}

// edgeIndex is the fleet view's KV index (routing/routing.Index); the fleet
// view exists from Start on.
type edgeIndex struct{ e *Router }

func (x edgeIndex) Match(blocks []uint64, now time.Time, dst []kvindex.Match) []kvindex.Match {
	return x.e.edge.Fleet().Index().Match(blocks, now, dst)
}

func (x edgeIndex) Holds(instance string, rank int, block uint64, now time.Time) (bool, bool) {
	return x.e.edge.Fleet().Index().Holds(instance, rank, block, now)
}

func (x edgeIndex) HeldByOther(instance string, block uint64, now time.Time) bool {
	return x.e.edge.Fleet().Index().HeldByOther(instance, block, now)
}

func (x edgeIndex) Predict(instance string, blocks []uint64, now time.Time) {
	x.e.edge.Fleet().Index().Predict(instance, blocks, now)
}

// Decision labels of a request routed by a stored response.
const (
	outcomeStored = "stored"
	policyStored  = "stored_response"
)

// PinnedHop is the hop to the instance holding rq's stored response or
// conversation: no decision, no log, no retry elsewhere (no other instance
// holds it).
func (e *Router) PinnedHop(rq *Request) *Hop {
	ref := rq.Pinned()
	f := fsm.Fleet(ref.ID.Fleet)
	h := &Hop{Hop: routing.Hop{Fleet: f, Key: rq.Model.Key(rq.ID.Key(f)), Instance: ref.ID.Instance, URL: ref.URL, Rank: ref.ID.Rank,
		Outcome: outcomeStored, Policy: policyStored}}
	e.metrics.Decisions.WithLabelValues(f.String(), policyStored, outcomeStored).Inc()
	return h
}

// ModelsUnready is /readyz's check of a catalogue of several models:
// each has a healthy instance in each fleet it serves.
func (e *Router) ModelsUnready(now time.Time) []string {
	if len(e.catalogue.Models()) == 1 {
		return nil
	}
	var reasons []string
	for _, m := range e.catalogue.Models() {
		vs := e.views(m, now, nil)
		for _, f := range m.Cfg.ServedFleets() {
			healthy := false
			for _, v := range vs.Fleet(f) {
				healthy = healthy || v.Healthy
			}
			if !healthy {
				reasons = append(reasons, fmt.Sprintf("no healthy %s instance of model %s", f, m.Name))
			}
		}
	}
	return reasons
}
