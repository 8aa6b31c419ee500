// Package vllm is a stand-in for `vllm serve` in tests: the OpenAI-compatible
// paths, /health, /metrics (vllm:* gauges labelled engine="<rank>"), the
// X-Data-Parallel-Rank header as vLLM reads it (a non-integer is ignored and
// its own balancer picks; a rank outside [0, --data-parallel-size) is a 400)
// and, with KVEvents, the --kv-events-config ZeroMQ publishers (one per
// data-parallel rank, on consecutive ports) and, with PD, one side of
// vLLM's prefill/decode split through the NixlConnector. The shared server
// and the upstream each behaviour follows live in test/engines/oaiserve.
package vllm

import "github.com/tether-project/tether/test/engines/oaiserve"

// Options configure the stand-in (see oaiserve.Options).
type Options struct {
	Model string
	// DataParallelSize is --data-parallel-size (default 1).
	DataParallelSize int
	// PromptTokensDetails is --enable-prompt-tokens-details: usage reports
	// prompt_tokens_details.cached_tokens when any were cached (else null).
	PromptTokensDetails bool
	// LoRAModules is --lora-modules (name=path, or name), MaxLoRAs
	// --max-loras (default 1), RuntimeLoRA
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: adapters served with
	// vllm:lora_requests_info and POST /v1/load_lora_adapter
	// (test/engines/oaiserve/lora.go).
	LoRAModules []string
	MaxLoRAs    int
	RuntimeLoRA bool
	// ZeroCachedDetails is the release that also reports cached_tokens 0.
	ZeroCachedDetails bool
	// BlockSize is --block-size (default 16); GPUBlocks the KV blocks per
	// engine core (default 4096).
	BlockSize, GPUBlocks int
	// KVEvents is --kv-events-config with the ZeroMQ publisher (nil: off).
	KVEvents *oaiserve.KVEventsOptions
	// PD is --kv-transfer-config with the NixlConnector: the server is a
	// prefill (kv_role kv_producer) or decode (kv_consumer) server of a
	// prefill/decode split (oaiserve/pd_vllm.go); nil: none.
	PD *oaiserve.PDOptions
	// StreamGate runs before each streamed token (oaiserve.Options).
	StreamGate func(token int)
	// ResponsesStore is VLLM_ENABLE_RESPONSES_API_STORE=1.
	ResponsesStore bool
}

// Server is a running stand-in.
type Server = oaiserve.Server

// Served is one answered request.
type Served = oaiserve.Served

// Start starts a stand-in on a loopback port.
func Start(o Options) *Server {
	return oaiserve.Start(oaiserve.Options{Engine: oaiserve.VLLM, Model: o.Model,
		DataParallelSize: o.DataParallelSize, ReportCachedTokens: o.PromptTokensDetails, VLLMZeroCachedDetails: o.ZeroCachedDetails,
		BlockSize: o.BlockSize, GPUBlocks: o.GPUBlocks, KVEvents: o.KVEvents, PD: o.PD, StreamGate: o.StreamGate,
		LoRAModules: o.LoRAModules, MaxLoRAs: o.MaxLoRAs, RuntimeLoRA: o.RuntimeLoRA, ResponsesStore: o.ResponsesStore})
}
