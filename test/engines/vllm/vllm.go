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
		DataParallelSize: o.DataParallelSize, ReportCachedTokens: o.PromptTokensDetails, ResponsesStore: o.ResponsesStore})
}
