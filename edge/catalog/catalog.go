// Package catalog is the models an edge serves, each on its own fleets
// (the top-level model and each models entry), and their LoRA adapters:
// which model or adapter a request's model names (by any of a model's
// names), the 404 naming the catalogue otherwise, GET /v1/models in vLLM's
// shape, the model an instance serves, what each model's fleets serve
// (the dialects, the Conversations API), a model's routing pieces (its
// routers, tokenizers and decision, its routing views' cache, the
// namespace of its keys), where LoRA requests went and the adapters loaded
// at runtime. See edge/DESIGN.md "Models and LoRA adapters".
package catalog

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/tokenize"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/httpjson"
	"github.com/tether-project/tether/routing"
)

// Model is one model of the edge's catalogue: its configuration, the
// routers, tokenizers and decision of its fleets, and its adapters.
type Model struct {
	Name    string
	Aliases []string // more names requests may give
	// NS is the routing-key namespace of the model's bindings
	// (fsm.ModelKey): "" for the first model, its name for the others.
	NS         string
	Cfg        *config.Config     // the model's whole configuration (config.Config.ModelAt)
	Routers    [3]*routing.Router // by fsm.Fleet
	Tokenizers tokenize.Fleets
	Decider    *routing.Decider
	RR         [3]atomic.Uint64 // round-robin counters by fleet
	// Views caches the model's routing views (edge/route).
	Views    atomic.Pointer[CachedViews]
	adapters map[string]config.AdapterConfig
	order    []string // adapter names as configured
}

// CachedViews are a model's routing views as built at Built, from the
// fleet view's Version, the log's State, after Placed decisions: kept until
// the fleet view or the log changes, this edge places a request (its
// dispatches count in the views), or a short age passes (health depends on
// time).
type CachedViews struct {
	Version uint64
	State   *fsm.State
	Placed  uint64
	Built   time.Time
	Views   *routing.Views
}

// Key is k in the model's routing-key namespace.
func (m *Model) Key(k string) string { return fsm.ModelKey(m.NS, k) }

// AdapterPath is where the engine loads adapter from ("" none given).
func (m *Model) AdapterPath(adapter string) string { return m.adapters[adapter].Path }

// Catalogue is the edge's models, the first first, by name, and their
// adapters by name.
type Catalogue struct {
	edge         Edge
	metrics      *observe.Metrics
	log          *slog.Logger
	models       []*Model
	modelByName  map[string]*Model
	adapterModel map[string]*Model
	loads        runtimeLoads // adapters loaded at runtime (lora.go)
}

// Edge is what the catalogue reads of the edge, when asked (from its
// Start on).
type Edge interface {
	// Fleet is the edge's view of the workers.
	Fleet() *fleetview.View
	// Client sends the runtime loads of adapters (the hops' client).
	Client() *http.Client
	// Now is the edge's clock.
	Now() time.Time
}

// New builds the catalogue of cfg: each model's routers and tokenizers
// (their files read once). Its decision is the router's to make
// (edge/route).
func New(cfg *config.Config, edge Edge, m *observe.Metrics, log *slog.Logger) (*Catalogue, error) {
	c := &Catalogue{edge: edge, metrics: m, log: log, modelByName: map[string]*Model{}, adapterModel: map[string]*Model{}}
	for i := 0; i < cfg.ModelCount(); i++ {
		m, err := newModel(cfg, i)
		if err != nil {
			return nil, err
		}
		c.models = append(c.models, m)
	}
	for _, m := range c.models {
		c.modelByName[m.Name] = m
		for _, a := range m.Aliases {
			c.modelByName[a] = m
		}
		for _, a := range m.order {
			c.adapterModel[a] = m
		}
	}
	return c, nil
}

// newModel prepares model i of cfg (0: the top-level one).
func newModel(cfg *config.Config, i int) (*Model, error) {
	mc := cfg.ModelAt(i)
	m := &Model{Name: mc.Model, Aliases: mc.ModelAliases, Cfg: mc}
	if i > 0 {
		m.NS = mc.Model
	}
	for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
		r, err := routing.NewRouter(mc.RoutingConfig(f))
		switch {
		case err != nil && i == 0:
			return nil, fmt.Errorf("%s router: %w", f, err)
		case err != nil:
			return nil, fmt.Errorf("model %s: %s router: %w", m.Name, f, err)
		}
		m.Routers[f] = r
	}
	var err error
	if m.Tokenizers, err = tokenize.Load(mc); err != nil {
		if i == 0 {
			return nil, err
		}
		return nil, fmt.Errorf("models[%d]: %w", i-1, err)
	}
	m.setAdapters(mc.LoRA)
	return m, nil
}

// Models are the catalogue's models, the first first.
func (c *Catalogue) Models() []*Model { return c.models }

// First is the top-level model.
func (c *Catalogue) First() *Model { return c.models[0] }

func (m *Model) setAdapters(l config.LoRAConfig) {
	m.adapters = map[string]config.AdapterConfig{}
	for _, a := range l.Adapters {
		m.adapters[a.Name] = a
		m.order = append(m.order, a.Name)
	}
}

// Lookup resolves a request's model: a model of the catalogue (by any of
// its names), or one of its adapters (adapter is then its name).
func (e *Catalogue) Lookup(name string) (m *Model, adapter string, ok bool) {
	if m, ok := e.modelByName[name]; ok {
		return m, "", true
	}
	if m, ok := e.adapterModel[name]; ok {
		return m, name, true
	}
	return nil, "", false
}

// NotFound is OpenAI's answer to an unknown model or adapter.
func (e *Catalogue) NotFound(name string) *api.Error {
	served := make([]string, 0, len(e.models))
	for _, m := range e.models {
		served = append(served, fmt.Sprintf("%q", m.Name))
		for _, a := range m.Aliases {
			served = append(served, fmt.Sprintf("%q (a name of %s)", a, m.Name))
		}
		for _, a := range m.order {
			served = append(served, fmt.Sprintf("%q (adapter of %s)", a, m.Name))
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

// cards are the catalogue's model cards: each model's names and its
// adapters.
func (e *Catalogue) cards() []modelCard {
	var out []modelCard
	for _, m := range e.models {
		name := m.Name
		out = append(out, modelCard{ID: name, Object: "model", OwnedBy: "tether", Root: &name})
		for _, a := range m.Aliases {
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

// ServeModels answers GET /v1/models: every model and adapter.
func (e *Catalogue) ServeModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		api.MethodNotAllowed(w, r, http.MethodGet)
		return
	}
	httpjson.Write(w, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", e.cards()})
	e.metrics.Requests.WithLabelValues("models", "200").Inc()
}

// ServeModel is GET /v1/models/{id}: a model's or an adapter's card, or
// 404 as OpenAI answers an unknown one.
func (e *Catalogue) ServeModel(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		api.MethodNotAllowed(w, r, http.MethodGet)
		return
	}
	id := r.PathValue("id")
	for _, c := range e.cards() {
		if c.ID == id {
			httpjson.Write(w, http.StatusOK, c)
			e.metrics.Requests.WithLabelValues("models", "200").Inc()
			return
		}
	}
	e.metrics.Requests.WithLabelValues("models", "404").Inc()
	api.WriteError(w, e.NotFound(id))
}

// InstanceModel is the model whose fleets instance v belongs to: the
// configured model of a static instance, else the model the worker
// reports; with one model every instance is its. nil: no model of this
// edge (a worker serving another model gets no requests).
func (e *Catalogue) InstanceModel(v *routing.InstanceView) *Model {
	if len(e.models) == 1 {
		return e.models[0]
	}
	return e.modelByName[v.Model]
}

// ModelOfInstance is InstanceModel by instance id (nil: unknown).
func (e *Catalogue) ModelOfInstance(id string, now time.Time) *Model {
	if len(e.models) == 1 {
		return e.models[0]
	}
	in, ok := e.edge.Fleet().Instance(id, now)
	if !ok {
		return nil
	}
	v := routing.InstanceView{Model: in.Model}
	if in.Served != "" {
		v.Model = in.Served
	}
	return e.InstanceModel(&v)
}

// DecisionOf is the decision of the model instance serves and that
// model's router of fleet f: where the edge's working sets for the
// instance live (routing Decider.HearRoute, Decider.WorkingSet). ok is
// false for an instance of no model of this edge or a fleet it does not
// route.
func (e *Catalogue) DecisionOf(f fsm.Fleet, instance string, now time.Time) (d *routing.Decider, r *routing.Router, ok bool) {
	m := e.ModelOfInstance(instance, now)
	if m == nil || m.Decider == nil || !f.Valid() || m.Routers[f] == nil {
		return nil, nil, false
	}
	return m.Decider, m.Routers[f], true
}

// Names are the model names, the first first (nil with one
// model: the admin API then shows keys as they always were).
func (e *Catalogue) Names() []string {
	if len(e.models) < 2 {
		return nil
	}
	out := make([]string, len(e.models))
	for i, m := range e.models {
		out[i] = m.Name
	}
	return out
}
