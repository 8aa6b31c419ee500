package edge

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
)

const secondModel = "test-model-b"

// startTwoModels is one edge in front of two models, each on its own
// static context and generation worker; the first model has the adapter
// agent-a, the second agent-b.
func startTwoModels(t *testing.T) (*edgeCluster, map[string]*testWorker) {
	t.Helper()
	ws := map[string]*testWorker{
		"ctx-a": startWorker(t, "ctx-a", workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext}),
		"gen-a": startWorker(t, "gen-a", workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration}),
		"ctx-b": startWorker(t, "ctx-b", workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext, model: secondModel}),
		"gen-b": startWorker(t, "gen-b", workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration, model: secondModel}),
	}
	ec := startEdges(t, 1, "", func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.ContextServers.URLs = []StaticInstance{{Name: "ctx-a", URL: ws["ctx-a"].proxy.URL}}
		c.GenerationServers.URLs = []StaticInstance{{Name: "gen-a", URL: ws["gen-a"].proxy.URL}}
		c.LoRA.Adapters = []AdapterConfig{{Name: "agent-a", Path: "/adapters/agent-a"}}
		d := DefaultConfig()
		m := ModelConfig{Name: secondModel, ContextServers: d.ContextServers, GenerationServers: d.GenerationServers}
		m.ContextServers.URLs = []StaticInstance{{Name: "ctx-b", URL: ws["ctx-b"].proxy.URL}}
		m.GenerationServers.URLs = []StaticInstance{{Name: "gen-b", URL: ws["gen-b"].proxy.URL}}
		m.LoRA.Adapters = []AdapterConfig{{Name: "agent-b"}}
		c.Models = []ModelConfig{m}
	})
	ec.waitInstances(4)
	return ec, ws
}

// Each model's requests go to its own fleets; one session id on two models
// is two bindings, and the admin API names each binding's model.
func TestTwoModelsRouteToTheirOwnFleets(t *testing.T) {
	ec, _ := startTwoModels(t)
	te := ec.edge(0)
	c := httpClient(t)
	for _, x := range []struct{ model, ctx, gen string }{{testModel, "ctx-a", "gen-a"}, {secondModel, "ctx-b", "gen-b"}} {
		for turn := range 2 {
			body := chatBody(t, longText("sys", 40), []string{"turn " + string(rune('0'+turn))}, map[string]any{"model": x.model})
			r := do(t, c, http.MethodPost, te.url()+"/v1/chat/completions", body, map[string]string{"x-session-id": "shared-session"})
			if r.status != http.StatusOK {
				t.Fatalf("%s: %d %s", x.model, r.status, r.body)
			}
			ci, gi := routeOf(t, r)
			if ci != x.ctx || gi != x.gen {
				t.Fatalf("%s turn %d routed to %s/%s, want its own fleets %s/%s", x.model, turn, ci, gi, x.ctx, x.gen)
			}
		}
	}
	for _, m := range te.e.catalogue.Models() {
		for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
			awaitOwnBind(t, te, f, m.Key("shared-session"))
		}
	}
	a, okA := binding(t, c, te, fsm.FleetContext, "shared-session")
	b, okB := adminBindingOf(t, c, te, "context", "shared-session", secondModel)
	if !okA || !okB || a.Instance != "ctx-a" || b.Instance != "ctx-b" {
		t.Fatalf("bindings of shared-session: first model %+v (%v), second %+v (%v)", a, okA, b, okB)
	}
	if a.Model != testModel || a.ModelKey != "shared-session" || b.Model != secondModel || b.ModelKey != "shared-session" ||
		b.Key != fsm.ModelKey(secondModel, "shared-session") || b.ConversationID != b.Key {
		t.Fatalf("admin model fields: first %+v, second %+v", a, b)
	}
	st := te.e.node.State()
	if st.Len() != 4 {
		t.Fatalf("%d bindings, want 4 (two models × two fleets)", st.Len())
	}
	if n := counter(t, te.registry, "tether_edge_model_requests_total", map[string]string{"model": secondModel, "adapter": "", "status": "200"}); n != 2 {
		t.Fatalf("tether_edge_model_requests_total for %s = %v, want 2", secondModel, n)
	}
}

// adminBindingOf is GET /admin/v1/bindings/{fleet}/{key}?model=.
func adminBindingOf(t *testing.T, c *http.Client, te *testEdge, fleet, key, model string) (admin.BindingInfo, bool) {
	t.Helper()
	f := fsm.FleetContext
	if fleet == fsm.FleetGeneration.String() {
		f = fsm.FleetGeneration
	}
	m, _, _ := te.e.catalogue.Lookup(model)
	awaitOwnBind(t, te, f, m.Key(key))
	r := adminGet(t, c, te, "/admin/v1/bindings/"+fleet+"/"+url.PathEscape(key)+"?model="+url.QueryEscape(model))
	if r.status == http.StatusNotFound {
		return admin.BindingInfo{}, false
	}
	if r.status != http.StatusOK {
		t.Fatalf("admin binding: %d %s", r.status, r.body)
	}
	var out admin.BindingInfo
	if err := json.Unmarshal(r.body, &out); err != nil {
		t.Fatal(err)
	}
	return out, true
}

// GET /v1/models lists every model and adapter in vLLM's shape (adapters
// with their parent), GET /v1/models/{id} answers each, and an unknown
// model is a 404 in OpenAI's shape on both that path and inference.
func TestModelsListsModelsAndAdapters(t *testing.T) {
	ec, _ := startTwoModels(t)
	te := ec.edge(0)
	c := httpClient(t)
	r := do(t, c, http.MethodGet, te.url()+"/v1/models", nil, nil)
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string  `json:"id"`
			Object string  `json:"object"`
			Root   *string `json:"root"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil || r.status != http.StatusOK || list.Object != "list" {
		t.Fatalf("GET /v1/models: %d %s (%v)", r.status, r.body, err)
	}
	want := []struct{ id, parent, root string }{{testModel, "", testModel}, {"agent-a", testModel, "/adapters/agent-a"}, {secondModel, "", secondModel}, {"agent-b", secondModel, "agent-b"}}
	if len(list.Data) != len(want) {
		t.Fatalf("GET /v1/models: %s", r.body)
	}
	for i, w := range want {
		d := list.Data[i]
		parent := ""
		if d.Parent != nil {
			parent = *d.Parent
		}
		if d.ID != w.id || d.Object != "model" || parent != w.parent || d.Root == nil || *d.Root != w.root {
			t.Fatalf("entry %d = %+v, want %+v (%s)", i, d, w, r.body)
		}
		one := do(t, c, http.MethodGet, te.url()+"/v1/models/"+w.id, nil, nil)
		if one.status != http.StatusOK || !strings.Contains(string(one.body), `"id":"`+w.id+`"`) {
			t.Fatalf("GET /v1/models/%s: %d %s", w.id, one.status, one.body)
		}
	}
	for _, path := range []string{"/v1/models/no-such-model"} {
		r := do(t, c, http.MethodGet, te.url()+path, nil, nil)
		checkModelNotFound(t, r)
	}
	for _, model := range []string{"no-such-model", "agent-c"} {
		body := chatBody(t, "hello", []string{"hi"}, map[string]any{"model": model})
		checkModelNotFound(t, do(t, c, http.MethodPost, te.url()+"/v1/chat/completions", body, nil))
	}
}

func checkModelNotFound(t *testing.T, r response) {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || r.status != http.StatusNotFound || e.Error.Type != "invalid_request_error" ||
		e.Error.Code == nil || *e.Error.Code != "model_not_found" || e.Error.Param == nil || *e.Error.Param != "model" ||
		!strings.Contains(e.Error.Message, secondModel) || !strings.Contains(e.Error.Message, "agent-b") {
		t.Fatalf("want 404 model_not_found naming the catalogue, got %d %s", r.status, r.body)
	}
}

// A model served under several names (model_aliases, as vLLM's
// --served-model-name) is one model: each name routes to its fleets under
// the same routing key, GET /v1/models lists every name with the model as
// root, and the answer names the model as the request did. Before, any
// name but model was a 404 (the Agents SDK's default model name among
// them).
func TestModelAliasesAreOneModel(t *testing.T) {
	const alias = "gpt-5.6-luna"
	aliases := []string{alias}
	ctx := startWorker(t, "ctx-a", workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext, aliases: aliases})
	gen := startWorker(t, "gen-a", workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration, aliases: aliases})
	ec := startEdges(t, 1, "", func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.ModelAliases = aliases
		c.ContextServers.URLs = []StaticInstance{{Name: "ctx-a", URL: ctx.proxy.URL}}
		c.GenerationServers.URLs = []StaticInstance{{Name: "gen-a", URL: gen.proxy.URL}}
	})
	ec.waitInstances(2)
	te := ec.edge(0)
	c := httpClient(t)
	for turn, model := range []string{testModel, alias} {
		body := chatBody(t, longText("sys", 40), []string{"turn " + string(rune('0'+turn))}, map[string]any{"model": model})
		r := do(t, c, http.MethodPost, te.url()+"/v1/chat/completions", body, map[string]string{"x-session-id": "aliased-session"})
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `"model":"`+model+`"`) {
			t.Fatalf("%s: %d %s", model, r.status, r.body)
		}
	}
	awaitOwnBind(t, te, fsm.FleetContext, "aliased-session")
	awaitOwnBind(t, te, fsm.FleetGeneration, "aliased-session")
	if st := te.e.node.State(); st.Len() != 2 {
		t.Fatalf("%d bindings, want 2 (one key, two fleets)", st.Len())
	}
	r := do(t, c, http.MethodGet, te.url()+"/v1/models", nil, nil)
	var list struct {
		Data []struct {
			ID   string `json:"id"`
			Root string `json:"root"`
		} `json:"data"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil || len(list.Data) != 2 || list.Data[0].ID != testModel || list.Data[1].ID != alias || list.Data[1].Root != testModel {
		t.Fatalf("GET /v1/models: %s", r.body)
	}
	if one := do(t, c, http.MethodGet, te.url()+"/v1/models/"+alias, nil, nil); one.status != http.StatusOK {
		t.Fatalf("GET /v1/models/%s: %d %s", alias, one.status, one.body)
	}
}
