package edge

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/test/engines/oaiserve"
	"github.com/tether-project/tether/test/engines/sglang"
	"github.com/tether-project/tether/test/engines/vllm"
)

// startLoRAEngines is one edge in front of two vLLM stand-ins serving the
// adapters agent-a and agent-b with one adapter slot each (--max-loras 1).
func startLoRAEngines(t *testing.T, mutate func(c *Config)) (*edgeCluster, map[string]*oaiserve.Server) {
	t.Helper()
	servers := map[string]*oaiserve.Server{}
	var urls []StaticInstance
	for i := range 2 {
		srv := vllm.Start(vllm.Options{Model: testModel, PromptTokensDetails: true, MaxLoRAs: 1,
			LoRAModules: []string{"agent-a=/adapters/agent-a", "agent-b=/adapters/agent-b"}, RuntimeLoRA: true})
		t.Cleanup(srv.Close)
		name := fmt.Sprintf("vllm-%d", i)
		servers[name] = srv
		urls = append(urls, StaticInstance{Name: name, URL: srv.URL()})
	}
	ec := startEdges(t, 1, "", func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.ContextServers = ServersConfig{URLs: urls, Engine: EngineVLLM}
		c.GenerationServers = ServersConfig{}
		c.Placement.PredictTTL = time.Minute // the test's requests are one burst
		c.LoRA.Adapters = []AdapterConfig{{Name: "agent-a", Path: "/adapters/agent-a"}, {Name: "agent-b", Path: "/adapters/agent-b"}}
		if mutate != nil {
			mutate(c)
		}
	})
	ec.waitInstances(2)
	return ec, servers
}

// loraBurst sends n new conversations per adapter (distinct prompts, no
// shared prefix) and returns the adapter loads the engines made.
func loraBurst(t *testing.T, ec *edgeCluster, servers map[string]*oaiserve.Server, n int) (loads int, where map[string][]string) {
	t.Helper()
	c := httpClient(t)
	where = map[string][]string{}
	for i := range n {
		for _, a := range []string{"agent-a", "agent-b"} {
			conv := fmt.Sprintf("%s-conv-%d", a, i)
			body := chatBody(t, longText("sys-"+conv, 40), []string{"go " + conv}, map[string]any{"model": a})
			r := postChat(t, c, ec.edge(0).url(), body, map[string]string{"x-session-id": conv})
			if r.status != http.StatusOK {
				t.Fatalf("%s: %d %s", conv, r.status, r.body)
			}
			for name, srv := range servers {
				for _, sv := range srv.Served() {
					if sv.LastUser == "go "+conv {
						where[a] = append(where[a], name)
					}
				}
			}
		}
	}
	for _, srv := range servers {
		loads += srv.AdapterLoads()
	}
	return loads, where
}

// With one adapter slot per instance, new conversations of an adapter go
// where it is loaded: each adapter loads once and every conversation of it
// shares the instance. A LoRA-blind edge (the load weighs nothing) spreads
// them by bindings and load, and the engines load adapters again and again.
func TestLoRAPlacementPrefersTheInstanceHoldingTheAdapter(t *testing.T) {
	ec, servers := startLoRAEngines(t, nil)
	loads, where := loraBurst(t, ec, servers, 4)
	for a, ws := range where {
		if len(slices.Compact(slices.Clone(ws))) != 1 {
			t.Fatalf("%s conversations on %v: want one instance", a, ws)
		}
	}
	if where["agent-a"][0] == where["agent-b"][0] || loads != 2 {
		t.Fatalf("agent-a on %v, agent-b on %v, %d adapter loads; want separate instances and 2 loads", where["agent-a"], where["agent-b"], loads)
	}
	te := ec.edge(0)
	if n := counter(t, te.registry, "tether_edge_lora_placements_total", map[string]string{"loaded": "true"}); n != 6 {
		t.Fatalf("placements on an instance holding the adapter: %v, want 6 of 8", n)
	}

	blindEC, blindServers := startLoRAEngines(t, func(c *Config) { c.Placement.Weights.LoRALoad, c.Placement.Weights.LoRAFull = 0, 0 })
	blindLoads, blindWhere := loraBurst(t, blindEC, blindServers, 4)
	if blindLoads <= loads {
		t.Fatalf("LoRA-blind placement: %d loads (%v), want more than %d", blindLoads, blindWhere, loads)
	}
}

// lora.runtime_load: an adapter the engine does not list is loaded with
// POST /v1/load_lora_adapter before the request, once per instance (the
// engine then lists it with its path and parent).
func TestLoRARuntimeLoad(t *testing.T) {
	ec, servers := startLoRAEngines(t, func(c *Config) {
		c.LoRA.RuntimeLoad = true
		c.LoRA.Adapters = append(c.LoRA.Adapters, AdapterConfig{Name: "agent-r", Path: "/adapters/agent-r"})
	})
	te := ec.edge(0)
	c := httpClient(t)
	for i := range 3 {
		body := chatBody(t, longText("sys-r", 40), []string{fmt.Sprintf("runtime %d", i)}, map[string]any{"model": "agent-r"})
		if r := postChat(t, c, te.url(), body, map[string]string{"x-session-id": "conv-r"}); r.status != http.StatusOK {
			t.Fatalf("turn %d: %d %s", i, r.status, r.body)
		}
	}
	listed := 0
	for _, srv := range servers {
		r := do(t, c, http.MethodGet, srv.URL()+"/v1/models", nil, nil)
		if strings.Contains(string(r.body), `"id":"agent-r"`) && strings.Contains(string(r.body), `"root":"/adapters/agent-r"`) &&
			strings.Contains(string(r.body), `"parent":"`+testModel+`"`) {
			listed++
		}
	}
	loaded := counter(t, te.registry, "tether_edge_lora_runtime_loads_total", map[string]string{"adapter": "agent-r", "result": "loaded"})
	if listed != 1 || loaded != 1 {
		t.Fatalf("agent-r listed by %d engines, loaded %v times; want the conversation's instance, once", listed, loaded)
	}
	// Known to the edge: agent-a is registered on both engines already.
	body := chatBody(t, longText("sys-a", 40), []string{"a known one"}, map[string]any{"model": "agent-a"})
	if r := postChat(t, c, te.url(), body, nil); r.status != http.StatusOK {
		t.Fatalf("agent-a: %d %s", r.status, r.body)
	}
	if n := counter(t, te.registry, "tether_edge_lora_runtime_loads_total", map[string]string{"adapter": "agent-a", "result": "already_loaded"}); n != 1 {
		t.Fatalf("agent-a load answered %v times already_loaded, want 1", n)
	}
}

// An SGLang fleet selects an adapter by model "<base>:<adapter>" or a body
// lora_path, and runs a model naming the adapter alone on the base model
// (python/sglang/srt/entrypoints/openai/serving_base.py): the edge names
// the adapter the client asked for as SGLang reads it, and a client's own
// lora_path does not pick another adapter behind the edge's placement.
func TestLoRAOnSGLangNamesTheAdapterAsSGLangReadsIt(t *testing.T) {
	srv := sglang.Start(sglang.Options{Model: testModel, CacheReport: true, FastHealth: true,
		LoRAPaths: []string{"agent-a=/adapters/agent-a", "agent-b=/adapters/agent-b"}, MaxLoRAsPerBatch: 1})
	t.Cleanup(srv.Close)
	ec := startEdges(t, 1, "", func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.ContextServers = ServersConfig{URLs: []StaticInstance{{Name: "sglang-0", URL: srv.URL()}}, Engine: EngineSGLang}
		c.GenerationServers = ServersConfig{}
		c.LoRA.Adapters = []AdapterConfig{{Name: "agent-a", Path: "/adapters/agent-a"}, {Name: "agent-b", Path: "/adapters/agent-b"}}
	})
	ec.waitInstances(1)
	c := httpClient(t)
	body := chatBody(t, "system", []string{"sql please"}, map[string]any{"model": "agent-a", "lora_path": "agent-b"})
	r := postChat(t, c, ec.edge(0).url(), body, map[string]string{"x-session-id": "lora-sglang"})
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if !srv.HoldsAdapter(0, "agent-a") || srv.HoldsAdapter(0, "agent-b") {
		t.Fatalf("SGLang ran the request under agent-a: %v, agent-b: %v; want agent-a only", srv.HoldsAdapter(0, "agent-a"), srv.HoldsAdapter(0, "agent-b"))
	}
	// The base model's requests carry no adapter.
	r = postChat(t, c, ec.edge(0).url(), chatBody(t, "system", []string{"plain"}, map[string]any{"lora_path": "agent-b"}), nil)
	if r.status != http.StatusOK || srv.HoldsAdapter(0, "agent-b") {
		t.Fatalf("a base-model request with a client lora_path: %d %s (agent-b loaded: %v)", r.status, r.body, srv.HoldsAdapter(0, "agent-b"))
	}
}
