package edge

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/catalog"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/flow"
	"github.com/tether-project/tether/edge/leader"
	"github.com/tether-project/tether/edge/natspub"
	"github.com/tether-project/tether/edge/readiness"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
)

// The edge as each of its parts sees it: every part is a package with a
// small interface the edge implements here, by a type of its own (so the
// methods stay out of Edge's API), and the part's settings from the edge's
// configuration.

// newLeaderDuties prepares the leader's duties (edge/leader) over this
// edge; startBackground runs them. Their proposals count in
// tether_edge_leader_actions_total by kind.
func (e *Edge) newLeaderDuties() *leader.Duties {
	return leader.New(leaderEdge{e}, leader.Config{
		NodeID:         e.nodeID,
		Interval:       e.cfg.Leader.Interval,
		SweepBatch:     e.cfg.Leader.SweepBatch,
		SessionTTL:     e.cfg.SessionTTL,
		MaxBindings:    e.cfg.MaxBindings,
		DownAfter:      e.cfg.Telemetry.DownAfter,
		ProposeTimeout: e.cfg.Cluster.ProposeTimeout,
		Acted: func(kind string, n int) {
			e.metrics.LeaderActions.WithLabelValues(kind).Add(float64(n))
		},
		Logger: e.log,
	})
}

// leaderEdge is the edge as the leader's duties see it (leader.Edge). A
// separate type keeps these methods out of Edge's own API.
type leaderEdge struct{ e *Edge }

var _ leader.Edge = leaderEdge{}

func (l leaderEdge) Node() *cluster.Node    { return l.e.node }
func (l leaderEdge) Fleet() *fleetview.View { return l.e.fleet }
func (l leaderEdge) Now() time.Time         { return l.e.now() }

func (l leaderEdge) Propose(ctx context.Context, ev fsm.Event) (fsm.Result, error) {
	return l.e.proposer.Propose(ctx, ev)
}

func (l leaderEdge) ObserveProposal(t fsm.EventType, res fsm.Result, err error, took time.Duration) {
	l.e.proposer.Observe(t, res, err, took)
}

func (l leaderEdge) ConversationKey(instance, conv string) (string, bool) {
	m := l.e.catalogue.ModelOfInstance(instance, l.e.now())
	if m == nil {
		return "", false
	}
	return m.Key(conv), true
}

// adminAPI is the admin API (edge/admin) over this edge, counted in
// tether_edge_requests_total{endpoint="admin"}.
func (e *Edge) adminAPI() http.Handler {
	return admin.New(adminEdge{e}, admin.Options{
		Token:   e.cfg.AdminToken,
		NodeID:  e.nodeID,
		DataDir: e.cfg.Cluster.DataDir,
		Models:  e.catalogue.Names(),
		Answered: func(status int) {
			e.metrics.Requests.WithLabelValues("admin", strconv.Itoa(status)).Inc()
		},
	})
}

// adminEdge is the edge as the admin API sees it (admin.Edge). A separate
// type keeps Now and DegradedPending out of Edge's own API.
type adminEdge struct{ e *Edge }

var _ admin.Edge = adminEdge{}

func (a adminEdge) Node() *cluster.Node { return a.e.node }

func (a adminEdge) Fleet() *fleetview.View { return a.e.fleet }

func (a adminEdge) Now() time.Time { return a.e.now() }

func (a adminEdge) DegradedPending() int { return a.e.placements.InFlight() }

func (a adminEdge) WorkingSet(f fsm.Fleet, instance string, now time.Time) (int, int64) {
	d, r, ok := a.e.catalogue.DecisionOf(f, instance, now)
	if !ok {
		return 0, 0
	}
	l := d.WorkingSet(r, instance, now)
	return l.Keys, l.Blocks
}

func (a adminEdge) OverloadedSince(instance string) (time.Time, bool) {
	return a.e.router.OverloadedSince(instance)
}

// observeSource is the edge as its scrape-time series read it
// (observe.Source).
type observeSource struct{ e *Edge }

func (s observeSource) Node() *cluster.Node { return s.e.node }

func (s observeSource) DataDir() string { return s.e.cfg.Cluster.DataDir }

func (s observeSource) InflightBodyBytes() int64 { return s.e.bodies.InUse() }

func (s observeSource) RecorderQueued() int { return s.e.recorder.Queued() }

func (s observeSource) PlacementsInFlight() int { return s.e.placements.InFlight() }

// proposalsEdge is the edge as its proposals read it (proposals.Edge).
type proposalsEdge struct{ e *Edge }

func (p proposalsEdge) Node() *cluster.Node { return p.e.node }

func (p proposalsEdge) NATS() *nats.Conn { return p.e.nats.conn }

func (p proposalsEdge) Publisher() *natspub.Publisher { return p.e.nats.pub }

// readinessEdge is the edge as its readiness reads it (readiness.Edge).
type readinessEdge struct{ e *Edge }

func (r readinessEdge) Node() *cluster.Node { return r.e.node }

func (r readinessEdge) Fleet() *fleetview.View { return r.e.fleet }

func (r readinessEdge) Now() time.Time { return r.e.now() }

func (r readinessEdge) ModelsUnready(now time.Time) []string { return r.e.router.ModelsUnready(now) }

// readinessConfig is what the configuration says of the edge's readiness:
// the startup grace, the fleets served and the instances wanted per fleet
// at startup (num_instances, summed over the models).
func (e *Edge) readinessConfig() readiness.Config {
	rc := readiness.Config{StartupGrace: e.cfg.Telemetry.StartupGrace, ServedFleets: e.cfg.ServedFleets()}
	for _, m := range e.catalogue.Models() {
		for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
			rc.NumInstances[f] += m.Cfg.Servers(f).NumInstances
		}
	}
	return rc
}

// admissionEdge is the edge as its admission layer reads it
// (admission.Edge).
type admissionEdge struct{ e *Edge }

func (a admissionEdge) Stalled(now time.Time) string { return a.e.ready.Stalled(now) }

func (a admissionEdge) Isolated(now time.Time) string { return a.e.ready.Isolated(now) }

func (a admissionEdge) RetryHint() time.Duration { return a.e.router.RetryHint() }

func (a admissionEdge) Now() time.Time { return a.e.now() }

// flowEdge is the edge as its flow control reads it (flow.Edge).
type flowEdge struct{ e *Edge }

// Headroom is the least of model's fleets' (flow.Headroom) over its routing
// views built afresh; Unlimited for a model this edge does not serve.
func (f flowEdge) Headroom(model string, now time.Time) int {
	m, _, ok := f.e.catalogue.Lookup(model)
	if !ok {
		return flow.Unlimited
	}
	vs := f.e.router.FreshViews(m, now)
	h := flow.Unlimited
	for _, fl := range m.Cfg.ServedFleets() {
		h = min(h, flow.Headroom(vs.Fleet(fl), f.e.cfg.FlowControl.QueuePerRank))
	}
	return h
}

func (f flowEdge) NATS() *nats.Conn { return f.e.nats.conn }

func (f flowEdge) Now() time.Time { return f.e.now() }

// routeEdge is the edge as its router reads it (route.Edge).
type routeEdge struct{ e *Edge }

func (r routeEdge) Node() *cluster.Node { return r.e.node }

func (r routeEdge) Fleet() *fleetview.View { return r.e.fleet }

func (r routeEdge) InStartupGate(now time.Time) bool { return r.e.ready.InStartupGate(now) }

// TellStrain goes out on the dispatcher's subject (it exists before the
// first request is routed).
func (r routeEdge) TellStrain(f fsm.Fleet, instance string, overloaded bool) {
	if d := r.e.dispatcher; d != nil {
		d.TellStrain(f, instance, overloaded)
	}
}

// catalogueEdge is the edge as its catalogue reads it (catalog.Edge).
type catalogueEdge struct{ e *Edge }

func (c catalogueEdge) Fleet() *fleetview.View { return c.e.fleet }

func (c catalogueEdge) Client() *http.Client { return c.e.client }

func (c catalogueEdge) Now() time.Time { return c.e.now() }

// storedEdge is the edge as its stored responses and conversations ask it
// (stored.Edge).
type storedEdge struct{ e *Edge }

func (s storedEdge) Fleet() *fleetview.View { return s.e.fleet }

// Unheard: the log records the instance, or the edge is in its startup
// gate (it may not have heard every instance yet).
func (s storedEdge) Unheard(instance string, now time.Time) bool {
	rec, inLog := s.e.node.State().Instance(instance)
	return (inLog && rec.Status != fsm.InstanceRemoved) || s.e.ready.InStartupGate(now)
}

// PlaceConversation places a new conversation as an unkeyed request on
// m's generation fleet (routeFleet with no key: the fleet's policy,
// unbound, nothing proposed).
func (s storedEdge) PlaceConversation(ctx context.Context, m *catalog.Model) (string, string, *api.Error) {
	e := s.e
	rq := &route.Request{Dialect: apireq.Responses, Model: m, ModelName: m.Name, Path: "/v1/conversations",
		RequestID: e.nodeID + "-" + strconv.FormatUint(e.reqSeq.Add(1), 10), Now: e.now()}
	h, aerr := e.router.Route(ctx, rq, m.Cfg.AnswerFleet(), nil)
	if aerr != nil {
		return "", "", aerr
	}
	return h.Instance, h.URL, nil
}

// engineEventsEdge is the edge as its engine events reader uses it
// (engineevents.Edge).
type engineEventsEdge struct{ e *Edge }

func (x engineEventsEdge) Node() *cluster.Node { return x.e.node }

func (x engineEventsEdge) Fleet() *fleetview.View { return x.e.fleet }

func (x engineEventsEdge) NATS() *nats.Conn { return x.e.nats.conn }

// dispatchEdge is the edge as its dispatcher uses it (dispatch.Edge).
type dispatchEdge struct{ e *Edge }

func (d dispatchEdge) Fleet() *fleetview.View { return d.e.fleet }

func (d dispatchEdge) NATS() *nats.Conn { return d.e.nats.conn }

func (d dispatchEdge) Publisher() *natspub.Publisher { return d.e.nats.pub }
