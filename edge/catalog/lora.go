package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/httpjson"
)

// AdapterPlaced counts where a LoRA request of model m went (instance of
// fleet f: one the edge believed to hold its adapter, or one that must load
// it) and notes the adapter there, so the next requests for it follow
// before the engine's own report does (fleetview.NoteAdapter). No adapter:
// nothing.
func (e *Catalogue) AdapterPlaced(m *Model, adapter string, f fsm.Fleet, instance string, now time.Time) {
	if adapter == "" {
		return
	}
	fleet := e.edge.Fleet()
	loaded := "false"
	if in, ok := fleet.Instance(instance, now); ok && in.LoRA.Holds(adapter) {
		loaded = "true"
	}
	e.metrics.LoRAPlacements.WithLabelValues(m.Name, adapter, f.String(), loaded).Inc()
	fleet.NoteAdapter(instance, adapter, now)
}

// EngineAdapter names a request's adapter to m's engine, in its body top, the way the engine reads
// it. vLLM (and a tether worker) select an adapter by the request's model
// naming it, as the client sent it. SGLang reads the model only for a
// "<base>:<adapter>" form and otherwise an explicit lora_path, and serves
// a model naming an adapter alone on the base model
// (python/sglang/srt/entrypoints/openai/serving_base.py; docs
// advanced_features/lora.md): for an SGLang fleet the edge sends
// model "<model>:<adapter>" and lora_path "<adapter>" (the lora_path, which
// SGLang prefers, also serves releases before the model syntax). A
// client's own lora_path never reaches an SGLang fleet: the edge places by
// the adapter it resolved.
func (m *Model) EngineAdapter(adapter string, top map[string]json.RawMessage) {
	if m.Cfg.Servers(fsm.FleetContext).Engine.Kind() != config.EngineSGLang {
		return
	}
	delete(top, "lora_path")
	if adapter == "" {
		return
	}
	top["model"] = api.MustMarshal(m.Name + ":" + adapter)
	top["lora_path"] = api.MustMarshal(adapter)
}

// runtimeLoadTTL is how long the edge trusts that an instance holds an
// adapter it loaded there (or that answered "already loaded"): a restarted
// engine forgets runtime-loaded adapters, and a call that finds it loaded
// costs one short round trip.
const runtimeLoadTTL = 30 * time.Second

// runtimeLoads remembers which instance holds which runtime-loaded adapter.
type runtimeLoads struct {
	mu   sync.Mutex
	done map[string]time.Time // instance \x00 adapter → when confirmed
}

func (r *runtimeLoads) fresh(key string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.done[key]
	return ok && now.Sub(t) < runtimeLoadTTL
}

func (r *runtimeLoads) confirm(key string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done == nil {
		r.done = map[string]time.Time{}
	}
	for k, t := range r.done {
		if now.Sub(t) >= runtimeLoadTTL {
			delete(r.done, k)
		}
	}
	r.done[key] = now
}

// EnsureAdapter loads a request's adapter of model m on instance (at url)
// before the hop, when the model loads adapters at runtime (lora.runtime_load, vLLM): POST
// /v1/load_lora_adapter {lora_name, lora_path}. vLLM answers 200 with
// "Success: LoRA adapter '…' added successfully." and 400 "The lora adapter
// '…' has already been loaded." when it holds it
// (vllm/entrypoints/openai/serving_models.py); both confirm the adapter.
// A failure is logged and counted, and the request goes on: the engine
// then answers it itself (404 for an adapter it does not know).
func (e *Catalogue) EnsureAdapter(ctx context.Context, m *Model, adapter, instance, url string) {
	if adapter == "" || !m.Cfg.LoRA.RuntimeLoad {
		return
	}
	key := instance + "\x00" + adapter
	now := e.edge.Now()
	if e.loads.fresh(key, now) {
		return
	}
	path := m.adapters[adapter].Path
	body, _ := json.Marshal(map[string]string{"lora_name": adapter, "lora_path": path})
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(lctx, http.MethodPost, url+"/v1/load_lora_adapter", bytes.NewReader(body))
	var resp *http.Response
	if err == nil {
		req.Header = http.Header{"Content-Type": {"application/json"}}
		resp, err = e.edge.Client().Do(req)
	}
	result := "failed"
	var detail string
	if err == nil {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK:
			result = "loaded"
		case resp.StatusCode == http.StatusBadRequest && bytes.Contains(b, []byte("already been loaded")):
			result = "already_loaded"
		default:
			detail = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(httpjson.Clip(string(b), 200)))
		}
	} else {
		detail = err.Error()
	}
	e.metrics.LoRALoads.WithLabelValues(m.Name, adapter, result).Inc()
	if result == "failed" {
		e.log.Warn("loading a LoRA adapter at runtime failed (the request goes on; the engine answers it)",
			"instance", instance, "adapter", adapter, "path", path, "err", detail)
		return
	}
	e.loads.confirm(key, e.edge.Now())
}
