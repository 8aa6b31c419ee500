package config

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/httpjson"
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
func (c *Config) ModelAt(i int) *Config {
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
func (c *Config) ModelCount() int { return 1 + len(c.Models) }

// validateModels checks the models and adapters: names unique across
// both (a request's model names one of them), each entry's fleets as the
// top-level ones are checked (errors under models[i]), instance ids and
// URLs unique across all models, and the fleet rules sub-agent affinity
// and conditional disaggregation impose.
func (c *Config) validateModels(p *yamlconf.Problems) {
	k := &catalogueCheck{bad: p.Add, names: map[string]string{}, ids: map[string]string{}, urls: map[string]string{}}
	if strings.TrimSpace(c.Model) != "" {
		k.claim("model", c.Model)
	}
	for i := 0; i < c.ModelCount(); i++ {
		mc := c.ModelAt(i)
		prefix := ""
		if i > 0 {
			prefix = fmt.Sprintf("models[%d].", i-1)
			k.entry(p, mc, prefix)
		}
		k.instances(mc, i > 0, prefix)
		if _, err := apireq.ParseInlineSystem(mc.AnthropicInlineSystem); err != nil {
			k.bad(prefix+"anthropic_inline_system", "%v", err)
		}
		aliasKey := "model_aliases"
		if i > 0 {
			aliasKey = prefix + "aliases"
		}
		k.aliases(mc.ModelAliases, aliasKey)
		k.lora(mc, prefix)
		if strings.Contains(mc.Model, fsm.ModelKeySep) {
			k.bad(prefix+"name", "must not contain U+001F (it separates the model from the key in routing keys)")
		}
	}
}

// catalogueCheck is what validateModels keeps across the models: the
// model and adapter names claimed, and the instances' ids and URLs, each
// with the key that named it first.
type catalogueCheck struct {
	bad              complain
	names, ids, urls map[string]string
}

// claim takes name for key: model and adapter names are unique together.
func (k *catalogueCheck) claim(key, name string) {
	if prev, dup := k.names[name]; dup {
		k.bad(key, "%q is also %s: model and adapter names must be unique (a request's model names one)", name, prev)
		return
	}
	k.names[name] = key
}

// entry checks a models entry's name and its fleets as the top-level ones
// are checked, their problems placed under the entry (prefix).
func (k *catalogueCheck) entry(p *yamlconf.Problems, mc *Config, prefix string) {
	if strings.TrimSpace(mc.Model) == "" {
		k.bad(prefix+"name", "required: the model name requests ask for")
	} else {
		k.claim(prefix+"name", mc.Model)
	}
	sub := yamlconf.NewProblems(nil)
	mc.validateFleets(sub)
	mc.validateModelServing(sub.Add)
	p.AddError(strings.TrimSuffix(prefix, "."), sub.Err())
}

// instances checks that an instance serves one model: its id and URL are
// named by no other model (within one model validateFleets names
// duplicates).
func (k *catalogueCheck) instances(mc *Config, another bool, prefix string) {
	for _, fl := range []struct {
		key string
		s   *ServersConfig
	}{{"context_servers", &mc.ContextServers}, {"generation_servers", &mc.GenerationServers}} {
		for j, si := range fl.s.URLs {
			key := fmt.Sprintf("%s%s.urls[%d]", prefix, fl.key, j)
			if another {
				if prev, dup := k.ids[si.ID()]; dup && !strings.HasPrefix(prev, prefix) {
					k.bad(key, "duplicate instance id %q (also %s): an instance serves one model", si.ID(), prev)
				}
				if prev, dup := k.urls[strings.TrimRight(si.URL, "/")]; dup && !strings.HasPrefix(prev, prefix) {
					k.bad(key, "duplicate URL %s (also %s): an instance serves one model", si.URL, prev)
				}
			}
			k.ids[si.ID()], k.urls[strings.TrimRight(si.URL, "/")] = key, key
		}
	}
}

// aliases checks and claims a model's other names (under key).
func (k *catalogueCheck) aliases(aliases []string, key string) {
	for j, a := range aliases {
		key := fmt.Sprintf("%s[%d]", key, j)
		if strings.TrimSpace(a) == "" || len(a) > 256 || strings.ContainsAny(a, fsm.ModelKeySep+"\r\n") {
			k.bad(key, "%q must be 1..256 bytes without control characters", httpjson.Clip(a, 40))
			continue
		}
		k.claim(key, a)
	}
}

// lora checks a model's lora section and claims its adapters' names.
func (k *catalogueCheck) lora(mc *Config, prefix string) {
	l := mc.LoRA
	if l.MaxLoRAs < 0 || l.MaxLoRAs > maxLoRAs {
		k.bad(prefix+"lora.max_loras", "must be 0 (the engine's report) or 1..%d, got %d", maxLoRAs, l.MaxLoRAs)
	}
	if l.RuntimeLoad && mc.ContextServers.Engine.Kind() != EngineVLLM {
		k.bad(prefix+"lora.runtime_load", "only vLLM loads adapters at runtime (POST /v1/load_lora_adapter); context_servers.engine is %s", mc.ContextServers.Engine.Kind())
	}
	for j, a := range l.Adapters {
		key := fmt.Sprintf("%slora.adapters[%d]", prefix, j)
		switch {
		case strings.TrimSpace(a.Name) == "":
			k.bad(key+".name", "required: the name requests give as their model")
		case len(a.Name) > 256 || strings.ContainsAny(a.Name, fsm.ModelKeySep+"\r\n"):
			k.bad(key+".name", "%q must be at most 256 bytes without control characters", httpjson.Clip(a.Name, 40))
		default:
			k.claim(key+".name", a.Name)
		}
		if l.RuntimeLoad && a.Path == "" {
			k.bad(key+".path", "required with lora.runtime_load: where the engine loads %q from", a.Name)
		}
	}
}

// validateModelServing checks the serving rules that depend on a model's
// fleets (validateServing checks them for the first model).
func (c *Config) validateModelServing(bad complain) {
	if c.ParentHeader != "" && c.InternalRequestAuthKey == "" && !c.EngineAggregated() {
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
