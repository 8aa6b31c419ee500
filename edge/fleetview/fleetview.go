// Package fleetview is what an edge knows about the workers: their load
// reports (registration and heartbeat), the KV blocks they hold (a
// routing/kvindex.Index fed by their KV events and dumps), the conversations
// their schedulers evicted, and, for statically configured workers without
// telemetry, HTTP readiness probes. It is the I/O side of routing: it turns
// NATS messages and probes into the []routing.InstanceView the router reads.
//
// Malformed messages, and messages whose payload names another instance than
// their subject, are dropped and counted; nothing a worker sends can crash
// the edge. While the edge's own NATS connection is down, telemetry silence
// says nothing about the workers: their last known health is kept and every
// worker is probed over HTTP instead (telemetry outage fallback). See the
// edge's DESIGN.md.
package fleetview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/routing/breaker"
	"github.com/tether-project/tether/routing/kvindex"
)

// Static is a worker configured by URL (context_servers.urls or
// generation_servers.urls).
type Static struct {
	ID    string // the configured name, else the URL
	URL   string
	Fleet fsm.Fleet
	// Metrics is the engine's /metrics format (MetricsVLLM,
	// MetricsSGLang): the edge scrapes it for load. "" for tether workers
	// (NATS telemetry) and engines it does not scrape.
	Metrics string
	// Ranks is the engine's data-parallel size (0: unknown).
	Ranks int
	// HealthPath is the readiness probe's path (default /health: what
	// trtllm-serve, vLLM, SGLang and tether workers all serve; 200 means
	// ready, anything else not, see docs/engines.md).
	HealthPath string
	// Model, when set, is also required in the worker's GET /v1/models
	// list for a probe to succeed (a server that came up with another
	// model is not ready for this edge).
	Model string
	// Served is the model of the edge's catalogue whose fleet lists the
	// instance.
	Served string
	// MaxLoRAs is the instance's LoRA adapter slots when its engine reports
	// none (the model's lora.max_loras; 0: unknown; lora.go).
	MaxLoRAs int
	// ProbeTimeout bounds one probe (the health GET and the /v1/models
	// check together; default Config.ProbeInterval). SGLang's /health
	// generates one token and answers after at least a second.
	ProbeTimeout time.Duration
	// EngineEvents: the KV index learns the engine's cache from its own
	// KV events (ApplyEngineKV, read by this edge from the engine), not
	// from a model of it. SharedEvents: from KV batches another edge
	// publishes over NATS under this instance's id (dumps included).
	EngineEvents bool
	SharedEvents bool
}

// DefaultHealthPath is the probe path of static instances.
const DefaultHealthPath = "/health"

// discoveredProbePath is the probe of telemetry-discovered (tether)
// workers during a telemetry outage: telemetry=optional, because the
// worker's own NATS connection may be down for the same reason as the
// edge's; the question is only whether it can serve.
const discoveredProbePath = "/readyz?telemetry=optional"

// Config configures a View. Zero durations take the defaults noted.
type Config struct {
	Static []Static
	// Conn is the NATS connection telemetry arrives on (nil: static
	// instances only, judged by probes).
	Conn *nats.Conn
	// PredictTTL is the KV index's prediction lifetime (kvindex.Config).
	PredictTTL time.Duration
	Breaker    breaker.Config
	// BlockSize is the KV block size in tokens (placement.block_size): a
	// prompt shorter than one block can never hit a prefix cache, so its
	// usage is no evidence for the circuit breaker (0: every prompt counts).
	BlockSize int
	// StaleIntervals: an instance is unhealthy after this many of its
	// telemetry intervals without a load report (default 5), and at
	// least MinStaleAfter (default 1s).
	StaleIntervals int
	MinStaleAfter  time.Duration
	// ProbeInterval: static instances without fresh telemetry are probed
	// (GET Static.HealthPath; discovered workers during a telemetry
	// outage: GET /readyz?telemetry=optional) this often (default 1s).
	ProbeInterval time.Duration
	// DumpTimeout bounds one KV dump request (default 2s).
	DumpTimeout time.Duration
	// ForgetAfter: a telemetry-discovered instance silent this long is
	// forgotten (default 10m).
	ForgetAfter time.Duration
	// ReconnectGrace: after the NATS connection comes back, an instance
	// that has not reported since is still judged by probes for this long
	// (workers reconnect with their own backoff; default 10s).
	ReconnectGrace time.Duration
	// ReachBackoff, ReachMaxBackoff: an instance a connect failed to is
	// unreachable from this edge for ReachBackoff (default 1s), doubled by
	// each further failed connect up to ReachMaxBackoff (default 30s), and
	// while a probe of it is in flight; a connection made clears it
	// (reach.go).
	ReachBackoff    time.Duration
	ReachMaxBackoff time.Duration
	// ProbeClient sends probes and scrapes (default: a plain client;
	// each request carries its own deadline).
	ProbeClient *http.Client
	// ReachClient sends the probes that test an instance's reachability
	// (marked unreachable, or suspect: reach.go), each on a new
	// connection: across a partition a connection kept alive from before
	// stalls and tells nothing (default ProbeClient).
	ReachClient *http.Client
	// VerifyAddress, when set, is asked before a discovered instance's
	// reports from an address it has not proven are applied: it dials url
	// (ctx carries ExpectWorker(workerID)) and returns nil when the server
	// there proved it is workerID (address.go). Nil: addresses are taken
	// from reports as they come (no transport identity to check).
	VerifyAddress func(ctx context.Context, workerID, url string) error
	// OnEvictions receives conversations a worker's scheduler evicted
	// (called on a NATS goroutine: keep it cheap).
	OnEvictions func(instance string, fleet fsm.Fleet, evictions []telemetry.Eviction)
	Registerer  prometheus.Registerer
	Logger      *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Instance is one worker as the edge sees it.
type Instance struct {
	ID     string
	Fleet  fsm.Fleet
	URL    string
	Static bool
	// Served: the configured model of a static instance ("" otherwise).
	Served string
	// From telemetry (zero without).
	Telemetry     bool
	Role          string // the worker's server_role ("" when omitted)
	Model         string
	Version       string
	FeatureLevel  int
	VerifiesHints bool
	BootID        uint64
	Ranks         int
	BlockSize     int
	Draining      bool
	// KVSource: the report's kv_source ("" the worker's own cache,
	// telemetry.KVSourceEngineEvents, telemetry.KVSourceNone).
	KVSource string
	// EngineEvents: a static engine whose own KV events feed the index
	// (Static.EngineEvents, Static.SharedEvents).
	EngineEvents bool
	// LastSeen is the last load report or successful probe.
	LastSeen time.Time
	// Healthy: a fresh report (or, for a static instance without
	// telemetry, a recent successful probe). During a telemetry outage
	// (the edge's NATS link down): the last probe's result, or before any
	// probe the health the instance had when the link went down. False
	// while the instance is unreachable from this edge (Unreachable).
	Healthy bool
	// TelemetryStale: the edge's NATS link is (or just was) down and this
	// instance's load figures are from before; health comes from probes.
	TelemetryStale bool
	// Unreachable: a connect from this edge to the instance failed and no
	// connection has been made since, within the backoff or while a probe
	// of it is in flight (reach.go); Healthy is false while it holds. UnreachableSince is the first
	// failure of the run (kept after the backoff lapsed, until a
	// connection is made), ConnectFailures the failed connects recorded
	// in it, LastConnectError the last one's error.
	Unreachable      bool
	UnreachableSince time.Time
	UnreachableUntil time.Time
	ConnectFailures  int
	LastConnectError string

	QueuedRequests     int
	ActiveRequests     int
	ActivePromptTokens int64
	// PrefillTokens: the prefill its ranks reported still to compute, when
	// PrefillReported (routing.InstanceView's).
	PrefillTokens   int64
	PrefillReported bool
	KVUsedBlocks    int64
	KVTotalBlocks   int64
	// RankKVTokens: one rank's KV capacity in tokens as the engine's
	// /metrics reports it (static engines; 0: unknown).
	RankKVTokens       int64
	WindowLookupTokens int64
	WindowHitTokens    int64
	// Dispatched since its last report by this edge.
	PendingRequests int64
	PendingTokens   int64
	Breaker         breaker.State
	// BreakerReason is why the breaker is open or half-open (grade.go);
	// Accuracy the instance's graded answers over its window.
	BreakerReason breaker.Reason
	Accuracy      breaker.Accuracy
	// LoRA: its adapters as routing sees them (lora.go; nil: unknown).
	LoRA *routing.LoRAView
}

// HitRate is the worker's rolling-window prefix-cache hit rate.
func (in Instance) HitRate() float64 {
	if in.WindowLookupTokens <= 0 {
		return 0
	}
	return float64(in.WindowHitTokens) / float64(in.WindowLookupTokens)
}

type instance struct {
	id string // the edge's id (a static name or URL, or the worker's id)
	// Probe of a static instance (Static.HealthPath, Static.Model).
	healthPath   string
	probeModel   string
	probeTimeout time.Duration
	probing      bool   // a probe is in flight (under View.mu)
	suspect      bool   // a hop's client gave up on it unanswered: probe it (reach.go; under View.mu)
	served       string // Static.Served
	// Engine KV events read by this edge (ApplyEngineKV): engineMu orders
	// the batches, engineSeq numbers them within the fleet's engineBoot.
	engineEvents bool
	engineMu     sync.Mutex
	engineSeq    uint64
	workerID     string // the id in the worker's subjects ("" until telemetry)
	fleet        fsm.Fleet
	url          string
	static       bool

	hasReport  bool
	report     telemetry.LoadReport // ranks dropped after aggregation
	lastReport time.Time
	interval   time.Duration
	queued     int
	active     int
	activeTok  int64
	// prefill: the prefill its ranks reported still to compute, when
	// hasPrefill (a worker of telemetry feature level 2 whose figures are
	// the ones in use: not replaced by a scrape).
	prefill    int64
	hasPrefill bool
	kvUsed     int64
	kvTotal    int64
	rankKVTok  int64 // scraped: one rank's KV capacity in tokens
	lookup     int64
	hit        int64

	// Dispatched by this edge since the last report and not finished yet
	// (reset by each report, which then counts them itself). reportGen
	// tells a finishing hop whether a report has reset the count since it
	// was dispatched (then there is nothing left to release).
	pendingReq atomic.Int64
	pendingTok atomic.Int64
	reportGen  atomic.Uint64
	// In flight to an instance without telemetry (no report would ever
	// reset a pending count): released when the hop ends.
	inflightReq atomic.Int64
	inflightTok atomic.Int64

	// Engine metrics scraped over HTTP (static engines; engines.go).
	metricsFormat string
	ranks         int
	scraped       bool
	scrapeFailed  bool
	lastScrape    time.Time

	// LoRA adapters (lora.go): the engine's report or scrape, and what
	// this edge sent lately (adapter → time).
	lora     *LoRAState
	loraSent map[string]time.Time
	maxLoRAs int // Static.MaxLoRAs

	lastProbeOK time.Time // last successful probe
	probedAt    time.Time // last completed probe, successful or not
	probeOK     bool      // its result

	// Reachability from this edge (reach.go): reach under View.mu;
	// marked is set while a run of failed connects lasts (reach.since
	// set; read without the lock on every hop's end and dial).
	reach  reachState
	marked atomic.Bool

	// KV sequence tracking (under View.mu).
	kvBoot       uint64
	kvApplied    uint64
	behindSince  time.Time
	dumping      bool
	dumpAgain    bool
	lastDumpFail time.Time
	buffered     []kvindex.Batch
}

// maxBufferedBatches bounds the batches kept while a dump is in flight;
// beyond it the buffer is dropped and another dump follows.
const maxBufferedBatches = 4096

// View tracks the workers of both fleets. Safe for concurrent use.
type View struct {
	cfg      Config
	log      *slog.Logger
	index    *kvindex.Index
	breakers *breaker.Set
	nc       *nats.Conn
	client   *http.Client
	// reachClient sends reachability probes (Config.ReachClient).
	reachClient *http.Client

	mu      sync.RWMutex
	byID    map[string]*instance
	alias   map[string]string // worker id -> edge id, for static instances reporting under another id
	version atomic.Uint64
	// Telemetry outage (under mu): linkDownAt is when the edge's NATS
	// connection went down (zero: no outage), linkBackAt when it came
	// back (zero while down). The outage ends ReconnectGrace after
	// linkBackAt.
	linkDownAt time.Time
	linkBackAt time.Time
	// lastHeard is when this edge last took a load report from any
	// instance (under mu): the reference a silence every instance shares
	// is judged against (sharedSilenceLocked).
	lastHeard time.Time

	subs   []*nats.Subscription
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	addrs   addresses // address verification (address.go)
	metrics *metrics
	// engineBoot is the boot id of the KV batches this edge makes of
	// engines' events (random per fleet view).
	engineBoot uint64
	// probeSlots bounds the probes in flight across rounds.
	probeSlots chan struct{}
	// kick asks the probe loop for a round now (reach.go).
	kick    chan struct{}
	closeMu sync.Mutex
	started bool
	closed  bool
}

// New builds a View; Start subscribes and starts the probes.
func New(cfg Config) (*View, error) {
	cfg.withDefaults()
	breakers, err := breaker.NewSet(cfg.Breaker)
	if err != nil {
		return nil, fmt.Errorf("fleetview: %w", err)
	}
	f := &View{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "fleetview"),
		index:    kvindex.New(kvindex.Config{PredictTTL: cfg.PredictTTL}),
		breakers: breakers,
		nc:       cfg.Conn,
		client:   cfg.ProbeClient,
		byID:     make(map[string]*instance),
		alias:    make(map[string]string),
		addrs:    addresses{byID: make(map[string]*addressState)},
	}
	if f.client == nil {
		f.client = &http.Client{}
	}
	if f.reachClient = cfg.ReachClient; f.reachClient == nil {
		f.reachClient = f.client
	}
	f.probeSlots = make(chan struct{}, maxParallelProbes)
	f.kick = make(chan struct{}, 1)
	f.engineBoot = rand.Uint64() | 1
	for _, s := range cfg.Static {
		if err := f.addStatic(s); err != nil {
			return nil, err
		}
	}
	if f.metrics, err = newMetrics(cfg.Registerer, f); err != nil {
		return nil, err
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f, nil
}

// withDefaults fills the zero settings.
func (cfg *Config) withDefaults() {
	if cfg.StaleIntervals <= 0 {
		cfg.StaleIntervals = 5
	}
	if cfg.MinStaleAfter <= 0 {
		cfg.MinStaleAfter = time.Second
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = time.Second
	}
	if cfg.DumpTimeout <= 0 {
		cfg.DumpTimeout = 2 * time.Second
	}
	if cfg.ForgetAfter <= 0 {
		cfg.ForgetAfter = 10 * time.Minute
	}
	if cfg.ReconnectGrace <= 0 {
		cfg.ReconnectGrace = 10 * time.Second
	}
	if cfg.ReachBackoff <= 0 {
		cfg.ReachBackoff = DefaultReachBackoff
	}
	if cfg.ReachMaxBackoff <= 0 {
		cfg.ReachMaxBackoff = DefaultReachMaxBackoff
	}
	cfg.ReachMaxBackoff = max(cfg.ReachMaxBackoff, cfg.ReachBackoff)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Breaker == (breaker.Config{}) {
		cfg.Breaker = breaker.DefaultConfig()
	}
}

// addStatic adds a configured instance.
func (f *View) addStatic(s Static) error {
	if s.ID == "" || s.URL == "" || !s.Fleet.Valid() {
		return fmt.Errorf("fleetview: static instance %q (%s, %v): id, url and fleet are required", s.ID, s.URL, s.Fleet)
	}
	if _, dup := f.byID[s.ID]; dup {
		return fmt.Errorf("fleetview: static instance %q configured twice", s.ID)
	}
	if s.Metrics != "" && s.Metrics != MetricsVLLM && s.Metrics != MetricsSGLang {
		return fmt.Errorf("fleetview: static instance %q: unknown metrics format %q", s.ID, s.Metrics)
	}
	hp := s.HealthPath
	if hp == "" {
		hp = DefaultHealthPath
	}
	if !strings.HasPrefix(hp, "/") {
		return fmt.Errorf("fleetview: static instance %q: health path %q must start with /", s.ID, hp)
	}
	pt := s.ProbeTimeout
	if pt <= 0 {
		pt = f.cfg.ProbeInterval
	}
	in := &instance{id: s.ID, fleet: s.Fleet, url: s.URL, static: true, healthPath: hp, probeModel: s.Model,
		probeTimeout: pt, served: s.Served, maxLoRAs: s.MaxLoRAs, metricsFormat: s.Metrics, ranks: s.Ranks, engineEvents: s.EngineEvents || s.SharedEvents}
	if s.SharedEvents {
		// Batches and dumps travel under the instance's id.
		in.workerID = s.ID
	}
	f.byID[s.ID] = in
	return nil
}

// Start subscribes to the telemetry subjects (when a connection is
// configured) and starts probing static instances.
func (f *View) Start(ctx context.Context) error {
	f.closeMu.Lock()
	defer f.closeMu.Unlock()
	if f.closed {
		return errors.New("fleetview: closed")
	}
	if f.started {
		return errors.New("fleetview: already started")
	}
	f.started = true
	if f.nc != nil {
		for _, s := range []struct {
			subject string
			h       nats.MsgHandler
		}{
			{telemetry.LoadSubjectAll, f.onLoad},
			{telemetry.KVSubjectAll, f.onKV},
			{telemetry.EvictSubjectAll, f.onEvict},
		} {
			sub, err := f.nc.Subscribe(s.subject, s.h)
			if err != nil {
				f.unsubscribe()
				return fmt.Errorf("fleetview: subscribe %s: %w", s.subject, err)
			}
			f.subs = append(f.subs, sub)
		}
		status := f.nc.StatusChanged(nats.CONNECTED, nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
		f.wg.Add(1)
		go f.watchLink(status)
		f.noteLink(f.nc.IsConnected())
		// Make the subscriptions effective before reporting started (the
		// first reports then are not missed). Not connected yet (NATS
		// down at startup): the client subscribes when it connects.
		if f.nc.IsConnected() {
			fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := f.nc.FlushWithContext(fctx)
			cancel()
			if err != nil {
				f.log.Warn("nats flush after subscribing failed", "err", err)
			}
		}
	}
	f.wg.Add(2)
	go f.probeLoop()
	go f.housekeeping()
	return nil
}

func (f *View) unsubscribe() {
	for _, s := range f.subs {
		_ = s.Unsubscribe()
	}
	f.subs = nil
}

// Close unsubscribes and stops the probes and dumps. It does not close the
// NATS connection (its owner does). Idempotent.
func (f *View) Close() {
	f.closeMu.Lock()
	if f.closed {
		f.closeMu.Unlock()
		return
	}
	f.closed = true
	f.unsubscribe()
	f.closeMu.Unlock()
	f.cancel()
	f.wg.Wait()
}

// Index is the KV block index (read it with Match; the edge adds
// predictions with Predict).
func (f *View) Index() *kvindex.Index { return f.index }

// Breakers are the per-instance cache circuit breakers; the edge records
// response usage into them with RecordUsage.
func (f *View) Breakers() *breaker.Set { return f.breakers }

// Version changes whenever what Views returns may have changed for a
// reason other than time passing.
func (f *View) Version() uint64 { return f.version.Load() }

func (f *View) bump() { f.version.Add(1) }

// staleAfter is how long a report stays fresh for an instance reporting
// every interval.
func (f *View) staleAfter(interval time.Duration) time.Duration {
	return max(time.Duration(f.cfg.StaleIntervals)*interval, f.cfg.MinStaleAfter)
}

// healthy reports whether in is usable at now (under f.mu).
func (f *View) healthyLocked(in *instance, now time.Time) bool {
	if in.hasReport && now.Sub(in.lastReport) <= f.staleAfter(in.interval) {
		return true
	}
	if f.blindLocked(in, now) {
		if in.probedAt.After(f.linkDownAt) {
			// Probed since the link went down: a failed probe is
			// evidence, the instance is unhealthy until one succeeds.
			return in.probeOK && f.probeFreshLocked(in, now)
		}
		// Not probed since the link went down: silence is not evidence,
		// keep the health it had then.
		return in.hasReport && f.linkDownAt.Sub(in.lastReport) <= f.staleAfter(in.interval) ||
			in.static && f.probeFreshLocked(in, f.linkDownAt)
	}
	if f.sharedSilenceLocked(in, now) {
		return true
	}
	return in.static && f.probeFreshLocked(in, now)
}

// sharedSilenceLocked reports whether in is late only because this edge
// has heard no instance at all for longer than in's staleness window: the
// silence is the edge's own (its process was not scheduled, or its
// subscription fell behind), not the instance's. in keeps the health it
// had when the edge last heard anyone: it is healthy if its report was
// current then and no probe failed since. An instance that stops while
// others go on reporting is late by their reports. As the leader's rule
// (edge/leader), the trade is that instances that all stop at once stay
// healthy until a probe, a failed hop or the log's down record says
// otherwise.
func (f *View) sharedSilenceLocked(in *instance, now time.Time) bool {
	window := f.staleAfter(in.interval)
	return in.hasReport && now.Sub(f.lastHeard) > window &&
		f.lastHeard.Sub(in.lastReport) <= window &&
		(!in.probedAt.After(in.lastReport) || in.probeOK)
}

// probeFreshLocked: a probe succeeded recently enough at now. A probe
// that takes its whole timeout (SGLang's /health answers after a second)
// delays the next one by as much, so the timeout extends the window.
func (f *View) probeFreshLocked(in *instance, now time.Time) bool {
	return !in.lastProbeOK.IsZero() && now.Sub(in.lastProbeOK) <= f.staleAfter(f.cfg.ProbeInterval)+f.probeTimeout(in)
}

// probeTimeout bounds one probe of in.
func (f *View) probeTimeout(in *instance) time.Duration {
	if in.probeTimeout > 0 {
		return in.probeTimeout
	}
	return f.cfg.ProbeInterval
}

// blindLocked reports whether the edge cannot hear in's telemetry at now:
// its NATS link is down, or came back less than ReconnectGrace ago and in
// has not reported since (under f.mu).
func (f *View) blindLocked(in *instance, now time.Time) bool {
	if f.linkDownAt.IsZero() {
		return false
	}
	if f.linkBackAt.IsZero() {
		return true
	}
	return now.Sub(f.linkBackAt) < f.cfg.ReconnectGrace && in.lastReport.Before(f.linkBackAt)
}

// watchLink follows the NATS connection's state.
func (f *View) watchLink(status chan nats.Status) {
	defer f.wg.Done()
	defer f.nc.RemoveStatusListener(status)
	for {
		select {
		case <-f.ctx.Done():
			return
		case st, ok := <-status:
			if !ok {
				return
			}
			f.noteLink(st == nats.CONNECTED)
		}
	}
}

// noteLink records the connection going down or coming back.
func (f *View) noteLink(up bool) {
	now := f.cfg.Now()
	f.mu.Lock()
	changed := false
	switch {
	case !up && (f.linkDownAt.IsZero() || !f.linkBackAt.IsZero()):
		f.linkDownAt, f.linkBackAt, changed = now, time.Time{}, true
		f.log.Warn("telemetry link down: keeping the workers' last known health and probing them over HTTP")
	case up && !f.linkDownAt.IsZero() && f.linkBackAt.IsZero():
		f.linkBackAt, changed = now, true
		f.log.Info("telemetry link back: probes decide until each worker reports again", "grace", f.cfg.ReconnectGrace)
	}
	f.mu.Unlock()
	if changed {
		f.bump()
		f.metrics.linkUp.Set(map[bool]float64{true: 1, false: 0}[up])
	}
}

// deafIntervals: an instance not heard for this many of its report
// intervals is one this edge does not hear now (Deaf).
const deafIntervals = 3

// Deaf reports whether this edge hears none of the workers it has heard
// before: no load report from any within deafIntervals of its report
// interval, no probe of any succeeding within the probe window (its last
// one failed or is older), none heard at all since they were forgotten —
// and how long ago it heard the last one. Its NATS link, its network or
// every worker is gone; which of them, the edge cannot tell. An edge that
// never heard a worker is not deaf (it has nothing to compare with).
func (f *View) Deaf(now time.Time) (silence time.Duration, deaf bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	heard := f.lastHeard
	for _, in := range f.byID {
		if in.hasReport {
			if in.interval > 0 && now.Sub(in.lastReport) <= deafIntervals*in.interval ||
				in.interval <= 0 && now.Sub(in.lastReport) <= f.staleAfter(in.interval) {
				return 0, false
			}
		}
		if !in.lastProbeOK.IsZero() {
			if in.probeOK && now.Sub(in.lastProbeOK) <= f.staleAfter(f.cfg.ProbeInterval)+f.probeTimeout(in) {
				return 0, false
			}
			if in.lastProbeOK.After(heard) {
				heard = in.lastProbeOK
			}
		}
	}
	if heard.IsZero() {
		return 0, false
	}
	return now.Sub(heard), true
}

// TelemetryLinkDown reports whether the edge's NATS connection is down now.
func (f *View) TelemetryLinkDown() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return !f.linkDownAt.IsZero() && f.linkBackAt.IsZero()
}

func (f *View) lastSeenLocked(in *instance) time.Time {
	if in.lastProbeOK.After(in.lastReport) {
		return in.lastProbeOK
	}
	return in.lastReport
}

func (f *View) snapshotLocked(in *instance, now time.Time) Instance {
	unreachable := f.unreachableLocked(in, now)
	out := Instance{
		ID: in.id, Fleet: in.fleet, URL: in.url, Static: in.static, Served: in.served,
		Telemetry: in.hasReport, VerifiesHints: true,
		LastSeen: f.lastSeenLocked(in), Healthy: f.healthyLocked(in, now) && !unreachable,
		TelemetryStale:  in.hasReport && f.blindLocked(in, now) && now.Sub(in.lastReport) > f.staleAfter(in.interval),
		PendingRequests: in.pendingReq.Load() + in.inflightReq.Load(), PendingTokens: in.pendingTok.Load() + in.inflightTok.Load(),
		LoRA: f.loraViewLocked(in, now), Accuracy: f.breakers.Accuracy(in.id, now),
		Unreachable: unreachable, UnreachableSince: in.reach.since, UnreachableUntil: in.reach.until,
		ConnectFailures: in.reach.failures, LastConnectError: in.reach.lastErr,
	}
	out.Breaker, out.BreakerReason = f.breakers.Status(in.id, now)
	if in.hasReport {
		r := &in.report
		out.Role, out.Model, out.Version = r.Role, r.Model, r.Version
		out.FeatureLevel, out.VerifiesHints, out.BootID = r.FeatureLevel, r.VerifiesHints, r.BootID
		out.Ranks, out.BlockSize, out.Draining = len(r.Ranks), r.BlockSize, r.Draining
		out.KVSource = r.KVSource
		out.QueuedRequests, out.ActiveRequests, out.ActivePromptTokens = in.queued, in.active, in.activeTok
		out.PrefillTokens, out.PrefillReported = in.reportedPrefill()
		out.KVUsedBlocks, out.KVTotalBlocks = in.kvUsed, in.kvTotal
		out.WindowLookupTokens, out.WindowHitTokens = in.lookup, in.hit
	}
	if in.engineEvents {
		out.EngineEvents, out.KVSource = true, telemetry.KVSourceEngineEvents
	}
	if in.metricsFormat != "" {
		out.Ranks = in.ranks
		if in.scraped {
			out.QueuedRequests, out.ActiveRequests, out.ActivePromptTokens = in.queued, in.active, in.activeTok
			out.KVUsedBlocks, out.KVTotalBlocks = in.kvUsed, in.kvTotal
			out.RankKVTokens = in.rankKVTok
		}
	}
	return out
}

// reportedPrefill is the prefill in's worker reported still to compute,
// and whether it reports one that is in use (a scrape's figures replace the
// report's).
func (in *instance) reportedPrefill() (int64, bool) {
	return in.prefill, in.hasPrefill && !in.scraped
}

// Instances lists every known instance, sorted by id.
func (f *View) Instances(now time.Time) []Instance {
	f.mu.RLock()
	out := make([]Instance, 0, len(f.byID))
	for _, in := range f.byID {
		out = append(out, f.snapshotLocked(in, now))
	}
	f.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Instance returns one instance.
func (f *View) Instance(id string, now time.Time) (Instance, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	in, ok := f.byID[id]
	if !ok {
		return Instance{}, false
	}
	return f.snapshotLocked(in, now), true
}

// Views returns the routing views of every known instance at now: health
// from heartbeat age (or probes) and this edge's connects to it (an
// instance unreachable from this edge is unhealthy, reach.go), draining
// and load from the last report plus what this edge dispatched since, hit
// rate, and CacheDegraded from the instance's circuit breaker. The caller merges the log's instance records
// (routing.NewViews).
func (f *View) Views(now time.Time, dst []routing.InstanceView) []routing.InstanceView {
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, in := range f.byID {
		unreachable := f.unreachableLocked(in, now)
		healthy := f.healthyLocked(in, now) && !unreachable
		v := routing.InstanceView{
			ID: in.id, Fleet: in.fleet, URL: in.url,
			Healthy: healthy, Unreachable: unreachable,
			// Late telemetry, no failed probe since the last report, no
			// failed connect.
			Silent:              !healthy && !unreachable && in.hasReport && (!in.probedAt.After(in.lastReport) || in.probeOK),
			QueuedRequests:      in.queued + int(in.pendingReq.Load()+in.inflightReq.Load()),
			ActiveRequests:      in.active,
			QueuedPrefillTokens: in.pendingTok.Load() + in.inflightTok.Load(),
			ActivePromptTokens:  in.activeTok,
			KVUsedBlocks:        in.kvUsed,
			KVTotalBlocks:       in.kvTotal,
			CacheDegraded:       f.breakers.Open(in.id, now),
			VerifiesHints:       true,
			Model:               in.served,
			LoRA:                f.loraViewLocked(in, now),
		}
		if in.hasReport {
			if v.Model == "" {
				v.Model = in.report.Model
			}
			v.Draining = in.report.Draining
			v.Ranks = len(in.report.Ranks)
			v.VerifiesHints = in.report.VerifiesHints
			v.Version = in.report.Version
			if in.lookup > 0 {
				v.HitRate = float64(in.hit) / float64(in.lookup)
			}
			v.PrefillTokens, v.PrefillReported = in.reportedPrefill()
		}
		if in.metricsFormat != "" {
			v.Ranks = in.ranks
		}
		dst = append(dst, v)
	}
	return dst
}

// NoteDispatch counts a request this edge sends to instance id and returns
// the function to call when the hop ends. For an instance with telemetry
// the request counts as queued until its next load report (which then
// includes it); for one without, until done is called.
func (f *View) NoteDispatch(id string, promptTokens int) (done func()) {
	f.mu.RLock()
	in, ok := f.byID[id]
	// A scraped engine's figures count what it received, as a report does.
	reported := ok && (in.hasReport || in.scraped)
	f.mu.RUnlock()
	switch {
	case !ok:
		return func() {}
	case reported:
		return in.countPending(promptTokens)
	}
	in.inflightReq.Add(1)
	in.inflightTok.Add(int64(promptTokens))
	var once sync.Once
	return func() {
		once.Do(func() {
			in.inflightReq.Add(-1)
			in.inflightTok.Add(-int64(promptTokens))
		})
	}
}

// NoteHeardDispatch counts a request another edge sent to instance id (it
// said so over NATS) as NoteDispatch counts this edge's own: queued on the
// instance until its next load report, which then includes it, or until
// done is called (the other edge said the request ended), whichever comes
// first. Every edge's view then holds what all edges dispatched since the
// last report. An instance without reports or scrapes (whose own
// dispatches count only while in flight, as this edge cannot hear how
// long another's are) is left as it is.
func (f *View) NoteHeardDispatch(id string, promptTokens int) (done func()) {
	f.mu.RLock()
	in, ok := f.byID[id]
	reported := ok && (in.hasReport || in.scraped)
	f.mu.RUnlock()
	if !reported {
		return func() {}
	}
	return in.countPending(promptTokens)
}

// countPending counts a request as queued on the instance until its next
// report includes it, or until the returned done is called, whichever comes
// first: a hop that finished before the next report must not keep its
// instance looking busy (back-to-back turns on a fast engine would
// otherwise overflow bound keys).
func (in *instance) countPending(promptTokens int) (done func()) {
	gen := in.reportGen.Load()
	in.pendingReq.Add(1)
	in.pendingTok.Add(int64(promptTokens))
	var once sync.Once
	return func() {
		once.Do(func() {
			if in.reportGen.Load() != gen {
				return
			}
			if in.pendingReq.Add(-1) < 0 {
				in.pendingReq.Store(0)
			}
			if in.pendingTok.Add(-int64(promptTokens)) < 0 {
				in.pendingTok.Store(0)
			}
		})
	}
}

// ApplyEngineKV applies one change to a static engine's cache, read by this
// edge from the engine itself (internal/enginekv), to the KV index: exact
// batches in this edge's own sequence for the instance. The first is a
// baseline (the engine's replay buffer, from its sequence 0, comes first).
// evs are one change, applied as one batch (a rank's GPU tier and its
// offloaded tier).
func (f *View) ApplyEngineKV(id string, evs ...kvindex.RankEvent) {
	f.mu.RLock()
	in, ok := f.byID[id]
	f.mu.RUnlock()
	if !ok || !in.engineEvents {
		return
	}
	in.engineMu.Lock()
	defer in.engineMu.Unlock()
	in.engineSeq++
	out, err := f.index.Apply(kvindex.Batch{Instance: id, Boot: f.engineBoot, Seq: in.engineSeq, Events: evs})
	if err != nil {
		f.drop("kv", err)
		return
	}
	f.metrics.kvBatches.WithLabelValues(out.String()).Inc()
	f.bump()
}

// RecordUsage feeds instance id's cache circuit breaker with a response's
// prompt and cached tokens. Only a lookup that could have hit counts: a
// prompt of at least one whole block. Shorter ones always miss: counted,
// they would open every instance's breaker.
func (f *View) RecordUsage(id string, promptTokens, cachedTokens int64, now time.Time) {
	if promptTokens <= 0 || promptTokens < int64(f.cfg.BlockSize) {
		return
	}
	before := f.breakers.State(id, now)
	st, err := f.breakers.Record(id, promptTokens, min(cachedTokens, promptTokens), now)
	if err != nil {
		return
	}
	if st != before {
		f.log.Info("cache circuit breaker changed", "instance", id, "from", before, "to", st)
		f.bump()
	}
}

// edgeID resolves a worker id from a subject to the edge's id (under f.mu).
func (f *View) edgeIDLocked(workerID string) string {
	if id, ok := f.alias[workerID]; ok {
		return id
	}
	return workerID
}

func (f *View) drop(kind string, err error) {
	reason := "malformed"
	var de *telemetry.DecodeError
	if errors.As(err, &de) {
		reason = de.Reason()
	}
	f.metrics.dropped.WithLabelValues(kind, reason).Inc()
	f.log.Debug("telemetry message dropped", "kind", kind, "reason", reason, "err", err)
}

// FleetOf is the log's fleet of a telemetry fleet (the one the subjects and
// payloads name).
func FleetOf(tf telemetry.Fleet) fsm.Fleet {
	if tf == telemetry.FleetGeneration {
		return fsm.FleetGeneration
	}
	return fsm.FleetContext
}

// TelemetryFleet is the telemetry fleet of one of the log's.
func TelemetryFleet(f fsm.Fleet) telemetry.Fleet {
	if f == fsm.FleetGeneration {
		return telemetry.FleetGeneration
	}
	return telemetry.FleetContext
}

// onLoad handles a load report: registration, heartbeat and load.
func (f *View) onLoad(m *nats.Msg) {
	r, err := telemetry.DecodeLoad(m.Subject, m.Data)
	if err != nil {
		f.drop("load", err)
		return
	}
	if !f.admitAddress(r) {
		return
	}
	f.metrics.received.WithLabelValues("load").Inc()
	now := f.cfg.Now()
	f.mu.Lock()
	in := f.resolveLocked(r)
	newBoot := in.hasReport && in.report.BootID != r.BootID
	first := !in.hasReport
	in.hasReport = true
	in.lastReport = now
	f.lastHeard = now
	in.interval = time.Duration(r.IntervalMilli) * time.Millisecond
	in.queued, in.active, in.activeTok, in.kvUsed, in.kvTotal, in.lookup, in.hit = 0, 0, 0, 0, 0, 0, 0
	in.prefill, in.hasPrefill = 0, r.FeatureLevel >= telemetry.FeatureLevelPrefill
	for _, rl := range r.Ranks {
		in.queued += int(rl.QueuedRequests)
		in.active += int(rl.ActiveRequests)
		in.activeTok += rl.ActivePromptTokens
		in.prefill += rl.PrefillTokens
		in.kvUsed += rl.KVBlocksUsed
		in.kvTotal += rl.KVBlocksTotal
		in.lookup += rl.WindowLookupTokens
		in.hit += rl.WindowHitTokens
	}
	in.lora = loraFromReport(&r)
	ranks := r.Ranks
	r.Ranks = make([]telemetry.RankLoad, len(ranks)) // keep the count, not the figures
	in.report = r
	if !in.static {
		f.moveLocked(in, r.URL)
		in.fleet = FleetOf(r.Fleet)
	}
	in.reportGen.Add(1)
	in.pendingReq.Store(0)
	in.pendingTok.Store(0)
	// KV sync: a worker we have not synced with (first sight, a restart)
	// or that published batches we have not seen needs a dump. Before its
	// first batch (KVSeq 0) the next batch is a complete baseline.
	needDump := false
	switch {
	case first || newBoot:
		if newBoot {
			f.log.Info("worker restarted", "instance", in.id, "boot_id", r.BootID)
		}
		in.kvBoot, in.kvApplied, in.behindSince = r.BootID, 0, time.Time{}
		needDump = r.KVSeq > 0
	case r.KVSeq > in.kvApplied && in.kvBoot == r.BootID && !in.dumping:
		if in.behindSince.IsZero() {
			in.behindSince = now
		} else if now.Sub(in.behindSince) > max(in.interval, 50*time.Millisecond) {
			needDump = true
		}
	default:
		in.behindSince = time.Time{}
	}
	f.mu.Unlock()
	if newBoot {
		f.breakers.Forget(in.id)
	}
	f.bump()
	if needDump {
		f.requestDump(in.id)
	}
}

// resolveLocked finds or creates the instance a report speaks for: a static
// instance configured under the worker's id or URL, else a discovered one.
func (f *View) resolveLocked(r telemetry.LoadReport) *instance {
	if id, ok := f.alias[r.Instance]; ok {
		if in, ok := f.byID[id]; ok {
			return in
		}
	}
	if in, ok := f.byID[r.Instance]; ok {
		in.workerID = r.Instance
		return in
	}
	for _, in := range f.byID {
		if in.static && in.workerID == "" && sameURL(in.url, r.URL) {
			in.workerID = r.Instance
			f.alias[r.Instance] = in.id
			return in
		}
	}
	in := &instance{id: r.Instance, workerID: r.Instance, fleet: FleetOf(r.Fleet), url: r.URL}
	f.byID[in.id] = in
	f.log.Info("worker registered", "instance", in.id, "fleet", in.fleet, "url", r.URL)
	return in
}

func sameURL(a, b string) bool {
	trim := func(s string) string {
		for len(s) > 0 && s[len(s)-1] == '/' {
			s = s[:len(s)-1]
		}
		return s
	}
	return trim(a) == trim(b)
}

// onKV applies a KV event batch to the index (or buffers it during a dump).
func (f *View) onKV(m *nats.Msg) {
	b, err := telemetry.DecodeKVEvents(m.Subject, m.Data)
	if err != nil {
		f.drop("kv", err)
		return
	}
	f.metrics.received.WithLabelValues("kv").Inc()
	f.mu.Lock()
	id := f.edgeIDLocked(b.Instance)
	in, known := f.byID[id]
	batch := kvindex.Batch{Instance: id, Boot: b.BootID, Seq: b.Seq, Events: make([]kvindex.RankEvent, len(b.Events))}
	for i, ev := range b.Events {
		batch.Events[i] = kvindex.RankEvent{Rank: ev.Rank, Removed: ev.Removed, Stored: ev.Stored}
	}
	if known && in.dumping {
		if len(in.buffered) < maxBufferedBatches {
			in.buffered = append(in.buffered, batch)
		} else {
			in.buffered, in.dumpAgain = nil, true
		}
		f.mu.Unlock()
		return
	}
	f.mu.Unlock()
	out, err := f.index.Apply(batch)
	if err != nil {
		f.drop("kv", err)
		f.requestDump(id)
		return
	}
	f.metrics.kvBatches.WithLabelValues(out.String()).Inc()
	switch out {
	case kvindex.Applied:
		f.mu.Lock()
		if in, ok := f.byID[id]; ok {
			in.kvBoot, in.kvApplied, in.behindSince = b.BootID, b.Seq, time.Time{}
		}
		f.mu.Unlock()
		f.bump()
	case kvindex.Gap, kvindex.NeedsDump:
		if known {
			f.requestDump(id)
		}
	}
}

// onEvict forwards a worker's conversation evictions.
func (f *View) onEvict(m *nats.Msg) {
	e, err := telemetry.DecodeEvictions(m.Subject, m.Data)
	if err != nil {
		f.drop("evict", err)
		return
	}
	f.metrics.received.WithLabelValues("evict").Inc()
	f.mu.RLock()
	id := f.edgeIDLocked(e.Instance)
	in, ok := f.byID[id]
	var fleet fsm.Fleet
	if ok {
		fleet = in.fleet
	}
	f.mu.RUnlock()
	if !ok || f.cfg.OnEvictions == nil {
		return
	}
	f.cfg.OnEvictions(id, fleet, e.Evictions)
}

func (f *View) requestDump(id string) {
	if f.nc == nil {
		return
	}
	f.mu.Lock()
	in, ok := f.byID[id]
	if !ok || in.workerID == "" {
		f.mu.Unlock()
		return
	}
	if in.dumping {
		in.dumpAgain = true
		f.mu.Unlock()
		return
	}
	if !in.lastDumpFail.IsZero() && f.cfg.Now().Sub(in.lastDumpFail) < f.cfg.DumpTimeout {
		f.mu.Unlock()
		return // the housekeeping loop retries (the instance stays stale)
	}
	in.dumping, in.dumpAgain, in.buffered = true, false, nil
	workerID := in.workerID
	f.mu.Unlock()
	if f.ctx.Err() != nil {
		f.finishDump(id, false)
		return
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.runDump(id, workerID)
	}()
}

// runDump requests a dump, collects its parts and installs it, then applies
// the batches that arrived meanwhile.
func (f *View) runDump(id, workerID string) {
	ctx, cancel := context.WithTimeout(f.ctx, f.cfg.DumpTimeout)
	defer cancel()
	subject := telemetry.KVDumpSubject(workerID)
	d, err := f.fetchDump(ctx, subject)
	if err != nil {
		f.metrics.dumps.WithLabelValues("failed").Inc()
		if f.ctx.Err() == nil {
			f.log.Warn("KV dump failed", "instance", id, "err", err)
		}
		f.finishDump(id, false)
		return
	}
	if err := f.index.ReplaceInstance(id, d.boot, d.seq, d.ranks); err != nil {
		f.metrics.dumps.WithLabelValues("invalid").Inc()
		f.log.Warn("KV dump rejected by the index", "instance", id, "err", err)
		f.finishDump(id, false)
		return
	}
	f.metrics.dumps.WithLabelValues("installed").Inc()
	f.mu.Lock()
	in, ok := f.byID[id]
	var buffered []kvindex.Batch
	if ok {
		buffered = in.buffered
		in.buffered = nil
		in.kvBoot, in.kvApplied, in.behindSince = d.boot, d.seq, time.Time{}
	}
	f.mu.Unlock()
	slices.SortStableFunc(buffered, func(a, b kvindex.Batch) int {
		switch {
		case a.Seq < b.Seq:
			return -1
		case a.Seq > b.Seq:
			return 1
		}
		return 0
	})
	gap := false
	last := d.seq
	for _, b := range buffered {
		if b.Boot != d.boot || b.Seq <= d.seq {
			continue
		}
		out, err := f.index.Apply(b)
		if err != nil || out == kvindex.Gap || out == kvindex.NeedsDump {
			gap = true
			break
		}
		if out == kvindex.Applied {
			last = b.Seq
		}
	}
	f.mu.Lock()
	if in, ok := f.byID[id]; ok && in.kvBoot == d.boot {
		in.kvApplied = max(in.kvApplied, last)
	}
	f.mu.Unlock()
	f.bump()
	f.finishDump(id, !gap)
}

func (f *View) finishDump(id string, ok bool) {
	f.mu.Lock()
	in, found := f.byID[id]
	again := false
	if found {
		again = in.dumpAgain && ok
		in.dumping, in.dumpAgain, in.buffered = false, false, nil
		if ok {
			in.lastDumpFail = time.Time{}
		} else {
			in.lastDumpFail = f.cfg.Now()
		}
	}
	f.mu.Unlock()
	if again {
		f.requestDump(id)
	}
}

type dump struct {
	boot, seq uint64
	ranks     [][]uint64
}

// fetchDump publishes a dump request with a fresh reply inbox and collects
// every part of one consistent (boot, seq) reply.
func (f *View) fetchDump(ctx context.Context, subject string) (dump, error) {
	inbox := f.nc.NewRespInbox()
	sub, err := f.nc.SubscribeSync(inbox)
	if err != nil {
		return dump{}, fmt.Errorf("subscribe %s: %w", inbox, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := f.nc.PublishRequest(subject, inbox, nil); err != nil {
		return dump{}, fmt.Errorf("request %s: %w", subject, err)
	}
	var (
		got   = map[int]bool{}
		parts = -1
		d     dump
		ranks = map[int][]uint64{}
	)
	for parts < 0 || len(got) < parts {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return dump{}, fmt.Errorf("%s: %d of %d parts received: %w", subject, len(got), parts, err)
		}
		part, err := telemetry.DecodeKVDump(subject, m.Data)
		if err != nil {
			f.drop("kvdump", err)
			return dump{}, fmt.Errorf("%s: %w", subject, err)
		}
		if parts < 0 {
			parts, d.boot, d.seq = part.Parts, part.BootID, part.Seq
		} else if part.Parts != parts || part.BootID != d.boot || part.Seq != d.seq {
			return dump{}, fmt.Errorf("%s: inconsistent parts (boot %d seq %d of %d parts, then boot %d seq %d of %d)",
				subject, d.boot, d.seq, parts, part.BootID, part.Seq, part.Parts)
		}
		if got[part.Part] {
			continue
		}
		got[part.Part] = true
		for _, rb := range part.Ranks {
			ranks[rb.Rank] = append(ranks[rb.Rank], rb.Blocks...)
		}
	}
	maxRank := -1
	for r := range ranks {
		maxRank = max(maxRank, r)
	}
	d.ranks = make([][]uint64, maxRank+1)
	for r, bs := range ranks {
		d.ranks[r] = bs
	}
	return d, nil
}

// probeLoop probes, every ProbeInterval, the instances telemetry says
// nothing about: static instances without fresh telemetry, and, during a
// telemetry outage, every instance not reporting; and every instance
// marked unreachable from this edge (reach.go), at once when it is
// marked, whatever its telemetry says. Probes run concurrently
// (at most maxParallelProbes in flight) and a round does not wait for the
// previous round's slow ones: an instance with a probe in flight is not
// probed again, so one slow health endpoint delays no other instance.
func (f *View) probeLoop() {
	defer f.wg.Done()
	t := time.NewTicker(f.cfg.ProbeInterval)
	defer t.Stop()
	for {
		if f.nc != nil {
			// Catches a status change whose event was missed.
			f.noteLink(f.nc.IsConnected())
		}
		f.probeRound()
		select {
		case <-f.ctx.Done():
			return
		case <-t.C:
		case <-f.kick:
		}
	}
}

const maxParallelProbes = 16

type probeTarget struct {
	id, worker, url, path, model, metrics string
	timeout                               time.Duration
	// reach: the probe tests the instance's reachability (marked
	// unreachable, or suspect): sent by Config.ReachClient, on a new
	// connection.
	reach bool
}

func (f *View) probeRound() {
	now := f.cfg.Now()
	var targets []probeTarget
	f.mu.Lock()
	for _, in := range f.byID {
		fresh := in.hasReport && now.Sub(in.lastReport) <= f.staleAfter(in.interval)
		reach := in.marked.Load() || in.suspect
		wanted := !fresh && (in.static || f.blindLocked(in, now)) || reach
		if in.url == "" || in.probing || !wanted {
			continue
		}
		in.suspect = false
		tg := probeTarget{id: in.id, worker: in.workerID, url: in.url, path: discoveredProbePath, timeout: f.probeTimeout(in), reach: reach}
		if in.static {
			tg.worker = ""
			tg.path, tg.model, tg.metrics = in.healthPath, in.probeModel, in.metricsFormat
		}
		in.probing = true
		targets = append(targets, tg)
	}
	f.mu.Unlock()
	for _, tg := range targets {
		select {
		case f.probeSlots <- struct{}{}:
		case <-f.ctx.Done():
			f.mu.Lock()
			if in, found := f.byID[tg.id]; found {
				in.probing = false
			}
			f.mu.Unlock()
			continue
		}
		f.wg.Add(1)
		go func() {
			defer func() { <-f.probeSlots; f.wg.Done() }()
			f.probeOne(tg)
		}()
	}
}

// probeOne probes one instance, records the result and, for an engine
// whose /metrics the edge reads, scrapes it after a successful probe.
func (f *View) probeOne(tg probeTarget) {
	f.mu.RLock()
	in, found := f.byID[tg.id]
	f.mu.RUnlock()
	if !found {
		in = &instance{id: tg.id} // forgotten meanwhile: nothing to record
	}
	target := &target{f: f, in: in, url: tg.url, began: f.cfg.Now()}
	ok, reach, err := f.probe(target, tg)
	f.metrics.probes.WithLabelValues(map[bool]string{true: "ok", false: "failed"}[ok]).Inc()
	at := f.cfg.Now()
	f.mu.Lock()
	if found = f.byID[tg.id] == in; found {
		in.probedAt, in.probeOK, in.probing = at, ok, false
		if ok {
			in.lastProbeOK = at
		}
	}
	f.mu.Unlock()
	f.bump()
	switch {
	case !found:
	case reach == reachFailed:
		target.failed(err)
	case reach == reachMade && in.marked.Load():
		target.reached("probe")
	}
	if ok && tg.metrics != "" {
		f.scrape(tg.id, tg.url, tg.metrics)
	}
}

// probe asks a worker whether it can serve within timeout: GET base+path
// answers 200 (the engines' /health answers 503 while starting, draining
// or dead), and, when model is set, GET /v1/models lists it. A discovered
// worker's server must prove its identity (worker: ExpectWorker). reach
// is what the first GET says of the instance's reachability (err: its
// error); a probe the view's own shutdown cut short says nothing.
func (f *View) probe(at *target, tg probeTarget) (ok bool, reach reachOutcome, err error) {
	ctx, cancel := context.WithTimeout(f.ctx, tg.timeout)
	defer cancel()
	if tg.worker != "" {
		ctx = ExpectWorker(ctx, tg.worker)
	}
	tctx, ct := at.watch(ctx)
	base, path, model := tg.url, tg.path, tg.model
	client := f.client
	if tg.reach {
		client = f.reachClient
	}
	ok, err = f.probeGet(tctx, client, base+path, nil)
	if reach = ct.outcome(err); f.ctx.Err() != nil {
		reach = reachUnknown
	}
	if !ok || model == "" {
		return ok, reach, err
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if ok, _ = f.probeGet(ctx, client, base+"/v1/models", &list); !ok {
		return false, reach, nil
	}
	for _, m := range list.Data {
		if m.ID == model {
			return true, reach, nil
		}
	}
	return false, reach, nil
}

// maxModelsBody bounds a /v1/models answer read by a probe.
const maxModelsBody = 1 << 20

// probeGet reports whether GET url answers 200, decoding the body into
// out when out is not nil (a body that does not decode is a failure);
// err is the request's error when no answer came.
func (f *View) probeGet(ctx context.Context, client *http.Client, url string, out any) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err // sent nowhere: no connection sought
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, nil
	}
	if out == nil {
		return true, nil
	}
	return json.NewDecoder(io.LimitReader(resp.Body, maxModelsBody)).Decode(out) == nil, nil
}

// housekeeping expires predictions, retries failed dumps and forgets
// instances silent for ForgetAfter.
func (f *View) housekeeping() {
	defer f.wg.Done()
	t := time.NewTicker(f.cfg.DumpTimeout / 2)
	defer t.Stop()
	for {
		select {
		case <-f.ctx.Done():
			return
		case <-t.C:
		}
		now := f.cfg.Now()
		f.index.Expire(now)
		f.expireAddresses(now)
		var retry, forget []string
		f.mu.Lock()
		for id, in := range f.byID {
			switch {
			case !in.static && in.hasReport && now.Sub(in.lastReport) > f.cfg.ForgetAfter && !in.dumping:
				forget = append(forget, id)
				delete(f.byID, id)
				if in.workerID != "" {
					delete(f.alias, in.workerID)
				}
			case !in.lastDumpFail.IsZero() && !in.dumping && now.Sub(in.lastDumpFail) >= f.cfg.DumpTimeout:
				in.lastDumpFail = time.Time{}
				retry = append(retry, id)
			}
		}
		f.mu.Unlock()
		for _, id := range forget {
			f.log.Info("worker forgotten after silence", "instance", id)
			f.index.RemoveInstance(id)
			f.breakers.Forget(id)
			f.bump()
		}
		for _, id := range retry {
			if f.index.Stale(id) {
				f.requestDump(id)
			}
		}
	}
}
