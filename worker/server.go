// Package worker is `tether worker`: an OpenAI-compatible HTTP server in
// front of an engine (simulated, or a proxy to a real inference server) with
// attention-DP rank scheduling (worker/adp), sub-agent hint verification
// (internal/hintauth) and telemetry over NATS (internal/telemetry).
//
// A request goes: parse → verify the sub-agent hint → adp.Place →
// engine.Run on the chosen rank → respond (JSON or SSE). See DESIGN.md.
//
// Embedding (tether dev, tests):
//
//	srv, err := worker.New(cfg)
//	err = srv.Start(ctx)         // listens on cfg.Hostname:cfg.Port
//	url := srv.URL()
//	defer srv.Close(ctx)
package worker

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

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/internal/bodybudget"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/worker/adp"
	"github.com/tether-project/tether/worker/engine"
)

// Response headers naming where a request ran.
const (
	HeaderADPRank  = "x-tether-adp-rank"
	HeaderInstance = "x-tether-instance"
)

// HeaderLogRank, on an edge's hop, is the ADP rank the affinity log
// records for the request's conversation (or its sub-agent root): a worker
// without a binding for it (restarted) binds it there again.
const HeaderLogRank = "x-tether-log-rank"

// Server is one worker: HTTP API, scheduler, engine and telemetry.
type Server struct {
	// bodies bounds the request-body bytes held at once.
	bodies   *bodybudget.Budget
	cfg      Config
	log      *slog.Logger
	eng      engine.Engine
	sched    *adp.Scheduler
	keys     [][]byte
	tls      *workerTLS // the listener's transport security (tls.go)
	tracer   trace.Tracer
	metrics  *metrics
	bootID   uint64
	bootTime time.Time
	ranks    int
	reqSeq   atomic.Uint64
	// inflight counts inference requests being served, for
	// max_concurrent_requests.
	inflight atomic.Int64
	// hintFormats are the accepted hint signature formats
	// (hint_signature_formats).
	hintFormats []hintauth.Format

	// Per-rank counters the scheduler and engine do not keep.
	overflows     []atomic.Int64
	convEvictions []atomic.Int64

	pub *publisher // nil without NATS

	// responses is the Responses API store (worker/respstore.go);
	// respRanks, for a proxy, the rank whose upstream holds each
	// response it relayed (worker/passthrough.go).
	responses *respStore
	// conversations is the Conversations API store (worker/convstore.go).
	conversations *convStore
	respRanks     *respRanks

	baseCtx    context.Context // parent of every request context
	cancelBase context.CancelFunc
	handlers   sync.WaitGroup // in-flight inference handlers

	mu        sync.Mutex
	httpSrv   *http.Server
	ln        net.Listener
	url       string
	started   bool
	closed    bool
	drained   bool // no new inference handlers may enter
	closeErr  error
	serveDone chan struct{}
	closing   atomic.Bool
}

// New validates cfg and builds the engine and scheduler. It neither listens
// nor connects to NATS: Start (or Serve) does.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("worker: config: %w", err)
	}
	opts, err := cfg.schedulerOptions()
	if err != nil {
		return nil, fmt.Errorf("worker: config: %w", err)
	}
	s := &Server{
		bodies:   bodybudget.New(cfg.inflightBodyBytes()),
		cfg:      cfg,
		log:      cfg.Logger,
		keys:     cfg.AuthKeys(),
		ranks:    opts.Ranks,
		bootID:   newBootID(),
		bootTime: time.Now(),
	}
	s.hintFormats = cfg.hintFormats()
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("component", "worker", "instance", cfg.InstanceID)
	for _, w := range cfg.Deprecated() {
		s.log.Warn("config: " + w)
	}
	if s.tls, err = loadServerTLS(cfg.TLS); err != nil {
		return nil, fmt.Errorf("worker: config: %w", err)
	}
	if s.cfg.Version == "" {
		s.cfg.Version = "dev"
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	s.tracer = tp.Tracer("github.com/tether-project/tether/worker")
	s.overflows = make([]atomic.Int64, s.ranks)
	s.convEvictions = make([]atomic.Int64, s.ranks)
	opts.OnBindingEvicted = s.onBindingEvicted
	if s.sched, err = adp.New(opts); err != nil {
		return nil, fmt.Errorf("worker: scheduler: %w", err)
	}
	if s.eng, err = buildEngine(cfg, s.ranks, s.log); err != nil {
		return nil, fmt.Errorf("worker: engine: %w", err)
	}
	if st := s.eng.Stats(); len(st) != s.ranks {
		s.eng.Close()
		return nil, fmt.Errorf("worker: engine reports %d ranks, scheduler has %d", len(st), s.ranks)
	}
	s.metrics = newMetrics(s)
	s.respRanks = newRespRanks(cfg.ResponsesStoreEntries)
	s.responses = newRespStore(cfg.ResponsesStoreEntries, cfg.ResponsesStoreBytes, s.log, func() { s.metrics.responsesEvicted.Inc() })
	s.conversations = newConvStore(cfg.ResponsesStoreEntries, cfg.ResponsesStoreBytes, s.log, func() { s.metrics.conversationsEvicted.Inc() })
	if cfg.NATS.Enabled() {
		s.pub = newPublisher(s)
		s.eng.SetKVEventSink(s.pub.addKVEvent)
	}
	s.baseCtx, s.cancelBase = context.WithCancel(context.Background())
	return s, nil
}

func newBootID() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err == nil {
			if id := binary.BigEndian.Uint64(b[:]); id != 0 {
				return id
			}
		}
	}
}

// Start listens on cfg.Hostname:cfg.Port, starts serving in the background
// and connects to NATS if configured (without waiting for the connection).
func (s *Server) Start(ctx context.Context) error {
	addr := net.JoinHostPort(s.cfg.Hostname, strconv.Itoa(s.cfg.Port))
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("worker: listen %s: %w", addr, err)
	}
	if err := s.start(ln); err != nil {
		ln.Close()
		return err
	}
	return nil
}

// Serve serves on ln until ctx is done (then shuts down gracefully, giving
// in-flight requests up to 30 s) or Close is called. It returns nil after a
// clean shutdown.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if err := s.start(ln); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return s.Close(cctx)
	case <-s.serveDone:
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closeErr
	}
}

func (s *Server) start(ln net.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("worker: server closed")
	}
	if s.started {
		return errors.New("worker: already started")
	}
	for _, w := range s.tls.warnings() {
		s.log.Warn(w)
	}
	ln = s.tls.listener(ln)
	s.ln = ln
	s.url = s.advertisedURL(ln.Addr())
	if s.pub != nil {
		// Before serving: a NATS configuration error (bad credentials
		// file) fails Start. An unreachable server does not: the
		// connection retries in the background.
		if err := s.pub.start(); err != nil {
			s.ln, s.url = nil, ""
			return fmt.Errorf("worker: %w", err)
		}
	}
	s.started = true
	s.httpSrv = &http.Server{
		Handler:           s.tls.guard(s.Handler()),
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout, // bodies up to max_body_bytes
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    1 << 20,
		BaseContext:       func(net.Listener) context.Context { return s.baseCtx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.serveDone = make(chan struct{})
	srv := s.httpSrv
	go func() {
		defer close(s.serveDone)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http serve stopped", "err", err)
		}
	}()
	s.log.Info("worker serving", "url", s.url, "fleet", s.cfg.Fleet, "role", s.cfg.ServerRole,
		"ranks", s.ranks, "engine", s.engineType(), "ignore_subagent_hints", s.cfg.IgnoreSubagentHints, "nats", s.cfg.NATS.Enabled())
	return nil
}

func (s *Server) engineType() string {
	if s.cfg.EngineOverride != nil {
		return fmt.Sprintf("%T", s.cfg.EngineOverride)
	}
	return s.cfg.Engine.Type
}

func (s *Server) advertisedURL(addr net.Addr) string {
	if s.cfg.AdvertiseURL != "" {
		return s.cfg.AdvertiseURL
	}
	host := s.cfg.Hostname
	port := strconv.Itoa(s.cfg.Port)
	if ta, ok := addr.(*net.TCPAddr); ok {
		port = strconv.Itoa(ta.Port)
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			if h, err := os.Hostname(); err == nil && h != "" {
				host = h
			} else {
				host = ta.IP.String()
			}
		}
	}
	return s.tls.scheme() + "://" + net.JoinHostPort(host, port)
}

// Addr is the listening address (nil before Start).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// URL is the base URL the worker advertises ("" before Start).
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url
}

// InstanceID is the configured instance id.
func (s *Server) InstanceID() string { return s.cfg.InstanceID }

// BootID is this process's random boot id, as published in telemetry.
func (s *Server) BootID() uint64 { return s.bootID }

// Ready reports what /readyz reports: serving, not closing, and connected
// to NATS when NATS is configured.
func (s *Server) Ready() bool {
	return s.Serving() && (s.pub == nil || s.pub.connected())
}

// Serving reports whether the worker takes requests (started, not
// closing), whatever its NATS connection: what /readyz?telemetry=optional
// reports. Edges probe it while their own NATS link is down, when
// telemetry silence says nothing about a worker.
func (s *Server) Serving() bool {
	s.mu.Lock()
	started := s.started && !s.closed
	s.mu.Unlock()
	return started && !s.closing.Load()
}

// Close shuts down gracefully: stop accepting, let in-flight requests
// finish until ctx is done (then cancel them), publish a final draining
// load report, disconnect from NATS and close the engine. Safe to call
// more than once.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		if s.serveDone != nil {
			<-s.serveDone
		}
		return s.closeErr
	}
	s.closed = true
	s.closing.Store(true)
	srv, done := s.httpSrv, s.serveDone
	s.mu.Unlock()

	var errs []error
	if srv != nil {
		if err := srv.Shutdown(ctx); err != nil {
			// Deadline passed with requests still running: cancel them
			// (their engine runs return) and drop the connections.
			s.cancelBase()
			if cerr := srv.Close(); cerr != nil {
				errs = append(errs, fmt.Errorf("worker: close http: %w", cerr))
			}
		}
		<-done
	}
	s.cancelBase()
	s.mu.Lock()
	s.drained = true
	s.mu.Unlock()
	s.handlers.Wait()
	if s.pub != nil {
		if err := s.pub.close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.eng.Close(); err != nil {
		errs = append(errs, fmt.Errorf("worker: close engine: %w", err))
	}
	err := errors.Join(errs...)
	s.mu.Lock()
	s.closeErr = err
	s.mu.Unlock()
	s.log.Info("worker stopped")
	return err
}

// enter registers an inference handler; false once Close is draining.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.drained {
		return false
	}
	s.handlers.Add(1)
	return true
}

// verifiesHints reports whether this worker accepts signed sub-agent hints.
func (s *Server) verifiesHints() bool { return !s.cfg.IgnoreSubagentHints && len(s.keys) > 0 }

// blockSize is the KV block size the engine hashes prompts with.
func (s *Server) blockSize() int { return s.cfg.Engine.BlockSize }

// nudgeTelemetry lets the publisher report a burst before the next tick.
func (s *Server) nudgeTelemetry() {
	if s.pub == nil {
		return
	}
	loads := s.sched.Loads()
	counts := make([]int, len(loads))
	for i, l := range loads {
		counts[i] = l.Active + l.Queued
	}
	s.pub.checkJump(counts)
}

// onBindingEvicted is the scheduler's callback for conversation bindings
// dropped beyond max_sessions.
func (s *Server) onBindingEvicted(key string, rank int) {
	if rank >= 0 && rank < s.ranks {
		s.convEvictions[rank].Add(1)
	}
	if s.pub != nil {
		s.pub.addEviction(key, rank)
	}
}
