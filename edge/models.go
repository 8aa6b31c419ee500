package edge

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/tokenize"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/httpjson"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/routing/decide"
)

// servedModel is one model of the edge's catalogue: its configuration,
// the routers, tokenizers and decision of its fleets, and its adapters.
type servedModel struct {
	name    string
	aliases []string // more names requests may give
	// ns is the routing-key namespace of the model's bindings
	// (fsm.ModelKey): "" for the first model, its name for the others.
	ns         string
	cfg        *Config
	routers    [3]*routing.Router // by fsm.Fleet
	tokenizers tokenize.Fleets    // by fsm.Fleet (tokenize.go)
	decider    *decide.Decider
	rr         [3]atomic.Uint64 // round-robin counters by fleet
	viewsCache atomic.Pointer[viewsEntry]
	adapters   map[string]AdapterConfig
	order      []string // adapter names as configured
}

// key is k in the model's routing-key namespace.
func (m *servedModel) key(k string) string { return fsm.ModelKey(m.ns, k) }

// buildCatalogue prepares every model after the first (which New sets up
// in the edge's own fields) and indexes models and adapters by name.
func (e *Edge) buildCatalogue() error {
	first := &servedModel{name: e.cfg.Model, aliases: e.cfg.ModelAliases, cfg: &e.cfg, routers: e.route.routers, tokenizers: e.tokenizers, decider: e.route.decider}
	first.setAdapters(e.cfg.LoRA)
	e.models = []*servedModel{first}
	for i := 1; i < e.cfg.ModelCount(); i++ {
		mc := e.cfg.ModelAt(i)
		m := &servedModel{name: mc.Model, aliases: mc.ModelAliases, ns: mc.Model, cfg: mc}
		for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
			r, err := routing.NewRouter(mc.RoutingConfig(f))
			if err != nil {
				return fmt.Errorf("model %s: %s router: %w", m.name, f, err)
			}
			m.routers[f] = r
		}
		var err error
		if m.tokenizers, err = tokenize.Load(mc); err != nil {
			return fmt.Errorf("models[%d]: %w", i-1, err)
		}
		m.setAdapters(mc.LoRA)
		e.models = append(e.models, m)
	}
	e.modelByName = map[string]*servedModel{}
	e.adapterModel = map[string]*servedModel{}
	for _, m := range e.models {
		e.modelByName[m.name] = m
		for _, a := range m.aliases {
			e.modelByName[a] = m
		}
		for _, a := range m.order {
			e.adapterModel[a] = m
		}
		if m.decider == nil {
			m.decider = &decide.Decider{Log: edgeLog{e}, Recorder: edgeRecorder{e}, Placements: e.placements, Fleet: edgeFleet{e, m},
				Index: edgeIndex{e}, Overload: e.route.overload, CommitFirst: m.cfg.Placement.CommitFirst}
		}
	}
	return nil
}

// firstModel is the catalogue's first model (an edge assembled without
// New, as some tests do, gets one over its own fields).
func (e *Edge) firstModel() *servedModel {
	if len(e.models) == 0 {
		return &servedModel{name: e.cfg.Model, aliases: e.cfg.ModelAliases, cfg: &e.cfg, routers: e.route.routers, tokenizers: e.tokenizers, decider: e.route.decider}
	}
	return e.models[0]
}

func (m *servedModel) setAdapters(l LoRAConfig) {
	m.adapters = map[string]AdapterConfig{}
	for _, a := range l.Adapters {
		m.adapters[a.Name] = a
		m.order = append(m.order, a.Name)
	}
}

// lookupModel resolves a request's model: a model of the catalogue (by
// any of its names), or one of its adapters (adapter is then its name).
func (e *Edge) lookupModel(name string) (m *servedModel, adapter string, ok bool) {
	if m, ok := e.modelByName[name]; ok {
		return m, "", true
	}
	if m, ok := e.adapterModel[name]; ok {
		return m, name, true
	}
	return nil, "", false
}

// modelNotFound is OpenAI's answer to an unknown model or adapter.
func (e *Edge) modelNotFound(name string) *api.Error {
	served := make([]string, 0, len(e.models))
	for _, m := range e.models {
		served = append(served, fmt.Sprintf("%q", m.name))
		for _, a := range m.aliases {
			served = append(served, fmt.Sprintf("%q (a name of %s)", a, m.name))
		}
		for _, a := range m.order {
			served = append(served, fmt.Sprintf("%q (adapter of %s)", a, m.name))
		}
	}
	if len(served) > 12 {
		served = append(served[:12], fmt.Sprintf("and %d more (GET /v1/models)", len(served)-12))
	}
	return api.NewError(http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
		"the model %q does not exist (this edge serves %s)", httpjson.Clip(name, 200), strings.Join(served, ", "))
}

// modelCard is one entry of GET /v1/models in vLLM's shape
// (vllm/entrypoints/openai/protocol.py ModelCard; serving_models.py lists
// each served model name with the same root, and each LoRA adapter with
// root = its path and parent = its base model).
type modelCard struct {
	ID      string  `json:"id"`
	Object  string  `json:"object"`
	Created int64   `json:"created"`
	OwnedBy string  `json:"owned_by"`
	Root    *string `json:"root"`
	Parent  *string `json:"parent"`
}

func (e *Edge) modelCards() []modelCard {
	var out []modelCard
	for _, m := range e.models {
		name := m.name
		out = append(out, modelCard{ID: name, Object: "model", OwnedBy: "tether", Root: &name})
		for _, a := range m.aliases {
			out = append(out, modelCard{ID: a, Object: "model", OwnedBy: "tether", Root: &name})
		}
		for _, a := range m.order {
			root := m.adapters[a].Path
			if root == "" {
				root = a
			}
			out = append(out, modelCard{ID: a, Object: "model", OwnedBy: "tether", Root: &root, Parent: &name})
		}
	}
	return out
}

func (e *Edge) handleModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		api.MethodNotAllowed(w, r, http.MethodGet)
		return
	}
	httpjson.Write(w, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", e.modelCards()})
	e.metrics.Requests.WithLabelValues("models", "200").Inc()
}

// handleModel is GET /v1/models/{id}: a model's or an adapter's card, or
// 404 as OpenAI answers an unknown one.
func (e *Edge) handleModel(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		api.MethodNotAllowed(w, r, http.MethodGet)
		return
	}
	id := r.PathValue("id")
	for _, c := range e.modelCards() {
		if c.ID == id {
			httpjson.Write(w, http.StatusOK, c)
			e.metrics.Requests.WithLabelValues("models", "200").Inc()
			return
		}
	}
	e.metrics.Requests.WithLabelValues("models", "404").Inc()
	api.WriteError(w, e.modelNotFound(id))
}

// instanceModel is the model whose fleets instance v belongs to: the
// configured model of a static instance, else the model the worker
// reports; with one model every instance is its. nil: no model of this
// edge (a worker serving another model gets no requests).
func (e *Edge) instanceModel(v *routing.InstanceView) *servedModel {
	if len(e.models) == 1 {
		return e.models[0]
	}
	return e.modelByName[v.Model]
}

// modelOfInstance is instanceModel by instance id (nil: unknown).
func (e *Edge) modelOfInstance(id string, now time.Time) *servedModel {
	if len(e.models) == 1 {
		return e.models[0]
	}
	in, ok := e.fleet.Instance(id, now)
	if !ok {
		return nil
	}
	v := routing.InstanceView{Model: in.Model}
	if in.Served != "" {
		v.Model = in.Served
	}
	return e.instanceModel(&v)
}

// catalogueNames are the model names, the first first (nil with one
// model: the admin API then shows keys as they always were).
func (e *Edge) catalogueNames() []string {
	if len(e.models) < 2 {
		return nil
	}
	out := make([]string, len(e.models))
	for i, m := range e.models {
		out[i] = m.name
	}
	return out
}

// modelsUnready is /readyz's check of a catalogue of several models:
// each has a healthy instance in each fleet it serves.
func (e *Edge) modelsUnready(now time.Time) []string {
	if len(e.models) == 1 {
		return nil
	}
	var reasons []string
	for _, m := range e.models {
		vs := e.views(m, now, nil)
		for _, f := range m.cfg.ServedFleets() {
			healthy := false
			for _, v := range vs.Fleet(f) {
				healthy = healthy || v.Healthy
			}
			if !healthy {
				reasons = append(reasons, fmt.Sprintf("no healthy %s instance of model %s", f, m.name))
			}
		}
	}
	return reasons
}
