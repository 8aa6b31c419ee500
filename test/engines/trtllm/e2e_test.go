package trtllm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/test/clustertest"
	"github.com/tether-project/tether/test/crosscheck"
	"github.com/tether-project/tether/test/edgetest"
	"github.com/tether-project/tether/test/natstest"
	"github.com/tether-project/tether/test/testhttp"
	"github.com/tether-project/tether/test/waitfor"
)

const (
	testModel    = "trt-model"
	testKey      = "stand-in-internal-key-0123456789"
	parentHeader = "X-Dynamo-Parent-Session-ID"
)

// standIn is one stand-in trtllm-serve on an HTTP port.
type standIn struct {
	*Server
	name string
	url  string
}

func startStandIn(t *testing.T, name, role string) *standIn {
	t.Helper()
	return startStandInWith(t, Config{Name: name, Model: testModel, Role: role, Key: testKey})
}

func startStandInWith(t *testing.T, cfg Config) *standIn {
	t.Helper()
	name := cfg.Name
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { hs.Close(); s.Close() })
	return &standIn{Server: s, name: name, url: hs.URL}
}

// startEdges starts n tether edges (a real Raft group over loopback) in
// front of the context and generation stand-ins, configured as a user
// would for trtllm-serve workers: static URLs, the shipped defaults
// (probe /health, TensorRT-LLM signatures), sub-agent affinity on.
func startEdges(t *testing.T, n int, ctx, gen []*standIn, mutate ...func(*edge.Config)) []*edge.Edge {
	t.Helper()
	g := edgetest.StartGroup(t, edgetest.GroupOptions{
		Options: clustertest.Options{N: n, ID: func(i int) string { return fmt.Sprintf("edge-%d", i+1) }, ParallelClose: true},
		Config: func(int, clustertest.Member) edge.Config {
			cfg := edge.DefaultConfig()
			cfg.Model = testModel
			cfg.Hostname, cfg.Port = "127.0.0.1", 0
			cfg.ParentHeader = parentHeader
			cfg.InternalRequestAuthKey = testKey
			cfg.DebugRouteHeader = true
			cfg.Telemetry.ProbeInterval = 100 * time.Millisecond
			cfg.ContextServers.Engine, cfg.GenerationServers.Engine = edge.EngineTRTLLM, edge.EngineTRTLLM
			for _, s := range ctx {
				cfg.ContextServers.URLs = append(cfg.ContextServers.URLs, edge.StaticInstance{Name: s.name, URL: s.url})
			}
			for _, s := range gen {
				cfg.GenerationServers.URLs = append(cfg.GenerationServers.URLs, edge.StaticInstance{Name: s.name, URL: s.url})
			}
			cfg.Cluster.ProposeTimeout = 2 * time.Second
			for _, m := range mutate {
				m(&cfg)
			}
			return cfg
		},
		Deps: func(int, clustertest.Member) edge.Deps {
			return edge.Deps{Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), Version: "test"}
		},
		StartTimeout: 20 * time.Second,
	})
	edges := edgetest.Edges(g)
	waitFor(t, "a leader and every stand-in healthy on every edge", 20*time.Second, func() bool {
		leader := false
		for _, e := range edges {
			leader = leader || e.Node().IsLeader()
			healthy := 0
			for _, in := range e.Fleet().Instances(time.Now()) {
				if in.Healthy {
					healthy++
				}
			}
			if healthy != len(ctx)+len(gen) {
				return false
			}
		}
		return leader
	})
	// /readyz: a leader known and this edge's state caught up with it.
	waitFor(t, "every edge ready (/readyz)", 20*time.Second, func() bool {
		for _, e := range edges {
			resp, err := http.Get("http://" + e.Addr() + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false
			}
		}
		return true
	})
	return edges
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	waitfor.True(t, d, what, cond)
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

// post sends one JSON request, retried while the edge answers 503 with
// Retry-After (testhttp.PostRetrying).
func post(t *testing.T, url string, body any, hdr map[string]string) answer {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	a := testhttp.PostRetrying(t, nil, url, b, hdr)
	return answer{a.Status, a.Header, a.Body}
}

// route parses x-tether-route: "context=ctx-1/-; generation=gen-0/-".
func route(t *testing.T, a answer) (ctxInst, genInst string) {
	t.Helper()
	h := a.header.Get("X-Tether-Route")
	for _, part := range strings.Split(h, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		inst, _, _ := strings.Cut(v, "/")
		switch k {
		case "context":
			ctxInst = inst
		case "generation":
			genInst = inst
		}
	}
	if ctxInst == "" || genInst == "" {
		t.Fatalf("route header %q", h)
	}
	return
}

func seenBy(servers []*standIn, conv string) (name string, seen []Seen) {
	for _, s := range servers {
		for _, x := range s.Seen() {
			if x.ConversationID == conv {
				name = s.name
				seen = append(seen, x)
			}
		}
	}
	return
}

// Three tether edges in front of trtllm-serve stand-ins in disaggregated
// mode: a parent on edge 1 and its sub-agents on edges 2 and 3 (chat,
// streaming and not, and completions) land on the parent's context
// instance (the seed contract: "the context instance stays sticky to the
// parent conversation"); the context workers verify the edges' hints with
// TensorRT-LLM's algorithm (python3, independent of tether's); the
// generation workers get the context's choices[0].disaggregated_params as
// generation_only with a valid x-trtllm-disagg-auth, and every answer is
// 200. Before, the edges never saw the stand-ins healthy (they probed
// /readyz), read the handoff from the wrong place, and signed hints in a
// format trtllm-serve refuses.
func TestThreeEdgesInFrontOfTRTLLMStandIns(t *testing.T) {
	ctx := []*standIn{startStandIn(t, "ctx-0", "context"), startStandIn(t, "ctx-1", "context")}
	gen := []*standIn{startStandIn(t, "gen-0", "generation"), startStandIn(t, "gen-1", "generation")}
	if !ctx[0].PythonVerifies() {
		if crosscheck.Required() {
			t.Fatal("python3 is not installed, and CI requires the stand-ins to check signatures with it")
		}
		t.Log("python3 not installed: the stand-ins accept signatures unchecked (counted); the routing assertions still hold")
	}
	edges := startEdges(t, 3, ctx, gen)
	url := func(i int, path string) string { return "http://" + edges[i].Addr() + path }
	system := strings.Repeat("you are a careful coding agent with tools ", 12)
	chat := func(user string, extra map[string]any) map[string]any {
		b := map[string]any{"model": testModel, "max_tokens": 6, "messages": []any{
			map[string]any{"role": "system", "content": system}, map[string]any{"role": "user", "content": user}}}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}

	parent := post(t, url(0, "/v1/chat/completions"), chat("plan the work", nil), map[string]string{"x-session-id": "parent-1"})
	if parent.status != 200 {
		t.Fatalf("parent: %d %s", parent.status, parent.body)
	}
	parentCtx, _ := route(t, parent)
	var pm struct {
		Choices []map[string]json.RawMessage `json:"choices"`
	}
	if err := json.Unmarshal(parent.body, &pm); err != nil || len(pm.Choices) != 1 || pm.Choices[0]["disaggregated_params"] != nil {
		t.Fatalf("parent answer %s", parent.body)
	}

	type child struct {
		edge   int
		id     string
		path   string
		body   map[string]any
		stream bool
	}
	children := []child{
		{1, "child-a", "/v1/chat/completions", chat("explore package routing", nil), false},
		{2, "child-b", "/v1/chat/completions", chat("read the tests", map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}}), true},
		{1, "child-c", "/v1/completions", map[string]any{"model": testModel, "max_tokens": 5, "prompt": system + " summarise"}, false},
		{2, "child-d", "/v1/completions", map[string]any{"model": testModel, "max_tokens": 5, "prompt": system + " list files",
			"stream": true, "stream_options": map[string]any{"include_usage": true}}, true},
	}
	for _, c := range children {
		a := post(t, url(c.edge, c.path), c.body, map[string]string{"x-session-id": c.id, parentHeader: "parent-1"})
		if a.status != 200 {
			t.Fatalf("%s: %d %s", c.id, a.status, a.body)
		}
		ctxInst, _ := route(t, a)
		if ctxInst != parentCtx {
			t.Fatalf("%s on context %s, its parent on %s", c.id, ctxInst, parentCtx)
		}
		if c.stream && (!bytes.Contains(a.body, []byte("data: [DONE]")) || !bytes.Contains(a.body, []byte(`"usage"`))) {
			t.Fatalf("%s stream: %s", c.id, a.body)
		}
		name, seen := seenBy(ctx, c.id)
		if name != parentCtx || len(seen) != 1 || seen[0].RequestType != "context_only" {
			t.Fatalf("%s at the context fleet: %s %+v", c.id, name, seen)
		}
		// Chat hops carry the signed parent hint, which the stand-in
		// verified (python3); completions get instance affinity only.
		wantAffinity := "parent-1"
		if c.path == "/v1/completions" {
			wantAffinity = ""
		}
		if seen[0].Affinity != wantAffinity {
			t.Fatalf("%s context hint %q, want %q", c.id, seen[0].Affinity, wantAffinity)
		}
		if c.path == "/v1/chat/completions" && seen[0].CachedTokens == 0 {
			t.Fatalf("%s found none of its parent's prompt cached: %+v", c.id, seen[0])
		}
		_, gseen := seenBy(gen, c.id)
		if len(gseen) != 1 || gseen[0].RequestType != "generation_only" || !gseen[0].DisaggAuth || gseen[0].Affinity != "" {
			t.Fatalf("%s at the generation fleet: %+v", c.id, gseen)
		}
	}
	if ctx[0].PythonVerifies() {
		for _, s := range append(append([]*standIn(nil), ctx...), gen...) {
			if s.Unverified() != 0 {
				t.Fatalf("%s accepted %d signatures unchecked", s.name, s.Unverified())
			}
		}
	}

	// trtllm-serve sends the edge no KV events: what edge 1's KV index
	// holds for the context server it sent the parent to is its shadow of
	// that server's cache (approximate), fed by the parent's prompt.
	if kv, ok := edges[0].Fleet().Index().Instance(parentCtx); !ok || !kv.Approximate || len(kv.RankBlocks) == 0 || kv.RankBlocks[0] == 0 {
		t.Fatalf("edge 1's KV index for %s: %+v (known %v), want the shadow of the parent's prompt", parentCtx, kv, ok)
	}

	// The state is replicated: the parent's binding is the same on every
	// edge's log (its Bind went to the log beside the first request, and
	// every edge applies it soon after).
	for i, e := range edges {
		waitFor(t, fmt.Sprintf("parent-1 bound to %s on edge %d", parentCtx, i+1), 20*time.Second, func() bool {
			b, ok := e.Node().State().Lookup(fsm.FleetContext, "parent-1")
			return ok && b.Instance == parentCtx
		})
	}
}

// A stand-in refuses a tampered hint as trtllm-serve does (400, its
// message); checked by python3 only.
func TestStandInRefusesTamperedSignatures(t *testing.T) {
	s := startStandIn(t, "ctx-x", "context")
	if !s.PythonVerifies() {
		crosscheck.Unavailable(t, "python3 is not installed: the stand-in cannot check signatures independently")
	}
	body := map[string]any{"model": testModel, "messages": []any{map[string]any{"role": "user", "content": "hi there"}},
		"disaggregated_params": map[string]any{"request_type": "context_only", "disagg_request_id": 5}}
	a := post(t, s.url+"/v1/chat/completions", body, map[string]string{"x-session-id": "kid",
		HeaderAffinityID: "parent", HeaderAffinityAuth: "sha256=" + strings.Repeat("0", 64)})
	if a.status != 400 || !strings.Contains(string(a.body), "Invalid internal subagent affinity authentication") {
		t.Fatalf("%d %s", a.status, a.body)
	}
}

// The trtllm-serve configuration example of docs/engines.md (its yaml
// block with engine: trtllm) is a valid edge configuration, with the probe
// and signature settings it shows.
func TestDocExampleParses(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "engines.md"))
	if err != nil {
		t.Fatal(err)
	}
	block, rest := "", string(b)
	for block == "" {
		var ok, ok2 bool
		var cand string
		_, rest, ok = strings.Cut(rest, "```yaml\n")
		cand, rest, ok2 = strings.Cut(rest, "```")
		if !ok || !ok2 {
			t.Fatal("no yaml block with engine: trtllm in docs/engines.md")
		}
		if strings.Contains(cand, "engine: trtllm") {
			block = cand
		}
	}
	t.Setenv("TETHER_INTERNAL_REQUEST_AUTH_KEY", "")
	cfg, err := edge.ParseConfig([]byte(block))
	if err != nil {
		t.Fatalf("docs/engines.md trtllm example: %v", err)
	}
	if cfg.ContextServers.HealthPath != "/health" || !cfg.ContextServers.HealthCheckModel ||
		cfg.HintSignatureFormat != "trtllm" || len(cfg.ContextServers.URLs) != 2 {
		t.Fatalf("example parsed as %+v", cfg.ContextServers)
	}
}

// A trtllm-serve that is starting (503 on every path, /health included,
// x-trtllm-server-state: starting) is not healthy for the edge, which
// places new conversations elsewhere; once it answers 200 it is back.
func TestStartingStandInIsNotHealthy(t *testing.T) {
	ctx := []*standIn{startStandIn(t, "ctx-0", "context"), startStandIn(t, "ctx-1", "context")}
	gen := []*standIn{startStandIn(t, "gen-0", "generation")}
	edges := startEdges(t, 1, ctx, gen)
	healthy := func(id string) bool {
		in, ok := edges[0].Fleet().Instance(id, time.Now())
		return ok && in.Healthy
	}
	ctx[0].SetStarting(true)
	waitFor(t, "ctx-0 unhealthy while starting", 10*time.Second, func() bool { return !healthy("ctx-0") })
	for i := range 4 {
		conv := fmt.Sprintf("conv-%d", i)
		a := post(t, "http://"+edges[0].Addr()+"/v1/chat/completions", map[string]any{"model": testModel, "max_tokens": 3,
			"messages": []any{map[string]any{"role": "user", "content": "hello " + conv}}}, map[string]string{"x-session-id": conv})
		if a.status != 200 {
			t.Fatalf("%s: %d %s", conv, a.status, a.body)
		}
		if c, _ := route(t, a); c != "ctx-1" {
			t.Fatalf("%s placed on %s while ctx-0 is starting", conv, c)
		}
	}
	ctx[0].SetStarting(false)
	waitFor(t, "ctx-0 healthy once started", 10*time.Second, func() bool { return healthy("ctx-0") })
}

// A context phase that finishes on its first token (the model emitted EOS:
// finish_reason "stop", ctx_request_id and encoded_opaque_state null) is
// the whole answer: the edge returns it, without the handoff, as
// trtllm-serve's disaggregated server does, and no generation server is
// asked. Before, the edge required ctx_request_id, retried the prefill on
// the other context server and answered 502.
func TestContextPhaseFinishingOnStopIsTheAnswer(t *testing.T) {
	ctx := []*standIn{
		startStandInWith(t, Config{Name: "ctx-0", Model: testModel, Role: "context", Key: testKey, EOSAt: 1}),
		startStandInWith(t, Config{Name: "ctx-1", Model: testModel, Role: "context", Key: testKey, EOSAt: 1}),
	}
	gen := []*standIn{startStandIn(t, "gen-0", "generation")}
	edges := startEdges(t, 1, ctx, gen)
	base := "http://" + edges[0].Addr()
	msgs := []any{map[string]any{"role": "user", "content": "say nothing at all"}}
	for _, c := range []struct {
		name, path string
		body       map[string]any
	}{
		{"chat", "/v1/chat/completions", map[string]any{"model": testModel, "max_tokens": 8, "messages": msgs}},
		{"chat-stream", "/v1/chat/completions", map[string]any{"model": testModel, "max_tokens": 8, "messages": msgs, "stream": true,
			"stream_options": map[string]any{"include_usage": true}}},
		{"completions", "/v1/completions", map[string]any{"model": testModel, "max_tokens": 8, "prompt": "say nothing"}},
	} {
		a := post(t, base+c.path, c.body, map[string]string{"x-session-id": "stop-" + c.name})
		if a.status != 200 {
			t.Fatalf("%s: %d %s", c.name, a.status, a.body)
		}
		if !bytes.Contains(a.body, []byte(`"finish_reason":"stop"`)) || bytes.Contains(a.body, []byte("disaggregated_params")) {
			t.Fatalf("%s: %s, want the context's stop answer without its handoff", c.name, a.body)
		}
		if _, seen := seenBy(ctx, "stop-"+c.name); len(seen) != 1 {
			t.Fatalf("%s: the context fleet served it %d times, want once", c.name, len(seen))
		}
	}
	if n := len(gen[0].Seen()); n != 0 {
		t.Fatalf("the generation server was asked %d times for answers the context phase completed", n)
	}
}

// needPython fails under CI, and skips elsewhere, when python3 cannot
// check the stand-ins' signatures.
func needPython(t *testing.T, s *standIn) {
	t.Helper()
	if s.PythonVerifies() {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("python3 is required in CI: the stand-ins check signatures with it")
	}
	t.Skip("python3 not installed: the stand-in cannot check signatures independently")
}

// Generation servers of a release that signs x-trtllm-disagg-auth over the
// whole disaggregated_params (model_dump) refuse the current payload (400,
// their message) and accept the edge's disagg_auth_format: trtllm-params;
// python3 checks the signatures with the release's algorithm.
func TestLegacyDisaggAuthFormat(t *testing.T) {
	legacy := func(name, role string) *standIn {
		return startStandInWith(t, Config{Name: name, Model: testModel, Role: role, Key: testKey, DisaggAuth: DisaggAuthParams})
	}
	ctx, gen := []*standIn{legacy("ctx-0", "context")}, []*standIn{legacy("gen-0", "generation")}
	needPython(t, gen[0])
	body := map[string]any{"model": testModel, "max_tokens": 4, "messages": []any{map[string]any{"role": "user", "content": "hello legacy"}}}
	current := startEdges(t, 1, ctx, gen)
	a := post(t, "http://"+current[0].Addr()+"/v1/chat/completions", body, map[string]string{"x-session-id": "legacy-1"})
	if a.status != 400 || !strings.Contains(string(a.body), "Invalid internal disaggregated request authentication") {
		t.Fatalf("current payload against a legacy release: %d %s, want its 400", a.status, a.body)
	}
	selected := startEdges(t, 1, ctx, gen, func(c *edge.Config) { c.DisaggAuthFormat = "trtllm-params" })
	a = post(t, "http://"+selected[0].Addr()+"/v1/chat/completions", body, map[string]string{"x-session-id": "legacy-2"})
	if a.status != 200 {
		t.Fatalf("disagg_auth_format trtllm-params: %d %s", a.status, a.body)
	}
	if _, seen := seenBy(gen, "legacy-2"); len(seen) != 1 || !seen[0].DisaggAuth {
		t.Fatalf("the generation server's view: %+v", seen)
	}
}

// conversation_params is validated as TensorRT-LLM's ConversationParams:
// extra fields and a null or blank conversation_id are 400s; a number is
// str()-ed, a string stripped.
func TestStandInValidatesConversationParams(t *testing.T) {
	s := startStandIn(t, "agg-0", "")
	msgs := []any{map[string]any{"role": "user", "content": "hello"}}
	for _, c := range []struct {
		params any
		status int
	}{
		{map[string]any{"conversation_id": "  c-1 "}, 200},
		{map[string]any{"conversation_id": 42}, 200},
		{map[string]any{"conversation_id": nil}, 400},
		{map[string]any{"conversation_id": "   "}, 400},
		{map[string]any{}, 400},
		{map[string]any{"conversation_id": "c", "extra": 1}, 400},
	} {
		a := post(t, s.url+"/v1/chat/completions", map[string]any{"model": testModel, "messages": msgs, "conversation_params": c.params}, nil)
		if a.status != c.status {
			t.Fatalf("conversation_params %v: %d %s, want %d", c.params, a.status, a.body, c.status)
		}
	}
	seen := s.Seen()
	if seen[0].ConversationID != "c-1" || seen[1].ConversationID != "42" {
		t.Fatalf("resolved ids %q %q", seen[0].ConversationID, seen[1].ConversationID)
	}
}

// The leader edge drains each trtllm-serve's POST /kv_cache_events (which
// hands every event out once) and shares the blocks over NATS: every edge's
// KV index holds what the context server caches, exact, and new
// conversations sharing a cached prefix land there from any edge. A
// trtllm-serve configured by URL sent the edges nothing before: each knew
// only its own shadow.
func TestLeaderDrainsAndSharesTRTLLMKVEvents(t *testing.T) {
	ns := natstest.Start(t, nil)
	withEvents := func(name string) *standIn {
		return startStandInWith(t, Config{Name: name, Model: testModel, Role: "context", Key: testKey, TokensPerBlock: 4, EventBufferMaxSize: 10000})
	}
	ctx := []*standIn{withEvents("ctx-0"), withEvents("ctx-1")}
	gen := []*standIn{startStandIn(t, "gen-0", "generation")}
	edges := startEdges(t, 3, ctx, gen, func(c *edge.Config) {
		c.NATS.URLs = []string{ns.ClientURL()}
		c.ContextServers.KVCacheEvents, c.ContextServers.BlockSize = true, 4
		c.Leader.Interval = 100 * time.Millisecond
	})
	system := strings.Repeat("you are a careful agent with tools and a plan ", 10)
	chat := func(user string) map[string]any {
		return map[string]any{"model": testModel, "max_tokens": 4, "messages": []any{
			map[string]any{"role": "system", "content": system}, map[string]any{"role": "user", "content": user}}}
	}
	a := post(t, "http://"+edges[0].Addr()+"/v1/chat/completions", chat("plan"), map[string]string{"x-session-id": "drain-parent"})
	if a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	home, _ := route(t, a)
	waitFor(t, "every edge's index to hold "+home+"'s blocks from its drained events", 15*time.Second, func() bool {
		for _, e := range edges {
			kv, ok := e.Fleet().Index().Instance(home)
			if !ok || !kv.Synced || kv.Approximate || len(kv.RankBlocks) == 0 || kv.RankBlocks[0] < 10 {
				return false
			}
			if in, _ := e.Fleet().Instance(home, time.Now()); !in.EngineEvents {
				return false
			}
		}
		return true
	})
	for c := range 4 {
		conv := fmt.Sprintf("drain-child-%d", c)
		a := post(t, "http://"+edges[1+c%2].Addr()+"/v1/chat/completions", chat("task "+conv), map[string]string{"x-session-id": conv})
		if a.status != 200 {
			t.Fatalf("%s: %d %s", conv, a.status, a.body)
		}
		if got, _ := route(t, a); got != home {
			t.Fatalf("%s sharing the cached prefix placed on %s; the prefix is cached on %s", conv, got, home)
		}
	}
}
