package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/ops/operator"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/clustertest"
	"github.com/tether-project/tether/test/edgetest"
	"github.com/tether-project/tether/test/waitfor"
	"github.com/tether-project/tether/worker"
)

const (
	testModel    = "tether-ops-test"
	parentHeader = "X-Dynamo-Parent-Session-ID"
	internalKey  = "ops-test-internal-key-0123456789"
	adminToken   = "ops-test-admin-token-0123456789"
)

// fleet is an in-process deployment built from the real parts: an embedded
// NATS server, edges (edge.New: Raft over loopback TCP, raft-boltdb and the
// bbolt archive in per-edge data dirs) as the members of a test/clustertest
// group, and simulated workers (worker.New: real HTTP servers publishing
// telemetry). Unlike ops/devstack it lets a test restart an edge as another
// version, replace a worker by one with another configuration under the
// same instance id, and start a subset of the bootstrap voters.
type fleet struct {
	t       *testing.T
	nats    *natsserver.Server
	edges   *clustertest.Group[*fleetEdge]
	client  *http.Client
	mu      sync.Mutex
	workers map[string]*worker.Server
	order   []string
	// versions are the versions startEdge last started edges as, by id
	// (the others run opts.version).
	versions map[string]string
	opts     fleetOptions

	wg         sync.WaitGroup
	stopHealth chan struct{}
}

type fleetOptions struct {
	edges      int
	ctxWorkers int
	genWorkers int
	// start lists the edges (0-based) started at first; nil: all.
	start []int
	// edgeConfig and workerConfig adjust each node's configuration;
	// edgeConfig also gets the version the edge starts as (an upgrade test
	// runs an "old" version with a compatibility setting).
	edgeConfig   func(i int, version string, c *edge.Config)
	workerConfig func(id string, c *worker.Config)
	version      string // initial edge and worker version (default "v1")
}

// fleetEdge is one edge process: a member of the fleet's group while it
// runs. Its HTTP port, the group's extra port, is kept across restarts.
type fleetEdge struct {
	edgetest.Member
	i                               int // member number
	id, dataDir, raftAddr, httpAddr string
	version                         string
	// ready: in the load balancer's rotation (see healthLoop). admitted:
	// it has heard every worker once since it started.
	ready    atomic.Bool
	admitted atomic.Bool
}

func (e *fleetEdge) url() string { return "http://" + e.httpAddr }

// state is the edge's current replicated state.
func (e *fleetEdge) state() *fsm.State { return e.Node().State() }

// memberURL is a member's HTTP URL, whether it runs or not.
func memberURL(m clustertest.Member) string { return "http://" + m.Extra[0] }

func quietLogger() *slog.Logger {
	if os.Getenv("OPS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.DiscardHandler)
}

func startFleet(t *testing.T, o fleetOptions) *fleet {
	t.Helper()
	if o.edges == 0 {
		o.edges = 3
	}
	if o.ctxWorkers == 0 {
		o.ctxWorkers = 2
	}
	if o.genWorkers == 0 {
		o.genWorkers = 1
	}
	if o.version == "" {
		o.version = "v1"
	}
	f := &fleet{t: t, workers: map[string]*worker.Server{}, versions: map[string]string{}, opts: o}
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 32, IdleConnTimeout: 10 * time.Second}
	f.client = &http.Client{Transport: tr, Timeout: 20 * time.Second}
	t.Cleanup(f.close)

	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoLog: true, NoSigs: true, MaxPayload: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats did not start")
	}
	f.nats = ns

	for i := range o.ctxWorkers {
		f.startWorker(fmt.Sprintf("ctx-%d", i+1), telemetry.FleetContext, o.version, nil)
	}
	for i := range o.genWorkers {
		f.startWorker(fmt.Sprintf("gen-%d", i+1), telemetry.FleetGeneration, o.version, nil)
	}

	// Registered after f.close, the group's cleanup closes the edges
	// before f.close stops the workers and NATS.
	f.edges = clustertest.New[*fleetEdge](t, clustertest.Options{N: o.edges, ExtraPorts: 1, CloseTimeout: 20 * time.Second,
		ID: func(i int) string { return fmt.Sprintf("edge-%d", i+1) }})
	f.stopHealth = make(chan struct{})
	f.wg.Add(1)
	go f.healthLoop()
	if o.start == nil {
		f.edges.StartAll(f.open)
	} else {
		f.edges.StartSome(f.open, o.start...)
	}
	return f
}

// edgeConfig is the configuration of edge m, member i, as version: the
// first opts.edges edges are the bootstrap voters; an edge added later
// joins no cluster by itself (it waits for an operator's add-voter).
func (f *fleet) edgeConfig(i int, m clustertest.Member, version string) edge.Config {
	cfg := edge.DefaultConfig()
	cfg.Model = testModel
	cfg.Hostname = "127.0.0.1"
	cfg.Port = 0
	cfg.ParentHeader = parentHeader
	cfg.Scope = routing.ScopeContext
	cfg.InternalRequestAuthKey = internalKey
	cfg.AdminToken = adminToken
	cfg.DebugRouteHeader = true
	cfg.TouchInterval = 50 * time.Millisecond
	cfg.ContextServers.Router.Type = routing.RouterConversation
	cfg.GenerationServers.Router.Type = routing.RouterConversation
	// /readyz needs one healthy worker per fleet (num_instances 0), so a
	// worker restarting in a rolling upgrade does not take every edge out
	// of the load balancer.
	// Turns run back to back on an instant engine, far above an agent's
	// pace: queue-based overflow and shedding would fire by design.
	cfg.Placement.Overflow.QueuedRequests = 0
	cfg.Placement.Shed.MaxQueuedRequests, cfg.Placement.Shed.MaxBacklogSeconds = 0, 0
	cfg.Telemetry.MinStaleAfter = 2 * time.Second
	cfg.Telemetry.DownAfter = 10 * time.Second
	cfg.Leader.Interval = 50 * time.Millisecond
	cfg.NATS.URLs = []string{f.nats.ClientURL()}
	cfg.Cluster.ProposeTimeout = 2 * time.Second
	// Timeouts generous enough for a race build on a loaded machine (a
	// user restore stalls the leader's loop while it installs).
	cfg.Cluster.Raft = cluster.RaftTiming{HeartbeatTimeout: time.Second, ElectionTimeout: time.Second,
		LeaderLeaseTimeout: 500 * time.Millisecond, CommitTimeout: 2 * time.Millisecond}
	var voters []clustertest.Member // the bootstrap voters; an edge added later joins none
	if i < f.opts.edges {
		voters = f.edges.Members()[:f.opts.edges]
	}
	edgetest.Place(&cfg, m, voters)
	if f.opts.edgeConfig != nil {
		f.opts.edgeConfig(i, version, &cfg)
	}
	return cfg
}

// version is the version edge id was last started as, or starts as.
func (f *fleet) version(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v, ok := f.versions[id]; ok {
		return v
	}
	return f.opts.version
}

// open starts member i, on ln (its Raft port) and its HTTP port, as the
// version it is to run: the group's open function.
func (f *fleet) open(i int, ln net.Listener) (*fleetEdge, error) {
	m := f.edges.Member(i)
	httpLn, err := f.edges.Listener(i, 0)
	if err != nil {
		ln.Close()
		return nil, err
	}
	version := f.version(m.ID)
	deps := edge.Deps{Logger: quietLogger().With("edge", m.ID), HTTPListener: httpLn, Version: version}
	e, err := edgetest.Start(f.edgeConfig(i, m, version), deps, ln, 30*time.Second)
	if err != nil {
		return nil, err
	}
	return &fleetEdge{Member: e, i: i, id: m.ID, dataDir: m.DataDir, raftAddr: m.Addr, httpAddr: m.Extra[0], version: version}, nil
}

// healthLoop keeps each running edge's place in the traffic's rotation
// up to date from its /readyz, as a load balancer's health check would: an
// edge whose node halted takes no traffic. A freshly started edge is first
// admitted once it has heard every worker's telemetry: /readyz only needs
// one healthy worker per fleet, and an edge that has not heard the
// instance a conversation is bound to serves that turn elsewhere (an
// overflow). Readiness that waits for every instance the log holds as up
// is requested of the edge. As deploy/kubernetes' readiness probes
// (failureThreshold 3), an edge leaves the rotation after three failed
// probes in a row, not one slow answer on a loaded host. An edge leaves it
// at once when it stops: the group no longer counts it as running.
func (f *fleet) healthLoop() {
	defer f.wg.Done()
	t := time.NewTicker(25 * time.Millisecond)
	defer t.Stop()
	failed := map[*fleetEdge]int{} // consecutive failed probes per edge process
	for {
		select {
		case <-f.stopHealth:
			return
		case <-t.C:
		}
		for _, e := range f.edges.Running() {
			if !e.admitted.Load() {
				if !f.hearsAllWorkers(e) {
					continue
				}
				e.admitted.Store(true)
			}
			ok := false
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.url()+"/readyz", nil)
			if resp, err := f.client.Do(req); err == nil {
				ok = resp.StatusCode == http.StatusOK
				resp.Body.Close()
			}
			cancel()
			if ok {
				delete(failed, e)
			} else {
				failed[e]++
			}
			if ok || failed[e] >= readinessFailureThreshold {
				e.ready.Store(ok)
			}
		}
	}
}

// readinessFailureThreshold is the failed probes in a row that take an
// edge out of the rotation.
const readinessFailureThreshold = 3

// hearsAllWorkers reports whether edge e sees every worker healthy through
// its telemetry.
func (f *fleet) hearsAllWorkers(e *fleetEdge) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var ans struct {
		Instances []admin.InstanceInfo `json:"instances"`
	}
	if f.admin(ctx, e, "instances", &ans) != nil {
		return false
	}
	healthy := map[string]bool{}
	for _, in := range ans.Instances {
		healthy[in.ID] = in.Healthy && in.Telemetry
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range f.order {
		if !healthy[id] {
			return false
		}
	}
	return true
}

// serving are the edges in the traffic's rotation.
func (f *fleet) serving() []*fleetEdge {
	var out []*fleetEdge
	for _, e := range f.edges.Running() {
		if e.ready.Load() {
			out = append(out, e)
		}
	}
	return out
}

// startEdge (re)starts edge i as version.
func (f *fleet) startEdge(i int, version string) {
	f.t.Helper()
	f.mu.Lock()
	f.versions[f.edges.Member(i).ID] = version
	f.mu.Unlock()
	if _, err := f.edges.Start(i); err != nil {
		f.t.Fatal(err)
	}
}

// stopEdge closes edge i gracefully (in-flight requests finish, a leader
// hands over).
func (f *fleet) stopEdge(i int) {
	if err := f.edges.Close(i); err != nil {
		f.t.Log(err)
	}
}

// leader waits for a ready Raft leader among the running edges (one may
// be elected anew after a membership change) and returns it.
func (f *fleet) leader() *fleetEdge {
	f.t.Helper()
	return f.edges.Node(f.edges.WaitLeader(15 * time.Second))
}

// startWorker starts (or replaces, under the same instance id) a worker.
func (f *fleet) startWorker(id string, fl telemetry.Fleet, version string, mutate func(*worker.Config)) {
	f.t.Helper()
	f.mu.Lock()
	old := f.workers[id]
	f.mu.Unlock()
	if old != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := old.Close(ctx); err != nil {
			f.t.Logf("close worker %s: %v", id, err)
		}
		cancel()
	}
	cfg := worker.DefaultConfig()
	cfg.InstanceID = id
	cfg.Fleet = fl
	cfg.ServerRole = hintauth.RoleContext
	if fl == telemetry.FleetGeneration {
		cfg.ServerRole = hintauth.RoleGeneration
	}
	cfg.Hostname = "127.0.0.1"
	cfg.Port = 0
	cfg.Model = testModel
	cfg.InternalRequestAuthKey = internalKey
	cfg.ADP.EnableAttentionDP = true
	cfg.ADP.AttentionDP.ConversationAffinity = true
	cfg.ADP.AttentionDP.NewConvPlacement = "least_tokens"
	cfg.Ranks = 4
	cfg.Engine.TimeScale = 0
	cfg.TelemetryInterval = 50 * time.Millisecond
	if f.nats != nil {
		cfg.NATS.URLs = []string{f.nats.ClientURL()}
	}
	cfg.Logger = quietLogger().With("worker", id)
	cfg.Version = version
	if f.opts.workerConfig != nil {
		f.opts.workerConfig(id, &cfg)
	}
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := worker.New(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	if f.workers[id] == nil {
		f.order = append(f.order, id)
	}
	f.workers[id] = srv
	f.mu.Unlock()
}

func (f *fleet) worker(id string) *worker.Server {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.workers[id]
}

// notReady says what the fleet lacks: a leader known to every running
// edge, and every running edge seeing every worker healthy, with the
// worker's telemetry (version, hint support) as wanted, and the log
// recording it up.
func (f *fleet) notReady(wantWorker func(id string, in admin.InstanceInfo) string) string {
	if f.edges.LeaderIndex() < 0 {
		return "no leader"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f.mu.Lock()
	ids := append([]string(nil), f.order...)
	f.mu.Unlock()
	for _, s := range f.edges.Running() {
		if id, _ := s.Node().Leader(); id == "" {
			return s.id + " knows no leader"
		}
		if !s.ready.Load() {
			return s.id + " is not in the rotation (/readyz)"
		}
		var ans struct {
			Instances []admin.InstanceInfo `json:"instances"`
		}
		if err := f.admin(ctx, s, "instances", &ans); err != nil {
			return err.Error()
		}
		byID := map[string]admin.InstanceInfo{}
		for _, in := range ans.Instances {
			byID[in.ID] = in
		}
		for _, id := range ids {
			in, ok := byID[id]
			if !ok || !in.Healthy || !in.Telemetry || in.LogStatus != "up" || in.URL != f.worker(id).URL() {
				return fmt.Sprintf("%s sees %s as %+v", s.id, id, in)
			}
			if wantWorker != nil {
				if why := wantWorker(id, in); why != "" {
					return fmt.Sprintf("%s: %s: %s", s.id, id, why)
				}
			}
		}
	}
	return ""
}

func (f *fleet) waitReady(d time.Duration, wantWorker func(id string, in admin.InstanceInfo) string) {
	f.t.Helper()
	waitFor(f.t, d, "fleet ready", func() string { return f.notReady(wantWorker) })
}

// waitFor polls cond (returning "" when satisfied, else why not) until d.
var waitFor = waitfor.Reason

func (f *fleet) admin(ctx context.Context, s *fleetEdge, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url()+"/admin/v1/"+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := f.client.Do(req)
	if err != nil {
		return fmt.Errorf("admin %s on %s: %w", path, s.id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("admin %s on %s: %d %s", path, s.id, resp.StatusCode, b)
	}
	return json.Unmarshal(b, out)
}

// urls are the HTTP URLs of every edge, running or not.
func (f *fleet) urls() []string {
	var urls []string
	for _, m := range f.edges.Members() {
		urls = append(urls, memberURL(m))
	}
	return urls
}

// operatorClient is an ops/operator client for the given edges (none:
// every edge, running or not).
func (f *fleet) operatorClient(edges ...*fleetEdge) *operator.Client {
	f.t.Helper()
	urls := f.urls()
	if len(edges) > 0 {
		urls = nil
		for _, e := range edges {
			urls = append(urls, e.url())
		}
	}
	c, err := operator.New(urls, adminToken, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(c.Close)
	return c
}

// turn is one answered chat request.
type turn struct {
	edge    string
	route   string // x-tether-route: "context=ctx-1/0; generation=gen-1/2"
	attempt int
}

func (t turn) contextInstance() string { inst, _ := t.contextHop(); return inst }

func (t turn) contextHop() (instance, rank string) {
	r, _ := edge.ParseRoute(t.route)
	return r.ContextInstance, r.ContextRank
}

// chat sends one chat turn through the running edges, starting with
// edges[start % n], retrying on another edge like a load balancer or an
// agent SDK would (connection errors, 5xx, 429): at most 6 attempts with
// exponential backoff from 25ms (about 1.5s in all).
func (f *fleet) chat(start int, session, parent, user string) (turn, error) {
	body, _ := json.Marshal(map[string]any{
		"model": testModel, "max_tokens": 2,
		"messages": []map[string]string{
			{"role": "system", "content": strings.Repeat("you are a careful coding agent; ", 30)},
			{"role": "user", "content": user},
		},
	})
	var last error
	backoff := 25 * time.Millisecond
	for attempt := range 6 {
		if attempt > 0 {
			time.Sleep(backoff)
			backoff *= 2
		}
		run := f.serving()
		if len(run) == 0 {
			last = errors.New("no edge ready")
			continue
		}
		s := run[(start+attempt)%len(run)]
		req, _ := http.NewRequest(http.MethodPost, s.url()+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-session-id", session)
		if parent != "" {
			req.Header.Set(parentHeader, parent)
		}
		resp, err := f.client.Do(req)
		if err != nil {
			last = fmt.Errorf("%s via %s: %w", session, s.id, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return turn{edge: s.id, route: resp.Header.Get(edge.HeaderRoute), attempt: attempt}, nil
		}
		last = fmt.Errorf("%s via %s: HTTP %d: %s", session, s.id, resp.StatusCode, b)
		if resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests {
			return turn{}, last
		}
	}
	return turn{}, last
}

// traffic runs agent conversations (a parent and two sub-agents each) in
// the background until stopped, recording every turn's context instance
// and every request that failed after its retries.
type traffic struct {
	f       *fleet
	stop    chan struct{}
	done    chan struct{}
	turns   atomic.Int64
	retried atomic.Int64
	mu      sync.Mutex
	failed  []string
	homes   map[string]map[string]int // parent key → context instance → turns
}

func (f *fleet) startTraffic(parents int) *traffic {
	tr := &traffic{f: f, stop: make(chan struct{}), done: make(chan struct{}), homes: map[string]map[string]int{}}
	go func() {
		defer close(tr.done)
		for n := 0; ; n++ {
			select {
			case <-tr.stop:
				return
			default:
			}
			p := fmt.Sprintf("load-parent-%d", n%parents)
			session, parent := p, ""
			switch n / parents % 3 {
			case 1:
				session, parent = p+"-child-a", p
			case 2:
				session, parent = p+"-child-b", p
			}
			t, err := f.chat(n, session, parent, fmt.Sprintf("turn %d of %s", n, session))
			tr.turns.Add(1)
			tr.mu.Lock()
			if err != nil {
				tr.failed = append(tr.failed, err.Error())
			} else {
				if t.attempt > 0 {
					tr.retried.Add(1)
				}
				if tr.homes[p] == nil {
					tr.homes[p] = map[string]int{}
				}
				tr.homes[p][t.contextInstance()]++
			}
			tr.mu.Unlock()
		}
	}()
	return tr
}

// waitTurns waits until n more turns were served.
func (tr *traffic) waitTurns(t *testing.T, n int64) {
	t.Helper()
	target := tr.turns.Load() + n
	waitFor(t, 60*time.Second, fmt.Sprintf("%d more turns", n), func() string {
		if got := tr.turns.Load(); got < target {
			return fmt.Sprintf("%d of %d turns", got, target)
		}
		return ""
	})
}

func (tr *traffic) halt() {
	select {
	case <-tr.stop:
	default:
		close(tr.stop)
	}
	<-tr.done
}

func (tr *traffic) failures() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.failed...)
}

// waitBound waits until every running edge's replica holds key's binding
// on fleet fl.
func (f *fleet) waitBound(fl fsm.Fleet, key string, d time.Duration) {
	f.t.Helper()
	waitFor(f.t, d, fmt.Sprintf("%s key %q bound on every edge", fl, key), func() string {
		for _, s := range f.edges.Running() {
			if _, ok := s.state().Lookup(fl, key); !ok {
				return s.id + " has not applied its binding"
			}
		}
		return ""
	})
}

// quiesce waits until every running edge has recorded everything it owes
// the log (BackgroundPending: background events, the touch batch, its own
// Binds) and applied and archived the same index, and returns that index.
// The index must also hold across several polls: a leader duty proposes on
// its own schedule.
func (f *fleet) quiesce() uint64 {
	f.t.Helper()
	var idx uint64
	stable := 0
	waitFor(f.t, 30*time.Second, "the log to settle", func() string {
		var indexes []uint64
		for _, s := range f.edges.Running() {
			if n := s.BackgroundPending(); n > 0 {
				stable = 0
				return fmt.Sprintf("%s has %d background events to record", s.id, n)
			}
			indexes = append(indexes, s.state().Index())
		}
		for _, x := range indexes[1:] {
			if x != indexes[0] {
				stable = 0
				return fmt.Sprintf("state indexes differ: %v", indexes)
			}
		}
		if indexes[0] != idx {
			idx, stable = indexes[0], 0
			return "still moving"
		}
		// Unchanged across several polls (leader duties run every 50ms).
		if stable++; stable < 12 {
			return "settling"
		}
		return ""
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range f.edges.Running() {
		if err := s.Node().WaitArchived(ctx, idx); err != nil {
			f.t.Fatal(err)
		}
	}
	return idx
}

// copyDir copies a data directory file by file (the way an operator would
// with cp -r while the node runs; the log has settled, so no write is in
// flight).
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o700)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// closeWorkers stops every worker (in-flight requests finish).
func (f *fleet) closeWorkers() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f.mu.Lock()
	ws := make([]*worker.Server, 0, len(f.workers))
	for _, w := range f.workers {
		ws = append(ws, w)
	}
	f.mu.Unlock()
	for _, w := range ws {
		_ = w.Close(ctx)
	}
}

// close stops what the group does not: the health loop, the workers and
// NATS (the group has closed the edges by then).
func (f *fleet) close() {
	if f.stopHealth != nil {
		close(f.stopHealth)
		f.wg.Wait()
	}
	f.closeWorkers()
	if f.nats != nil {
		f.nats.Shutdown()
		f.nats.WaitForShutdown()
	}
	f.client.CloseIdleConnections()
}
