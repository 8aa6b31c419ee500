package worker

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/worker/engine"
)

// LoRAConfig is the lora section: the LoRA adapters the worker serves
// besides its model (requests name one as their model, as vLLM serves
// --lora-modules), and the simulated engine's adapter slots.
type LoRAConfig struct {
	Adapters []string `yaml:"adapters"`
	// MaxLoRAs is the adapters a rank holds at once (vLLM --max-loras;
	// default 1 with adapters, vLLM's default).
	MaxLoRAs int `yaml:"max_loras"`
	// LoadTime is what the simulated engine spends loading an adapter into
	// a slot (default 100ms of engine time).
	LoadTime time.Duration `yaml:"load_time"`
}

// maxLoRAs is lora.max_loras with its default.
func (l LoRAConfig) maxLoRAs() int {
	if l.MaxLoRAs == 0 && len(l.Adapters) > 0 {
		return 1
	}
	return l.MaxLoRAs
}

// validateLoRA: adapter names unique, not the model's, one subject-safe
// string each; slots within bounds.
func (c *Config) validateLoRA() error {
	l := c.LoRA
	seen := map[string]bool{c.Model: true}
	for _, a := range c.ModelAliases {
		seen[a] = true
	}
	for i, a := range l.Adapters {
		switch {
		case strings.TrimSpace(a) == "" || len(a) > 256 || strings.ContainsAny(a, "\x1f\r\n,"):
			return fmt.Errorf("lora.adapters[%d]: %q must be 1..256 bytes without commas or control characters", i, truncate(a, 40))
		case seen[a]:
			return fmt.Errorf("lora.adapters[%d]: %q is named twice (or is a name of the model)", i, a)
		}
		seen[a] = true
	}
	if l.MaxLoRAs < 0 || l.MaxLoRAs > telemetry.MaxLoRAs {
		return fmt.Errorf("lora.max_loras: must be 0..%d, got %d", telemetry.MaxLoRAs, l.MaxLoRAs)
	}
	if l.LoadTime < 0 {
		return fmt.Errorf("lora.load_time: must be >= 0, got %s", l.LoadTime)
	}
	return nil
}

// servedAdapter resolves a request's model: a name of the worker's model
// ("") or one of its adapters.
func (s *Server) servedAdapter(model string) (adapter string, ok bool) {
	if model == s.cfg.Model || slices.Contains(s.cfg.ModelAliases, model) {
		return "", true
	}
	if slices.Contains(s.cfg.LoRA.Adapters, model) {
		return model, true
	}
	return "", false
}

// modelCards are GET /v1/models: each name of the model (the same root,
// as vLLM lists every --served-model-name), then each adapter with its
// parent, as vLLM lists --lora-modules (serving_models.py).
func (s *Server) modelCards() []map[string]any {
	created := s.bootTime.Unix()
	var out []map[string]any
	for _, name := range s.modelNames() {
		out = append(out, map[string]any{"id": name, "object": "model", "created": created, "owned_by": "tether", "root": s.cfg.Model, "parent": nil})
	}
	for _, a := range s.cfg.LoRA.Adapters {
		out = append(out, map[string]any{"id": a, "object": "model", "created": created, "owned_by": "tether", "root": a, "parent": s.cfg.Model})
	}
	return out
}

// modelNames are the names the model is served under, the first first.
func (s *Server) modelNames() []string {
	return append([]string{s.cfg.Model}, s.cfg.ModelAliases...)
}

// reportedMaxLoRAs is the load report's max_loras: the adapter slots of
// an engine that reports which adapters its ranks hold (the simulated
// engine); 0 otherwise (a proxy does not know its upstreams' slots).
func (s *Server) reportedMaxLoRAs() int {
	if _, ok := s.eng.(engine.AdapterHolder); !ok {
		return 0
	}
	return s.cfg.LoRA.maxLoRAs()
}
