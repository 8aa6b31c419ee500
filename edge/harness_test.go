package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/convid"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/clustertest"
	"github.com/tether-project/tether/test/leakcheck"
	"github.com/tether-project/tether/test/metricstest"
	"github.com/tether-project/tether/test/testhttp"
	"github.com/tether-project/tether/test/waitfor"
	"github.com/tether-project/tether/worker"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

const (
	testModel     = "test-model"
	testKey       = "test-internal-key-0123456789"
	testAdmin     = "test-admin-token-0123456789"
	parentHeader  = "X-Dynamo-Parent-Session-ID"
	testBlockSize = 4
)

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("EDGE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	waitfor.True(t, timeout, what, cond)
}

// seenRequest is what a worker received, as recorded in front of it.
type seenRequest struct {
	path   string
	header http.Header
	body   map[string]any
}

func (s seenRequest) conversationID() string {
	var conv string
	if cp, ok := s.body["conversation_params"].(map[string]any); ok {
		conv, _ = cp["conversation_id"].(string)
	}
	return convid.Resolve(conv, s.header)
}

func (s seenRequest) requestType() string {
	if dp, ok := s.body["disaggregated_params"].(map[string]any); ok {
		rt, _ := dp["request_type"].(string)
		return rt
	}
	return "aggregated"
}

// testWorker is a real worker (simulated engine, TimeScale 0) behind a
// recording reverse proxy: the URL it advertises is the proxy's, so
// everything the edge sends it is observable.
type testWorker struct {
	srv   *worker.Server
	proxy *httptest.Server
	id    string

	mu   sync.Mutex
	seen []seenRequest
	// failNext makes the proxy answer 503 to this many requests.
	failNext atomic.Int32
	// gate, when set, holds inference requests until it is closed.
	gate atomic.Pointer[chan struct{}]
	// cutStream > 0 breaks the connection of the next stream after that
	// many events, as a worker that dies mid-stream.
	cutStream atomic.Int32
}

func (w *testWorker) requests() []seenRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]seenRequest(nil), w.seen...)
}

type workerOpts struct {
	fleet  telemetry.Fleet
	role   hintauth.Role
	legacy bool
	nats   string
	tp     trace.TracerProvider
	// maxSessions bounds the worker's ADP conversation bindings (0: default).
	maxSessions int
	// capacityBlocks is the KV capacity per rank (0: 4096).
	capacityBlocks int
	// ranks is the number of ADP ranks (0: 2).
	ranks int
	// only404 makes the proxy answer 404 to these paths, as an engine
	// that does not serve them (trtllm-serve has no /readyz).
	only404 []string
	// model overrides the served model (default testModel); aliases
	// are its other names.
	model   string
	aliases []string
	// legacyHandoff makes the worker answer context_only as releases
	// before the trtllm protocol did: a top-level disaggregated_params
	// with opaque_state.
	legacyHandoff bool
}

func startWorker(t testing.TB, id string, o workerOpts) *testWorker {
	t.Helper()
	tw := &testWorker{id: id}
	var target atomic.Pointer[url.URL]
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target.Load())
		},
		FlushInterval: -1,
		// Cancelled hops (a test's client going away) are expected.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	rp.ModifyResponse = func(resp *http.Response) error {
		// Only a stream takes the cut (a probe's answer in between keeps it).
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			if n := tw.cutStream.Swap(0); n > 0 {
				resp.Body = &cutBody{r: resp.Body, events: int(n)}
			}
		}
		if o.legacyHandoff {
			return toLegacyHandoff(resp)
		}
		return nil
	}
	tw.proxy = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slices.Contains(o.only404, r.URL.Path) {
			http.NotFound(w, r)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			var m map[string]any
			_ = json.Unmarshal(b, &m)
			tw.mu.Lock()
			tw.seen = append(tw.seen, seenRequest{path: r.URL.Path, header: r.Header.Clone(), body: m})
			tw.mu.Unlock()
			if g := tw.gate.Load(); g != nil {
				select {
				case <-*g:
				case <-r.Context().Done():
					return
				}
			}
			if tw.failNext.Load() > 0 && tw.failNext.Add(-1) >= 0 {
				http.Error(w, `{"error":{"message":"injected failure","type":"server_error"}}`, http.StatusServiceUnavailable)
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(tw.proxy.Close)

	cfg := worker.DefaultConfig()
	cfg.InstanceID = id
	cfg.Model = testModel
	if o.model != "" {
		cfg.Model = o.model
	}
	cfg.ModelAliases = o.aliases
	cfg.InternalRequestAuthKey = testKey
	cfg.ADP.EnableAttentionDP = true
	cfg.ADP.AttentionDP.ConversationAffinity = true
	cfg.Ranks = 2
	if o.ranks > 0 {
		cfg.Ranks = o.ranks
	}
	cfg.Engine.TimeScale = 0
	cfg.Engine.BlockSize = testBlockSize
	cfg.Engine.CapacityBlocks = 4096
	if o.capacityBlocks > 0 {
		cfg.Engine.CapacityBlocks = o.capacityBlocks
	}
	cfg.Fleet = o.fleet
	if cfg.Fleet == "" {
		cfg.Fleet = telemetry.FleetContext
	}
	cfg.ServerRole = o.role
	cfg.IgnoreSubagentHints = o.legacy
	cfg.TelemetryInterval = 50 * time.Millisecond
	cfg.AdvertiseURL = tw.proxy.URL
	cfg.Logger = testLogger(t)
	cfg.TracerProvider = o.tp
	cfg.ADP.AttentionDP.MaxSessions = o.maxSessions
	if o.nats != "" {
		cfg.NATS.URLs = []string{o.nats}
	}
	srv, err := worker.New(cfg)
	if err != nil {
		t.Fatalf("worker %s: %v", id, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatalf("worker %s start: %v", id, err)
	}
	u, _ := url.Parse("http://" + srv.Addr().String())
	target.Store(u)
	tw.srv = srv
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return tw
}

// testEdge is one edge of a test cluster.
type testEdge struct {
	e        *Edge
	cfg      Config
	raftAddr string
	httpAddr string
	registry *prometheus.Registry
}

func (te *testEdge) url() string { return "http://" + te.httpAddr }

// edgeCluster is a group of edges over loopback TCP (test/clustertest).
type edgeCluster struct {
	t     testing.TB
	g     *clustertest.Group[edgeMember]
	mu    sync.Mutex
	edges []*testEdge
	deps  func(i int) Deps
}

// edgeMember is an edge as a member of a clustertest group.
type edgeMember struct{ *Edge }

func (m edgeMember) IsLeader() bool { return m.Node().IsLeader() }

func (m edgeMember) Kill() error {
	m.Edge.Kill()
	return nil
}

// baseConfig is one edge's configuration in a test cluster.
func baseConfig(t testing.TB, nodeID, dataDir, natsURL string, peers []cluster.Peer) Config {
	cfg := DefaultConfig()
	cfg.Model = testModel
	cfg.Hostname = "127.0.0.1"
	cfg.Port = 0
	cfg.ParentHeader = parentHeader
	cfg.InternalRequestAuthKey = testKey
	cfg.AdminToken = testAdmin
	cfg.DebugRouteHeader = true
	cfg.TouchInterval = 50 * time.Millisecond
	cfg.Placement.BlockSize = testBlockSize
	cfg.Telemetry.MinStaleAfter = 2 * time.Second
	cfg.Telemetry.DownAfter = 5 * time.Second
	cfg.Telemetry.DumpTimeout = time.Second
	cfg.Leader.Interval = 100 * time.Millisecond
	if natsURL != "" {
		cfg.NATS.URLs = []string{natsURL}
	}
	cfg.Cluster = ClusterConfig{
		Settings: cluster.Settings{NodeID: nodeID, DataDir: dataDir, Bootstrap: true, Peers: peers, ProposeTimeout: 2 * time.Second, Raft: cluster.RaftTiming{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
			LeaderLeaseTimeout: 100 * time.Millisecond, CommitTimeout: 2 * time.Millisecond}},
	}
	return cfg
}

// startEdges bootstraps n edges sharing natsURL; mutate adjusts each
// configuration.
func startEdges(t testing.TB, n int, natsURL string, mutate func(i int, c *Config)) *edgeCluster {
	t.Helper()
	return startEdgesDeferred(t, n, natsURL, mutate, nil)
}

// startEdgesDeferred is startEdges with per-edge dependencies.
func startEdgesDeferred(t testing.TB, n int, natsURL string, mutate func(i int, c *Config), deps func(i int) Deps) *edgeCluster {
	t.Helper()
	ec := &edgeCluster{t: t, deps: deps}
	ec.g = clustertest.New[edgeMember](t, clustertest.Options{N: n, ID: func(i int) string { return fmt.Sprintf("edge-%d", i+1) }, ParallelClose: true})
	ms := ec.g.Members()
	peers := make([]cluster.Peer, n)
	for i, m := range ms {
		peers[i] = cluster.Peer{ID: m.ID, Addr: m.Addr}
	}
	for i, m := range ms {
		cfg := baseConfig(t, m.ID, m.DataDir, natsURL, peers)
		cfg.Cluster.BindAddr = m.Addr
		if mutate != nil {
			mutate(i, &cfg)
		}
		ec.edges = append(ec.edges, &testEdge{cfg: cfg, raftAddr: m.Addr})
	}
	ec.g.StartAll(ec.open)
	ec.leader(15 * time.Second)
	return ec
}

// add makes one more edge, id, a member (its Raft port reserved) with the
// configuration config returns for it, and starts it.
func (ec *edgeCluster) add(id string, config func(m clustertest.Member) Config) {
	ec.t.Helper()
	i, m := ec.g.Add(id)
	ec.mu.Lock()
	ec.edges = append(ec.edges, &testEdge{cfg: config(m), raftAddr: m.Addr})
	ec.mu.Unlock()
	if err := ec.start(i); err != nil {
		ec.t.Fatalf("start %s: %v", id, err)
	}
}

// open starts edge i from its configuration on ln, its Raft port.
func (ec *edgeCluster) open(i int, ln net.Listener) (edgeMember, error) {
	te := ec.edge(i)
	reg := prometheus.NewRegistry()
	deps := Deps{Logger: testLogger(ec.t).With("edge", te.cfg.Cluster.NodeID), Registry: reg, Version: "test", ClusterListener: ln}
	if ec.deps != nil {
		d := ec.deps(i)
		deps.TracerProvider = d.TracerProvider
		deps.Transport = d.Transport
	}
	e, err := New(te.cfg, deps)
	if err != nil {
		ln.Close()
		return edgeMember{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_ = e.Close(cctx)
		return edgeMember{}, err
	}
	ec.mu.Lock()
	te.e, te.registry, te.httpAddr = e, reg, e.Addr()
	ec.mu.Unlock()
	return edgeMember{e}, nil
}

// start (re)starts edge i on its Raft address, as a restarted process
// would.
func (ec *edgeCluster) start(i int) error {
	_, err := ec.g.Start(i)
	return err
}

func (ec *edgeCluster) edge(i int) *testEdge {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	return ec.edges[i]
}

// down forgets edge i's process (nil while it is down).
func (ec *edgeCluster) down(i int) {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	ec.edges[i].e = nil
}

func (ec *edgeCluster) closeAll() {
	ec.mu.Lock()
	n := len(ec.edges)
	ec.mu.Unlock()
	for i := range n {
		ec.down(i)
	}
	ec.g.CloseAll()
}

// kill stops edge i abruptly.
func (ec *edgeCluster) kill(i int) {
	ec.down(i)
	_ = ec.g.Kill(i)
}

// leader waits for a ready leader among the running edges and returns its
// index.
func (ec *edgeCluster) leader(timeout time.Duration) int {
	ec.t.Helper()
	return ec.g.WaitLeader(timeout)
}

// waitInstances waits until every running edge sees n healthy instances
// with a synced KV index.
func (ec *edgeCluster) waitInstances(n int) {
	ec.t.Helper()
	waitFor(ec.t, fmt.Sprintf("%d healthy instances on every edge", n), 15*time.Second, func() bool {
		for i := range ec.edges {
			te := ec.edge(i)
			if te.e == nil {
				continue
			}
			healthy := 0
			for _, in := range te.e.Fleet().Instances(time.Now()) {
				if in.Healthy {
					healthy++
				}
			}
			if healthy < n {
				return false
			}
		}
		return true
	})
}

func httpClient(t testing.TB) *http.Client { return testhttp.Client(t, nil) }

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response is not JSON (%v): %s", err, r.body)
	}
	return m
}

func do(t testing.TB, c *http.Client, method, u string, body []byte, headers map[string]string) response {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// chatBody is a chat request with a long shared system prompt (so prefix
// caching shows in whole blocks) and the given turns.
func chatBody(t testing.TB, system string, turns []string, extra map[string]any) []byte {
	t.Helper()
	msgs := []map[string]any{{"role": "system", "content": system}}
	for i, turn := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]any{"role": role, "content": turn})
	}
	m := map[string]any{"model": testModel, "messages": msgs, "max_tokens": 4}
	for k, v := range extra {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func longText(tag string, words int) string {
	var sb strings.Builder
	for i := range words {
		fmt.Fprintf(&sb, "%s-w%d ", tag, i)
	}
	return sb.String()
}

// routeOf parses x-tether-route into (context instance, generation instance).
func routeOf(t testing.TB, r response) (ctxInst, genInst string) {
	t.Helper()
	rt, err := ParseRoute(r.header.Get(HeaderRoute))
	if err != nil {
		t.Fatal(err)
	}
	return rt.ContextInstance, rt.GenerationInstance
}

func cachedTokens(t testing.TB, m map[string]any) int {
	t.Helper()
	u, ok := m["usage"].(map[string]any)
	if !ok {
		t.Fatalf("no usage in %v", m)
	}
	d, _ := u["prompt_tokens_details"].(map[string]any)
	n, _ := d["cached_tokens"].(float64)
	return int(n)
}

func promptTokensOf(t testing.TB, m map[string]any) int {
	t.Helper()
	u, ok := m["usage"].(map[string]any)
	if !ok {
		t.Fatalf("no usage in %v", m)
	}
	n, _ := u["prompt_tokens"].(float64)
	return int(n)
}

// counter sums a counter's (or gauge's) series whose labels include want.
func counter(t testing.TB, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	return metricstest.Sum(t, reg, name, want)
}

// adminGet calls the admin API.
func adminGet(t testing.TB, c *http.Client, te *testEdge, path string) response {
	t.Helper()
	return do(t, c, http.MethodGet, te.url()+path, nil, map[string]string{"Authorization": "Bearer " + testAdmin})
}

// binding reads key's binding from te's admin API, once te's own Bind
// proposal for it (a new key is dispatched beside it) has been answered —
// while te knows the log can commit.
func binding(t testing.TB, c *http.Client, te *testEdge, fleet fsm.Fleet, key string) (admin.BindingInfo, bool) {
	t.Helper()
	awaitOwnBind(t, te, fleet, key)
	r := adminGet(t, c, te, "/admin/v1/bindings/"+fleet.String()+"/"+url.PathEscape(key))
	if r.status == http.StatusNotFound {
		return admin.BindingInfo{}, false
	}
	if r.status != http.StatusOK {
		t.Fatalf("admin binding %s/%s: %d %s", fleet, key, r.status, r.body)
	}
	var b admin.BindingInfo
	if err := json.Unmarshal(r.body, &b); err != nil {
		t.Fatal(err)
	}
	return b, true
}

// awaitOwnBind waits until te's own Bind proposal for key (in its model's
// namespace) has been answered, or te knows the log cannot commit.
func awaitOwnBind(t testing.TB, te *testEdge, fleet fsm.Fleet, key string) {
	t.Helper()
	waitFor(t, "the Bind proposal of "+key+" answered and applied here, or the log down", 20*time.Second, func() bool {
		p, ok := te.e.placements.Pending(fleet, key)
		if !ok || te.e.proposer.Down() {
			return true
		}
		// The answer comes from the leader; this replica may apply the
		// entry later.
		st := te.e.Node().State()
		return p.Settled && (!p.Result.Found || st.Index() >= st.EpochIndex(p.Result.Binding.Epoch))
	})
}

// staticSetup is one edge in front of workers configured by URL (no NATS:
// the edge probes them).
type staticSetup struct {
	ec       *edgeCluster
	te       *testEdge
	ctx, gen []*testWorker
	c        *http.Client
}

func startStatic(t testing.TB, nCtx, nGen int, mutate func(c *Config)) *staticSetup {
	t.Helper()
	s := &staticSetup{c: httpClient(t)}
	for i := range nCtx {
		s.ctx = append(s.ctx, startWorker(t, fmt.Sprintf("ctx-%d", i), workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext}))
	}
	for i := range nGen {
		s.gen = append(s.gen, startWorker(t, fmt.Sprintf("gen-%d", i), workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration}))
	}
	s.ec = startEdges(t, 1, "", func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		for _, w := range s.ctx {
			c.ContextServers.URLs = append(c.ContextServers.URLs, StaticInstance{Name: w.id, URL: w.proxy.URL})
		}
		for _, w := range s.gen {
			c.GenerationServers.URLs = append(c.GenerationServers.URLs, StaticInstance{Name: w.id, URL: w.proxy.URL})
		}
		if mutate != nil {
			mutate(c)
		}
	})
	s.te = s.ec.edge(0)
	if nCtx > 0 && nGen > 0 {
		s.ec.waitInstances(nCtx + nGen)
	}
	return s
}

func (s *staticSetup) worker(id string) *testWorker {
	for _, w := range append(append([]*testWorker(nil), s.ctx...), s.gen...) {
		if w.id == id {
			return w
		}
	}
	return nil
}

func (s *staticSetup) chat(t testing.TB, body []byte, h map[string]string) response {
	t.Helper()
	return do(t, s.c, http.MethodPost, s.te.url()+"/v1/chat/completions", body, h)
}

// toLegacyHandoff rewrites a context_only answer into the shape of
// releases before the trtllm protocol: choices[0].disaggregated_params
// moved to the top level, encoded_opaque_state named opaque_state.
func toLegacyHandoff(resp *http.Response) error {
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	var m map[string]any
	if json.Unmarshal(b, &m) == nil {
		if cs, _ := m["choices"].([]any); len(cs) == 1 {
			c, _ := cs[0].(map[string]any)
			if dp, _ := c["disaggregated_params"].(map[string]any); dp != nil {
				delete(c, "disaggregated_params")
				delete(m, "prompt_token_ids")
				dp["opaque_state"] = dp["encoded_opaque_state"]
				delete(dp, "encoded_opaque_state")
				m["disaggregated_params"] = dp
				b, _ = json.Marshal(m)
			}
		}
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return nil
}

// cutBody passes a stream's first events, then fails as a connection
// reset would (the reverse proxy then aborts its answer to the edge).
type cutBody struct {
	r      io.ReadCloser
	events int
	seen   []byte
}

func (c *cutBody) Read(p []byte) (int, error) {
	if c.events <= 0 {
		return 0, errors.New("connection reset by the test")
	}
	n, err := c.r.Read(p)
	for i := 0; i < n; i++ {
		c.seen = append(c.seen, p[i])
		if l := len(c.seen); l >= 2 && c.seen[l-1] == '\n' && c.seen[l-2] == '\n' {
			c.seen = c.seen[:0]
			if c.events--; c.events == 0 {
				return i + 1, nil
			}
		}
	}
	return n, err
}

func (c *cutBody) Close() error { return c.r.Close() }

// awaitPlacementsApplied waits until edge i has the log's answer to every
// Bind it proposed and each edge has applied as far as edge i: the next
// request, through any edge, finds the placements committed. (Edges
// without NATS hear no placement of another edge before its commit.)
func awaitPlacementsApplied(t testing.TB, ec *edgeCluster, i int) {
	t.Helper()
	p := ec.edge(i).e.placements
	waitFor(t, fmt.Sprintf("edge-%d's Bind proposals answered", i+1), 20*time.Second, func() bool {
		return p.InFlight() == 0
	})
	want := ec.edge(i).e.node.State().Index()
	ec.mu.Lock()
	n := len(ec.edges)
	ec.mu.Unlock()
	waitFor(t, fmt.Sprintf("every edge applied up to edge-%d's index %d", i+1, want), 20*time.Second, func() bool {
		for j := range n {
			if ec.edge(j).e.node.State().Index() < want {
				return false
			}
		}
		return true
	})
}

// parseBody is an inference body of dialect d as the request path parses
// it (api.Parse: internal fields removed): the edge's request, the body's
// conversation id and the prompt's words tokens.
func parseBody(body []byte, d apireq.Dialect) (rq *route.Request, bodyConv string, tokens []uint32, aerr *api.Error) {
	p, aerr := api.Parse(body, d.Path())
	if aerr != nil {
		return nil, "", nil, aerr
	}
	return fromParsed(p), p.ConversationID, p.WordTokens(), nil
}
