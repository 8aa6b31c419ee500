package oaiserve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"time"
)

// PDRole is a server's side of a prefill/decode split.
type PDRole string

const (
	// PDPrefill computes prompts and keeps their KV for a decode server:
	// vLLM with --kv-transfer-config '{"kv_connector": "NixlConnector",
	// "kv_role": "kv_producer"}' (kv_both serves either side by the
	// request's kv_transfer_params), SGLang --disaggregation-mode prefill.
	PDPrefill PDRole = "prefill"
	// PDDecode reads a prompt's KV from the prefill server and generates:
	// vLLM kv_role kv_consumer, SGLang --disaggregation-mode decode.
	PDDecode PDRole = "decode"
)

// Handoff kinds recorded in Served.Handoff.
const (
	HandoffPrefill = "prefill" // computed a prompt and kept its KV for a decode
	HandoffDecode  = "decode"  // generated from KV read from a prefill server
	// HandoffDecodeRecomputed: the KV could not be read and the server
	// computed the prompt itself (vLLM kv_load_failure_policy recompute).
	HandoffDecodeRecomputed = "decode-recomputed"
	// HandoffDecodeInvalidParams: kv_transfer_params asked for a remote
	// prefill without the fields to read it; vLLM computes the prompt
	// locally (NixlConnectorScheduler.update_state_after_alloc: "Got
	// invalid KVTransferParams ... will not utilize KVTransfer").
	HandoffDecodeInvalidParams = "decode-invalid-params"
	// HandoffDecodeFailed: the KV could not be read and the request
	// failed as the engine fails it.
	HandoffDecodeFailed = "decode-failed"
	// HandoffPrefillFailed: a prefill whose decode never came (SGLang's
	// bootstrap timeout) or that was aborted.
	HandoffPrefillFailed = "prefill-failed"
)

// PDOptions configure one side of a prefill/decode split.
type PDOptions struct {
	Role PDRole
	// KVLoadFailurePolicy is vLLM's kv_load_failure_policy (decode):
	// "fail" (the default, vllm/config/kv_transfer.py) ends a request
	// whose KV cannot be read with an error; "recompute" computes it.
	KVLoadFailurePolicy string
	// KVLeaseDuration is the NixlConnector's kv_lease_duration
	// (kv_connector_extra_config; prefill, default 30 s,
	// nixl/base_scheduler.py): how long a finished prefill keeps its blocks
	// for a decode that never reads them (the decode's heartbeats renew it;
	// the stand-in's decode reads at once). With LegacyNIXL it stands for
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT (default 480 s).
	KVLeaseDuration time.Duration
	// LegacyNIXL is a vLLM release whose NixlConnectorScheduler.request_finished
	// hands off FINISHED_LENGTH_CAPPED requests only: a prefill the model
	// stopped on its first token frees its blocks at once and answers
	// kv_transfer_params null. Current releases (nixl/pull_scheduler.py,
	// push_scheduler.py) hand off FINISHED_STOPPED too.
	LegacyNIXL bool
	// BootstrapTimeout is SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT
	// (prefill, default 300 s): how long a prefill waits for its decode to
	// connect; WaitingTimeout is SGLANG_DISAGGREGATION_WAITING_TIMEOUT
	// (decode, default 300 s): how long a decode waits for the KV.
	BootstrapTimeout, WaitingTimeout time.Duration
	// FirstTokenEOS makes the model's first token EOS: the request
	// finishes with finish_reason stop after one token unless it asks for
	// min_tokens above 1 (vLLM masks the stop tokens until min_tokens are
	// out: MinTokensLogitsProcessor). On a prefill server the stopped
	// request is handed off as any other (LegacyNIXL: nothing is).
	FirstTokenEOS bool
	// AgentAPIsIgnoreKVTransfer is a vLLM release whose Messages and
	// Responses APIs predate kv_transfer_params (pd_agentapi.go): both
	// drop the field, so a request on either is computed whole and
	// answers no handoff.
	AgentAPIsIgnoreKVTransfer bool
	// BeforeHandoff, when set, runs on a decode server when a request
	// arrives, before it reads the prompt's KV (tests: stop the prefill
	// server between the two hops).
	BeforeHandoff func()
}

// Sources of a prompt's tokens: vLLM's vllm:prompt_tokens_by_source
// (vllm/v1/metrics/loggers.py) labels.
const (
	srcCompute  = iota // local_compute: computed here (prefill work)
	srcCacheHit        // local_cache_hit: this server's prefix cache
	srcExternal        // external_kv_transfer: read from a prefill server
	numSources
)

var sourceLabels = [numSources]string{"local_compute", "local_cache_hit", "external_kv_transfer"}

type sources struct{ compute, cacheHit, external int }

func (s *Server) addSourcesLocked(rank int, src sources) {
	s.sources[rank][srcCompute] += int64(src.compute)
	s.sources[rank][srcCacheHit] += int64(src.cacheHit)
	s.sources[rank][srcExternal] += int64(src.external)
}

// PromptTokensBySource sums every rank's prompt tokens by source:
// computed here, found in this server's cache, read from a prefill server.
func (s *Server) PromptTokensBySource() (compute, cacheHit, external int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.sources {
		compute += r[srcCompute]
		cacheHit += r[srcCacheHit]
		external += r[srcExternal]
	}
	return compute, cacheHit, external
}

// pdState is a split server's transfer side: vLLM's NIXL side channel
// (pd_vllm.go) or SGLang's bootstrap server (pd_sglang.go), and what they
// hold.
type pdState struct {
	opts   PDOptions
	side   *httptest.Server
	client *http.Client

	mu        sync.Mutex
	warnings  []string            // what the engine would log as warnings
	engineIDs []string            // vLLM: each rank's engine id
	held      map[string]*heldKV  // vLLM: finished prefills by request id
	nextBlock []int               // vLLM: each rank's next block id
	rooms     map[roomKey]*pdRoom // SGLang: bootstrap rooms by rank
}

func (s *Server) startPD(o PDOptions) {
	if o.KVLoadFailurePolicy == "" {
		o.KVLoadFailurePolicy = "fail"
	}
	if o.KVLeaseDuration <= 0 {
		o.KVLeaseDuration = 30 * time.Second
		if o.LegacyNIXL {
			o.KVLeaseDuration = 480 * time.Second
		}
	}
	if o.BootstrapTimeout <= 0 {
		o.BootstrapTimeout = 300 * time.Second
	}
	if o.WaitingTimeout <= 0 {
		o.WaitingTimeout = 300 * time.Second
	}
	s.pd = &pdState{opts: o, client: &http.Client{Transport: &http.Transport{Proxy: nil}},
		held: map[string]*heldKV{}, nextBlock: make([]int, s.opts.DataParallelSize), rooms: map[roomKey]*pdRoom{}}
	mux := http.NewServeMux()
	if s.opts.Engine == SGLang {
		s.registerBootstrap(mux)
	} else {
		s.registerSideChannel(mux)
	}
	s.pd.side = httptest.NewServer(mux)
}

// warnf records a warning the engine logs.
func (s *Server) warnf(format string, args ...any) {
	s.pd.mu.Lock()
	defer s.pd.mu.Unlock()
	s.pd.warnings = append(s.pd.warnings, fmt.Sprintf(format, args...))
}

// Warnings are the warnings the engine would have logged (a handoff it
// could not use).
func (s *Server) Warnings() []string {
	if s.pd == nil {
		return nil
	}
	s.pd.mu.Lock()
	defer s.pd.mu.Unlock()
	return slices.Clone(s.pd.warnings)
}

func (s *Server) closePD() {
	if s.pd == nil {
		return
	}
	s.pd.side.Close()
	s.pd.client.CloseIdleConnections()
}

// Kill stops the server as a crashed process stops: its listeners close
// (new connections are refused) and every open connection is cut, streams
// included. Close still releases the rest afterwards.
func (s *Server) Kill() {
	s.mu.Lock()
	s.healthy = false
	s.mu.Unlock()
	_ = s.ts.Listener.Close()
	s.ts.CloseClientConnections()
	if s.pd != nil {
		_ = s.pd.side.Listener.Close()
		s.pd.side.CloseClientConnections()
	}
}

// handoff is one request's part in a split; nil on an aggregated server
// (every method answers as for a plain request).
type handoff struct {
	kind string
	// got: the prompt's KV was read from the prefill server (recv, its
	// tokens); a decode without it computes the prompt itself.
	got    bool
	recv   []uint32
	prompt []uint32 // the decode's own prompt (receivedLocked)
	// fields are set on the non-streamed answer (vLLM's
	// kv_transfer_params).
	fields map[string]any
	finish string

	reqID string  // vLLM prefill: the engine's request id
	room  *pdRoom // SGLang prefill: the bootstrap room
	// oneToken: the server generates only the first token (an SGLang
	// prefill server; the decode generates the rest).
	oneToken bool
}

// handoff resolves the request's part in the split: nil, true for a plain
// request; ok=false when the engine's answer (an error) is written.
func (s *Server) handoff(w http.ResponseWriter, r *http.Request, top map[string]json.RawMessage, req request, chat bool, tokens []uint32, last string, rank *int, headerRank bool) (*handoff, bool) {
	if s.pd == nil {
		return nil, true
	}
	rq := pdRequest{r: r, req: req, chat: chat, tokens: tokens, last: last}
	if s.opts.Engine == SGLang {
		return s.sglangHandoff(w, rq, top, rank, headerRank)
	}
	return s.vllmHandoff(w, rq, top, *rank)
}

// pdRequest is the request a split server handles.
type pdRequest struct {
	r    *http.Request
	req  request
	chat bool
	// agent is the agent API the request came in on ("" chat or
	// completions; pd_agentapi.go).
	agent  string
	tokens []uint32
	last   string
}

// recordFailed records a request that failed its handoff.
func (s *Server) recordFailed(rq pdRequest, rank int, kind string) {
	s.mu.Lock()
	s.served = append(s.served, Served{Path: rq.r.URL.Path, Rank: rank, LastUser: rq.last, PromptTokens: len(rq.tokens), Stream: rq.req.Stream, Handoff: kind})
	s.mu.Unlock()
}

func (h *handoff) received() bool { return h != nil && h.got }

func (h *handoff) name() string {
	if h == nil {
		return ""
	}
	return h.kind
}

func (h *handoff) mismatch() bool { return h != nil && h.got && !slices.Equal(h.recv, h.prompt) }

// outputTokens is how many tokens the server generates for a request that
// asked for n.
func (h *handoff) outputTokens(n int) int {
	if h != nil && h.oneToken {
		return 1
	}
	return n
}

func (h *handoff) finishReason() string {
	if h == nil || h.finish == "" {
		return "length"
	}
	return h.finish
}

func (h *handoff) answerFields(answer map[string]any) {
	if h == nil {
		return
	}
	for k, v := range h.fields {
		answer[k] = v
	}
}

// prefilledLocked runs after a prefill computed its prompt: the KV is kept
// for the decode (vLLM: held under the request id, named in
// kv_transfer_params; SGLang: handed to the room's waiting decode).
func (h *handoff) prefilledLocked(s *Server, rank int, tokens []uint32) {
	if h == nil || h.kind != HandoffPrefill {
		return
	}
	if s.opts.Engine == SGLang {
		h.room.setReady(tokens)
		return
	}
	s.vllmHoldLocked(h, rank, tokens)
}

// awaitDecode (SGLang prefill) waits until the decode took the KV before
// answering; false when the answer (an error) is written.
func (h *handoff) awaitDecode(w http.ResponseWriter, s *Server) bool {
	if h == nil || h.room == nil {
		return true
	}
	return s.sglangAwaitTransfer(w, h)
}

// receivedLocked stores a decode's received prompt in its cache (the
// blocks are now local) and accounts for where its tokens came from.
func (s *Server) receivedLocked(rank int, adapter string, tokens []uint32, h *handoff) (cached int, src sources) {
	h.prompt = tokens
	bs := s.opts.BlockSize
	hit, stored, removed := s.caches[rank].lookup(tokens, bs, adapter)
	s.publishLocked(rank, stored, removed, false)
	local := min(hit*bs, len(tokens))
	if s.opts.Engine == SGLang {
		// The prefill computed every prompt token and sent its first
		// output token with the KV (disaggregation/prefill.py
		// send_kv_chunk with the metadata buffer): nothing is computed
		// here. A decode server runs without its radix cache by default
		// (--disaggregation-decode-enable-radix-cache off), so it reports
		// nothing cached.
		return 0, sources{external: len(tokens)}
	}
	// vLLM: once the remote blocks are in, the scheduler counts the prompt
	// computed up to its last token, whose logits it computes itself
	// (v1/core/sched/scheduler.py _update_waiting_for_remote_kv), and
	// reports those tokens as cached.
	n := max(len(tokens)-1, 0)
	local = min(local, n)
	return n, sources{cacheHit: local, external: n - local, compute: len(tokens) - n}
}
