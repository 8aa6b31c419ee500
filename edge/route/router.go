// Package route is where each fleet's part of a request goes: the request
// as the path carries it (its parsed body, the model it names, its
// identity and each fleet's prompt keys, the stored response or
// conversation it names), and the Router, which runs the routing decision
// (routing.Decider: sticky to the key's committed binding or an overflow, a
// new placement proposed through the log, degraded while the log cannot
// commit, unbound) over this edge's views, log, proposals and KV index,
// predicts the prompt on the chosen instance, counts and traces the
// decision, and records its evidence and the ranks the log should hold.
// The hop it returns is sent by edge/dispatch. See edge/DESIGN.md "Request
// path" and "New keys".
package route

import (
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/catalog"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/proposals"
	"github.com/tether-project/tether/edge/readiness"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/routing/overload"
)

// Router decides where each fleet's part of a request goes.
type Router struct {
	edge       Edge
	cfg        *config.Config
	nodeID     string
	catalogue  *catalog.Catalogue
	proposer   *proposals.Proposer
	placements *proposals.Placements
	recorder   *proposals.Recorder
	touches    *proposals.Touches
	fresh      *readiness.Freshness
	metrics    *observe.Metrics
	tracer     trace.Tracer
	log        *slog.Logger
	now        func() time.Time
	overload   *overload.Tracker
	placed     atomic.Uint64 // decisions made (views: the views cache)
}

// Edge is what the router reads of the edge, per decision (from its Start
// on).
type Edge interface {
	// Node is the edge's cluster node: the log's state.
	Node() *cluster.Node
	// Fleet is the edge's view of the workers.
	Fleet() *fleetview.View
	// InStartupGate reports whether the edge may not have heard every
	// instance the log records up yet (edge/readiness).
	InStartupGate(now time.Time) bool
	// TellStrain tells the other edges a transition of this edge's
	// overload history: instance of fleet f became unable to take its
	// bound keys (overloaded) or able again (strain.go).
	TellStrain(f fsm.Fleet, instance string, overloaded bool)
}

// Config is what the router takes from the edge.
type Config struct {
	// Edge is the edge's configuration.
	Edge      *config.Config
	NodeID    string
	Catalogue *catalog.Catalogue
	Proposals *proposals.Proposals
	// Fresh judges whether this edge's state is current (degraded
	// placement, hard affinity).
	Fresh   *readiness.Freshness
	Metrics *observe.Metrics
	Tracer  trace.Tracer
	Logger  *slog.Logger
	Now     func() time.Time
}

// New is the router over edge; each model of the catalogue gets its
// decision (NewDecider).
func New(edge Edge, cfg Config) *Router {
	p := cfg.Proposals
	r := &Router{edge: edge, cfg: cfg.Edge, nodeID: cfg.NodeID, catalogue: cfg.Catalogue, proposer: p.Proposer, placements: p.Placements,
		recorder: p.Recorder, touches: p.Touches, fresh: cfg.Fresh, metrics: cfg.Metrics, tracer: cfg.Tracer, log: cfg.Logger,
		now: cfg.Now, overload: overload.NewTracker()}
	for _, m := range cfg.Catalogue.Models() {
		m.Decider = r.newDecider(m)
	}
	return r
}

// newDecider is model m's routing decision over this edge's log, recorder,
// proposals, fleet view (m's instances) and KV index.
func (e *Router) newDecider(m *catalog.Model) *routing.Decider {
	return &routing.Decider{Log: edgeLog{e}, Recorder: edgeRecorder{e}, Placements: e.placements, Fleet: edgeFleet{e, m},
		Index: edgeIndex{e}, Overload: e.overload, CommitFirst: m.Cfg.Placement.CommitFirst}
}
