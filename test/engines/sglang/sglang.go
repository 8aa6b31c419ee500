// Package sglang is a stand-in for an SGLang server (sglang.launch_server
// --enable-metrics) in tests: the OpenAI-compatible paths, /health (a
// one-token generation answered after a second, as upstream), /metrics
// (sglang:* gauges labelled dp_rank="<rank>" with data parallelism), the
// X-Data-Parallel-Rank header as SGLang reads it (a non-integer is a 400; a
// rank outside [0, --dp-size) is a 400) and, with KVEvents, the
// --kv-events-config ZeroMQ publishers and, with PD, one side of SGLang's
// prefill/decode split (--disaggregation-mode, the bootstrap server). The
// shared server and the upstream each behaviour follows live in
// test/engines/oaiserve.
package sglang

import "github.com/tether-project/tether/test/engines/oaiserve"

// Options configure the stand-in (see oaiserve.Options).
type Options struct {
	Model string
	// DPSize is --dp-size (default 1).
	DPSize int
	// CacheReport is --enable-cache-report: usage reports
	// prompt_tokens_details.cached_tokens when any were cached (else null).
	CacheReport bool
	// FastHealth is SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false (see
	// oaiserve.Options.SGLangFastHealth); by default /health takes a second.
	FastHealth bool
	// TPSize is each data-parallel group's tensor-parallel ranks; with
	// AllSchedulers (--enable-metrics-for-all-schedulers) each of them
	// exports the group's figures on /metrics.
	TPSize        int
	AllSchedulers bool
	// PageSize is --page-size (default 1); GPUBlocks the KV pages per
	// rank (default 4096).
	PageSize, GPUBlocks int
	// KVEvents is --kv-events-config with the ZeroMQ publisher (nil: off).
	KVEvents *oaiserve.KVEventsOptions
	// PD is --disaggregation-mode prefill or decode (its bootstrap server
	// on BootstrapPort; oaiserve/pd_sglang.go); nil: null (aggregated).
	PD *oaiserve.PDOptions
	// StreamGate runs before each streamed token (oaiserve.Options).
	StreamGate func(token int)
	// LoRAPaths is --enable-lora --lora-paths (name=path, or name);
	// MaxLoRAsPerBatch --max-loras-per-batch (oaiserve/lora.go: a request
	// names its adapter by lora_path or model "<base>:<adapter>").
	LoRAPaths        []string
	MaxLoRAsPerBatch int
}

// Server is a running stand-in.
type Server = oaiserve.Server

// Served is one answered request.
type Served = oaiserve.Served

// Start starts a stand-in on a loopback port.
func Start(o Options) *Server {
	return oaiserve.Start(oaiserve.Options{Engine: oaiserve.SGLang, Model: o.Model,
		DataParallelSize: o.DPSize, ReportCachedTokens: o.CacheReport, SGLangFastHealth: o.FastHealth,
		SGLangTPSize: o.TPSize, SGLangAllSchedulers: o.AllSchedulers, BlockSize: o.PageSize, GPUBlocks: o.GPUBlocks, KVEvents: o.KVEvents,
		PD: o.PD, StreamGate: o.StreamGate, LoRAModules: o.LoRAPaths, MaxLoRAs: o.MaxLoRAsPerBatch})
}
