// Package edge is `tether edge`: the OpenAI-compatible front door over the
// replicated affinity log. It turns each request into routing keys
// (routing), reads where a key lives from the replicated state (a local read
// of the cluster's fsm.State), places new keys and proposes the placement
// through the log (the committed winner is used), sends the prefill to a
// context worker and the decode to a generation worker, and signs the
// sub-agent hint for each hop (internal/hintauth). Because every edge reads
// the same log, a parent on one edge and its sub-agents on others share one
// context instance. See DESIGN.md.
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
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/edge/admission"
	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/catalog"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/dispatch"
	"github.com/tether-project/tether/edge/edgetls"
	"github.com/tether-project/tether/edge/engineevents"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/leader"
	"github.com/tether-project/tether/edge/natsembed"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/proposals"
	"github.com/tether-project/tether/edge/readiness"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/edge/stored"
	"github.com/tether-project/tether/edge/tokenize"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/bodybudget"
	"github.com/tether-project/tether/internal/httpjson"
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
	respIDs *respid.Codec   // mints and reads Responses ids (edge/stored)
	stored  *stored.Service // stored responses and conversations (edge/stored)
	tls     *edgetls.TLS    // transport security (edge/edgetls)

	// The request path: a request's routing keys and placement, the
	// hops' client, what the edge proposes, batches and records for the
	// log, and whether it takes the request at all.
	tokenizers     tokenize.Fleets        // by fsm.Fleet (tokenize.go)
	identityConfig routing.IdentityConfig // the sub-agent identity routing resolves
	router         *route.Router          // where each fleet's part of a request goes (edge/route)
	dispatcher     *dispatch.Dispatcher   // sends the hops (edge/dispatch)
	client         *http.Client
	// What the edge proposes to the log beside its requests (edge/proposals):
	// every proposal (proposer), its own Bind proposals (placements), the
	// recorder's background events and the touch batches.
	proposer   *proposals.Proposer
	placements *proposals.Placements
	touches    *proposals.Touches
	recorder   *proposals.Recorder
	fresh      *readiness.Freshness // is this edge's state current (readyz, degraded placement)
	ready      *readiness.Readiness
	admission  *admission.Layer // stalled or saturated: the request is refused (edge/admission)
	// bodies bounds the request-body bytes held at once.
	bodies *bodybudget.Budget
	reqSeq atomic.Uint64

	// The catalogue (edge/catalog): the models, each on its own fleets,
	// and their LoRA adapters.
	catalogue *catalog.Catalogue

	// The cluster node and the leader's duties while it leads (leader.go,
	// edge/leader).
	node   *cluster.Node
	duties *leader.Duties

	// What the edge knows of the workers: the fleet view, and what it
	// learns of the engines beside it (their KV events, shadows of static
	// engines' caches).
	fleet *fleetview.View
	// engineEvents reads the engines' own KV events (edge/engineevents).
	engineEvents *engineevents.Reader
	nats         natsLink

	// Observability.
	registry *prometheus.Registry
	metrics  *observe.Metrics
	answers  api.Relayer // passes workers' answers to clients
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
	// noHandoff: Close skips the Raft leadership transfer.
	noHandoff atomic.Bool
}

// natsLink is the edge's NATS: the embedded server when configured, and
// the connection.
type natsLink struct {
	srv  *natsserver.Server
	conn *nats.Conn
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
	return nil
}

// newLogSide prepares the edge's side of the affinity log: its proposals
// (edge/proposals), its freshness (edge/readiness) and the admission layer
// that refuses requests while its state is stalled (edge/admission).
func (e *Edge) newLogSide() error {
	p := proposals.New(e.ctx, proposalsEdge{e}, proposals.Config{NodeID: e.nodeID, ProposeTimeout: e.cfg.Cluster.ProposeTimeout,
		TouchInterval: e.cfg.TouchInterval, Metrics: e.metrics, Logger: e.log, Now: e.now})
	e.proposer, e.placements, e.recorder, e.touches = p.Proposer, p.Placements, p.Recorder, p.Touches
	e.fresh = readiness.NewFreshness(readinessEdge{e}, e.cfg.Cluster, e.log)
	e.admission = admission.New(admissionEdge{e}, e.cfg.Admission, e.metrics)
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
		Tracer: e.tracing.tracer, Now: e.now})
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
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			ForceAttemptHTTP2:   false,
			TLSClientConfig:     e.tls.Worker,
		}
	}
	e.client = &http.Client{Transport: e.tls.GuardHops(transport, e.log, e.registry)}
	var b [8]byte
	_, _ = rand.Read(b[:])
	// Request ids ("<node id>-<n>", recorded in the log's decisions) start
	// at a random point of a 63-bit space, so an edge restarted on its data
	// directory does not reuse the ids its previous process recorded.
	e.reqSeq.Store(binary.BigEndian.Uint64(b[:]) >> 1 &^ (1<<32 - 1))
	return nil
}

// Start opens the cluster node, starts NATS (embedded or client), the
// fleet view, the background duties and the HTTP server. Each step leaves
// what it started where stopLocked releases it, so on error everything
// started is stopped.
func (e *Edge) Start(ctx context.Context) (err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started || e.stopped {
		return errors.New("edge: Start called twice or after Close")
	}
	e.started = true
	defer func() {
		if err != nil {
			e.stopLocked(false)
		}
	}()
	if err := e.listen(ctx); err != nil {
		return err
	}
	if err := e.startNATS(); err != nil {
		return err
	}
	if err := e.openNode(ctx); err != nil {
		return err
	}
	if err := e.startFleetView(ctx); err != nil {
		return err
	}
	if err := e.placements.Listen(); err != nil {
		return err
	}
	if err := e.dispatcher.Start(); err != nil {
		return err
	}
	if err := e.startAdmission(); err != nil {
		return err
	}
	e.serve()
	e.startBackground()
	e.log.Info("edge serving", "url", e.URL(), "tls", e.TLSMode(), "raft", e.node.Addr(), "nats", e.natsURL())
	return nil
}

// listen takes the HTTP listener (Deps.HTTPListener, or hostname:port),
// behind TLS when configured and answering header-level errors in the
// API's shape (headererrors.go). stopLocked closes it until serve owns it.
func (e *Edge) listen(ctx context.Context) error {
	ln := e.deps.HTTPListener
	if ln == nil {
		addr := net.JoinHostPort(e.cfg.Hostname, strconv.Itoa(e.cfg.Port))
		var lc net.ListenConfig
		var err error
		if ln, err = lc.Listen(ctx, "tcp", addr); err != nil {
			return fmt.Errorf("edge: listen %s: %w", addr, err)
		}
	}
	for _, w := range e.tls.Warnings(&e.cfg) {
		e.log.Warn(w)
	}
	e.http.ln = api.Listener{Listener: e.tls.Listener(ln)}
	return nil
}

// openNode opens the cluster node on the edge's cluster settings, its
// metrics and TLS. The node owns Deps.ClusterListener from here on (it
// closes it when Open fails).
func (e *Edge) openNode(ctx context.Context) error {
	ccfg := e.cfg.NodeConfig()
	ccfg.Version, ccfg.Listener, ccfg.TLS = e.version, e.deps.ClusterListener, e.tls.Cluster
	ccfg.Registerer, ccfg.Logger = e.registry, e.log
	e.deps.ClusterListener = nil
	n, err := cluster.Open(ctx, ccfg)
	if err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	e.node = n
	return nil
}

// startAdmission prepares what decides whether the edge takes a request:
// its readiness (edge/readiness), which requests read from the first one on
// (route.go unheardAtStartup), and the shedder (edge/admission).
func (e *Edge) startAdmission() error {
	e.ready = readiness.New(readinessEdge{e}, e.fresh, e.readinessConfig(), e.now())
	run, err := e.admission.Start(e.registry)
	if err != nil {
		return err
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		run(e.ctx.Done())
	}()
	return nil
}

// serve serves the HTTP API on the listener; stopLocked awaits the
// server's exit.
func (e *Edge) serve() {
	srv := api.NewServer(e.Handler(), &e.cfg, slog.NewLogLogger(e.log.Handler(), slog.LevelWarn))
	e.http.srv = srv
	done := make(chan error, 1)
	e.http.serveErr = done
	ln := e.http.ln
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		done <- err
	}()
}

// startBackground starts the edge's own loops, which run until e.ctx is
// cancelled: freshness, the recorder, touch batching, the leader's duties
// while this node leads, and advertising this edge's NodeInfo.
func (e *Edge) startBackground() {
	e.wg.Add(5)
	go func() {
		defer e.wg.Done()
		e.fresh.Run(e.ctx)
	}()
	go func() {
		defer e.wg.Done()
		e.recorder.Run(e.ctx)
	}()
	go func() {
		defer e.wg.Done()
		e.touches.Run(e.ctx)
	}()
	go func() {
		defer e.wg.Done()
		e.duties.Run(e.ctx)
	}()
	go e.advertise()
}

// staticInstances are the configured workers of every model's fleets, as
// the fleet view takes them.
func (e *Edge) staticInstances() []fleetview.Static {
	var static []fleetview.Static
	for _, m := range e.catalogue.Models() {
		for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
			sc := m.Cfg.Servers(f)
			model := ""
			if sc.HealthCheckModel {
				model = m.Name
			}
			for _, si := range sc.URLs {
				static = append(static, fleetview.Static{ID: si.ID(), URL: trimSlash(si.URL), Fleet: f, HealthPath: sc.HealthPath, Model: model,
					Served: m.Name, MaxLoRAs: m.Cfg.LoRA.MaxLoRAs, Metrics: metricsFormat(sc.Engine.Kind()), Ranks: sc.DataParallelSize,
					ProbeTimeout: sc.ProbeTimeout(e.cfg.Telemetry.ProbeInterval), EngineEvents: si.KVEvents != nil, SharedEvents: sc.KVCacheEvents})
			}
		}
	}
	return static
}

// startFleetView builds and starts the view of the workers (static ones,
// NATS telemetry, probes) and subscribes to the engines' own KV events.
func (e *Edge) startFleetView(ctx context.Context) error {
	t := e.cfg.Telemetry
	var err error
	if e.fleet, err = fleetview.New(fleetview.Config{
		Static: e.staticInstances(), Conn: e.nats.conn, PredictTTL: e.cfg.Placement.PredictTTL, Breaker: e.cfg.Placement.Breaker, BlockSize: e.cfg.Placement.BlockSize,
		StaleIntervals: t.StaleIntervals, MinStaleAfter: t.MinStaleAfter, ProbeInterval: t.ProbeInterval,
		DumpTimeout: t.DumpTimeout, ForgetAfter: 10 * t.DownAfter,
		OnEvictions: e.duties.QueueEvictions, Registerer: e.registry, Logger: e.log, Now: e.now,
		ProbeClient:   &http.Client{Transport: e.client.Transport},
		VerifyAddress: edgetls.AddressVerifier(e.cfg.TLS, e.client),
	}); err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	if err := e.fleet.Start(ctx); err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	if err := e.startEngineEvents(); err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	return nil
}

func trimSlash(s string) string {
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}

// startNATS starts the embedded server when configured and connects.
func (e *Edge) startNATS() error {
	n := e.cfg.NATS
	if !n.Enabled() {
		return nil
	}
	urls := n.URLs
	if n.Embedded {
		host, portStr, _ := net.SplitHostPort(n.Listen)
		port, err := strconv.Atoi(portStr)
		if err != nil {
			return fmt.Errorf("edge: nats.listen %q: %w", n.Listen, err)
		}
		if port == 0 {
			port = natsembed.RandomPort
		}
		opts := &natsserver.Options{Host: host, Port: port, Username: n.User, Password: n.Password, Authorization: n.Token}
		e.tls.NATSServerAuth(opts, n, e.log)
		srv, err := natsembed.Start(opts)
		if err != nil {
			return fmt.Errorf("edge: embedded %w", err)
		}
		e.nats.srv = srv
		urls = []string{srv.ClientURL()}
	}
	opts := []nats.Option{
		nats.Name("tether-edge-" + e.cfg.Cluster.NodeID),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.NoCallbacksAfterClientClose(),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				e.log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { e.log.Info("nats reconnected", "server", c.ConnectedUrlRedacted()) }),
	}
	switch {
	case n.User != "":
		opts = append(opts, nats.UserInfo(n.User, n.Password))
	case n.Token != "":
		opts = append(opts, nats.Token(n.Token))
	case n.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(n.NKeySeedFile)
		if err != nil {
			return fmt.Errorf("edge: nats.nkey_seed_file: %w", err)
		}
		opts = append(opts, o)
	case n.CredsFile != "":
		opts = append(opts, nats.UserCredentials(n.CredsFile))
	}
	opts = append(opts, e.tls.NATSClientOptions()...)
	joined := ""
	for i, u := range urls {
		if i > 0 {
			joined += ","
		}
		joined += u
	}
	nc, err := nats.Connect(joined, opts...)
	if err != nil {
		return fmt.Errorf("edge: nats connect %s: %w", joined, err)
	}
	e.nats.conn = nc
	return nil
}

func (e *Edge) natsURL() string {
	if e.nats.srv != nil {
		return e.nats.srv.ClientURL()
	}
	if e.nats.conn != nil {
		return e.nats.conn.ConnectedUrlRedacted()
	}
	return ""
}

// NATSURL is the embedded NATS server's client URL ("" when not embedded).
func (e *Edge) NATSURL() string {
	if e.nats.srv != nil {
		return e.nats.srv.ClientURL()
	}
	return ""
}

// Addr is the HTTP listen address (host:port).
func (e *Edge) Addr() string {
	if e.http.ln == nil {
		return ""
	}
	return e.http.ln.Addr().String()
}

// Node is the edge's cluster node (read-only use).
func (e *Edge) Node() *cluster.Node { return e.node }

// Fleet is the edge's view of the workers.
func (e *Edge) Fleet() *fleetview.View { return e.fleet }

// Registry is the edge's metrics registry.
func (e *Edge) Registry() *prometheus.Registry { return e.registry }

// Close shuts the edge down gracefully: stop accepting requests and let
// in-flight ones finish (until ctx is done), flush the pending touches and
// background events and await the answers to its Bind proposals, hand leadership over and close the node, NATS and
// the fleet view. Idempotent.
func (e *Edge) Close(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return nil
	}
	var errs []error
	if e.http.srv != nil {
		if err := e.http.srv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("edge: http shutdown: %w", err))
			e.http.srv.Close()
		}
	}
	if e.node != nil {
		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		e.touches.Flush(fctx)
		e.recorder.Flush(fctx)
		e.awaitPlacements(fctx)
		cancel()
	}
	if err := e.stopLocked(false); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// awaitPlacements waits, until ctx is done, for the log's answer to the
// Bind proposals this edge has in flight: a graceful stop keeps the
// placements of the requests it served.
func (e *Edge) awaitPlacements(ctx context.Context) {
	if e.placements == nil {
		return
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for e.placements.InFlight() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SkipLeadershipHandoff makes Close stop the Raft node without handing
// leadership to another edge: for a deployment stopping every edge
// (ops/devstack), where the edge taking over would be stopping too.
func (e *Edge) SkipLeadershipHandoff() {
	e.noHandoff.Store(true)
	e.mu.Lock()
	n := e.node
	e.mu.Unlock()
	if n != nil {
		n.SkipLeadershipTransfer()
	}
}

// Kill stops the edge abruptly, as a crash would: connections drop, the
// Raft node dies without a leadership transfer, nothing is flushed. Tests
// use it to kill a leader.
func (e *Edge) Kill() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return
	}
	if e.http.srv != nil {
		e.http.srv.Close()
	}
	_ = e.stopLocked(true)
}

// stopLocked stops everything started (under e.mu).
func (e *Edge) stopLocked(abrupt bool) error {
	e.stopped = true
	var errs []error
	if e.http.srv == nil && e.http.ln != nil {
		e.http.ln.Close() // Start failed before serving
	}
	e.cancel()
	e.wg.Wait()
	if e.engineEvents != nil {
		e.engineEvents.Close()
	}
	if e.fleet != nil {
		e.fleet.Close()
	}
	if e.node != nil {
		var err error
		if abrupt {
			err = e.node.Kill()
		} else {
			if e.noHandoff.Load() {
				e.node.SkipLeadershipTransfer()
			}
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err = e.node.Close(cctx)
			cancel()
		}
		if err != nil {
			errs = append(errs, err)
		}
	} else if e.deps.ClusterListener != nil {
		e.deps.ClusterListener.Close()
	}
	if e.nats.conn != nil {
		e.nats.conn.Close()
	}
	if e.nats.srv != nil {
		e.nats.srv.Shutdown()
		e.nats.srv.WaitForShutdown()
	}
	if e.http.serveErr != nil {
		if err := <-e.http.serveErr; err != nil {
			errs = append(errs, fmt.Errorf("edge: http serve: %w", err))
		}
	}
	e.client.CloseIdleConnections() // reaches through the hop guard
	if e.tracing.shutdown != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = e.tracing.shutdown(cctx)
		cancel()
	}
	return errors.Join(errs...)
}

// Handler is the edge's HTTP API: the OpenAI endpoints, health, metrics
// and the admin API.
func (e *Edge) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, d := range []apireq.Dialect{apireq.Chat, apireq.Completions, apireq.Messages, apireq.Responses} {
		mux.HandleFunc(d.Path(), func(w http.ResponseWriter, r *http.Request) { e.handleInference(w, r, d) })
	}
	mux.HandleFunc(api.CountTokensPath, func(w http.ResponseWriter, r *http.Request) { e.handleInference(w, r, apireq.Messages) })
	mux.HandleFunc("/v1/responses/", e.stored.ServeByID)
	mux.HandleFunc("/v1/conversations", e.stored.ServeConversations)
	mux.HandleFunc("/v1/conversations/", e.stored.ServeConversations)
	mux.HandleFunc("/v1/models", e.catalogue.ServeModels)
	mux.HandleFunc("/v1/models/{id...}", e.catalogue.ServeModel)
	mux.HandleFunc("/healthz", e.handleHealth)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) { e.ready.ServeHTTP(w, r) })
	mux.Handle("/metrics", e.metricsHandler())
	mux.Handle(admin.Prefix, e.adminAPI())
	return e.admission.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				e.log.Error("handler panic", "path", r.URL.Path, "panic", v)
				api.WriteError(w, api.NewError(http.StatusInternalServerError, "server_error", "internal_error", "", "internal error"))
			}
		}()
		if _, pattern := mux.Handler(r); pattern == "" {
			e.metrics.Requests.WithLabelValues("other", "404").Inc()
			api.WriteError(w, api.NewError(http.StatusNotFound, "invalid_request_error", "unknown_url", "",
				"unknown path %s %s (the edge serves POST /v1/chat/completions, /v1/completions, /v1/messages, /v1/messages/count_tokens, /v1/responses, GET/DELETE /v1/responses/{id}, /v1/conversations[/{id}[/items[/{item_id}]]], GET /v1/models, /healthz, /readyz, /metrics, /admin/v1/...)",
				r.Method, httpjson.Clip(r.URL.Path, 200)))
			return
		}
		mux.ServeHTTP(w, r)
	}))
}

// metricsHandler serves /metrics, behind the admin token when
// metrics_access is admin_token (docs/security.md).
func (e *Edge) metricsHandler() http.Handler {
	h := promhttp.HandlerFor(e.registry, promhttp.HandlerOpts{})
	if e.cfg.MetricsAccess != config.MetricsAdminToken {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !admin.Authorized(r, e.cfg.AdminToken) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tether-metrics"`)
			admin.Error(w, http.StatusUnauthorized, "unauthorized", "/metrics needs Authorization: Bearer <admin_token> (metrics_access: admin_token)")
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (e *Edge) handleHealth(w http.ResponseWriter, r *http.Request) {
	httpjson.Write(w, http.StatusOK, map[string]string{"status": "ok"})
}

// advertise proposes this edge's NodeInfo until it commits (the leader
// raises the cluster feature level from these).
func (e *Edge) advertise() {
	defer e.wg.Done()
	ev := fsm.NodeInfo{NodeID: e.nodeID, Version: e.version, MaxFeatureLevel: e.featureLevel()}
	backoff := 50 * time.Millisecond
	for {
		if n, ok := findNode(e.node.State(), e.nodeID); ok && n.Version == ev.Version && n.MaxFeatureLevel == ev.MaxFeatureLevel {
			return
		}
		ctx, cancel := context.WithTimeout(e.ctx, time.Second)
		_, err := e.proposer.Propose(ctx, ev)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-e.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// featureLevel is the highest fsm feature level this edge advertises and
// uses: cluster.compat_feature_level (its default: this build's maximum).
func (e *Edge) featureLevel() uint32 { return e.cfg.Cluster.FeatureLevel }

func findNode(st *fsm.State, id string) (fsm.Edge, bool) {
	for _, n := range st.Edges() {
		if n.ID == id {
			return n, true
		}
	}
	return fsm.Edge{}, false
}
