package edge

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/routing/breaker"
	"github.com/tether-project/tether/test/engines/oaiserve"
	"github.com/tether-project/tether/test/engines/vllm"
	"github.com/tether-project/tether/test/natstest"
)

// An engine restarts without a word to the edges (its prefix cache is
// empty and it publishes no KV event: a vLLM configured by URL, whose cache
// the edges shadow). The KV index goes on claiming the conversations'
// prompts there; the engines' answers refute the claims. Every edge —
// including two that served none of those requests, hearing the answers
// over NATS — marks the instance degraded with reason index_disagrees,
// stops crediting its cache in placement, and says so in its metrics and
// /admin/v1/instances; once the index agrees with the engine again, the
// instance recovers everywhere.
func TestStaleIndexIsDegradedOnEveryEdgeAndRecovers(t *testing.T) {
	const blockSize = 16
	ns := natstest.Start(t, nil)
	servers := map[string]*oaiserve.Server{}
	var urls []StaticInstance
	for _, name := range []string{"eng-a", "eng-b"} {
		srv := vllm.Start(vllm.Options{Model: testModel, PromptTokensDetails: true})
		t.Cleanup(srv.Close)
		servers[name] = srv
		urls = append(urls, StaticInstance{Name: name, URL: srv.URL()})
	}
	ec := startEdges(t, 3, ns.ClientURL(), func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.Placement.BlockSize = blockSize
		c.Placement.Breaker.Cooldown = time.Hour // recovery by agreement, not by a half-open retry
		c.ContextServers = ServersConfig{URLs: urls, Engine: EngineVLLM, KVShadowBlocks: config.DefaultKVShadowBlocks}
		c.GenerationServers = ServersConfig{}
	})
	ec.waitInstances(2)
	hc := httpClient(t)
	for i := range 3 {
		te := ec.edge(i)
		waitFor(t, fmt.Sprintf("edge %d ready with the engines' KV capacity", i), 15*time.Second, func() bool {
			for name := range servers {
				if in, ok := te.e.fleet.Instance(name, time.Now()); !ok || in.RankKVTokens <= 0 || !in.Healthy {
					return false
				}
			}
			return do(t, hc, http.MethodGet, te.url()+"/readyz", nil, nil).status == http.StatusOK
		})
	}

	// Twelve conversations sharing a long system prompt, two turns each,
	// all through edge 0: KV-aware placement puts them together (the
	// shared prefix), and edge 0's shadow holds their prompts.
	const convs = 12
	system := longText("stale-sys", 150)
	turn := func(c, n int) []string {
		var out []string
		for i := 1; i <= n; i++ {
			if i > 1 {
				out = append(out, fmt.Sprintf("reply c%d t%d", c, i-1))
			}
			out = append(out, fmt.Sprintf("stale c%d turn %d %s", c, i, longText(fmt.Sprintf("c%dt%d", c, i), 40)))
		}
		return out
	}
	send := func(edge, c, n int) string {
		t.Helper()
		r := do(t, hc, http.MethodPost, ec.edge(edge).url()+"/v1/chat/completions", chatBody(t, system, turn(c, n), nil),
			map[string]string{"x-session-id": fmt.Sprintf("stale-conv-%d", c)})
		if r.status != http.StatusOK {
			t.Fatalf("conversation %d turn %d: %d %s", c, n, r.status, r.body)
		}
		inst, _ := routeOf(t, r)
		return inst
	}
	homes := map[string]int{}
	for n := 1; n <= 2; n++ {
		for c := range convs {
			homes[send(0, c, n)]++
		}
	}
	home := "eng-a"
	if homes["eng-b"] > homes["eng-a"] {
		home = "eng-b"
	}
	if homes[home] != 2*convs {
		t.Fatalf("the conversations did not share an instance: %v (the test needs them on one)", homes)
	}
	if b, ok := binding(t, hc, ec.edge(0), fsm.FleetContext, "stale-conv-1"); !ok || b.Policy != routing.PolicyKVAware {
		t.Fatalf("the second conversation was not placed for the cached system prompt: %+v", b)
	}
	status := func(i int) (breaker.State, breaker.Reason, breaker.Accuracy) {
		in, ok := ec.edge(i).e.fleet.Instance(home, time.Now())
		if !ok {
			t.Fatalf("edge %d does not know %s", i, home)
		}
		return in.Breaker, in.BreakerReason, in.Accuracy
	}
	// Every edge graded the index's claims (edge 0's answers, told to the
	// others): confirmed, nothing degraded. (The very first answer is not
	// graded: nothing was cached and vLLM then writes no
	// prompt_tokens_details, which says nothing until the engine has shown
	// it reports them.)
	for i := range 3 {
		waitFor(t, fmt.Sprintf("edge %d heard the answers", i), 10*time.Second, func() bool {
			_, _, a := status(i)
			return a.Graded == 2*convs-1
		})
		if st, _, a := status(i); st != breaker.Closed || a.Confirmed != a.Claims || a.Claims < convs {
			t.Fatalf("edge %d before the restart: breaker %v, accuracy %+v", i, st, a)
		}
	}

	// The engine restarts: an empty cache, no event.
	servers[home].FlushCache()
	restarted := time.Now()
	for c := range convs {
		if got := send(0, c, 3); got != home {
			t.Fatalf("conversation %d turn 3 went to %s: bound keys stay", c, got)
		}
	}
	for i := range 3 {
		waitFor(t, fmt.Sprintf("edge %d: %s degraded (index_disagrees)", i, home), 30*time.Second, func() bool {
			st, r, _ := status(i)
			return st == breaker.Open && r == breaker.ReasonIndexDisagrees
		})
	}
	t.Logf("degraded on every edge %v after the restart (12 refuted claims through edge 0)", time.Since(restarted).Round(time.Millisecond))

	// Every edge says why, and none credits the instance's cache.
	for i := range 3 {
		te := ec.edge(i)
		info, _ := instanceInfo(t, hc, te, home)
		if !info.Degraded || info.BreakerReason != "index_disagrees" || info.Breaker != "open" ||
			info.IndexAccuracy.Source != admin.KVSourceShadow && i == 0 || info.IndexAccuracy.Claims < 10 ||
			2*info.IndexAccuracy.ConfirmedClaims >= info.IndexAccuracy.Claims {
			t.Fatalf("edge %d /admin/v1/instances %s: %+v", i, home, info)
		}
		if got := counter(t, te.registry, "tether_edge_instance_cache_degraded", map[string]string{"instance": home, "reason": "index_disagrees"}); got != 1 {
			t.Fatalf("edge %d tether_edge_instance_cache_degraded = %v", i, got)
		}
		if !routingView(t, te, home).CacheDegraded {
			t.Fatalf("edge %d still credits %s's cache", i, home)
		}
	}
	// Edge 0's index claims the shared system prompt on the instance (the
	// engine computed it again since), but a new conversation is not
	// credited for it: placed by load.
	r := do(t, hc, http.MethodPost, ec.edge(0).url()+"/v1/chat/completions", chatBody(t, system, []string{"a new conversation"}, nil),
		map[string]string{"x-session-id": "stale-new"})
	if r.status != http.StatusOK {
		t.Fatalf("new conversation: %d %s", r.status, r.body)
	}
	b, ok := binding(t, hc, ec.edge(0), fsm.FleetContext, "stale-new")
	claimed := false
	for _, c := range b.Candidates {
		claimed = claimed || c.Instance == home && c.CachedTokens > 0
	}
	if !ok || b.Policy == routing.PolicyKVAware || !claimed {
		t.Fatalf("a new conversation while %s is degraded: %+v (want the index's claim on it, not credited)", home, b)
	}

	// The index agrees again (the shadow corrected itself from the
	// answers; the engine holds what it computed since): confirmed claims
	// close the breaker on every edge.
	for n := 4; n <= 5; n++ {
		for c := range convs {
			send(0, c, n)
		}
	}
	for i := range 3 {
		waitFor(t, fmt.Sprintf("edge %d: %s recovered", i, home), 30*time.Second, func() bool {
			st, _, _ := status(i)
			return st == breaker.Closed
		})
		info, _ := instanceInfo(t, hc, ec.edge(i), home)
		if info.Degraded || info.BreakerReason != "" || routingView(t, ec.edge(i), home).CacheDegraded {
			t.Fatalf("edge %d after recovery: %+v", i, info)
		}
		if got := counter(t, ec.edge(i).registry, "tether_edge_instance_cache_degraded", map[string]string{"instance": home}); got != 0 {
			t.Fatalf("edge %d still reports %s degraded: %v", i, home, got)
		}
	}
	// Only edge 0 served: its counters hold the answers; the others'
	// hold none of their own.
	if got := counter(t, ec.edge(0).registry, "tether_edge_index_claims_total", map[string]string{"instance": home, "result": "refuted"}); got < 10 {
		t.Fatalf("edge 0 refuted claims: %v", got)
	}
	if got := counter(t, ec.edge(1).registry, "tether_edge_index_answers_total", nil); got != 0 {
		t.Fatalf("edge 1 counted %v answers of its own", got)
	}
}

// routingView is the routing view te's decisions read of instance id.
func routingView(t *testing.T, te *testEdge, id string) routing.InstanceView {
	t.Helper()
	for _, v := range te.e.fleet.Views(time.Now(), nil) {
		if v.ID == id {
			return v
		}
	}
	t.Fatalf("no routing view of %s", id)
	return routing.InstanceView{}
}
