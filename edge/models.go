package edge

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/yamlconf"
	"github.com/tether-project/tether/routing"
)

// ModelConfig is one more model the edge serves (an entry of models):
// its name, its own context and generation fleets (engine kind, tokenizer
// and block size are per fleet, so per model) and its LoRA adapters. The
// top-level model, context_servers, generation_servers and lora keys are
// the first model; a configuration without models serves that one alone.
type ModelConfig struct {
	Name string `yaml:"name"`
	// Aliases are more names of the model (as the top-level
	// model_aliases are of the first).
	Aliases           []string      `yaml:"aliases"`
	ContextServers    ServersConfig `yaml:"context_servers"`
	GenerationServers ServersConfig `yaml:"generation_servers"`
	LoRA              LoRAConfig    `yaml:"lora"`
	// AnthropicInlineSystem: as the top-level key, for this model.
	AnthropicInlineSystem string `yaml:"anthropic_inline_system"`
}

// UnmarshalYAML decodes an entry over the fleet defaults the top-level
// fleets have (health path, tokenizer, shadow cache size).
func (m *ModelConfig) UnmarshalYAML(n *yaml.Node) error {
	type plain ModelConfig
	d := DefaultConfig()
	p := plain{ContextServers: d.ContextServers, GenerationServers: d.GenerationServers}
	if err := yamlconf.DecodeNode(n, &p); err != nil {
		return err
	}
	*m = ModelConfig(p)
	return nil
}

// LoRAConfig is a model's LoRA adapters: the names requests may give as
// their model (served by the model's fleets), and how the engines hold
// them.
type LoRAConfig struct {
	Adapters []AdapterConfig `yaml:"adapters"`
	// MaxLoRAs is the adapters one instance holds at once (vLLM
	// --max-loras, SGLang --max-loras-per-batch) when the engine does not
	// report it (vLLM's vllm:lora_requests_info and tether workers do);
	// 0: unknown, placement then prefers an instance with the adapter
	// loaded without judging its free slots.
	MaxLoRAs int `yaml:"max_loras"`
	// RuntimeLoad: before a request for an adapter goes to a vLLM instance
	// whose GET /v1/models does not list it, the edge loads it there (POST
	// /v1/load_lora_adapter with the adapter's path; the engine must run
	// with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).
	RuntimeLoad bool `yaml:"runtime_load"`
}

// AdapterConfig is one LoRA adapter: a name, or {name, path}.
type AdapterConfig struct {
	Name string `yaml:"name"`
	// Path is where the engine loads the adapter from (lora_path of
	// vLLM's load_lora_adapter; the model card's root).
	Path string `yaml:"path"`
}

// UnmarshalYAML accepts a plain name or a {name, path} mapping.
func (a *AdapterConfig) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		a.Name, a.Path = n.Value, ""
		return nil
	}
	type plain AdapterConfig
	var p plain
	if err := yamlconf.DecodeNode(n, &p); err != nil {
		return err
	}
	*a = AdapterConfig(p)
	return nil
}

// maxLoRAs bounds lora.max_loras (engines hold a few dozen at most).
const maxLoRAs = 1024

// modelConfig is model i of the catalogue as a whole configuration: c for
// the first, else c with that model's name, fleets and adapters, so every
// fleet-level method (RoutingConfig, Aggregated, servers, …) answers for
// that model.
func (c *Config) modelConfig(i int) *Config {
	if i == 0 {
		return c
	}
	m := c.Models[i-1]
	mc := *c
	mc.Model, mc.ModelAliases, mc.ContextServers, mc.GenerationServers, mc.LoRA, mc.Models = m.Name, m.Aliases, m.ContextServers, m.GenerationServers, m.LoRA, nil
	mc.AnthropicInlineSystem = m.AnthropicInlineSystem
	return &mc
}

// modelCount is the models of the catalogue, the first included.
func (c *Config) modelCount() int { return 1 + len(c.Models) }

// validateModels checks the models and adapters: names unique across
// both (a request's model names one of them), each entry's fleets as the
// top-level ones are checked (errors under models[i]), instance ids and
// URLs unique across all models, and the fleet rules sub-agent affinity
// and conditional disaggregation impose.
func (c *Config) validateModels(p *yamlconf.Problems) {
	bad := p.Add
	names := map[string]string{}
	claim := func(key, name string) {
		if prev, dup := names[name]; dup {
			bad(key, "%q is also %s: model and adapter names must be unique (a request's model names one)", name, prev)
			return
		}
		names[name] = key
	}
	if strings.TrimSpace(c.Model) != "" {
		claim("model", c.Model)
	}
	ids, urls := map[string]string{}, map[string]string{}
	for i := 0; i < c.modelCount(); i++ {
		mc := c.modelConfig(i)
		prefix := ""
		if i > 0 {
			prefix = fmt.Sprintf("models[%d].", i-1)
			if strings.TrimSpace(mc.Model) == "" {
				bad(prefix+"name", "required: the model name requests ask for")
			} else {
				claim(prefix+"name", mc.Model)
			}
			// The entry's fleets are checked as the top-level ones, and
			// their problems placed under models[i].
			sub := yamlconf.NewProblems(nil)
			mc.validateFleets(sub)
			mc.validateModelServing(sub.Add)
			p.AddError(strings.TrimSuffix(prefix, "."), sub.Err())
		}
		for _, fl := range []struct {
			key string
			s   *ServersConfig
		}{{"context_servers", &mc.ContextServers}, {"generation_servers", &mc.GenerationServers}} {
			for j, si := range fl.s.URLs {
				key := fmt.Sprintf("%s%s.urls[%d]", prefix, fl.key, j)
				if i > 0 {
					// Within one model validateFleets names duplicates.
					if prev, dup := ids[si.ID()]; dup && !strings.HasPrefix(prev, prefix) {
						bad(key, "duplicate instance id %q (also %s): an instance serves one model", si.ID(), prev)
					}
					if prev, dup := urls[trimSlash(si.URL)]; dup && !strings.HasPrefix(prev, prefix) {
						bad(key, "duplicate URL %s (also %s): an instance serves one model", si.URL, prev)
					}
				}
				ids[si.ID()], urls[trimSlash(si.URL)] = key, key
			}
		}
		if _, err := apireq.ParseInlineSystem(mc.AnthropicInlineSystem); err != nil {
			bad(prefix+"anthropic_inline_system", "%v", err)
		}
		aliasKey := "model_aliases"
		if i > 0 {
			aliasKey = prefix + "aliases"
		}
		for j, a := range mc.ModelAliases {
			key := fmt.Sprintf("%s[%d]", aliasKey, j)
			if strings.TrimSpace(a) == "" || len(a) > 256 || strings.ContainsAny(a, fsm.ModelKeySep+"\r\n") {
				bad(key, "%q must be 1..256 bytes without control characters", truncate(a, 40))
				continue
			}
			claim(key, a)
		}
		l := mc.LoRA
		if l.MaxLoRAs < 0 || l.MaxLoRAs > maxLoRAs {
			bad(prefix+"lora.max_loras", "must be 0 (the engine's report) or 1..%d, got %d", maxLoRAs, l.MaxLoRAs)
		}
		if l.RuntimeLoad && mc.ContextServers.Engine.Kind() != EngineVLLM {
			bad(prefix+"lora.runtime_load", "only vLLM loads adapters at runtime (POST /v1/load_lora_adapter); context_servers.engine is %s", mc.ContextServers.Engine.Kind())
		}
		for j, a := range l.Adapters {
			key := fmt.Sprintf("%slora.adapters[%d]", prefix, j)
			switch {
			case strings.TrimSpace(a.Name) == "":
				bad(key+".name", "required: the name requests give as their model")
			case len(a.Name) > 256 || strings.ContainsAny(a.Name, fsm.ModelKeySep+"\r\n"):
				bad(key+".name", "%q must be at most 256 bytes without control characters", truncate(a.Name, 40))
			default:
				claim(key+".name", a.Name)
			}
			if l.RuntimeLoad && a.Path == "" {
				bad(key+".path", "required with lora.runtime_load: where the engine loads %q from", a.Name)
			}
		}
		if strings.Contains(mc.Model, fsm.ModelKeySep) {
			bad(prefix+"name", "must not contain U+001F (it separates the model from the key in routing keys)")
		}
	}
}

// validateModelServing checks the serving rules that depend on a model's
// fleets (validateServing checks them for the first model).
func (c *Config) validateModelServing(bad complain) {
	if c.ParentHeader != "" && c.InternalRequestAuthKey == "" && !c.engineAggregated() {
		bad("internal_request_auth_key", "required when conversation_affinity_header_for_subagents is set (%s): sub-agent hints must be signed; set it or %s",
			c.ParentHeader, EnvInternalRequestAuthKey)
	}
	if c.Scope == routing.ScopeBoth && !c.Aggregated() && c.GenerationServers.Router.Type != routing.RouterConversation {
		bad("generation_servers.router.type", "subagent_affinity_scope both requires conversation (got %s)", c.GenerationServers.Router.Type)
	}
	if c.ConditionalDisagg.MaxLocalPrefillLength > 0 && !c.Aggregated() && c.GenerationServers.Router.Type != routing.RouterKVCacheAware {
		bad("generation_servers.router.type", "conditional_disagg_config requires kv_cache_aware (got %s)", c.GenerationServers.Router.Type)
	}
}

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
	tokenizers [3]fleetTokenizer  // by fsm.Fleet (tokenize.go)
	decider    *routing.Decider
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
	for i := 1; i < e.cfg.modelCount(); i++ {
		mc := e.cfg.modelConfig(i)
		m := &servedModel{name: mc.Model, aliases: mc.ModelAliases, ns: mc.Model, cfg: mc}
		for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
			r, err := routing.NewRouter(mc.RoutingConfig(f))
			if err != nil {
				return fmt.Errorf("model %s: %s router: %w", m.name, f, err)
			}
			m.routers[f] = r
		}
		var err error
		if m.tokenizers, err = loadFleetTokenizers(mc); err != nil {
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
			m.decider = &routing.Decider{Log: edgeLog{e}, Recorder: edgeRecorder{e}, Placements: e.placements, Fleet: edgeFleet{e, m},
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
func (e *Edge) modelNotFound(name string) *apiError {
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
	return newAPIError(http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
		"the model %q does not exist (this edge serves %s)", truncate(name, 200), strings.Join(served, ", "))
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
		methodNotAllowed(w, r, http.MethodGet)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", e.modelCards()})
	e.metrics.requests.WithLabelValues("models", "200").Inc()
}

// handleModel is GET /v1/models/{id}: a model's or an adapter's card, or
// 404 as OpenAI answers an unknown one.
func (e *Edge) handleModel(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, http.MethodGet)
		return
	}
	id := r.PathValue("id")
	for _, c := range e.modelCards() {
		if c.ID == id {
			writeJSON(w, http.StatusOK, c)
			e.metrics.requests.WithLabelValues("models", "200").Inc()
			return
		}
	}
	e.metrics.requests.WithLabelValues("models", "404").Inc()
	writeAPIError(w, e.modelNotFound(id))
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

// modelMetrics are the per-model series.
type modelMetrics struct {
	requests *prometheus.CounterVec
}

func newModelMetrics(reg prometheus.Registerer) (*modelMetrics, error) {
	m := &modelMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_model_requests_total",
			Help: "Inference requests by model, LoRA adapter (\"\" for the base model) and status code.",
		}, []string{"model", "adapter", "status"}),
	}
	if err := reg.Register(m.requests); err != nil {
		return nil, fmt.Errorf("edge: metrics: %w", err)
	}
	return m, nil
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
		for _, f := range m.cfg.servedFleets() {
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
