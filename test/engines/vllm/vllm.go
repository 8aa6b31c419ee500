// Package vllm is a stand-in for `vllm serve` in tests: the OpenAI-compatible
// paths, /health, /metrics (vllm:* gauges labelled engine="<rank>") and the
// X-Data-Parallel-Rank header as vLLM reads it (a non-integer is ignored and
// its own balancer picks; a rank outside [0, --data-parallel-size) is a 400).
// The shared server lives in test/engines/oaiserve.
package vllm

import "github.com/tether-project/tether/test/engines/oaiserve"

// Options configure the stand-in (see oaiserve.Options).
type Options struct {
	Model string
	// DataParallelSize is --data-parallel-size (default 1).
	DataParallelSize int
	// PromptTokensDetails is --enable-prompt-tokens-details: usage reports
	// prompt_tokens_details.cached_tokens (else null).
	PromptTokensDetails bool
	// LoRAModules is --lora-modules (name=path, or name), MaxLoRAs
	// --max-loras (default 1), RuntimeLoRA
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: adapters served with
	// vllm:lora_requests_info and POST /v1/load_lora_adapter
	// (test/engines/oaiserve/lora.go).
	LoRAModules []string
	MaxLoRAs    int
	RuntimeLoRA bool
}

// Server is a running stand-in.
type Server = oaiserve.Server

// Served is one answered request.
type Served = oaiserve.Served

// Start starts a stand-in on a loopback port.
func Start(o Options) *Server {
	return oaiserve.Start(oaiserve.Options{Engine: oaiserve.VLLM, Model: o.Model,
		DataParallelSize: o.DataParallelSize, ReportCachedTokens: o.PromptTokensDetails,
		LoRAModules: o.LoRAModules, MaxLoRAs: o.MaxLoRAs, RuntimeLoRA: o.RuntimeLoRA})
}
