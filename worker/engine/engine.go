// Package engine defines what a worker runs requests on: the simulated
// engine (paged prefix cache per ADP rank, computed prefill/decode timing) or
// a proxy to a real OpenAI-compatible server. The worker's HTTP layer,
// scheduler and telemetry only see this interface.
package engine

import (
	"context"
	"time"
)

// Phase is the disaggregated phase a request runs.
type Phase uint8

const (
	// PhaseAggregated runs prefill and decode on this worker.
	PhaseAggregated Phase = iota
	// PhaseContextOnly runs prefill only and returns the first token plus
	// the state the generation side needs.
	PhaseContextOnly
	// PhaseGenerationOnly continues from a context-phase result.
	PhaseGenerationOnly
)

func (p Phase) String() string {
	switch p {
	case PhaseAggregated:
		return "aggregated"
	case PhaseContextOnly:
		return "context_only"
	case PhaseGenerationOnly:
		return "generation_only"
	}
	return "phase(?)"
}

// Request is one inference request after the worker has parsed, verified
// and scheduled it. Engines never see routing hints.
type Request struct {
	ID     string // worker-unique request id
	Rank   int    // ADP rank chosen by the scheduler
	Model  string
	Prompt []uint32 // prompt token ids (internal/prefix tokenizer)
	// MaxTokens bounds the completion tokens (the client's max_tokens, or
	// what the worker decided without one). The simulated engine needs it
	// (>= 1); 0 lets a proxied engine apply its own default.
	MaxTokens int
	Phase     Phase
	// ContextState is the opaque state returned by a context-only run,
	// given back to the generation side (PhaseGenerationOnly).
	ContextState []byte
	// Raw is the original request body, for engines that forward it
	// (the proxy). The simulated engine ignores it.
	Raw []byte
	// Path is the API path the request arrived on (/v1/chat/completions
	// or /v1/completions), for proxies.
	Path string
	// Output shapes what the simulated engine answers (tool calls, JSON,
	// stop sequences, seed). Nil: free text. Proxies ignore it: the
	// upstream reads the same options from Raw.
	Output *OutputOptions
	// Adapter is the LoRA adapter the request runs under ("" the base
	// model): the engine keys its blocks by it (internal/prefix
	// AdapterBlockHashes) and holds it in a slot while it runs.
	Adapter string
}

// OutputOptions are the request options that shape a chat answer, parsed
// and validated by the worker (worker/chatopts.go).
type OutputOptions struct {
	Tools []Tool
	// ToolChoice is "none", "auto", "required" or "function" (then
	// ToolName names it). Empty: "auto" with tools, "none" without.
	ToolChoice string
	ToolName   string
	// ParallelToolCalls allows more than one call in an answer.
	ParallelToolCalls bool
	// ResponseFormat is "", "text", "json_object" or "json_schema" (with
	// Schema, the JSON schema the answer must satisfy).
	ResponseFormat string
	Schema         []byte
	Stop           []string
	// Seed, when set, varies the deterministic output.
	Seed *int64
	// IgnoreEOS and MinTokens are vLLM's sampling extensions: free text
	// runs to MaxTokens, or at least MinTokens before it may stop.
	IgnoreEOS bool
	MinTokens int
	// LastUserText is what the user wrote in the last user turn (without
	// the context agent harnesses add to user messages: worker/chatopts.go);
	// ToolResults is true when a tool message follows it (the tools
	// already ran).
	LastUserText string
	ToolResults  bool
}

// Tool is a function the model may call.
type Tool struct {
	Name       string
	Parameters []byte // JSON schema of the arguments (may be empty)
	// Own is the name a user names the tool by when it differs from Name:
	// a Responses namespace's function's own name (Name is the
	// namespace__name an engine renders).
	Own string
	// Subagent marks a tool that starts a sub-agent (the worker's
	// engine.subagent_tools): the simulated model calls it only when the
	// user names it exactly, never as a fallback.
	Subagent bool
}

// Mention is the name a user names the tool by: Own, else Name.
func (t Tool) Mention() string {
	if t.Own != "" {
		return t.Own
	}
	return t.Name
}

// ToolCall is one function call of an answer.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string
}

// Chunk is one streamed piece of output: text, or a piece of a tool call.
type Chunk struct {
	Text string
	// ToolCall, when set, is a delta of call number ToolIndex: its first
	// delta carries ID and Name, the following ones pieces of Arguments.
	ToolCall  *ToolCall
	ToolIndex int
}

// Completion is the outcome of a run.
type Completion struct {
	PromptTokens     int
	CachedTokens     int // prompt tokens served from the rank's prefix cache
	CompletionTokens int
	Text             string // the whole generated text
	ToolCalls        []ToolCall
	FinishReason     string // "stop", "length" or "tool_calls"
	// ContextState is set by context-only runs: what the generation side
	// needs to continue (for the simulator: the prompt and first token).
	ContextState []byte
	// Timings of the run (simulated or measured).
	Queue, Prefill, Transfer, Decode time.Duration
	// TransferTokens are prompt tokens a generation-only run had to
	// receive from the context side because its rank did not hold them.
	TransferTokens int
}

// RankStats is one ADP rank's load and cache figures, as telemetry reports them.
type RankStats struct {
	Rank               int
	ActivePromptTokens int // prompt tokens of requests admitted and not finished
	ActiveRequests     int
	QueuedRequests     int
	// PrefillTokens is the prefill still to compute for the admitted
	// requests, in prompt tokens: queued prompts less what the cache holds
	// of them, and the rest of a running prefill (telemetry's
	// RankLoad.PrefillTokens).
	PrefillTokens int
	KVBlocksUsed  int
	KVBlocksTotal int
	// Cache effectiveness over a rolling window: prompt tokens looked up
	// and prompt tokens hit.
	WindowLookupTokens int64
	WindowHitTokens    int64
	Evictions          int64 // blocks evicted since start
	// LoRA adapter slots (engines serving adapters): the adapters held,
	// least recently used first; those with admitted requests; loads
	// since start.
	LoRAAdapters []string
	LoRARunning  []string
	LoRALoads    int64
}

// KVEvent reports blocks stored in or removed from a rank's cache.
type KVEvent struct {
	Rank    int
	Stored  []uint64 // chained block hashes (internal/prefix)
	Removed []uint64
}

// Engine runs requests.
// RankPrefixer is implemented by engines that can say, before a run, how
// much of a prompt each rank holds as a cached prefix (the worker's
// kv_aware rank placement reads it; engines that cannot, such as proxies,
// leave placement to load).
type RankPrefixer interface {
	// CachedPrefix returns, per rank, the prompt tokens held as a cached
	// prefix.
	CachedPrefix(prompt []uint32) []int
}

// AdapterHolder is implemented by engines that hold LoRA adapters in
// bounded slots per rank: AdapterRanks reports, per rank, whether it holds
// adapter, and the worker's rank placement prefers those ranks for new
// conversations (worker/adp).
type AdapterHolder interface {
	AdapterRanks(adapter string) []bool
}

type Engine interface {
	// Run executes req, calling emit for each output chunk as it is
	// produced (streaming callers forward them; others ignore them). It
	// returns when the request completes, fails, or ctx is done.
	Run(ctx context.Context, req Request, emit func(Chunk) error) (Completion, error)
	// Stats returns per-rank figures, indexed by rank.
	Stats() []RankStats
	// SetKVEventSink registers a function called (synchronously, keep it
	// cheap) with every change to the ranks' caches. Proxies may never call it.
	SetKVEventSink(func(KVEvent))
	// Close releases the engine's resources.
	Close() error
}
