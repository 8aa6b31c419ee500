// Package dispatch sends a request's hops, in each engine's flow: the
// disaggregated flow of tether workers and trtllm-serve (a context hop,
// then a generation hop with the context's handoff and signed sub-agent
// hints; conditional disaggregation; the context's answer when it already
// finished), the one hop of an aggregated vLLM or SGLang fleet pinned to
// the key's data-parallel rank, the prefill/decode splits of vLLM
// (NixlConnector) and SGLang (bootstrap rendezvous), and the hop to the
// instance holding a stored response or conversation. Failed hops are
// retried on another instance (the router's Reroute, max_retries), each
// hop is counted on the fleet view and told to the other edges, static
// engines' prefix caches are shadowed, and the answer is relayed (edge/api)
// with the route headers. What crosses the wire is edge/disagg's; where a
// hop goes is the Router's (edge/route). See edge/DESIGN.md "Request path",
// "Retries" and the engines' sections.
package dispatch

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/catalog"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/kvshadow"
	"github.com/tether-project/tether/edge/natspub"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/edge/stored"
	"github.com/tether-project/tether/fsm"
)

// Router is where each fleet's hop goes (edge/route's Router).
type Router interface {
	// Route decides where fleet f's part of rq goes.
	Route(ctx context.Context, rq *route.Request, f fsm.Fleet, prev *route.Hop) (*route.Hop, *api.Error)
	// Reroute picks another instance after failed failed.
	Reroute(ctx context.Context, rq *route.Request, failed *route.Hop) (*route.Hop, *api.Error)
	// PinnedHop is the hop to the instance holding rq's stored response
	// or conversation.
	PinnedHop(rq *route.Request) *route.Hop
	// RecordRank records the rank of the binding h followed (replace: a
	// worker's report; else the edge's choice for an engine).
	RecordRank(h *route.Hop, rank uint32, replace bool)
	// RecordAnswer grades h's KV index claim against the engine's answer
	// (this edge's breaker and figures, the log) and returns the answer
	// for the other edges (ok false: nothing graded).
	RecordAnswer(rq *route.Request, h *route.Hop, promptTokens, cachedTokens int) (fleetview.Answer, bool)
	// HearStrain applies another edge's transition of an instance's
	// overload history.
	HearStrain(instance string, overloaded bool)
}

// Edge is what the dispatcher uses of the edge (from its Start on).
type Edge interface {
	// Fleet is the edge's view of the workers.
	Fleet() *fleetview.View
	// NATS is the edge's connection (nil: dispatches are not shared).
	NATS() *nats.Conn
	// Publisher sends the edge's own NATS messages off the request path
	// (nil without NATS).
	Publisher() *natspub.Publisher
}

// Config is what the dispatcher takes from the edge.
type Config struct {
	// Edge is the edge's configuration.
	Edge   *config.Config
	NodeID string
	// AuthKey signs the sub-agent hints and the disaggregation handoff
	// (internal_request_auth_key; nil: none).
	AuthKey   []byte
	Router    Router
	Catalogue *catalog.Catalogue
	Stored    *stored.Service
	// Client sends the hops (behind the TLS hop guard).
	Client  *http.Client
	Answers api.Relayer
	Metrics *observe.Metrics
	Tracer  trace.Tracer
	Logger  *slog.Logger
	Now     func() time.Time
	// DisaggBase is this process's disaggregated request id prefix
	// (disagg.TRTLLMIDBase).
	DisaggBase uint64
}

// Dispatcher sends requests' hops.
type Dispatcher struct {
	edge      Edge
	cfg       *config.Config
	nodeID    string
	authKey   []byte
	router    Router
	catalogue *catalog.Catalogue
	stored    *stored.Service
	client    *http.Client
	answers   api.Relayer
	metrics   *observe.Metrics
	tracer    trace.Tracer
	log       *slog.Logger
	now       func() time.Time
	disagg    disaggIDs
	// dispatches: the requests this edge sends, told to the others, and
	// theirs it counts (dispatches.go).
	dispatches dispatchShare
	shadow     *kvshadow.Shadows // static engines' shadow KV caches (shadow.go)
	// cacheReporters: engine instances seen reporting cached tokens, by
	// dialect (engines.go engineUsage).
	cacheReporters sync.Map
	// noHandoff: prefill instances whose agent API answered without a
	// handoff, warned about once (pd_vllm.go).
	noHandoff sync.Map
}

// disaggIDs mints the ids of disaggregated requests: a random base and a
// sequence.
type disaggIDs struct {
	base uint64
	seq  atomic.Uint64
}

// New is the dispatcher over edge.
func New(edge Edge, cfg Config) *Dispatcher {
	d := &Dispatcher{edge: edge, cfg: cfg.Edge, nodeID: cfg.NodeID, authKey: cfg.AuthKey, router: cfg.Router, catalogue: cfg.Catalogue,
		stored: cfg.Stored, client: cfg.Client, answers: cfg.Answers, metrics: cfg.Metrics, tracer: cfg.Tracer, log: cfg.Logger, now: cfg.Now}
	d.disagg.base = cfg.DisaggBase
	return d
}

// Start prepares what needs the fleet view and NATS: the shadows of static
// engines' caches, and the subscription to the other edges' dispatches.
func (e *Dispatcher) Start() error {
	e.shadow = kvshadow.New(e.edge.Fleet().Index(), 1)
	return e.listenDispatches()
}

// newDisaggID is the next disaggregated request id.
func (e *Dispatcher) newDisaggID() uint64 {
	return e.disagg.base | (e.disagg.seq.Add(1) & (1<<disagg.TRTLLMIDSeqBits - 1))
}
