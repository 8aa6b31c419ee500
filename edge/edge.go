// Package edge is `tether edge`: the OpenAI-compatible front door over the
// replicated affinity log, and the composition root of its parts. An edge
// turns each request into routing keys, reads where a key lives from the
// replicated state (a local read of the cluster's fsm.State), places new
// keys and proposes the placement through the log, sends the prefill to a
// context worker and the decode to a generation worker with the sub-agent
// hint signed for each hop. Because every edge reads the same log, a parent
// on one edge and its sub-agents on others share one context instance.
//
// This package builds the parts and wires them (New, Start, Close), serves
// the HTTP API's mux and assembles each inference request (inference.go);
// each part is a package of its own with a small interface the edge
// implements (parts.go): the configuration (edge/config), the HTTP surface
// (edge/api), admission (edge/admission), readiness (edge/readiness), the
// models (edge/catalog), tokenization (edge/tokenize), stored responses and
// conversations (edge/stored), routing each hop (edge/route), sending it in
// each engine's flow (edge/dispatch, over edge/disagg's wire protocols),
// the proposals beside the requests (edge/proposals), the engines' KV events
// (edge/engineevents), transport security (edge/edgetls), metrics and
// tracing (edge/observe), the leader's duties (edge/leader) and the admin
// API (edge/admin). See DESIGN.md.
//
// Embedding:
//
//	e, err := edge.New(cfg, edge.Deps{})
//	err = e.Start(ctx)
//	url := "http://" + e.Addr()
//	defer e.Close(ctx)
package edge

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/admission"
	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/catalog"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/dispatch"
	"github.com/tether-project/tether/edge/edgetls"
	"github.com/tether-project/tether/edge/engineevents"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/flow"
	"github.com/tether-project/tether/edge/leader"
	"github.com/tether-project/tether/edge/natspub"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/proposals"
	"github.com/tether-project/tether/edge/readiness"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/edge/stored"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/bodybudget"
	"github.com/tether-project/tether/internal/respid"
	"github.com/tether-project/tether/routing"
)

// Deps are the edge's in-process collaborators; every field is optional.
type Deps struct {
	Logger *slog.Logger
	// Registry receives the edge's metrics and serves /metrics (default: a
	// new registry per edge).
	Registry *prometheus.Registry
	// TracerProvider creates the edge's spans (default: tracing.exporter).
	TracerProvider trace.TracerProvider
	// HTTPListener, when set, is served instead of listening on
	// hostname:port. The edge takes ownership.
	HTTPListener net.Listener
	// ClusterListener, when set, carries Raft instead of
	// cluster.bind_addr (tests pre-bind ports so peers know them).
	ClusterListener net.Listener
	// Transport sends the worker hops (default: a keep-alive transport
	// sized for many concurrent requests).
	Transport http.RoundTripper
	// Version is reported in NodeInfo and the cluster status.
	Version string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Edge is one edge node. Start it, serve, then Close (or Kill in tests).
type Edge struct {
	cfg     Config
	deps    Deps
	log     *slog.Logger
	now     func() time.Time
	nodeID  string
	version string
	authKey []byte
	respIDs *respid.Codec // mints and reads the self-routing ids (edge/stored)

	// The request path: whether the edge takes a request (admission,
	// readiness), the model it names (catalogue), its identity, where each
	// fleet's hop goes (router) and how it is sent (dispatcher, client),
	// stored responses and conversations (stored).
	admission      *admission.Layer
	flow           *flow.Controller     // fair admission across tenants, fleet-wide (edge/flow)
	fresh          *readiness.Freshness // is this edge's state current (readyz, degraded placement)
	ready          *readiness.Readiness
	catalogue      *catalog.Catalogue
	identityConfig routing.IdentityConfig // the sub-agent identity routing resolves
	router         *route.Router
	dispatcher     *dispatch.Dispatcher
	client         *http.Client // the hops' (behind the TLS hop guard)
	reachClient    *http.Client // the fleet view's reachability probes, each on a new connection
	stored         *stored.Service
	bodies         *bodybudget.Budget // the request-body bytes held at once
	reqSeq         atomic.Uint64      // request ids ("<node id>-<n>")

	// The log: the cluster node, what the edge proposes beside its
	// requests (edge/proposals: every proposal, its own Bind proposals,
	// the recorder's background events, the touch batches), and the
	// leader's duties while it leads (edge/leader).
	node       *cluster.Node
	proposer   *proposals.Proposer
	placements *proposals.Placements
	recorder   *proposals.Recorder
	touches    *proposals.Touches
	duties     *leader.Duties

	// The workers: the fleet view, the engines' own KV events, NATS, and
	// the transport security of every link.
	fleet        *fleetview.View
	engineEvents *engineevents.Reader
	nats         natsLink
	tls          *edgetls.TLS

	// Observability (edge/observe).
	registry *prometheus.Registry
	metrics  *observe.Metrics
	answers  api.Relayer // passes workers' answers to clients
	served   api.Served  // traces and counts the endpoints
	tracing  spanTracing

	// The HTTP API's server (serve).
	http httpServing

	// The edge's own loops (startBackground, the shedder, the engines'
	// drains) run until ctx is cancelled; wg awaits them.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu orders Start, Close and Kill.
	mu      sync.Mutex
	started bool
	stopped bool
	// settled: Settle ran (no more requests; the log flushed).
	settled bool
	// noHandoff: Close skips the Raft leadership transfer.
	noHandoff atomic.Bool
}

// natsLink is the edge's NATS: the embedded server when configured, the
// connection, and the publisher of the edge's own messages on it.
type natsLink struct {
	srv  *natsserver.Server
	conn *nats.Conn
	pub  *natspub.Publisher
}

// spanTracing is the edge's tracer and, when the edge made its provider,
// the provider's shutdown.
type spanTracing struct {
	tracer   trace.Tracer
	shutdown func(context.Context) error
}

// httpServing is the HTTP API's server, its listener and the server's
// exit.
type httpServing struct {
	srv      *http.Server
	ln       net.Listener
	serveErr chan error
}

// New validates cfg and prepares an edge; Start opens the cluster node,
// connects to NATS and listens.
func New(cfg Config, deps Deps) (*Edge, error) {
	cfg.Normalize()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("edge: config: %w", err)
	}
	e := &Edge{cfg: cfg, deps: deps}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.setUp()
	for _, step := range []func() error{e.newObservability, e.newLogSide, e.newRouting, e.newHops, e.newStored, e.newDispatch} {
		if err := step(); err != nil {
			e.cancel()
			return nil, err
		}
	}
	e.duties = e.newLeaderDuties()
	return e, nil
}

// setUp fills what every part of the edge reads: its logger, clock, node
// id, version, keys, body budget and metrics registry.
func (e *Edge) setUp() {
	cfg, deps := &e.cfg, e.deps
	e.identityConfig = cfg.IdentityConfig()
	e.bodies = bodybudget.New(cfg.MaxInflightBodyBytes)
	e.log = deps.Logger
	if e.log == nil {
		e.log = slog.Default()
	}
	e.log = e.log.With("component", "edge", "node", cfg.Cluster.NodeID)
	for _, w := range cfg.Deprecated() {
		e.log.Warn("config: " + w)
	}
	e.now = deps.Now
	if e.now == nil {
		e.now = time.Now
	}
	e.nodeID = cfg.Cluster.NodeID
	e.version = deps.Version
	if e.version == "" {
		e.version = "dev"
	}
	if cfg.InternalRequestAuthKey != "" {
		e.authKey = []byte(cfg.InternalRequestAuthKey)
	}
	e.respIDs = respid.NewCodec(e.authKey)
	e.registry = deps.Registry
	if e.registry == nil {
		e.registry = prometheus.NewRegistry()
	}
}

// newObservability creates the edge's series (edge/observe), the relay
// that counts the answers it cannot finish, and the tracer.
func (e *Edge) newObservability() error {
	var err error
	if e.metrics, err = observe.New(e.registry, observeSource{e}); err != nil {
		return err
	}
	e.answers = api.Relayer{Metrics: e.metrics, Log: e.log}
	tp := e.deps.TracerProvider
	if tp == nil {
		if tp, e.tracing.shutdown, err = observe.TracerProvider(e.cfg.Tracing, e.cfg.Cluster.NodeID, os.Stdout); err != nil {
			return fmt.Errorf("edge: %w", err)
		}
	}
	e.tracing.tracer = tp.Tracer("github.com/tether-project/tether/edge")
	e.served = api.Served{Tracer: e.tracing.tracer, Metrics: e.metrics, NodeID: e.nodeID}
	return nil
}

// newLogSide prepares the edge's side of the affinity log: its proposals
// (edge/proposals), its freshness (edge/readiness), the admission layer
// that refuses requests while its state is stalled (edge/admission), and
// flow control (edge/flow).
func (e *Edge) newLogSide() error {
	p := proposals.New(e.ctx, proposalsEdge{e}, proposals.Config{NodeID: e.nodeID, ProposeTimeout: e.cfg.Cluster.ProposeTimeout,
		TouchInterval: e.cfg.TouchInterval, Metrics: e.metrics, Logger: e.log, Now: e.now})
	e.proposer, e.placements, e.recorder, e.touches = p.Proposer, p.Placements, p.Recorder, p.Touches
	e.fresh = readiness.NewFreshness(readinessEdge{e}, e.cfg.Cluster, e.log)
	e.admission = admission.New(admissionEdge{e}, e.cfg.Admission, e.metrics)
	e.flow = flow.New(e.cfg.FlowControl, e.nodeID, e.authKey, flowEdge{e}, &e.metrics.Flow, e.log)
	return nil
}

// newRouting prepares the catalogue (edge/catalog: each model's routers
// and tokenizers) and the router (edge/route), which makes each model's
// decision.
func (e *Edge) newRouting() error {
	cat, err := catalog.New(&e.cfg, catalogueEdge{e}, e.metrics, e.log)
	if err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	e.catalogue = cat
	e.logTokenizers()
	e.router = route.New(routeEdge{e}, route.Config{Edge: &e.cfg, NodeID: e.nodeID, Catalogue: cat,
		Proposals: &proposals.Proposals{Proposer: e.proposer, Placements: e.placements, Recorder: e.recorder, Touches: e.touches},
		Fresh:     e.fresh, Metrics: e.metrics, Tracer: e.tracing.tracer, Logger: e.log, Now: e.now})
	return nil
}

// newDispatch prepares what sends the hops (edge/dispatch), with this
// process's disaggregated request id prefix.
func (e *Edge) newDispatch() error {
	var b [4]byte
	_, _ = rand.Read(b[:])
	e.dispatcher = dispatch.New(dispatchEdge{e}, dispatch.Config{Edge: &e.cfg, NodeID: e.nodeID, AuthKey: e.authKey, Router: e.router,
		Catalogue: e.catalogue, Stored: e.stored, Client: e.client, Answers: e.answers, Metrics: e.metrics, Tracer: e.tracing.tracer,
		Logger: e.log, Now: e.now, DisaggBase: disagg.TRTLLMIDBase(binary.BigEndian.Uint32(b[:]))})
	return nil
}

// newStored prepares the stored responses and conversations (edge/stored).
func (e *Edge) newStored() error {
	e.stored = stored.New(storedEdge{e}, stored.Config{NodeID: e.nodeID, Codec: e.respIDs, Retention: e.cfg.StoredResponseRetention,
		UpstreamTimeout: e.cfg.UpstreamTimeout, DebugRouteHeader: e.cfg.DebugRouteHeader, Catalogue: e.catalogue,
		Bodies: e.bodies, MaxBodyBytes: e.cfg.MaxBodyBytes, Client: e.client, Answers: e.answers, Metrics: e.metrics,
		Served: e.served, Now: e.now})
	return nil
}

// newHops prepares the hops to workers: the transport security of every
// link (edge/edgetls), the hops' client behind its guard, and the ids of
// the requests the log records.
func (e *Edge) newHops() error {
	var err error
	if e.tls, err = edgetls.Load(&e.cfg); err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	transport := e.deps.Transport
	if transport == nil {
		transport = &http.Transport{
			Proxy: nil,
			// A connect that fails marks the instance unreachable from
			// this edge, also after the request that started it gave up,
			// and one to a marked instance is bounded by
			// fleetview.MarkedConnectTimeout (edge/fleetview reach.go).
			DialContext:         fleetview.WatchDials((&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext),
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			ForceAttemptHTTP2:   false,
			TLSClientConfig:     e.tls.Worker,
		}
	}
	e.client = &http.Client{Transport: e.tls.GuardHops(transport, e.log, e.registry)}
	e.reachClient = e.client
	if t, ok := transport.(*http.Transport); ok {
		fresh := t.Clone()
		fresh.DisableKeepAlives = true
		e.reachClient = &http.Client{Transport: e.tls.GuardHops(fresh, e.log, e.registry)}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	// Request ids ("<node id>-<n>", recorded in the log's decisions) start
	// at a random point of a 63-bit space, so an edge restarted on its data
	// directory does not reuse the ids its previous process recorded.
	e.reqSeq.Store(binary.BigEndian.Uint64(b[:]) >> 1 &^ (1<<32 - 1))
	return nil
}

// logTokenizers says at start how each fleet's block keys are computed.
func (e *Edge) logTokenizers() {
	for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
		ft := e.catalogue.First().Tokenizers[f]
		dir, chatTemplate, ok := ft.Model()
		if !ok {
			continue // words: as every tether dev and simulator run
		}
		e.log.Info("fleet block keys from the model's tokenizer", "fleet", f.String(), "dir", dir,
			"block_size", ft.BlockSize(), "chat_template", chatTemplate)
		if !chatTemplate {
			e.log.Warn("the model's tokenizer_config.json has no chat_template: chat requests get no block keys", "fleet", f.String(), "dir", dir)
		}
	}
}
