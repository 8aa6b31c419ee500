package edge

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/natstest"
)

// The admin API: nothing without the bearer token; the cluster, binding,
// history, instance, hash and snapshot shapes with it.
func TestAdminAPI(t *testing.T) {
	s := startStatic(t, 1, 1, func(c *Config) { c.MaxBindings = 5000 })
	a := &agent{session: "admin-conv", system: longText("admin", 24)}
	first := a.send(t, s.c, s.te, "one", nil)

	for _, h := range []map[string]string{nil, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": testAdmin}} {
		for _, path := range []string{"/admin/v1/cluster", "/admin/v1/bindings/context/admin-conv", "/admin/v1/snapshot"} {
			r := do(t, s.c, http.MethodGet, s.te.url()+path, nil, h)
			if r.status != http.StatusUnauthorized || bytes.Contains(r.body, []byte("admin-conv")) || r.header.Get(admin.HeaderSnapshotHash) != "" {
				t.Fatalf("GET %s with %v: %d %s", path, h, r.status, r.body)
			}
		}
		r := do(t, s.c, http.MethodPost, s.te.url()+"/admin/v1/raft/remove-peer", []byte(`{"id":"edge-1"}`), h)
		if r.status != http.StatusUnauthorized {
			t.Fatalf("POST remove-peer with %v: %d", h, r.status)
		}
	}

	var cl map[string]any
	waitFor(t, "cluster feature level and max_bindings committed", 10*time.Second, func() bool {
		r := adminGet(t, s.c, s.te, "/admin/v1/cluster")
		cl = r.json(t)
		return cl["feature_level"] == float64(fsm.FeatureLevelMax) && cl["max_bindings"] == float64(5000)
	})
	for _, k := range []string{"leader", "leader_addr", "node_id", "peers", "applied_index", "state_hash", "feature_level", "term"} {
		if _, ok := cl[k]; !ok {
			t.Fatalf("cluster info lacks %q: %v", k, cl)
		}
	}
	if cl["leader"] != "edge-1" || cl["node_id"] != "edge-1" || len(cl["peers"].([]any)) != 1 || cl["state_hash"] == "" {
		t.Fatalf("cluster info %v", cl)
	}

	b, ok := binding(t, s.c, s.te, fsm.FleetContext, "admin-conv")
	if !ok || b.Instance != first.ctxInst || b.ConversationID != "admin-conv" || b.Edge != "edge-1" || b.Epoch == 0 ||
		b.Policy == "" || len(b.Candidates) == 0 || b.BoundAt.IsZero() {
		t.Fatalf("binding %+v", b)
	}
	// A sticky turn is touched through the log: last_used advances.
	a.send(t, s.c, s.te, "two", nil)
	// Each instance's working set, as placement weighs it: the one
	// conversation sent there within the window (checked at once: the
	// window is two minutes).
	var ws struct {
		Instances []admin.InstanceInfo `json:"instances"`
	}
	if err := json.Unmarshal(adminGet(t, s.c, s.te, "/admin/v1/instances").body, &ws); err != nil {
		t.Fatal(err)
	}
	for _, in := range ws.Instances {
		if in.WorkingSet.Conversations != 1 || in.WorkingSet.Blocks <= 0 {
			t.Fatalf("%s (%s): working set %+v, want admin-conv's", in.ID, in.Fleet, in.WorkingSet)
		}
	}
	if len(ws.Instances) != 2 {
		t.Fatalf("instances %+v, want the context and the generation instance", ws.Instances)
	}
	waitFor(t, "last_used to advance", 30*time.Second, func() bool {
		nb, _ := binding(t, s.c, s.te, fsm.FleetContext, "admin-conv")
		return nb.LastUsed.After(b.LastUsed)
	})
	if r := adminGet(t, s.c, s.te, "/admin/v1/bindings/context/never-seen"); r.status != http.StatusNotFound {
		t.Fatalf("unknown binding: %d %s", r.status, r.body)
	}
	if r := adminGet(t, s.c, s.te, "/admin/v1/bindings/nowhere/x"); r.status != http.StatusBadRequest {
		t.Fatalf("unknown fleet: %d %s", r.status, r.body)
	}

	var hist struct {
		Fleet, Key string
		Events     []historyEntry `json:"events"`
	}
	if err := json.Unmarshal(adminGet(t, s.c, s.te, "/admin/v1/bindings/context/admin-conv/history").body, &hist); err != nil {
		t.Fatal(err)
	}
	types := map[string]bool{}
	for _, ev := range hist.Events[min(1, len(hist.Events)):] {
		types[ev.Type] = true
	}
	// After the Bind: the sticky turn's Touch and (feature level 2) the
	// worker's rank, recorded off the request path.
	if len(hist.Events) < 2 || hist.Events[0].Type != "Bind" || hist.Events[0].Event.Decision.Edge != "edge-1" ||
		hist.Events[0].Index == 0 || hist.Events[0].Time.IsZero() || !types["Touch"] {
		t.Fatalf("history %+v", hist.Events)
	}
	waitFor(t, "the binding's rank", 30*time.Second, func() bool {
		nb, _ := binding(t, s.c, s.te, fsm.FleetContext, "admin-conv")
		return nb.Rank != nil
	})

	var inst struct {
		Instances []admin.InstanceInfo `json:"instances"`
	}
	waitFor(t, "instances up in the log", 30*time.Second, func() bool {
		if err := json.Unmarshal(adminGet(t, s.c, s.te, "/admin/v1/instances").body, &inst); err != nil {
			t.Fatal(err)
		}
		up := 0
		for _, in := range inst.Instances {
			if in.LogStatus == "up" && in.Healthy {
				up++
			}
		}
		return up == 2
	})
	// Workers configured by URL without NATS send no KV events: the
	// edge's index holds only its own predictions for them.
	for _, in := range inst.Instances {
		if kv := in.KV; kv.Source != admin.KVSourcePredictionsOnly || kv.Blocks != 0 || kv.LastSeq != 0 || kv.Approximate {
			t.Fatalf("%s: kv %+v, want predictions only", in.ID, kv)
		}
	}

	// The hash at an exact index, after the state moved past it.
	st := s.te.e.Node().State()
	if _, err := s.te.e.Node().Propose(context.Background(), fsm.Annotation{Source: "test", Text: "move the state on"}); err != nil {
		t.Fatal(err)
	}
	want := st.Hash()
	hr := adminGet(t, s.c, s.te, "/admin/v1/state/hash?index="+strconv.FormatUint(st.Index(), 10)).json(t)
	if hr["index"].(float64) != float64(st.Index()) || hr["hash"] != hex.EncodeToString(want[:]) || hr["exact"] != true {
		t.Fatalf("state hash at %d: %v, want %x", st.Index(), hr, want)
	}
	if cur := adminGet(t, s.c, s.te, "/admin/v1/state/hash").json(t); cur["index"].(float64) <= float64(st.Index()) || cur["exact"] != nil || cur["bindings"] == nil {
		t.Fatalf("current state hash %v", cur)
	}
	if r := adminGet(t, s.c, s.te, "/admin/v1/state/hash?index=x"); r.status != http.StatusBadRequest {
		t.Fatalf("bad index: %d", r.status)
	}

	snap := adminGet(t, s.c, s.te, "/admin/v1/snapshot")
	if snap.status != http.StatusOK || len(snap.body) == 0 || snap.header.Get(admin.HeaderSnapshotIndex) == "" ||
		snap.header.Get(admin.HeaderSnapshotTerm) == "" || len(snap.header.Get(admin.HeaderSnapshotHash)) != 64 {
		t.Fatalf("snapshot: %d headers %v (%d bytes)", snap.status, snap.header, len(snap.body))
	}
	r := do(t, s.c, http.MethodPost, s.te.url()+"/admin/v1/snapshot/restore", snap.body, map[string]string{"Authorization": "Bearer " + testAdmin})
	if r.status != http.StatusOK {
		t.Fatalf("restore: %d %s", r.status, r.body)
	}
	if _, ok := binding(t, s.c, s.te, fsm.FleetContext, "admin-conv"); !ok {
		t.Fatal("the binding is gone after restoring the snapshot that holds it")
	}
	r = do(t, s.c, http.MethodPost, s.te.url()+"/admin/v1/snapshot/restore", []byte("not a snapshot"), map[string]string{"Authorization": "Bearer " + testAdmin})
	if r.status != http.StatusBadRequest {
		t.Fatalf("restore garbage: %d %s", r.status, r.body)
	}
	r = do(t, s.c, http.MethodPost, s.te.url()+"/admin/v1/raft/add-voter", []byte(`{"id":"x"}`), map[string]string{"Authorization": "Bearer " + testAdmin})
	if r.status != http.StatusBadRequest {
		t.Fatalf("add-voter without addr: %d %s", r.status, r.body)
	}
	if r := adminGet(t, s.c, s.te, "/admin/v1/raft/remove-peer"); r.status != http.StatusMethodNotAllowed {
		t.Fatalf("GET remove-peer: %d", r.status)
	}
}

// Leader duty: an idle binding is evicted after session_ttl.
func TestLeaderSweepsIdleBindings(t *testing.T) {
	s := startStatic(t, 1, 1, func(c *Config) { c.SessionTTL = 400 * time.Millisecond })
	a := &agent{session: "ttl-conv", system: longText("ttl", 24)}
	a.send(t, s.c, s.te, "one", nil)
	// Dispatched beside its Bind: the sweep evicts a binding, so the Bind
	// must have been answered first.
	waitFor(t, "the conversation's Bind answered", 10*time.Second, func() bool { return s.te.e.placements.InFlight() == 0 })
	waitFor(t, "the idle binding evicted", 10*time.Second, func() bool {
		_, ok := binding(t, s.c, s.te, fsm.FleetContext, "ttl-conv")
		return !ok
	})
	var hist struct {
		Events []historyEntry `json:"events"`
	}
	_ = json.Unmarshal(adminGet(t, s.c, s.te, "/admin/v1/bindings/context/ttl-conv/history").body, &hist)
	last := hist.Events[len(hist.Events)-1]
	if last.Type != "Evict" || last.Event.Reason != "ttl" || last.Status != "applied" {
		t.Fatalf("last history event %+v", last)
	}
}

// Leader duty: an instance that stops answering is recorded down after
// telemetry.down_after, which evicts its bindings.
func TestLeaderRecordsDeadInstanceDown(t *testing.T) {
	s := startStatic(t, 2, 1, func(c *Config) {
		// Generous against a loaded machine: the surviving instance's
		// probes must not lapse.
		c.Telemetry.MinStaleAfter = time.Second
		c.Telemetry.DownAfter = 1500 * time.Millisecond
	})
	b := &agent{session: "down-conv", system: longText("down", 24)}
	r := b.send(t, s.c, s.te, "one", nil)
	victim := s.worker(r.ctxInst)
	victim.proxy.Close()
	waitFor(t, "the dead instance recorded down", 10*time.Second, func() bool {
		in, ok := s.te.e.Node().State().Instance(victim.id)
		return ok && in.Status == fsm.InstanceDown
	})
	if _, ok := s.te.e.Node().State().Lookup(fsm.FleetContext, "down-conv"); ok {
		t.Fatal("the down instance's binding survived")
	}
	if ev := s.te.e.Node().State().Counters().Evictions[fsm.EvictInstanceRemoved]; ev < 1 {
		t.Fatalf("instance_removed evictions %d", ev)
	}
	// The conversation continues on the surviving instance.
	r2 := b.send(t, s.c, s.te, "two", nil)
	if r2.ctxInst == victim.id {
		t.Fatal("routed to the dead instance")
	}
}

// A worker whose telemetry says it cannot verify hints (legacy) gets no
// hint headers; the sub-agent still lands on its parent's instance.
func TestLegacyWorkerGetsNoHint(t *testing.T) {
	ns := natstest.Start(t, nil)
	legacy := startWorker(t, "ctx-legacy", workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext, legacy: true, nats: ns.ClientURL()})
	startWorker(t, "gen-0", workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration, nats: ns.ClientURL()})
	ec := startEdges(t, 1, ns.ClientURL(), nil)
	ec.waitInstances(2)
	te, c := ec.edge(0), httpClient(t)
	waitFor(t, "the legacy worker's telemetry", 5*time.Second, func() bool {
		in, ok := te.e.Fleet().Instance("ctx-legacy", time.Now())
		return ok && in.Telemetry && !in.VerifiesHints
	})
	p := &agent{session: "legacy-root", system: longText("legacy", 24)}
	p.send(t, c, te, "one", nil)
	ch := &agent{session: "legacy-child", parent: "legacy-root", system: longText("legacy-c", 24)}
	r := ch.send(t, c, te, "one", nil)
	if r.ctxInst != "ctx-legacy" {
		t.Fatalf("child on %s", r.ctxInst)
	}
	for _, seen := range legacy.requests() {
		if seen.header.Get(hintauth.HeaderAffinityID) != "" || seen.header.Get(hintauth.HeaderAffinityAuth) != "" {
			t.Fatalf("the legacy worker received a hint for %s", seen.conversationID())
		}
	}
}

// One trace: the edge's server span, its routing-decision spans, and the
// context and generation workers' spans all share the trace id, and each
// worker span is a child of the edge's hop span.
func TestTraceSpansAcrossHops(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctxW := startWorker(t, "ctx-0", workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext, tp: tp})
	genW := startWorker(t, "gen-0", workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration, tp: tp})
	s := &staticSetup{c: httpClient(t), ctx: []*testWorker{ctxW}, gen: []*testWorker{genW}}
	s.ec = startEdgesWithDeps(t, func(c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.ContextServers.URLs = []StaticInstance{{Name: "ctx-0", URL: ctxW.proxy.URL}}
		c.GenerationServers.URLs = []StaticInstance{{Name: "gen-0", URL: genW.proxy.URL}}
	}, Deps{TracerProvider: tp})
	s.te = s.ec.edge(0)
	s.ec.waitInstances(2)
	// A client trace to continue.
	clientCtx, clientSpan := tp.Tracer("client").Start(context.Background(), "client call")
	h := map[string]string{"x-session-id": "traced", "traceparent": traceparent(clientSpan.SpanContext())}
	r := s.chat(t, oneTurn(t, "trace"), h)
	clientSpan.End()
	_ = clientCtx
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	tid := clientSpan.SpanContext().TraceID()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	var edgeServer, route, workerCtx, workerGen sdktrace.ReadOnlySpan
	waitFor(t, "the spans to end", 5*time.Second, func() bool {
		edgeServer, route, workerCtx, workerGen = nil, nil, nil, nil
		for _, sp := range rec.Ended() {
			byID[sp.SpanContext().SpanID()] = sp
			attrs := spanAttrs(sp)
			switch {
			case sp.Name() == "tether.edge /v1/chat/completions":
				edgeServer = sp
			case sp.Name() == "tether.edge route context":
				route = sp
			case sp.SpanKind() == trace.SpanKindServer && attrs["tether.instance"] == "ctx-0":
				workerCtx = sp
			case sp.SpanKind() == trace.SpanKindServer && attrs["tether.instance"] == "gen-0":
				workerGen = sp
			}
		}
		return edgeServer != nil && route != nil && workerCtx != nil && workerGen != nil
	})
	for _, sp := range []sdktrace.ReadOnlySpan{edgeServer, route, workerCtx, workerGen} {
		if sp.SpanContext().TraceID() != tid {
			t.Fatalf("span %s has trace %s, want the client's %s", sp.Name(), sp.SpanContext().TraceID(), tid)
		}
	}
	if edgeServer.Parent().SpanID() != clientSpan.SpanContext().SpanID() {
		t.Fatal("the edge span does not continue the client's traceparent")
	}
	attrs := spanAttrs(route)
	if attrs["tether.instance"] != "ctx-0" || attrs["tether.policy"] == "" || attrs["tether.routing_key.kind"] != "conversation" ||
		attrs["tether.outcome"] != routing.OutcomeNewBind || attrs["tether.cached_tokens"] == "" || attrs["tether.rank"] == "" {
		t.Fatalf("routing span attributes %v", attrs)
	}
	for _, w := range []sdktrace.ReadOnlySpan{workerCtx, workerGen} {
		hop, ok := byID[w.Parent().SpanID()]
		if !ok || hop.Parent().SpanID() != edgeServer.SpanContext().SpanID() {
			t.Fatalf("worker span %s's parent is not an edge hop span under the edge's server span", w.Name())
		}
	}
}

func spanAttrs(sp sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, kv := range sp.Attributes() {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

func traceparent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
}

// startEdgesWithDeps is a one-edge cluster with extra dependencies.
func startEdgesWithDeps(t testing.TB, mutate func(c *Config), d Deps) *edgeCluster {
	t.Helper()
	ec := startEdgesDeferred(t, 1, "", func(_ int, c *Config) { mutate(c) }, func(int) Deps { return d })
	return ec
}

// historyEntry is an element of a key's history as the tests read it: the
// event's fields typed as far as the tests look.
type historyEntry struct {
	admin.HistoryEntry
	Event struct {
		Reason   string           `json:"reason"`
		Decision fsm.DecisionJSON `json:"decision"`
	} `json:"event"`
}
