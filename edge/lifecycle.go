package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/edgetls"
	"github.com/tether-project/tether/edge/engineevents"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/natsembed"
	"github.com/tether-project/tether/edge/natspub"
	"github.com/tether-project/tether/edge/readiness"
	"github.com/tether-project/tether/fsm"
)

// Start, Close and Kill: the steps that bring the edge up (each leaving
// what it started where stopLocked releases it) and down.

// metricsFormat is the /metrics format the edge scrapes of engine k ("" none).
func metricsFormat(k EngineKind) string {
	switch k {
	case EngineVLLM:
		return fleetview.MetricsVLLM
	case EngineSGLang:
		return fleetview.MetricsSGLang
	}
	return ""
}

// startEngineEvents subscribes to the engines' own KV events and runs the
// leader's drains of trtllm-serve's (edge/engineevents) until the edge
// stops.
func (e *Edge) startEngineEvents() error {
	models := make([]*Config, len(e.catalogue.Models()))
	for i, m := range e.catalogue.Models() {
		models[i] = m.Cfg
	}
	e.engineEvents = engineevents.New(engineEventsEdge{e}, engineevents.Config{Models: models,
		LeaderInterval: e.cfg.Leader.Interval, Metrics: e.metrics, Logger: e.log})
	if err := e.engineEvents.Start(); err != nil {
		return err
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.engineEvents.RunDrains(e.ctx)
	}()
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
// API's shape (edge/api). stopLocked closes it until serve owns it.
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
	e.http.ln = api.Listener{Listener: ln, TLS: e.tls.HTTP}
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
// (edge/route unheardAtStartup), the shedder (edge/admission) and flow
// control (edge/flow: the other edges' states, its dispatch loop).
func (e *Edge) startAdmission() error {
	e.ready = readiness.New(readinessEdge{e}, e.fresh, e.readinessConfig(), e.now())
	run, err := e.admission.Start(e.registry)
	if err != nil {
		return err
	}
	if err := e.flow.Start(); err != nil {
		return err
	}
	e.wg.Add(2)
	go func() {
		defer e.wg.Done()
		run(e.ctx.Done())
	}()
	go func() {
		defer e.wg.Done()
		e.flow.Run(e.ctx.Done())
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
				static = append(static, fleetview.Static{ID: si.ID(), URL: strings.TrimRight(si.URL, "/"), Fleet: f, HealthPath: sc.HealthPath, Model: model,
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
		ReachClient:   e.reachClient,
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
		// A write the server does not take within a second (its peer cut
		// off, the socket open) ends the connection and reconnects,
		// instead of holding the connection's lock for nats.go's default
		// minute (the fleet view then probes the workers over HTTP).
		nats.FlusherTimeout(natsFlusherTimeout),
		nats.ReconnectOnFlusherError(),
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
	e.nats.pub = natspub.New(nc, natspub.QueueSize)
	e.nats.pub.Start()
	return nil
}

// natsFlusherTimeout bounds one write to the NATS server.
const natsFlusherTimeout = time.Second

func (e *Edge) natsURL() string {
	if e.nats.srv != nil {
		return e.nats.srv.ClientURL()
	}
	if e.nats.conn != nil {
		return e.nats.conn.ConnectedUrlRedacted()
	}
	return ""
}

// Close shuts the edge down gracefully: Settle (stop accepting requests,
// let in-flight ones finish, flush what they left for the log and await
// the answers to its Bind proposals), then hand leadership over and close
// the node, NATS and the fleet view. Idempotent.
func (e *Edge) Close(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return nil
	}
	err := e.settleLocked(ctx)
	return errors.Join(err, e.stopLocked(false))
}

// settleBound bounds how long Settle waits for the log after the requests
// have finished: the pending touches, background events and the answers
// to the edge's own Bind proposals.
const settleBound = 10 * time.Second

// Settle stops the edge accepting requests, lets in-flight ones finish
// (until ctx is done), then flushes the pending touches and background
// events and awaits the answers to its Bind proposals (within
// settleBound), so that a stop keeps the placements of the requests it
// served. The node keeps running: a deployment stopping every edge settles
// them all before it closes any, as a Bind needs its leader. Idempotent;
// Close settles an edge not settled yet.
func (e *Edge) Settle(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return nil
	}
	return e.settleLocked(ctx)
}

func (e *Edge) settleLocked(ctx context.Context) error {
	if e.settled {
		return nil
	}
	e.settled = true
	var err error
	e.flow.Close() // requests waiting for the fleet go to another edge now
	if e.http.srv != nil {
		if err = e.http.srv.Shutdown(ctx); err != nil {
			err = fmt.Errorf("edge: http shutdown: %w", err)
			e.http.srv.Close()
		}
	}
	if e.node != nil {
		fctx, cancel := context.WithTimeout(ctx, settleBound)
		e.touches.Flush(fctx)
		e.recorder.Flush(fctx)
		e.awaitPlacements(fctx)
		cancel()
	}
	return err
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
	e.flow.Close()
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
	e.nats.pub.Close()
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
