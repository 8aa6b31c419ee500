package catalog

import (
	"net/http"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/httpjson"
)

// Serves answers 501 for a dialect the fleets of model m do not serve
// (nil: served). trtllm-serve's disaggregated server serves only
// /v1/completions and /v1/chat/completions
// (tensorrt_llm/serve/openai_disagg_server.py register_routes), and the
// edge does not translate one API into another. A vLLM split serves every
// API: Messages and Responses carry kv_transfer_params as chat does
// (edge/disagg agentapis.go). An SGLang split serves neither Messages nor
// Responses: their request models carry no bootstrap fields
// (python/sglang/srt/entrypoints/anthropic/protocol.py,
// openai/protocol.py ResponsesRequest), and a split server refuses a
// request without a bootstrap room.
func (m *Model) Serves(d apireq.Dialect) *api.Error {
	if d != apireq.Messages && d != apireq.Responses {
		return nil
	}
	if m.Cfg.PDEngine() == config.EngineSGLang {
		return api.NewError(http.StatusNotImplemented, "invalid_request_error", "unsupported_endpoint", "",
			"the fleets of model %q are an SGLang prefill/decode split, and SGLang's %s API (%s) carries no bootstrap fields (bootstrap_host, bootstrap_port, bootstrap_room), so its servers cannot hand a request off through it: send chat completions, or serve it from an aggregated fleet or a vLLM split (docs/engines.md)",
			httpjson.Clip(m.Name, 200), d, d.Path())
	}
	if !m.TRTLLM() {
		return nil
	}
	return api.NewError(http.StatusNotImplemented, "invalid_request_error", "unsupported_endpoint", "",
		"the fleets of model %q are served by trtllm-serve in disaggregated mode, whose disaggregated server serves only /v1/completions and /v1/chat/completions; the %s API (%s) is not translated by tether: send chat completions, or serve it with engine vllm, sglang or tether workers (docs/engines.md)",
		httpjson.Clip(m.Name, 200), d, d.Path())
}

// ServesRequest is Serves for a parsed request: a Messages count_tokens
// request generates nothing, and every server of a split counts tokens
// (vLLM's and SGLang's /v1/messages/count_tokens need no handoff).
func (m *Model) ServesRequest(p *apireq.Request) *api.Error {
	if p.CountTokens && m.Cfg.PDEngine() != "" {
		return nil
	}
	return m.Serves(p.Dialect)
}

// ByIDServed answers 501 to a request by response id when no model's
// fleets serve the Responses API (trtllm-serve, SGLang splits): no such id
// can have been minted. Otherwise (nil) the id names the instance
// that holds it.
func (e *Catalogue) ByIDServed() *api.Error {
	for _, m := range e.models {
		if m.Serves(apireq.Responses) == nil {
			return nil
		}
	}
	return e.models[0].Serves(apireq.Responses)
}

// TRTLLM reports whether m's fleets are served by trtllm-serve's
// disaggregated server.
func (m *Model) TRTLLM() bool {
	return m.Cfg.ContextServers.Engine.Kind() == config.EngineTRTLLM || m.Cfg.GenerationServers.Engine.Kind() == config.EngineTRTLLM
}

// ServesConversations answers 501 for a model whose fleets are engines
// the edge relays to directly (vLLM, SGLang, trtllm-serve, prefill/decode
// splits): they serve no Conversations API, and no tether worker is there
// to hold one (a proxy worker in front of them does: engine.type proxy).
func (m *Model) ServesConversations() *api.Error {
	if aerr := m.Serves(apireq.Responses); aerr != nil {
		return aerr
	}
	if m.Cfg.EngineAggregated() || m.Cfg.PDEngine() != "" {
		return api.NewError(http.StatusNotImplemented, "invalid_request_error", "unsupported_endpoint", "",
			"the fleets of model %q are %s engines, which serve no Conversations API: run tether workers in front of them (engine.type: proxy) to hold conversations (docs/engines.md)",
			httpjson.Clip(m.Name, 200), m.Cfg.ContextServers.Engine.Kind())
	}
	return nil
}

// BootstrapPort is the bootstrap port of SGLang prefill instance id, in
// whichever model's context fleet lists it (SGLang's default when none).
func (e *Catalogue) BootstrapPort(id string) int {
	for _, m := range e.models {
		for _, si := range m.Cfg.ContextServers.URLs {
			if si.ID() == id && si.BootstrapPort > 0 {
				return si.BootstrapPort
			}
		}
	}
	return disagg.DefaultSGLangBootstrapPort
}
