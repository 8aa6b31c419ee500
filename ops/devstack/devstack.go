// Package devstack runs a complete local tether deployment in one process:
// an embedded NATS server, N edges forming the Raft group on loopback (real
// cluster nodes, real bbolt files in the data directory) and simulated
// context and generation workers with attention-DP ranks (or one aggregated
// fleet: Options.Aggregated), wired for sub-agent affinity. `tether dev` is
// a thin command over it; end-to-end, audit, soak and benchmark tests reuse
// it in-process.
//
//	st, err := devstack.Start(ctx, devstack.Options{}) // zero Options: a test stack on free ports
//	defer st.Close(ctx)
//	err = st.WaitReady(ctx)
//	url := st.Edges()[0].URL()
//
// See DESIGN.md for the data directory layout, ports, readiness and
// shutdown order.
package devstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/edge/natsembed"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/worker"
)

// ParentHeader is the parent-session header the stack configures
// (conversation_affinity_header_for_subagents).
const ParentHeader = "X-Dynamo-Parent-Session-ID"

// DefaultModel is the model name edges and workers serve unless Options.Model
// says otherwise.
const DefaultModel = "tether-sim"

// AgentsSDKDefaultModel is the model the OpenAI Agents SDK asks for when
// an agent names none (@openai/agents-core 0.20.0, getDefaultModel in
// dist/defaultModel.js, without OPENAI_DEFAULT_MODEL).
const AgentsSDKDefaultModel = "gpt-5.6-luna"

// DefaultModelAliases are the other names of DefaultModel a stack serves
// when Options.Model is not given: the Agents SDK's default, so an agent
// built without a model runs against the stack as it is.
var DefaultModelAliases = []string{AgentsSDKDefaultModel}

// Defaults applied to zero Options fields.
const (
	DefaultEdges             = 3
	DefaultContextWorkers    = 2
	DefaultGenerationWorkers = 2
	DefaultRanks             = 4
)

// edgeStartTimeout bounds one edge's Start when the caller's context has no
// deadline.
const edgeStartTimeout = 30 * time.Second

// MaxNodes bounds Edges and each worker count: a local stack larger than
// this is a mistake, not a deployment.
const MaxNodes = 16

// Options configure a stack. The zero value is a test stack: 3 edges, 2+2
// workers with 4 ranks, free ports everywhere, a temporary data directory,
// random secrets, context scope, an instant simulated engine.
type Options struct {
	Edges             int // default 3
	ContextWorkers    int // default 2
	GenerationWorkers int // default 2 (0 and no other with Aggregated)
	Ranks             int // ADP ranks per worker, default 4

	// Aggregated runs one fleet of workers serving whole requests, prefill
	// and decode on one worker, as aggregated vLLM and SGLang servers do:
	// the ContextWorkers workers, no generation fleet (GenerationWorkers
	// stays 0), the edges' context_servers.aggregated. The default is
	// TensorRT-LLM's split: a context hop, then a generation hop.
	// tether dev --generation-workers 0.
	Aggregated bool

	// Host is the loopback address everything listens on (default
	// 127.0.0.1).
	Host string
	// Port is the first edge's HTTP port; edge i listens on Port+i. 0 picks
	// free ports for every edge.
	Port int
	// NATSPort is the embedded NATS server's port (0: a free port).
	NATSPort int
	// DataDir holds each edge's Raft log, snapshots and archive (DataDir/
	// edge-N) and the stack manifest. Kept when given, so a restart on the
	// same directory recovers the bindings; "" uses a temporary directory
	// removed by Close.
	DataDir string

	// AdminToken guards the edges' admin API; "" generates one.
	AdminToken string
	// InternalKey is internal_request_auth_key (edges sign sub-agent
	// hints with it, workers verify; it also authenticates the edges to
	// each other); "" generates one.
	InternalKey string
	// Model is the served model name (default DefaultModel, then with
	// DefaultModelAliases unless ModelAliases is set).
	Model string
	// ModelAliases are more names of Model: requests may give any of
	// them (edges' model_aliases, workers' model_aliases), as vLLM's
	// --served-model-name takes several names.
	ModelAliases []string
	// MaxModelLen is the simulated workers' context length
	// (max_model_len; 0: the worker's default).
	MaxModelLen int
	// ExtraModels are models served besides Model, each on its own
	// ContextWorkers + GenerationWorkers workers (ids m2-ctx-1, …): the
	// edges' models entries (edge/catalog).
	ExtraModels []string
	// Adapters are the LoRA adapters of each model (by model name): the
	// model's workers serve them with MaxLoRAs slots per rank (default 2)
	// and LoRALoadTime per load (the simulated engine's default), and the
	// edges list them (lora.adapters).
	Adapters     map[string][]string
	MaxLoRAs     int
	LoRALoadTime time.Duration
	// Scope is subagent_affinity_scope (zero: context).
	Scope routing.Scope
	// TimeScale is the simulated engine's wall time per unit of engine
	// time: 1 real time, 0.1 ten times faster, 0 instant.
	TimeScale float64
	// HideRouteHeader turns off the x-tether-route debug header (on by
	// default in a development stack).
	HideRouteHeader bool
	// MutualTLS runs every link over mutual TLS with an ephemeral CA in
	// DataDir/tls (reused by a kept data directory): the cluster port,
	// the edges' HTTPS listeners, edge → worker hops and NATS, where each
	// worker's certificate may publish only its own telemetry. tether dev
	// sets it unless --plaintext; the zero value (in-process tests) is
	// plaintext. Clients use CAFile or ClientTLS.
	MutualTLS bool

	// Logger receives every component's logs (default: discarded).
	Logger *slog.Logger
	// Version is reported by edges and workers (default "dev").
	Version string
	// EdgeConfig, when set, adjusts each edge's configuration (index from
	// 0) before it is validated.
	EdgeConfig func(i int, c *edge.Config)
	// WorkerConfig, when set, adjusts each worker's configuration before
	// it is validated.
	WorkerConfig func(id string, c *worker.Config)
	// EngineEvents "vllm" runs every worker as a proxy (engine.type proxy)
	// in front of simulated engines that publish vLLM-format ZeroMQ KV
	// events (one single-rank engine per ADP rank, like vLLM's DP ranks),
	// which the worker consumes (engine.kv_events): the real-engine path
	// without a GPU. "" (default): the simulated engine in the worker.
	EngineEvents string
}

// Normalize fills the defaults in and validates; every error names the
// option. Start calls it; callers (tether dev) may call it first to tell bad
// arguments from failures to start.
func (o *Options) Normalize() error {
	if o.Edges == 0 {
		o.Edges = DefaultEdges
	}
	if o.ContextWorkers == 0 {
		o.ContextWorkers = DefaultContextWorkers
	}
	if o.GenerationWorkers == 0 && !o.Aggregated {
		o.GenerationWorkers = DefaultGenerationWorkers
	}
	if o.Ranks == 0 {
		o.Ranks = DefaultRanks
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.Model == "" {
		o.Model = DefaultModel
		if o.ModelAliases == nil {
			o.ModelAliases = append([]string(nil), DefaultModelAliases...)
		}
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MaxLoRAs == 0 && len(o.Adapters) > 0 {
		o.MaxLoRAs = 2
	}
	return errors.Join(append(o.checkSizes(), o.checkRest()...)...)
}

// checkSizes checks the counts of nodes and ranks and the ports they need.
func (o *Options) checkSizes() []error {
	var errs []error
	for _, c := range []struct {
		name string
		v    int
	}{{"edges", o.Edges}, {"context workers", o.ContextWorkers}, {"generation workers", o.GenerationWorkers}} {
		if c.name == "generation workers" && o.Aggregated {
			continue // checkAggregated
		}
		if c.v < 1 || c.v > MaxNodes {
			errs = append(errs, fmt.Errorf("%s: must be 1..%d, got %d", c.name, MaxNodes, c.v))
		}
	}
	errs = append(errs, o.checkAggregated()...)
	if o.EngineEvents != "" && o.EngineEvents != EngineEventsVLLM {
		errs = append(errs, fmt.Errorf("engine events: want %q or nothing, got %q", EngineEventsVLLM, o.EngineEvents))
	}
	if o.Ranks < 1 || o.Ranks > telemetry.MaxRanks {
		errs = append(errs, fmt.Errorf("ranks: must be 1..%d, got %d", telemetry.MaxRanks, o.Ranks))
	}
	if o.Port < 0 || o.Port+o.Edges-1 > 65535 {
		errs = append(errs, fmt.Errorf("port: edges need ports %d..%d, outside 0..65535", o.Port, o.Port+o.Edges-1))
	}
	if o.NATSPort < 0 || o.NATSPort > 65535 {
		errs = append(errs, fmt.Errorf("nats port: must be 0..65535, got %d", o.NATSPort))
	}
	if ip := net.ParseIP(o.Host); ip == nil || !ip.IsLoopback() {
		errs = append(errs, fmt.Errorf("host: %q is not a loopback IP address (a development stack has no authentication between its parts beyond shared secrets; keep it on loopback)", o.Host))
	}
	return errs
}

// checkRest checks the options but sizes.
func (o *Options) checkRest() []error {
	var errs []error
	if !(o.TimeScale >= 0) || o.TimeScale > 1e6 {
		errs = append(errs, fmt.Errorf("time scale: must be 0 (instant) or more, got %v", o.TimeScale))
	}
	errs = append(errs, o.checkNames()...)
	if o.MaxLoRAs < 0 || o.LoRALoadTime < 0 {
		errs = append(errs, fmt.Errorf("lora: max loras %d and load time %s must be >= 0", o.MaxLoRAs, o.LoRALoadTime))
	}
	if n := 1 + len(o.ExtraModels); n*(o.ContextWorkers+o.GenerationWorkers) > 4*MaxNodes {
		errs = append(errs, fmt.Errorf("models: %d models × %d workers is more than a local stack runs (%d)", n, o.ContextWorkers+o.GenerationWorkers, 4*MaxNodes))
	}
	if o.MaxModelLen < 0 || o.MaxModelLen == 1 {
		errs = append(errs, fmt.Errorf("max model len: must be 0 (the workers' default) or at least 2, got %d", o.MaxModelLen))
	}
	if o.Scope != routing.ScopeContext && o.Scope != routing.ScopeBoth {
		errs = append(errs, fmt.Errorf("scope: unknown value %s (allowed: context, both)", o.Scope))
	}
	for _, s := range []struct{ name, v string }{{"admin token", o.AdminToken}, {"internal key", o.InternalKey}} {
		if s.v != "" && len(s.v) < edge.MinSecretLen {
			errs = append(errs, fmt.Errorf("%s: %d bytes is too short (want at least %d)", s.name, len(s.v), edge.MinSecretLen))
		}
	}
	return errs
}

// checkAggregated checks the options an aggregated stack rules out.
func (o *Options) checkAggregated() []error {
	if !o.Aggregated {
		return nil
	}
	var errs []error
	if o.GenerationWorkers != 0 {
		errs = append(errs, fmt.Errorf("generation workers: an aggregated stack has none (its %d context workers serve whole requests), got %d", o.ContextWorkers, o.GenerationWorkers))
	}
	if o.Scope == routing.ScopeBoth {
		errs = append(errs, fmt.Errorf("scope: both makes sub-agents follow their parent on the generation fleet too, which an aggregated stack does not have (use context)"))
	}
	return errs
}

// checkNames checks that the model names, aliases and adapters are
// distinct and that adapters name a model of the stack.
func (o *Options) checkNames() []error {
	var errs []error
	seenModel := map[string]bool{o.Model: true}
	for _, m := range o.ModelAliases {
		if m == "" || seenModel[m] {
			errs = append(errs, fmt.Errorf("model aliases: %q is empty or named twice", m))
		}
		seenModel[m] = true
	}
	for _, m := range o.ExtraModels {
		if m == "" || seenModel[m] {
			errs = append(errs, fmt.Errorf("models: %q is empty or named twice", m))
		}
		seenModel[m] = true
	}
	for m, as := range o.Adapters {
		if !seenModel[m] {
			errs = append(errs, fmt.Errorf("lora adapters: %q is not a model of the stack (%v)", m, o.models()))
		}
		for _, a := range as {
			if a == "" || seenModel[a] {
				errs = append(errs, fmt.Errorf("lora adapters: %q is empty or named twice (adapter and model names are unique)", a))
			}
			seenModel[a] = true
		}
	}
	return errs
}

// Stack is a running local deployment.
type Stack struct {
	opts       Options
	rejoin     map[string]bool // edges that join the others as new members (settleRemoved)
	log        *slog.Logger
	dataDir    string
	tempDir    bool
	adminToken string
	// adminTokenFrom is where the admin token came from: given (flag or
	// environment), kept (the data dir's) or generated (and stored there).
	adminTokenFrom string
	internalKey    string
	peers          []cluster.Peer
	pki            *devPKI // nil: plaintext
	nats           *natsserver.Server
	edges          []*EdgeNode
	workers        []*WorkerNode
	engines        []*worker.Server // simulated engines behind proxy workers (EngineEvents)
	client         *http.Client

	closeOnce sync.Once
	closeErr  error
}

// EdgeNode is one edge of the stack. Its *edge.Edge changes when the edge
// is restarted and is nil while it is stopped.
type EdgeNode struct {
	Index    int    // position in Stack.Edges
	ID       string // cluster node id: edge-1, edge-2, …
	RaftAddr string // Raft/forwarding address (stable across restarts)
	DataDir  string

	stack *Stack
	mu    sync.Mutex
	e     *edge.Edge
	addr  string // HTTP host:port (kept across restarts)
}

// WorkerNode is one simulated worker of the stack.
type WorkerNode struct {
	ID string // instance id: ctx-1, …, gen-1, … (m2-ctx-1, … for the second model)
	// Fleet is the worker's fleet; an aggregated stack's workers are the
	// context fleet, serving whole requests.
	Fleet  fsm.Fleet
	Model  string // the model it serves
	Server *worker.Server
}

// URL is the worker's base URL.
func (w *WorkerNode) URL() string { return w.Server.URL() }

// Start brings the whole stack up: NATS, the workers, then the edges. It
// returns once everything listens; call WaitReady for a leader and
// registered workers. On error everything started is stopped.
func Start(ctx context.Context, opts Options) (_ *Stack, err error) {
	if err := opts.Normalize(); err != nil {
		return nil, fmt.Errorf("devstack: %w", err)
	}
	s := &Stack{opts: opts, log: opts.Logger.With("component", "devstack")}
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}
	s.client = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = s.Close(cctx)
		}
	}()

	if err := s.prepareDataDir(); err != nil {
		return nil, err
	}
	if s.internalKey, _, err = secret(s.dataDir, internalKeyName, opts.InternalKey); err != nil {
		return nil, err
	}
	if s.adminToken, s.adminTokenFrom, err = secret(s.dataDir, adminTokenName, opts.AdminToken); err != nil {
		return nil, err
	}
	if err := s.preparePKI(); err != nil {
		return nil, err
	}
	if err := s.startNATS(); err != nil {
		return nil, err
	}
	if err := s.startWorkers(ctx); err != nil {
		return nil, err
	}
	if err := s.startEdges(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func randomSecret() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// prepareDataDir creates the temporary directory or opens the given one and
// settles the edges' Raft addresses (from the manifest on a restart).
func (s *Stack) prepareDataDir() error {
	o := &s.opts
	if o.DataDir == "" {
		dir, err := os.MkdirTemp("", "tether-dev-*")
		if err != nil {
			return fmt.Errorf("devstack: temporary data dir: %w", err)
		}
		s.dataDir, s.tempDir = dir, true
	} else {
		dir, err := filepath.Abs(o.DataDir)
		if err != nil {
			return fmt.Errorf("devstack: data dir %s: %w", o.DataDir, err)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("devstack: data dir: %w", err)
		}
		s.dataDir = dir
	}
	m, found, err := readManifest(s.dataDir)
	if err != nil {
		return err
	}
	if found {
		if len(m.Edges) != o.Edges {
			return fmt.Errorf("devstack: data dir %s holds a %d-edge cluster (%s); start with %d edges or use another data dir",
				s.dataDir, len(m.Edges), manifestName, len(m.Edges))
		}
		for _, me := range m.Edges {
			s.peers = append(s.peers, cluster.Peer{ID: me.ID, Addr: me.RaftAddr})
		}
		return s.settleRemoved()
	}
	// A new cluster: its Raft addresses are recorded before any node
	// persists them in its log, so a restart finds its peers again.
	for i := range o.Edges {
		s.peers = append(s.peers, cluster.Peer{ID: edgeID(i)})
	}
	return nil
}

// settleRemoved prepares a kept data directory in which an edge was removed
// from the cluster (`tether operator raft remove-peer`), or had its
// directory wiped, while other edges kept their Raft state: such an edge
// could never start again as it was (its tombstone stops it; an empty
// directory would bootstrap a second cluster). Its directory is moved aside
// (edge-N.removed-<unix time>, nothing is deleted) and it rejoins the others
// as a new member on its recorded address.
func (s *Stack) settleRemoved() error {
	hasState := func(id string) bool {
		_, err := os.Stat(filepath.Join(s.dataDir, id, "raft.db"))
		return err == nil
	}
	s.rejoin = map[string]bool{}
	keep := 0
	for _, p := range s.peers {
		dir := filepath.Join(s.dataDir, p.ID)
		_, err := os.Stat(filepath.Join(dir, cluster.TombstoneFile))
		switch {
		case err == nil:
			aside := fmt.Sprintf("%s.removed-%d", dir, time.Now().Unix())
			if err := os.Rename(dir, aside); err != nil {
				return fmt.Errorf("devstack: %s was removed from the cluster; moving its data dir aside: %w", p.ID, err)
			}
			s.opts.Logger.Warn("devstack: edge was removed from the cluster: its data dir is moved aside and it rejoins as a new member",
				"edge", p.ID, "moved_to", aside)
			s.rejoin[p.ID] = true
		case !hasState(p.ID):
			s.rejoin[p.ID] = true
		default:
			keep++
		}
	}
	if keep == 0 {
		s.rejoin = nil // nothing kept: a new cluster bootstraps
	}
	return nil
}

func edgeID(i int) string { return "edge-" + strconv.Itoa(i+1) }

func (s *Stack) startNATS() error {
	port := s.opts.NATSPort
	if port == 0 {
		port = natsembed.RandomPort
	}
	opts := &natsserver.Options{
		ServerName: "tether-dev", Host: s.opts.Host, Port: port,
		MaxPayload: 8 << 20, // KV dumps of 4 large ranks fit in one reply
	}
	if err := s.natsTLS(opts); err != nil {
		return err
	}
	ns, err := natsembed.Start(opts)
	if err != nil {
		return fmt.Errorf("devstack: %w", err)
	}
	s.nats = ns
	return nil
}

// workerSpec is one worker of the stack.
type workerSpec struct {
	id    string
	fleet telemetry.Fleet
	role  hintauth.Role
	model string
}

// models are the stack's models, Model first.
func (o Options) models() []string { return append([]string{o.Model}, o.ExtraModels...) }

// workerSpecs are the stack's workers, per model: ctx-1.., then gen-1..
// (m2-ctx-1.., m2-gen-1.. for the second model).
func workerSpecs(o Options) []workerSpec {
	var specs []workerSpec
	for mi, model := range o.models() {
		prefix := ""
		if mi > 0 {
			prefix = fmt.Sprintf("m%d-", mi+1)
		}
		for i := range o.ContextWorkers {
			specs = append(specs, workerSpec{fmt.Sprintf("%sctx-%d", prefix, i+1), telemetry.FleetContext, hintauth.RoleContext, model})
		}
		for i := range o.GenerationWorkers {
			specs = append(specs, workerSpec{fmt.Sprintf("%sgen-%d", prefix, i+1), telemetry.FleetGeneration, hintauth.RoleGeneration, model})
		}
	}
	return specs
}

func (s *Stack) startWorkers(ctx context.Context) error {
	o := s.opts
	for _, sp := range workerSpecs(o) {
		cfg := worker.DefaultConfig()
		cfg.InstanceID = sp.id
		cfg.Fleet = sp.fleet
		cfg.ServerRole = sp.role
		cfg.Hostname = o.Host
		cfg.Port = 0
		cfg.Model = sp.model
		if sp.model == o.Model {
			cfg.ModelAliases = append([]string(nil), o.ModelAliases...)
		}
		if o.MaxModelLen > 0 {
			cfg.MaxModelLen = o.MaxModelLen
		}
		if as := o.Adapters[sp.model]; len(as) > 0 {
			cfg.LoRA = worker.LoRAConfig{Adapters: as, MaxLoRAs: o.MaxLoRAs, LoadTime: o.LoRALoadTime}
		}
		cfg.InternalRequestAuthKey = s.internalKey
		cfg.ADP.EnableAttentionDP = true
		cfg.ADP.AttentionDP.ConversationAffinity = true
		cfg.ADP.AttentionDP.NewConvPlacement = "least_tokens"
		cfg.Ranks = o.Ranks
		cfg.Engine.TimeScale = o.TimeScale
		cfg.NATS.URLs = []string{s.nats.ClientURL()}
		cfg.Logger = o.Logger
		cfg.Version = o.Version
		s.workerTLS(sp.id, &cfg)
		if o.EngineEvents != "" {
			if err := s.proxyToEngines(ctx, sp.id, &cfg); err != nil {
				return err
			}
		}
		if o.WorkerConfig != nil {
			o.WorkerConfig(sp.id, &cfg)
		}
		srv, err := worker.New(cfg)
		if err != nil {
			return fmt.Errorf("devstack: worker %s: %w", sp.id, err)
		}
		if err := srv.Start(ctx); err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = srv.Close(cctx)
			cancel()
			return fmt.Errorf("devstack: worker %s: %w", sp.id, err)
		}
		fleet := fsm.FleetContext
		if sp.fleet == telemetry.FleetGeneration {
			fleet = fsm.FleetGeneration
		}
		s.workers = append(s.workers, &WorkerNode{ID: sp.id, Fleet: fleet, Model: sp.model, Server: srv})
	}
	return nil
}

// startEdges binds every edge's ports first (so each knows its peers),
// records a new cluster's manifest, then starts the edges concurrently: a
// bootstrapping edge waits for its peers only through Raft, but starting
// them together keeps the first election short.
func (s *Stack) startEdges(ctx context.Context) error {
	o := s.opts
	n := o.Edges
	raftLns := make([]net.Listener, n)
	httpLns := make([]net.Listener, n)
	closeAll := func() {
		for i := range n {
			if raftLns[i] != nil {
				raftLns[i].Close()
			}
			if httpLns[i] != nil {
				httpLns[i].Close()
			}
		}
	}
	var lc net.ListenConfig
	newCluster := s.peers[0].Addr == ""
	for i := range n {
		addr := s.peers[i].Addr
		if newCluster {
			addr = net.JoinHostPort(o.Host, "0")
		}
		ln, err := lc.Listen(ctx, "tcp", addr)
		if err != nil {
			closeAll()
			if !newCluster {
				return fmt.Errorf("devstack: %s: Raft address %s recorded in %s: %w (another tether dev on this data dir?)",
					s.peers[i].ID, addr, filepath.Join(s.dataDir, manifestName), err)
			}
			return fmt.Errorf("devstack: %s: raft listen: %w", s.peers[i].ID, err)
		}
		raftLns[i] = ln
		s.peers[i].Addr = ln.Addr().String()
		port := 0
		if o.Port != 0 {
			port = o.Port + i
		}
		haddr := net.JoinHostPort(o.Host, strconv.Itoa(port))
		if httpLns[i], err = lc.Listen(ctx, "tcp", haddr); err != nil {
			closeAll()
			return fmt.Errorf("devstack: %s: listen %s: %w (edges use --port and the ports after it)", s.peers[i].ID, haddr, err)
		}
	}
	if newCluster {
		if err := writeManifest(s.dataDir, s.peers); err != nil {
			closeAll()
			return err
		}
	}
	for i := range n {
		s.edges = append(s.edges, &EdgeNode{
			Index: i, ID: s.peers[i].ID, RaftAddr: s.peers[i].Addr, DataDir: filepath.Join(s.dataDir, s.peers[i].ID),
			stack: s, addr: httpLns[i].Addr().String(),
		})
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.edges[i].start(ctx, httpLns[i], raftLns[i])
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// EdgeConfig is edge i's configuration as the stack builds it.
func (s *Stack) EdgeConfig(i int) edge.Config {
	o := s.opts
	cfg := edge.DefaultConfig()
	cfg.Hostname = o.Host
	cfg.Port = 0 // the stack passes the bound listener
	cfg.Model = o.Model
	cfg.ModelAliases = append([]string(nil), o.ModelAliases...)
	cfg.ParentHeader = ParentHeader
	cfg.Scope = o.Scope
	cfg.InternalRequestAuthKey = s.internalKey
	cfg.AdminToken = s.adminToken
	cfg.DebugRouteHeader = !o.HideRouteHeader
	cfg.ContextServers.NumInstances = o.ContextWorkers
	cfg.ContextServers.Aggregated = o.Aggregated
	cfg.GenerationServers.NumInstances = o.GenerationWorkers
	cfg.ContextServers.Router.Type = routing.RouterConversation
	cfg.GenerationServers.Router.Type = routing.RouterConversation
	cfg.NATS.URLs = []string{s.nats.ClientURL()}
	cfg.Cluster.NodeID = s.peers[i].ID
	cfg.Cluster.DataDir = filepath.Join(s.dataDir, s.peers[i].ID)
	cfg.Cluster.BindAddr = s.peers[i].Addr
	cfg.Cluster.Bootstrap = true // ignored once the data dir holds Raft state
	cfg.Cluster.Peers = append([]cluster.Peer(nil), s.peers...)
	adapters := func(model string) edge.LoRAConfig {
		var l edge.LoRAConfig
		for _, a := range o.Adapters[model] {
			l.Adapters = append(l.Adapters, edge.AdapterConfig{Name: a})
		}
		return l
	}
	cfg.LoRA = adapters(o.Model)
	for _, m := range o.ExtraModels {
		mc := edge.ModelConfig{Name: m, ContextServers: cfg.ContextServers, GenerationServers: cfg.GenerationServers, LoRA: adapters(m)}
		cfg.Models = append(cfg.Models, mc)
	}
	if s.rejoin[s.peers[i].ID] {
		// Removed from the cluster (or its directory wiped) while the
		// others kept theirs: it joins them as a new member.
		cfg.Cluster.Bootstrap, cfg.Cluster.Peers = false, nil
		for j, p := range s.peers {
			if j != i && !s.rejoin[p.ID] {
				cfg.Cluster.Join = append(cfg.Cluster.Join, p.Addr)
			}
		}
	}
	s.edgeTLS(s.peers[i].ID, &cfg)
	if o.EdgeConfig != nil {
		o.EdgeConfig(i, &cfg)
	}
	return cfg
}

// start creates and starts the edge on the given listeners (nil: bind the
// edge's recorded addresses again, as a restarted process would).
func (n *EdgeNode) start(ctx context.Context, httpLn, raftLn net.Listener) error {
	s := n.stack
	var lc net.ListenConfig
	var err error
	if raftLn == nil {
		if raftLn, err = lc.Listen(ctx, "tcp", n.RaftAddr); err != nil {
			return fmt.Errorf("devstack: %s: raft listen %s: %w", n.ID, n.RaftAddr, err)
		}
	}
	if httpLn == nil {
		if httpLn, err = lc.Listen(ctx, "tcp", n.addr); err != nil {
			raftLn.Close()
			return fmt.Errorf("devstack: %s: listen %s: %w", n.ID, n.addr, err)
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		// Parts of an edge's start (the NATS subscription flush) need a
		// deadline; a start that takes this long is stuck anyway.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, edgeStartTimeout)
		defer cancel()
	}
	cfg := s.EdgeConfig(n.Index)
	e, err := edge.New(cfg, edge.Deps{
		Logger: s.opts.Logger, HTTPListener: httpLn, ClusterListener: raftLn, Version: s.opts.Version,
	})
	if err != nil {
		httpLn.Close()
		raftLn.Close()
		return fmt.Errorf("devstack: %s: %w", n.ID, err)
	}
	if err := e.Start(ctx); err != nil {
		return fmt.Errorf("devstack: %s: %w", n.ID, err)
	}
	n.mu.Lock()
	n.e = e
	n.mu.Unlock()
	return nil
}

// Edge is the running edge (nil while stopped).
func (n *EdgeNode) Edge() *edge.Edge {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.e
}

// Running reports whether the edge is up.
func (n *EdgeNode) Running() bool { return n.Edge() != nil }

// Addr is the edge's HTTP address (host:port), stable across restarts.
func (n *EdgeNode) Addr() string { return n.addr }

// URL is the edge's base URL, e.g. https://127.0.0.1:8000 (http:// without
// MutualTLS).
func (n *EdgeNode) URL() string { return n.stack.scheme() + "://" + n.addr }

// Kill stops the edge abruptly, as a crash would (no leadership
// transfer, nothing flushed). No-op when it is stopped.
func (n *EdgeNode) Kill() {
	n.mu.Lock()
	e := n.e
	n.e = nil
	n.mu.Unlock()
	if e != nil {
		e.Kill()
	}
}

// Stop closes the edge gracefully (in-flight requests finish, leadership
// is handed over). No-op when it is stopped.
func (n *EdgeNode) Stop(ctx context.Context) error {
	n.mu.Lock()
	e := n.e
	n.e = nil
	n.mu.Unlock()
	if e == nil {
		return nil
	}
	if err := e.Close(ctx); err != nil {
		return fmt.Errorf("devstack: stop %s: %w", n.ID, err)
	}
	return nil
}

// Restart starts a stopped or killed edge again on its data directory, its
// Raft address and its HTTP address.
func (n *EdgeNode) Restart(ctx context.Context) error {
	if n.Running() {
		return fmt.Errorf("devstack: restart %s: it is running", n.ID)
	}
	return n.start(ctx, nil, nil)
}

// Edges are the stack's edges in order (edge-1 first).
func (s *Stack) Edges() []*EdgeNode { return append([]*EdgeNode(nil), s.edges...) }

// Workers are the stack's workers: context workers first.
func (s *Stack) Workers() []*WorkerNode { return append([]*WorkerNode(nil), s.workers...) }

// NATSURL is the embedded NATS server's client URL.
func (s *Stack) NATSURL() string { return s.nats.ClientURL() }

// DataDir is the stack's data directory (temporary unless Options.DataDir).
func (s *Stack) DataDir() string { return s.dataDir }

// TemporaryDataDir reports whether Close removes the data directory.
func (s *Stack) TemporaryDataDir() bool { return s.tempDir }

// AdminToken is the edges' admin bearer token.
func (s *Stack) AdminToken() string { return s.adminToken }

// AdminTokenSource says where the admin token came from: "given" (flag or
// environment, not stored), "kept" (the data dir's) or "generated" (new,
// stored in the data dir).
func (s *Stack) AdminTokenSource() string { return s.adminTokenFrom }

// InternalKey is the shared internal_request_auth_key.
func (s *Stack) InternalKey() string { return s.internalKey }

// Model is the served model name (the first model).
func (s *Stack) Model() string { return s.opts.Model }

// ModelAliases are the other names of Model.
func (s *Stack) ModelAliases() []string { return append([]string(nil), s.opts.ModelAliases...) }

// Models are every model the stack serves, Model first.
func (s *Stack) Models() []string { return s.opts.models() }

// Options are the options the stack runs with, defaults applied.
func (s *Stack) Options() Options { return s.opts }

// Leader is the running edge that is the ready Raft leader, or nil.
func (s *Stack) Leader() *EdgeNode {
	for _, n := range s.edges {
		if e := n.Edge(); e != nil && e.Node().IsLeader() {
			return n
		}
	}
	return nil
}

// NotReady says what the stack still lacks ("" when ready): a leader known
// to every running edge, and every running edge seeing every worker healthy
// through telemetry with the replicated log recording it up (an instance the
// log still holds as draining from a previous run takes no new
// conversations).
func (s *Stack) NotReady() string {
	if s.Leader() == nil {
		return "no leader"
	}
	now := time.Now()
	running := 0
	for _, n := range s.edges {
		e := n.Edge()
		if e == nil {
			continue
		}
		running++
		if id, _ := e.Node().Leader(); id == "" {
			return n.ID + " knows no leader"
		}
		st := e.Node().State()
		for _, w := range s.workers {
			in, ok := e.Fleet().Instance(w.ID, now)
			if !ok || !in.Healthy || !in.Telemetry {
				return fmt.Sprintf("%s has no healthy telemetry from %s", n.ID, w.ID)
			}
			rec, ok := st.Instance(w.ID)
			if !ok || rec.Status != fsm.InstanceUp {
				status := "unknown"
				if ok {
					status = rec.Status.String()
				}
				return fmt.Sprintf("%s's log holds %s as %s", n.ID, w.ID, status)
			}
		}
	}
	if running == 0 {
		return "no edge running"
	}
	return ""
}

// WaitReady waits until NotReady is empty or ctx ends (the error then says
// what was missing).
func (s *Stack) WaitReady(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		why := s.NotReady()
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("devstack: not ready: %s: %w", why, ctx.Err())
		case <-t.C:
		}
	}
}

// Close shuts the stack down: the workers drain (in-flight requests
// finish until ctx ends), the edges close together without handing
// leadership to each other, NATS stops, and a temporary data directory is
// removed. Idempotent.
func (s *Stack) Close(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closeErr = s.close(ctx) })
	return s.closeErr
}

func (s *Stack) close(ctx context.Context) error {
	var mu sync.Mutex
	var errs []error
	addErr := func(err error) {
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for _, w := range s.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Server.Close(ctx); err != nil {
				addErr(fmt.Errorf("devstack: worker %s: %w", w.ID, err))
			}
		}()
	}
	wg.Wait()
	addErr(s.closeEngines(ctx))
	// Every edge stops: none hands Raft leadership on (the peer taking it
	// would be stopping too and hand it on again, each transfer logging
	// errors), and they stop together so no election runs in between.
	for _, m := range s.edges {
		if e := m.Edge(); e != nil {
			e.SkipLeadershipHandoff()
		}
	}
	// Each settles first (its requests finished, their placements
	// answered by the log), while every node still runs to commit them.
	for _, m := range s.edges {
		if e := m.Edge(); e != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				addErr(e.Settle(ctx))
			}()
		}
	}
	wg.Wait()
	for _, m := range s.edges {
		wg.Add(1)
		go func() {
			defer wg.Done()
			addErr(m.Stop(ctx))
		}()
	}
	wg.Wait()
	if s.nats != nil {
		s.nats.Shutdown()
		s.nats.WaitForShutdown()
	}
	if t, ok := s.client.Transport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
	if s.tempDir && s.dataDir != "" {
		if err := os.RemoveAll(s.dataDir); err != nil {
			addErr(fmt.Errorf("devstack: remove %s: %w", s.dataDir, err))
		}
	}
	return errors.Join(errs...)
}
