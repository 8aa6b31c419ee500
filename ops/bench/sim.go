package bench

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/tether-project/tether/edge/kvshadow"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/routing/breaker"
	"github.com/tether-project/tether/routing/kvindex"
	"github.com/tether-project/tether/routing/overload"
	"github.com/tether-project/tether/worker/adp"
	"github.com/tether-project/tether/worker/engine"
	"github.com/tether-project/tether/worker/engine/sim"
)

// ParentHeader is the sub-agent parent-session header the tether policy
// configures (conversation_affinity_header_for_subagents), the local
// deployment's.
const ParentHeader = devstack.ParentHeader

// epoch is virtual time zero as a wall time (routing and the log take
// time.Time; nothing reads a clock).
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// SimConfig configures one simulated run: one policy, one edge count.
type SimConfig struct {
	Policy    Policy
	Edges     int
	Instances int
	Ranks     int // ADP ranks per instance
	// CapacityBlocks is each instance's KV capacity, split evenly over
	// its ranks.
	CapacityBlocks int
	// TimeScale multiplies the workload's offsets (0.5 replays twice as
	// fast). Must be > 0.
	TimeScale float64
	// Seed drives the load balancer's choice of edge per request and the
	// random policy.
	Seed uint64
	Log  LogKind
	// TouchInterval is how long an edge batches Touch events (the edge's
	// touch_interval; default 1s).
	TouchInterval time.Duration
	// Engine is the simulated workers' timing model; Ranks, CapacityBlocks
	// and BlockSize are set from the fields above and the workload.
	Engine sim.Config
	// Routing is the base router configuration; the policy sets Type,
	// and session policies disable overflow.
	Routing routing.Config
	// ADPPlacement is the workers' kv_cache_routing_new_conv_placement
	// (default round_robin, the contract's default: docs/subagent-routing.md).
	ADPPlacement adp.Placement
	// NoBreaker disables the tether policy's cache circuit breaker.
	NoBreaker bool
	// EdgeRoundRobin spreads requests over the edges in turn (one global
	// counter) instead of at random.
	EdgeRoundRobin bool
	// EdgeFor, when set, picks the edge of each request (agent id, call
	// number): tests script which edge sees what.
	EdgeFor func(agent string, call int) int
	// Aggregated runs prefill and decode on the same simulated worker
	// (its blocks stay referenced while it decodes). The default is
	// tether's disaggregated flow: the simulated instances are the context
	// fleet (context-only runs: blocks released after prefill) and the
	// generation hop adds its decode time to the response, not to the
	// context workers' caches.
	Aggregated bool
	// SessionTTL evicts a binding idle this long (the edge's session_ttl,
	// default 10m; 0 disables). The edge's sweeper proposes the Evict; the
	// harness proposes it when the idle key comes back, which routes the
	// same (keys that never return are not evicted: fewer commits).
	SessionTTL time.Duration
	// TelemetryInterval is the workers' load report interval (default
	// 100ms, the worker's). Edges see each instance as its last report
	// says plus the requests they dispatched to it since, as the edge's
	// fleet view does.
	TelemetryInterval time.Duration
	// KVFlushInterval is how often a worker publishes its KV events (the
	// worker's default, 100ms): a request's stored and evicted blocks reach
	// the edges' indexes at the first flush after its prefill ends.
	KVFlushInterval time.Duration
	// CommitLatency is the affinity log's commit latency with --log
	// virtual (default MeasuredCommitLatency).
	CommitLatency CommitLatency
	// CommitFirst makes a new key's first request wait for its Bind to
	// commit (the edge's placement.commit_first); the default dispatches
	// it at once beside the proposal, as the edge does.
	CommitFirst bool
	// Share makes the edges see what the others learned, ShareLatency
	// after they learned it (the ablation of edge-local state).
	Share        Share
	ShareLatency time.Duration
	// InstanceIDs names the simulated instances (default worker-00, …);
	// a deployment's names make rendezvous tie-breaks the same as its.
	InstanceIDs []string
	// KVEvents is what the edges hear of the workers' caches: every
	// batch at the worker's flush (exact), each a fixed delay later
	// (lag), or nothing (none: each edge knows only its own predictions).
	KVEvents KVEvents
	// EdgeRestarts restarts edges this many times, spread evenly over the
	// workload's span (edge k mod Edges at the k-th): the restarted edge
	// keeps only what its policy persists (restart.go).
	EdgeRestarts int
	// RefuseOversized makes the engines refuse a prompt needing more KV
	// blocks than a rank holds, as the engines do: vLLM will not start
	// unless one request of max_model_len fits its KV cache and refuses a
	// longer prompt (400, context_length_exceeded), and so does the
	// worker's simulated engine in e2e mode (sim.ErrPromptTooLarge). The
	// refusal is at once; the rank computes nothing. It is recorded as e2e
	// mode records it: a full miss whose time to first token is its
	// prefill modelled alone. The default (false) computes such a prompt
	// in full without the cache, holding the rank's prefill meanwhile.
	RefuseOversized bool
	// Progress, when set, is called as requests complete.
	Progress func(done, total int)
}

// Share names the pieces of edge-local state the edges share: the new
// placements an edge dispatches beside their Binds, the requests
// dispatched since each instance's last load report (its queued requests
// and prefill tokens) and the transitions of each edge's overload history
// (strain.go), all told over NATS as shipped (edge/proposals/placements.go,
// edge/dispatch/dispatches.go, edge/route/strain.go) and so only among the
// edges of one affinity log (Policy.usesSharedLog; independent routers do
// not share them); and, as ablations, the KV predictions made after
// placing, the cache circuit breakers and, without KV events, the routes
// that feed each edge's shadow caches (shadow.go).
type Share struct {
	Placements, Dispatches, Predictions, Overload, Breakers, Shadows bool
	// WorkingSets: each route's entry in the deciding edge's working sets,
	// told with its dispatch as shipped (worksets.go).
	WorkingSets bool
}

// ShippedShare is what edges share as shipped: their new placements, their
// dispatches with each route's working-set entry, and their overload
// histories' transitions.
var ShippedShare = Share{Placements: true, Dispatches: true, WorkingSets: true, Overload: true}

// ParseShare parses --share: a comma-separated subset of placements,
// dispatches, worksets, predictions, overload, breakers, shadows, or all /
// none.
func ParseShare(s string) (Share, error) {
	var sh Share
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(f) {
		case "", "none":
		case "all":
			sh = Share{true, true, true, true, true, true, true}
		case "placements":
			sh.Placements = true
		case "dispatches":
			sh.Dispatches = true
		case "worksets":
			sh.WorkingSets = true
		case "predictions":
			sh.Predictions = true
		case "overload":
			sh.Overload = true
		case "breakers":
			sh.Breakers = true
		case "shadows":
			sh.Shadows = true
		default:
			return Share{}, fmt.Errorf("bench: --share: unknown piece %q (allowed: placements, dispatches, worksets, predictions, overload, breakers, shadows, all, none)", f)
		}
	}
	return sh, nil
}

func (sh Share) String() string {
	var out []string
	for _, x := range []struct {
		on   bool
		name string
	}{{sh.Placements, "placements"}, {sh.Dispatches, "dispatches"}, {sh.WorkingSets, "worksets"}, {sh.Predictions, "predictions"}, {sh.Overload, "overload"}, {sh.Breakers, "breakers"}, {sh.Shadows, "shadows"}} {
		if x.on {
			out = append(out, x.name)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ",")
}

// DefaultSimConfig is the reference setup: 8 instances, 1 rank, 6,000 KV
// blocks per instance, 3 edges, the virtual-time log with measured commit
// latency.
func DefaultSimConfig() SimConfig {
	return SimConfig{
		Policy:            PolicyTether,
		Edges:             3,
		Instances:         8,
		Ranks:             1,
		CapacityBlocks:    6000,
		TimeScale:         1,
		Seed:              1,
		Log:               LogVirtual,
		CommitLatency:     MeasuredCommitLatency,
		KVFlushInterval:   100 * time.Millisecond,
		TouchInterval:     time.Second,
		TelemetryInterval: 100 * time.Millisecond,
		Share:             ShippedShare,
		ShareLatency:      time.Millisecond,
		SessionTTL:        10 * time.Minute,
		Engine:            sim.DefaultConfig(),
		Routing:           routing.DefaultConfig(),
		ADPPlacement:      adp.RoundRobin,
	}
}

func (c *SimConfig) validate() error {
	var errs []error
	if c.Edges < 1 || c.Edges > 64 {
		errs = append(errs, fmt.Errorf("edges must be 1..64, got %d", c.Edges))
	}
	if c.Instances < 1 || c.Instances > 4096 {
		errs = append(errs, fmt.Errorf("instances must be 1..4096, got %d", c.Instances))
	}
	if c.Ranks < 1 || c.Ranks > kvindex.MaxRanks {
		errs = append(errs, fmt.Errorf("ranks must be 1..%d, got %d", kvindex.MaxRanks, c.Ranks))
	}
	if c.CapacityBlocks < c.Ranks {
		errs = append(errs, fmt.Errorf("capacity blocks must be at least one per rank (%d), got %d", c.Ranks, c.CapacityBlocks))
	}
	if !(c.TimeScale > 0) || c.TimeScale > 1e6 {
		errs = append(errs, fmt.Errorf("time scale must be > 0, got %v", c.TimeScale))
	}
	if c.TouchInterval <= 0 {
		errs = append(errs, fmt.Errorf("touch interval must be > 0, got %v", c.TouchInterval))
	}
	if c.SessionTTL < 0 {
		errs = append(errs, fmt.Errorf("session TTL must be >= 0, got %v", c.SessionTTL))
	}
	if c.KVFlushInterval <= 0 {
		errs = append(errs, fmt.Errorf("kv flush interval must be > 0, got %v", c.KVFlushInterval))
	}
	if err := c.CommitLatency.validate(); err != nil {
		errs = append(errs, err)
	}
	if n := len(c.InstanceIDs); n > 0 && n != c.Instances {
		errs = append(errs, fmt.Errorf("instance ids: %d names for %d instances", n, c.Instances))
	}
	if c.ShareLatency < 0 {
		errs = append(errs, fmt.Errorf("share latency must be >= 0, got %v", c.ShareLatency))
	}
	if c.TelemetryInterval <= 0 {
		errs = append(errs, fmt.Errorf("telemetry interval must be > 0, got %v", c.TelemetryInterval))
	}
	if err := c.KVEvents.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.EdgeRestarts < 0 || c.EdgeRestarts > 1000 {
		errs = append(errs, fmt.Errorf("edge restarts must be 0..1000, got %d", c.EdgeRestarts))
	}
	known := false
	for _, p := range slices.Concat(AllPolicies, TetherVariants, PeerPolicies) {
		known = known || p == c.Policy
	}
	if !known {
		errs = append(errs, fmt.Errorf("unknown policy %q", c.Policy))
	}
	if c.Policy.usesSharedLog() {
		if _, err := ParseLogKind(string(c.Log)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: sim config: %w", err)
	}
	return nil
}

// RequestRecord is one replayed request's outcome.
type RequestRecord struct {
	Agent    string
	Root     string // the root conversation's id
	SubAgent bool
	Call     int // index of the request within its agent's requests
	Edge     int
	Instance int
	// InstanceID names the instance (sim: SimConfig.InstanceIDs or
	// worker-NN; e2e: the deployment's id).
	InstanceID string
	Rank       int
	Arrival    time.Duration // first arrival at an edge (before any shed retry)
	Admitted   time.Duration // when the worker received it
	TTFT       time.Duration // first arrival to first token
	Prefill    time.Duration // prefill compute time
	Prompt     int
	Cached     int
	// Oversized: the prompt needs more blocks than a rank holds; it was
	// computed without the cache.
	Oversized bool
	// Adapter is the request's LoRA adapter; AdapterLoaded says the rank
	// had to load it first (lora.go).
	Adapter       string
	AdapterLoaded bool
}

// RunResult is one run's outcome.
type RunResult struct {
	Policy  Policy
	Edges   int
	Records []RequestRecord
	// InstancePrefillTokens are the prompt tokens each instance computed.
	InstancePrefillTokens []int64
	Overflows             int // edge overflows (a bound key served elsewhere)
	Rebinds               int
	RankOverflows         int // worker ADP overflows (a bound rank saturated)
	Shed                  int // 429s (the client retried after Retry-After)
	// Refused counts prompts the engines refused as larger than a rank's
	// KV cache (SimConfig.RefuseOversized).
	Refused int
	// LostBinds counts Bind proposals that lost to another edge's Bind
	// naming another instance (the race a speculative placement can lose).
	LostBinds    int
	Restarts     int // edge restarts (EdgeRestarts)
	Commits      int // affinity-log events committed during the replay
	LocalWrites  int // session_local: events applied to the edges' own tables
	TTLEvictions int // bindings evicted as idle for session_ttl
	VirtualEnd   time.Duration
	Makespan     time.Duration // the last response's end
	Wall         time.Duration
	// RankCapacityTokens is one rank's KV cache in tokens (sim; 0:
	// unknown), the capacity Reuse judges working sets by.
	RankCapacityTokens int
}

// Simulate replays w under cfg in virtual time.
func Simulate(ctx context.Context, w *Workload, cfg SimConfig) (_ *RunResult, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	started := time.Now()
	s, err := newSimulator(ctx, w, cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = errors.Join(err, s.close(cctx))
	}()
	if err := s.run(ctx); err != nil {
		return nil, err
	}
	s.res.Wall = time.Since(started)
	return s.res, nil
}

type simInstance struct {
	id       string
	sched    *adp.Scheduler
	ranks    []*sim.VirtualRank
	rankCap  int
	inflight []*inflight
	recent   []*inflight // finished within the last telemetry interval
	kvSeq    uint64
	// KV batches not yet published: each is ready once its request's
	// prefill ended, and goes out at the worker's next flush (in order).
	kvPending []pendingBatch
	kvArmed   bool

	// The last load report (taken at reportAt).
	reportAt             time.Duration
	reported             bool
	repQueued, repActive int
	repPrefill           int64
	repActiveTok         int64
	repLoRA              *routing.LoRAView // its adapters (lora.go)
	maxLoRAs             int               // adapter slots per rank (Engine.MaxLoRAs)
	// lookups are the prompt and cached tokens of the requests admitted
	// within the engine's stats window (oldest first); repLookup and
	// repHit their sums as of the last report (the window hit rate a
	// worker reports).
	lookups           []lookupRec
	repLookup, repHit int64
}

// lookupRec is one admission's prompt and cached tokens.
type lookupRec struct {
	at             time.Duration
	prompt, cached int64
}

type pendingBatch struct {
	ready time.Duration
	batch kvindex.Batch
}

// dispatch is a request an edge sent to an instance: it counts in the
// edge's view from visible (its own: at once; another edge's, shared:
// ShareLatency later) until the instance's next report includes it.
type dispatch struct {
	at      time.Duration
	visible time.Duration
	tokens  int
}

type inflight struct {
	agent         *agentRun
	arrival       time.Duration
	record        int // index into RunResult.Records
	instance      int
	edge          int
	ticket        adp.Ticket
	start         time.Duration
	firstToken    time.Duration
	done          time.Duration
	uncached      int
	prompt        int
	cached        int
	prefill       time.Duration
	breakerLookup bool
	// shadow is where the deciding edge's shadow (shadowOf) modelled the
	// prompt's blocks, for the response's correction (shadow.go).
	shadow   *kvshadow.Placement
	shadowOf *kvshadow.Shadows
	blocks   []uint64
}

type simEdge struct {
	num        int
	id         string
	pending    [][]dispatch // per instance, since its last report
	index      *kvindex.Index
	shadow     *kvshadow.Shadows // without KV events (shadow.go)
	predictTTL time.Duration
	heard      map[string]uint64 // the last KV batch heard per instance
	local      *virtualLog       // session_local: this edge's own binding table
	rr         uint64
	breakers   *breaker.Set
	overload   *overload.Tracker // the edge's own (edge/route/route.go views)
	dec        *routing.Decider
	// proposals are the edge's own Bind proposals until they commit.
	proposals map[fsm.FleetKey]*simProposal
	// waitUntil: the virtual time the current decision's synchronous
	// proposals committed (the request waits for them).
	waitUntil time.Duration

	touchKeys    []fsm.FleetKey
	touchLinks   []string
	touchPending map[string]bool
	touchArmed   bool

	// loraSent: per instance, the adapters this edge sent there lately
	// and when (lora.go).
	loraSent []map[string]time.Duration
}

type agentRun struct {
	agent       *Agent
	parent      *agentRun
	start       time.Duration
	next        int // next step to launch
	outstanding int // steps of the current group not finished
	calls       int // requests launched
	chainDone   bool
}

type eventKind uint8

const (
	evLaunch eventKind = iota + 1
	evRetry
	evDone     // the worker's part ends: ticket, load, blocks, usage
	evComplete // the response's last token: the agent moves on
	evTouchFlush
	evAdmit      // a request whose placement waited for a commit reaches its worker
	evKVFlush    // a worker publishes its ready KV batches
	evKVHear     // lagged KV batches reach the edges (KVEvents lag)
	evRestart    // an edge restarts
	evShadowHear // another edge's route reaches an edge's shadow
	evStrainHear // another edge's overload transition reaches an edge
	evWorkHear   // another edge's route reaches an edge's working sets
)

type event struct {
	at    time.Duration
	seq   uint64
	kind  eventKind
	agent *agentRun
	step  int
	// evRetry: the request's first arrival and call number.
	firstArrival time.Duration
	call         int
	fl           *inflight
	edge         int
	// evAdmit: the placement; evKVFlush: the instance.
	inst     int
	affinity string
	// evKVHear: the batches heard.
	batches []kvindex.Batch
	// evShadowHear: the route's rank and blocks (inst: its instance).
	rank   int
	blocks []uint64
	// evStrainHear: the transition (inst: its instance).
	overloaded bool
	// evWorkHear: the route's working-set entry (inst: its instance).
	work routing.Work
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return x
}

type simulator struct {
	cfg       SimConfig
	w         *Workload
	now       time.Duration
	queue     eventQueue
	seq       uint64
	instances []*simInstance
	byID      map[string]int
	edges     []*simEdge
	log       *virtualLog
	router    *routing.Router
	ident     routing.IdentityConfig
	lbRand    *rand.Rand
	edgeTurn  uint64
	pickRand  *rand.Rand
	res       *RunResult
	total     int
	completed int
	ctx       context.Context
	setupLogs int
	emptyLog  *fsm.Machine // the state policies without a log read
	err       error        // the first error a decision adapter met
	// kvLog: every batch the workers published, in order, for a restarted
	// edge's resync (with EdgeRestarts and KV events on).
	kvLog []kvindex.Batch
	peer  *peerState // the peers' policies (peers.go)
}

func newSimulator(ctx context.Context, w *Workload, cfg SimConfig) (_ *simulator, err error) {
	s := &simulator{
		cfg:      cfg,
		w:        w,
		byID:     map[string]int{},
		emptyLog: fsm.NewMachine(),
		lbRand:   rand.New(rand.NewPCG(cfg.Seed, 0x6c62)),
		pickRand: rand.New(rand.NewPCG(cfg.Seed, 0x7069)),
		res: &RunResult{Policy: cfg.Policy, Edges: cfg.Edges, InstancePrefillTokens: make([]int64, cfg.Instances),
			RankCapacityTokens: cfg.CapacityBlocks / cfg.Ranks * w.BlockSize},
		ctx: ctx,
	}
	w.WalkRequests(func(*Agent, *Request) { s.total++ })
	s.res.Records = make([]RequestRecord, 0, s.total)
	rc := routerConfig(cfg, w.BlockSize)
	if s.router, err = routing.NewRouter(rc); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if cfg.Policy.isTether() && cfg.Policy != PolicyTetherNoParent {
		s.ident = routing.IdentityConfig{ParentHeader: ParentHeader}
	}
	if err := s.newInstances(); err != nil {
		return nil, err
	}
	if err := s.newEdges(rc); err != nil {
		return nil, err
	}
	if cfg.Policy.isPeer() {
		s.peer = newPeerState(s)
	}
	if cfg.Policy.usesSharedLog() {
		if err := s.registerWorkers(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// routerConfig is the routing configuration of cfg's policy.
func routerConfig(cfg SimConfig, blockSize int) routing.Config {
	rc := cfg.Routing
	rc.BlockSize = blockSize
	if !cfg.Policy.isTether() {
		// The baselines place by cache and load only: no working sets,
		// no live-binding spread.
		rc.Weights.Evict, rc.Weights.LiveBinding = 0, 0
	}
	switch cfg.Policy {
	case PolicyRoundRobin:
		rc.Type = routing.RouterRoundRobin
	case PolicyLeastLoaded:
		rc.Type = routing.RouterLoadBalancing
	case PolicyPrefix:
		rc.Type = routing.RouterKVCacheAware
	case PolicySession, PolicySessionLocal:
		// Plain sticky sessions: no overflow away from a bound instance.
		rc.Type = routing.RouterConversation
		rc.Overflow = routing.OverflowConfig{}
	default:
		rc.Type = routing.RouterConversation
		tetherVariant(cfg.Policy, &rc)
	}
	return rc
}

// tetherVariant sets what an ablation of tether turns off.
func tetherVariant(p Policy, rc *routing.Config) {
	switch p {
	case PolicyTetherNoOverflow:
		rc.Overflow = routing.OverflowConfig{}
	case PolicyTetherNoCacheRebind:
		rc.Overflow.CacheLostBelow = 0
	case PolicyTetherWeigh:
		rc.Overflow.Weigh = true
	case PolicyTetherNoRelief:
		rc.Overflow.ReliefFactor = 0
	case PolicyTetherNoTreeBudget:
		rc.Overflow.SubAgentTreeBudget = false
	case PolicyTetherNoWorkingSet:
		rc.Weights.Evict = 0
	case PolicyTetherNoSpread:
		rc.Weights.LiveBinding = 0
	case PolicyTetherFirstWithParent:
		rc.Overflow.SubAgentFirstWithParent = true
	case PolicyTetherQueuedLimit:
		rc.Shed.MaxQueuedRequests, rc.Shed.MaxBacklogSeconds = 64, 0
	case PolicyTetherReportedPrefill:
		rc.ReportedPrefill = true
	}
}

// newInstances builds the simulated workers: each a rank scheduler over
// virtual ranks.
func (s *simulator) newInstances() (err error) {
	cfg := s.cfg
	ec := cfg.Engine
	ec.Ranks = cfg.Ranks
	ec.BlockSize = s.w.BlockSize
	ec.CapacityBlocks = cfg.CapacityBlocks / cfg.Ranks
	for i := 0; i < cfg.Instances; i++ {
		in := &simInstance{id: fmt.Sprintf("worker-%02d", i), rankCap: ec.CapacityBlocks, maxLoRAs: ec.MaxLoRAs}
		if i < len(cfg.InstanceIDs) {
			in.id = cfg.InstanceIDs[i]
		}
		if in.sched, err = adp.New(adp.Options{Ranks: cfg.Ranks, ConversationAffinity: true, Placement: cfg.ADPPlacement}); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		for r := 0; r < cfg.Ranks; r++ {
			vr, err := sim.NewVirtualRank(r, ec)
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			in.ranks = append(in.ranks, vr)
		}
		s.byID[in.id] = i
		s.instances = append(s.instances, in)
	}
	return nil
}

// newEdges builds the simulated edges, each with what a real edge has.
func (s *simulator) newEdges(rc routing.Config) (err error) {
	cfg := s.cfg
	var sharedBreakers *breaker.Set
	for e := 0; e < cfg.Edges; e++ {
		// Edges have been running: their round-robin counters stand at
		// arbitrary positions (all at 0 would send every edge's first
		// request to the same instance).
		ed := &simEdge{num: e, id: fmt.Sprintf("edge-%d", e), touchPending: map[string]bool{}, rr: s.lbRand.Uint64() % uint64(cfg.Instances),
			pending: make([][]dispatch, cfg.Instances), overload: overload.NewTracker(),
			proposals: map[fsm.FleetKey]*simProposal{}}
		if cfg.Policy.usesKVIndex() {
			ed.predictTTL = rc.PredictTTL
			if cfg.Policy.isPeer() && cfg.KVEvents.Mode == KVEventsNone {
				ed.predictTTL = dynamoApproxTTL
			}
			ed.index = kvindex.New(kvindex.Config{PredictTTL: ed.predictTTL})
			if s.usesShadow() {
				ed.shadow = newShadow(ed.index)
			}
		}
		if cfg.Policy.local() {
			ed.local = newVirtualLog(1, CommitLatency{}, 0) // the edge's own table: no commit wait
		}
		if cfg.Policy.isTether() && !cfg.NoBreaker {
			if ed.breakers, err = breaker.NewSet(rc.Breaker); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			if cfg.Share.Breakers {
				if sharedBreakers == nil {
					sharedBreakers = ed.breakers
				}
				ed.breakers = sharedBreakers
			}
		}
		ed.dec = s.decider(ed)
		s.edges = append(s.edges, ed)
	}
	return nil
}

// registerWorkers starts the shared log and registers the workers in it
// the way the deployment does.
func (s *simulator) registerWorkers() error {
	cfg := s.cfg
	lat := cfg.CommitLatency
	if cfg.Log == LogSequencer {
		lat = CommitLatency{}
	}
	s.log = newVirtualLog(cfg.Edges, lat, cfg.Seed)
	// Register the workers the way the deployment does.
	var evs []fsm.Event
	for _, in := range s.instances {
		evs = append(evs, fsm.InstanceState{Instance: in.id, Fleet: fsm.FleetContext, URL: "sim://" + in.id,
			Status: fsm.InstanceUp, Version: "sim", FeatureLevel: fsm.FeatureLevelMax, Ranks: uint32(cfg.Ranks)})
	}
	// Registered before the replay: committed at virtual time 0.
	saved := s.log.latency
	s.log.latency = CommitLatency{}
	_, _, err := s.log.Propose(0, evs)
	s.log.latency = saved
	if err != nil {
		return err
	}
	s.setupLogs = s.log.Commits()
	return nil
}

func (s *simulator) close(context.Context) error { return nil }

func (s *simulator) push(ev *event) {
	s.seq++
	ev.seq = s.seq
	heap.Push(&s.queue, ev)
}

func (s *simulator) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * s.cfg.TimeScale)
}

func (s *simulator) run(ctx context.Context) error {
	for _, a := range s.w.Agents {
		if !a.Chained {
			s.advance(&agentRun{agent: a, start: a.Start}, a.Start)
		}
	}
	s.scheduleRestarts()
	n := 0
	for s.queue.Len() > 0 {
		if n++; n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("bench: replay interrupted at virtual %v: %w", s.now, err)
			}
		}
		ev := heap.Pop(&s.queue).(*event)
		s.now = ev.at
		var err error
		switch ev.kind {
		case evLaunch:
			err = s.launch(ev.agent, ev.step)
		case evRetry:
			err = s.dispatch(ev.agent, ev.step, ev.call, ev.firstArrival)
		case evDone:
			s.finish(ev.fl)
		case evComplete:
			s.complete(ev.fl)
		case evTouchFlush:
			err = s.flushTouches(ev.edge)
		case evAdmit:
			req := ev.agent.agent.Steps[ev.step].Request
			err = s.admit(ev.agent, req, ev.call, ev.edge, ev.inst, ev.affinity, ev.firstArrival)
		case evKVFlush:
			err = s.flushKV(ev.inst)
		case evKVHear:
			err = s.hearKV(ev.batches)
		case evRestart:
			err = s.restartEdge(ev.edge)
		case evShadowHear:
			s.hearShadow(ev.edge, ev.inst, ev.rank, ev.blocks)
		case evStrainHear:
			s.hearStrain(ev.edge, ev.inst, ev.overloaded)
		case evWorkHear:
			s.hearWork(ev.edge, ev.inst, ev.work)
		}
		if err != nil {
			return err
		}
	}
	if s.completed != s.total {
		return fmt.Errorf("bench: replay ended with %d of %d requests completed", s.completed, s.total)
	}
	s.res.VirtualEnd = s.now
	if s.log != nil {
		s.res.Commits = s.log.Commits() - s.setupLogs
	}
	for _, e := range s.edges {
		if e.local != nil {
			s.res.LocalWrites += e.local.Commits()
		}
	}
	return nil
}

// advance launches the agent's next group of steps once the current one
// finished; an agent with no steps left reports to its parent.
func (s *simulator) advance(ar *agentRun, now time.Duration) {
	if ar.outstanding > 0 {
		return
	}
	steps := ar.agent.Steps
	if ar.next >= len(steps) {
		if p := ar.parent; p != nil {
			p.outstanding--
			s.advance(p, now)
		} else if n := ar.agent.Next; n != nil && !ar.chainDone {
			// A closed loop: the next conversation of this client starts
			// when this one ended.
			ar.chainDone = true
			s.advance(&agentRun{agent: n, start: now}, now)
		}
		return
	}
	end := ar.next + 1
	for end < len(steps) && steps[end].WithPrevious {
		end++
	}
	for k := ar.next; k < end; k++ {
		at := max(now, ar.start+s.scaled(steps[k].At))
		s.push(&event{at: at, kind: evLaunch, agent: ar, step: k})
	}
	ar.outstanding = end - ar.next
	ar.next = end
}

func (s *simulator) launch(ar *agentRun, step int) error {
	st := ar.agent.Steps[step]
	if st.SubAgent != nil {
		s.advance(&agentRun{agent: st.SubAgent, parent: ar, start: s.now}, s.now)
		return nil
	}
	call := ar.calls
	ar.calls++
	return s.dispatch(ar, step, call, s.now)
}

// dispatch sends a request through a load-balancer-chosen edge, routes it by
// the policy and admits it on the chosen instance.
func (s *simulator) dispatch(ar *agentRun, step, call int, firstArrival time.Duration) error {
	req := ar.agent.Steps[step].Request
	edge := 0
	switch {
	case len(s.edges) == 1:
	case s.cfg.EdgeFor != nil:
		edge = s.cfg.EdgeFor(ar.agent.ID, call)
		if edge < 0 || edge >= len(s.edges) {
			return fmt.Errorf("bench: edge chooser picked edge %d of %d", edge, len(s.edges))
		}
	case s.cfg.EdgeRoundRobin:
		edge = int(s.edgeTurn % uint64(len(s.edges)))
		s.edgeTurn++
	case ar.agent.BurstSibling > 0 && call == 0:
		// A fan-out burst: sibling k's first request through the k-th
		// edge after the root's.
		edge = int((stringHash(ar.agent.Root().ID) + uint64(ar.agent.BurstSibling)) % uint64(len(s.edges)))
	default:
		edge = s.lbRand.IntN(len(s.edges))
	}
	inst, affinity, retry, err := s.route(edge, ar, req, call)
	if err != nil {
		return fmt.Errorf("bench: %s: route %s call %d at virtual %v: %w", s.cfg.Policy, ar.agent.ID, call, s.now, err)
	}
	if inst < 0 {
		s.res.Shed++
		s.push(&event{at: s.now + max(retry, time.Millisecond), kind: evRetry, agent: ar, step: step, call: call, firstArrival: firstArrival})
		return nil
	}
	if at := s.edges[edge].waitUntil; at > s.now {
		// The placement waited for its Bind (or a retry's Overflow) to
		// commit before the request went on.
		s.push(&event{at: at, kind: evAdmit, agent: ar, step: step, call: call, firstArrival: firstArrival, edge: edge, inst: inst, affinity: affinity})
		return nil
	}
	return s.admit(ar, req, call, edge, inst, affinity, firstArrival)
}

// admit runs the request on the instance as the worker does: the ADP
// scheduler picks the rank (the verified hint's affinity id, if any), the
// rank's virtual engine computes its schedule, and its KV events reach every
// edge's index.
func (s *simulator) admit(ar *agentRun, req *Request, call, edge, instIdx int, affinity string, firstArrival time.Duration) error {
	in := s.instances[instIdx]
	if s.cfg.RefuseOversized && len(req.Blocks) > in.rankCap {
		s.refuse(ar, req, call, edge, in, firstArrival)
		return nil
	}
	preq := adp.Request{ConversationID: ar.agent.ID, AffinityID: affinity, PromptTokens: req.PromptTokens}
	if s.cfg.ADPPlacement == adp.KVAware {
		// The worker asks its engine which rank holds the prompt's prefix
		// (engine.RankPrefixer).
		preq.CachedTokens = make([]int, len(in.ranks))
		for r, vr := range in.ranks {
			preq.CachedTokens[r] = min(vr.Match(req.Blocks)*s.w.BlockSize, req.PromptTokens)
		}
	}
	d := in.sched.Place(preq)
	if d.Overflow {
		s.res.RankOverflows++
	}
	in.sched.Start(&d.Ticket)
	phase := engine.PhaseContextOnly
	if s.cfg.Aggregated {
		phase = engine.PhaseAggregated
	}
	vreq := sim.VirtualRequest{Phase: phase, Hashes: req.Blocks, PromptTokens: req.PromptTokens, OutputTokens: req.OutputTokens, Adapter: req.Adapter}
	oversized := len(req.Blocks) > in.rankCap
	if oversized {
		vreq.Hashes = nil // cannot be cached on this rank: computed in full
	}
	res, err := in.ranks[d.Rank].Admit(s.now, vreq)
	if err != nil {
		return fmt.Errorf("bench: %s rank %d: admit %s call %d: %w", in.id, d.Rank, ar.agent.ID, call, err)
	}
	if len(res.Stored) > 0 || len(res.Removed) > 0 {
		in.kvSeq++
		batch := kvindex.Batch{Instance: in.id, Boot: 1, Seq: in.kvSeq, Events: []kvindex.RankEvent{{Rank: d.Rank, Removed: res.Removed, Stored: res.Stored}}}
		// The blocks exist once the prefill computed them; the worker
		// publishes them at its next flush.
		in.kvPending = append(in.kvPending, pendingBatch{ready: res.FirstTokenAt, batch: batch})
		s.armKVFlush(instIdx)
	}
	uncached := req.PromptTokens - res.CachedTokens
	s.res.InstancePrefillTokens[instIdx] += int64(uncached)
	in.lookups = append(in.lookups, lookupRec{at: s.now, prompt: int64(req.PromptTokens), cached: int64(res.CachedTokens)})
	s.res.Records = append(s.res.Records, RequestRecord{
		Agent: ar.agent.ID, Root: ar.agent.Root().ID, SubAgent: ar.agent.SubAgent(), Call: call, Edge: edge, Instance: instIdx, InstanceID: in.id, Rank: d.Rank,
		Arrival: firstArrival, Admitted: s.now, TTFT: res.FirstTokenAt - firstArrival, Prefill: res.Prefill,
		Prompt: req.PromptTokens, Cached: res.CachedTokens, Oversized: oversized,
		Adapter: req.Adapter, AdapterLoaded: res.LoadedAdapter,
	})
	s.noteDispatch(edge, instIdx, req.PromptTokens)
	fl := &inflight{
		arrival: s.now, agent: ar, record: len(s.res.Records) - 1, instance: instIdx, edge: edge, ticket: d.Ticket,
		start: res.StartAt, firstToken: res.FirstTokenAt, done: res.DoneAt,
		uncached: uncached, prompt: req.PromptTokens, cached: res.CachedTokens, prefill: res.Prefill,
	}
	if p := s.shadowRoute(edge, instIdx, d.Rank, req.Blocks); p != nil {
		fl.shadow, fl.shadowOf, fl.blocks = p, s.edges[edge].shadow, req.Blocks
	}
	in.inflight = append(in.inflight, fl)
	s.push(&event{at: res.DoneAt, kind: evDone, fl: fl})
	complete := res.DoneAt
	if !s.cfg.Aggregated {
		// The generation hop streams the remaining tokens.
		complete = res.FirstTokenAt + time.Duration(max(req.OutputTokens-1, 0))*res.TokenTime
	}
	if s.peer != nil {
		s.peer.note(edge, instIdx, peerFlight{at: s.now, firstToken: res.FirstTokenAt, done: res.DoneAt, finish: complete,
			tokens: req.PromptTokens, blocks: len(req.Blocks)})
	}
	s.push(&event{at: complete, kind: evComplete, fl: fl})
	return nil
}

// noteDispatch counts a request of tokens prompt tokens, dispatched by edge
// to instIdx, in the edges' pending dispatches until the instance's next
// report: the deciding edge's at once, the others' ShareLatency later
// when the policy's edges tell each other (edges of one affinity log;
// independent routers do not).
func (s *simulator) noteDispatch(edge, instIdx, tokens int) {
	for _, e := range s.edges {
		d := dispatch{at: s.now, visible: s.now, tokens: tokens}
		if e.num != edge {
			if !s.cfg.Share.Dispatches || !s.cfg.Policy.usesSharedLog() {
				continue
			}
			d.visible += s.cfg.ShareLatency
		}
		e.pending[instIdx] = append(e.pending[instIdx], d)
	}
}

// refuse answers a prompt no rank can hold as the engine does
// (SimConfig.RefuseOversized): at once, before any rank or cache sees it,
// so the agent goes on. Its record is e2e mode's for the same refusal: no
// instance, a full miss, the prefill modelled alone as its time to first
// token.
func (s *simulator) refuse(ar *agentRun, req *Request, call, edge int, in *simInstance, firstArrival time.Duration) {
	prefill := in.ranks[0].PrefillTime(req.PromptTokens)
	s.res.Refused++
	s.res.Records = append(s.res.Records, RequestRecord{
		Agent: ar.agent.ID, Root: ar.agent.Root().ID, SubAgent: ar.agent.SubAgent(), Call: call, Edge: edge, Instance: -1, Rank: -1,
		Arrival: firstArrival, Admitted: s.now, TTFT: s.now - firstArrival + prefill, Prefill: prefill,
		Prompt: req.PromptTokens, Oversized: true, Adapter: req.Adapter,
	})
	s.push(&event{at: s.now, kind: evComplete, fl: &inflight{arrival: s.now, agent: ar, record: len(s.res.Records) - 1, instance: -1, edge: edge}})
}

func (s *simulator) finish(fl *inflight) {
	in := s.instances[fl.instance]
	in.sched.Finish(&fl.ticket)
	if i := slices.Index(in.inflight, fl); i >= 0 {
		in.inflight = slices.Delete(in.inflight, i, i+1)
	}
	// Keep it while a report taken before it finished may still be read.
	in.recent = slices.DeleteFunc(in.recent, func(r *inflight) bool { return r.done <= s.now-s.cfg.TelemetryInterval })
	in.recent = append(in.recent, fl)
	// The edge that relayed the request feeds its breaker from usage.
	if b := s.edges[fl.edge].breakers; b != nil {
		_, _ = b.Record(in.id, int64(fl.prompt), int64(fl.cached), epoch.Add(s.now))
	}
	s.shadowCorrect(fl)
}

// complete is the response's end: the agent's next step may start.
func (s *simulator) complete(fl *inflight) {
	s.completed++
	s.res.Makespan = max(s.res.Makespan, s.now)
	if s.cfg.Progress != nil {
		s.cfg.Progress(s.completed, s.total)
	}
	ar := fl.agent
	ar.outstanding--
	s.advance(ar, s.now)
}

// views is what edge e knows at s.now, as the edge's fleet view builds it:
// each instance's last load report (taken every TelemetryInterval: queued
// and active requests, active prompt tokens — the scheduler's placed,
// unfinished prompt tokens) plus the requests this edge dispatched to it
// since (as queued requests and queued prefill tokens), and the edge's own
// circuit breakers.
func (s *simulator) views(e *simEdge) (*routing.Views, error) {
	now := epoch.Add(s.now)
	iv := s.cfg.TelemetryInterval
	reportAt := s.now / iv * iv
	vs := make([]routing.InstanceView, len(s.instances))
	for i, in := range s.instances {
		if !in.reported || in.reportAt != reportAt {
			in.report(reportAt, s.cfg.Engine.StatsWindow)
		}
		// The report taken at reportAt covers requests admitted before
		// it; this edge's dispatches since (including at reportAt) are
		// pending.
		pend := e.pending[i]
		k := 0
		for k < len(pend) && pend[k].at < reportAt {
			k++
		}
		pend = pend[k:]
		e.pending[i] = pend
		v := routing.InstanceView{ID: in.id, Fleet: fsm.FleetContext, URL: "sim://" + in.id, Healthy: true,
			Ranks: len(in.ranks), VerifiesHints: true, Version: "sim",
			QueuedRequests: in.repQueued, ActiveRequests: in.repActive, ActivePromptTokens: in.repActiveTok,
			PrefillTokens: in.repPrefill, PrefillReported: true, KVTotalBlocks: int64(in.rankCap * len(in.ranks))}
		if in.repLookup > 0 {
			v.HitRate = float64(in.repHit) / float64(in.repLookup)
		}
		for _, d := range pend {
			if d.visible <= s.now {
				v.QueuedRequests++
				v.QueuedPrefillTokens += int64(d.tokens)
			}
		}
		if e.breakers != nil {
			v.CacheDegraded = e.breakers.Open(in.id, now)
		}
		v.LoRA = s.loraView(e, i, in)
		s.observeStrain(e, i, s.router.Condition(&v) != 0)
		vs[i] = v
	}
	return routing.NewViews(vs)
}

// report computes the instance's load report as of at: requests admitted
// before at and not done by then; queued ones have not started their
// prefill. (Requests admitted at exactly at are the edges' pending ones, so
// a burst within one instant is counted once.)
func (in *simInstance) report(at, window time.Duration) {
	in.reported, in.reportAt = true, at
	in.repQueued, in.repActive, in.repActiveTok, in.repPrefill = 0, 0, 0, 0
	in.reportLoRA(at)
	in.reportHits(at, window)
	count := func(fl *inflight) {
		if fl.arrival >= at || fl.done <= at {
			return
		}
		if fl.start > at {
			in.repQueued++
		} else {
			in.repActive++
		}
		in.repActiveTok += int64(fl.prompt)
		in.repPrefill += int64(sim.PrefillLeft(fl.uncached, fl.start, fl.firstToken, at))
	}
	for _, fl := range in.inflight {
		count(fl)
	}
	for _, fl := range in.recent {
		count(fl)
	}
}

// reportHits sums the prompt and cached tokens of the requests admitted
// within the stats window before at (sim.DefaultStatsWindow when window is
// 0), as the worker's rolling window reports them, and forgets older ones.
func (in *simInstance) reportHits(at, window time.Duration) {
	if window <= 0 {
		window = sim.DefaultStatsWindow
	}
	k := 0
	for k < len(in.lookups) && in.lookups[k].at < at-window {
		k++
	}
	in.lookups = in.lookups[k:]
	in.repLookup, in.repHit = 0, 0
	for _, l := range in.lookups {
		if l.at >= at {
			break
		}
		in.repLookup += l.prompt
		in.repHit += l.cached
	}
}
