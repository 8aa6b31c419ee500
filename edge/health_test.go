package edge

import (
	"net/http"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
)

// startHealthSetup is one edge in front of one static context and one
// static generation worker started with o (fleet and role set here).
func startHealthSetup(t *testing.T, o workerOpts, mutate func(c *Config)) (*edgeCluster, *testEdge) {
	t.Helper()
	co, go_ := o, o
	co.fleet, co.role = telemetry.FleetContext, hintauth.RoleContext
	go_.fleet, go_.role = telemetry.FleetGeneration, hintauth.RoleGeneration
	cw := startWorker(t, "ctx-0", co)
	gw := startWorker(t, "gen-0", go_)
	ec := startEdges(t, 1, "", func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.ContextServers.URLs = []StaticInstance{{Name: cw.id, URL: cw.proxy.URL}}
		c.GenerationServers.URLs = []StaticInstance{{Name: gw.id, URL: gw.proxy.URL}}
		if mutate != nil {
			mutate(c)
		}
	})
	return ec, ec.edge(0)
}

// A static worker that serves /health but no /readyz (as trtllm-serve,
// vLLM and SGLang) is probed healthy and gets traffic. Before, the edge
// probed /readyz only and answered every request 503 no_healthy_instance.
func TestStaticWorkerServingOnlyHealthGetsTraffic(t *testing.T) {
	ec, te := startHealthSetup(t, workerOpts{only404: []string{"/readyz", "/healthz"}}, nil)
	ec.waitInstances(2)
	c := httpClient(t)
	r := do(t, c, http.MethodPost, te.url()+"/v1/chat/completions", oneTurn(t, "health-only"), map[string]string{"x-session-id": "health-only"})
	if r.status != http.StatusOK {
		t.Fatalf("%d %s, want 200", r.status, r.body)
	}
	if ctxInst, genInst := routeOf(t, r); ctxInst != "ctx-0" || genInst != "gen-0" {
		t.Fatalf("route %s/%s", ctxInst, genInst)
	}
}

// health_path is per fleet: a path the worker does not serve keeps its
// instances unhealthy (503 no_healthy_instance), while the other fleet
// probes its default.
func TestHealthPathPerFleet(t *testing.T) {
	_, te := startHealthSetup(t, workerOpts{}, func(c *Config) { c.ContextServers.HealthPath = "/not-served" })
	c := httpClient(t)
	waitFor(t, "generation instance healthy", 10*time.Second, func() bool {
		in, ok := te.e.Fleet().Instance("gen-0", time.Now())
		return ok && in.Healthy
	})
	r := do(t, c, http.MethodPost, te.url()+"/v1/chat/completions", oneTurn(t, "bad-path"), map[string]string{"x-session-id": "bad-path"})
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("%d %s, want 503", r.status, r.body)
	}
	if e := r.json(t)["error"].(map[string]any); e["code"] != "no_healthy_instance" {
		t.Fatalf("error %v", e)
	}
}

// health_check_model: a worker whose /v1/models does not list the edge's
// model is not ready for it; one that does is.
func TestHealthCheckModel(t *testing.T) {
	check := func(c *Config) {
		c.ContextServers.HealthCheckModel = true
		c.GenerationServers.HealthCheckModel = true
	}
	t.Run("other model", func(t *testing.T) {
		_, te := startHealthSetup(t, workerOpts{model: "another-model"}, check)
		// Probes run every 100ms: wait for a few completed rounds, then
		// the instance must still be unhealthy.
		waitFor(t, "probes counted", 10*time.Second, func() bool {
			return counter(t, te.registry, "tether_edge_probes_total", map[string]string{"result": "failed"}) >= 6
		})
		if in, ok := te.e.Fleet().Instance("ctx-0", time.Now()); !ok || in.Healthy {
			t.Fatalf("ctx-0 %+v healthy with another model", in)
		}
	})
	t.Run("served model", func(t *testing.T) {
		ec, te := startHealthSetup(t, workerOpts{}, check)
		ec.waitInstances(2)
		r := do(t, httpClient(t), http.MethodPost, te.url()+"/v1/chat/completions", oneTurn(t, "model-ok"), map[string]string{"x-session-id": "model-ok"})
		if r.status != http.StatusOK {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
}

// Rolling upgrade: a context worker of a release before the trtllm
// protocol (top-level disaggregated_params with opaque_state) still
// serves through a new edge, which gives the generation worker the old
// generation request.
func TestLegacyHandoffStillUnderstood(t *testing.T) {
	cw := startWorker(t, "ctx-0", workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext, legacyHandoff: true})
	gw := startWorker(t, "gen-0", workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration})
	ec := startEdges(t, 1, "", func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.ContextServers.URLs = []StaticInstance{{Name: cw.id, URL: cw.proxy.URL}}
		c.GenerationServers.URLs = []StaticInstance{{Name: gw.id, URL: gw.proxy.URL}}
	})
	ec.waitInstances(2)
	r := do(t, httpClient(t), http.MethodPost, ec.edge(0).url()+"/v1/chat/completions", oneTurn(t, "legacy"), map[string]string{"x-session-id": "legacy"})
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	reqs := gw.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d generation requests", len(reqs))
	}
	dp, _ := reqs[0].body["disaggregated_params"].(map[string]any)
	if dp["request_type"] != "generation_only" || dp["opaque_state"] == nil || dp["encoded_opaque_state"] != nil {
		t.Fatalf("generation request to an old-shape context's peer: %v", dp)
	}
	if reqs[0].header.Get(hintauth.HeaderDisaggAuth) != "" {
		t.Fatal("the old handoff was signed with x-trtllm-disagg-auth")
	}
}

// Conversation ids as TensorRT-LLM resolves them: Claude Code's session
// header before x-session-id, and, without any header, a client-native
// body field (Codex's prompt_cache_key).
func TestConversationIDAsTRTLLM(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	for _, c := range []struct {
		name string
		body map[string]any
		hdr  map[string]string
		want string
	}{
		{"claude code header first", nil, map[string]string{"x-session-id": "sess-1", "X-Claude-Code-Session-Id": "cc-1"}, "cc-1"},
		{"codex body field", map[string]any{"prompt_cache_key": "codex-thread-1"}, nil, "codex-thread-1"},
		{"header beats body field", map[string]any{"prompt_cache_key": "codex-thread-2"}, map[string]string{"x-session-id": "sess-2"}, "sess-2"},
	} {
		r := s.chat(t, chatBody(t, "", []string{c.name}, c.body), c.hdr)
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", c.name, r.status, r.body)
		}
		if _, ok := binding(t, s.c, s.te, fsm.FleetContext, c.want); !ok {
			t.Fatalf("%s: no context binding for %q", c.name, c.want)
		}
		reqs := s.ctx[0].requests()
		if got := reqs[len(reqs)-1].conversationID(); got != c.want {
			t.Fatalf("%s: the worker got conversation %q, want %q", c.name, got, c.want)
		}
	}
}
