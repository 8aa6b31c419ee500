package agentapi

import (
	"strings"
	"testing"

	"github.com/tether-project/tether/ops/devstack"
)

// Proxy workers in front of engines that serve the agents' APIs
// themselves (tether dev --engine-events vllm: simulated engines behind
// tether worker proxies) relay Messages and Responses untouched, and a
// stored response, held by the engine behind one rank of one proxy, is
// continued and read back through any edge.
func TestAgentAPIsThroughProxyWorkers(t *testing.T) {
	st := startStack(t, devstack.Options{Edges: 3, EngineEvents: devstack.EngineEventsVLLM, Ranks: 2})
	e := st.Edges()
	model := st.Model()
	r := do(t, "POST", e[0].URL()+"/v1/messages", map[string]any{"model": model, "max_tokens": 8, "system": words("p", 80),
		"messages": []any{map[string]any{"role": "user", "content": "hello"}}, "stream": true}, map[string]string{"x-claude-code-session-id": "px-cc"})
	if r.status != 200 || !strings.Contains(string(r.body), "event: message_stop") {
		t.Fatalf("messages: %d %s", r.status, r.body)
	}
	r = do(t, "POST", e[1].URL()+"/v1/responses", map[string]any{"model": model, "input": "first " + words("q", 80)}, nil)
	var first respObj
	decode(t, r.body, &first)
	_, gen := route(t, r)
	if r.status != 200 || first.ID == "" {
		t.Fatalf("responses: %d %s", r.status, r.body)
	}
	for i := range 3 {
		r = do(t, "POST", e[(i+2)%3].URL()+"/v1/responses", map[string]any{"model": model, "input": "next", "previous_response_id": first.ID, "stream": i == 1}, nil)
		if _, g := route(t, r); r.status != 200 || g != gen {
			t.Fatalf("continuation %d: %d on %s (stored on %s) %s", i, r.status, g, gen, r.body)
		}
		g := do(t, "GET", e[i].URL()+"/v1/responses/"+first.ID, nil, nil)
		var back respObj
		decode(t, g.body, &back)
		if g.status != 200 || back.ID != first.ID {
			t.Fatalf("GET via %s: %d %s", e[i].ID, g.status, g.body)
		}
	}
}
