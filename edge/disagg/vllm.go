package disagg

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/tether-project/tether/internal/apireq"
)

// vLLM's prefill/decode split through a KV connector (the NixlConnector,
// vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py and
// push_scheduler.py), spoken as vLLM's own proxy speaks it
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, and the
// nixlv2 connector of llm-d's routing sidecar):
//
//  1. the prefill server gets the request for one token, not streamed,
//     without min_tokens and min_completion_tokens, with kv_transfer_params
//     {do_remote_decode: true, do_remote_prefill: false, remote_*: null};
//     it computes the prompt and keeps its blocks for the decode (for
//     kv_lease_duration, 30 s by default, renewed by the decode's
//     heartbeats; VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s, in releases
//     before the lease);
//  2. its answer's kv_transfer_params (do_remote_prefill true,
//     remote_block_ids, remote_engine_id, remote_request_id, remote_host,
//     remote_port, tp_size, and what newer releases add:
//     request_finished) go, as the server wrote them, into the client's
//     request — min_tokens and all — to the decode server, which reads the
//     blocks (freeing them on the prefill server) and generates; its
//     answer (streamed or not) is relayed.
//
// The prefill hands its blocks off whether its one token was length-capped
// or the model stopped (request_finished keeps them for
// FINISHED_LENGTH_CAPPED and FINISHED_STOPPED alike), and the proxy always
// asks the decode, so a model that stops on its first token still goes to
// the decode server: it frees the blocks, and the decode honours the
// client's min_tokens the prefill could not. Releases whose
// request_finished handed off length-capped requests only answer a stopped
// prefill with kv_transfer_params null, having kept nothing: that answer is
// the client's, unless the client asked for more tokens (min_tokens or
// min_completion_tokens above 1), whose request the decode server then
// computes whole.
//
// Both hops carry the same X-Request-Id and each the X-Data-Parallel-Rank
// of its key (Header).

// nixlPrefillParams is the prefill request's kv_transfer_params.
var nixlPrefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// VLLMOwnedFields are what a client may not send (the edge owns the
// handoff).
var VLLMOwnedFields = []string{"kv_transfer_params"}

// VLLMHandoff is the dialect of a request that is handed off from a
// prefill to a decode server: its path (the request's), its max_tokens (0:
// not given), its body top and its API d. False: the prefill server
// answers it whole.
func VLLMHandoff(path string, maxTokens int, top map[string]json.RawMessage, d apireq.Dialect) (Dialect, bool) {
	dl, ok := DialectOf(path)
	if !ok || maxTokens == 1 || Batch(top, d) > 0 {
		// Nothing to hand off (one token is all prefill), or a request
		// the handoff cannot carry: a KV handoff has one consumer, and
		// n > 1 or a batch of prompts would have several pull (or
		// free) the same blocks.
		return nil, false
	}
	return dl, true
}

// VLLMPrefillFields are the prefill request's fields in dialect d for the
// client's body top: one token, not streamed, and the handoff asked for.
func VLLMPrefillFields(d Dialect, top map[string]json.RawMessage) Fields {
	f := d.PrefillFields(top)
	f.Set["kv_transfer_params"] = nixlPrefillParams
	return f
}

// VLLMPrefill is a prefill hop's verified answer.
type VLLMPrefill struct {
	Answer *Answer
	// Params is the answer's kv_transfer_params, for the decode (nil: the
	// server handed nothing off, and the decode computes the request
	// whole).
	Params json.RawMessage
	// Finished: the prefill's one token ended the request and the server
	// handed nothing off (vLLM releases that keep blocks for length-capped
	// requests only): the answer is the client's unless Relayed says not.
	Finished bool
	// agent: the answer is in an agent API (Dialect.Agent).
	agent bool
	// Rank is the prefill's data-parallel rank (-1: none), set by the
	// caller.
	Rank int
	// ID is the X-Request-Id both hops carry, set by the caller.
	ID string
}

// DecodeFields are the decode request's fields: the client's body with
// the prefill's kv_transfer_params as the server wrote them; for a
// prefill that handed nothing off, the client's body alone (the decode
// server computes the prompt).
func (p *VLLMPrefill) DecodeFields() Fields {
	if p.Params == nil {
		return Fields{Set: map[string]json.RawMessage{}, Del: VLLMOwnedFields}
	}
	return Fields{Set: map[string]json.RawMessage{"kv_transfer_params": p.Params}}
}

// Relayed reports whether the prefill's own answer is the client's: the
// model stopped on its one token with nothing handed off, the client asked
// for no more (MustDecode), and the API is chat or completions (an agent
// API's answer comes from the decode server, which computes the request
// whole: the edge renders none of the engine's Messages or Responses
// streams).
func (p *VLLMPrefill) Relayed(top map[string]json.RawMessage) bool {
	return p.Finished && !p.agent && !MustDecode(top)
}

// MustDecode reports whether a request whose prefill finished without a
// handoff still needs the decode server: the client asked for more than
// the one token the prefill could give (min_tokens or
// min_completion_tokens above 1, which the prefill request does not carry).
func MustDecode(top map[string]json.RawMessage) bool {
	for _, k := range []string{"min_tokens", "min_completion_tokens"} {
		var n int
		if raw, ok := top[k]; ok && json.Unmarshal(raw, &n) == nil && n > 1 {
			return true
		}
	}
	return false
}

// ReadVLLMPrefill reads a prefill answer (at most limit bytes of it, the
// body closed): one choice, and the kv_transfer_params naming its blocks —
// required of a request still pending (finish_reason length: the one token
// it was allowed); a request the model stopped is handed off when the
// server names its blocks, else Finished.
func ReadVLLMPrefill(resp *http.Response, limit int64, d Dialect) (*VLLMPrefill, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("reading the response: %w", err)
	}
	a, err := d.ReadAnswer(b)
	if err != nil {
		return nil, err
	}
	if a.Choices != 1 {
		return nil, fmt.Errorf("%d choices, want 1", a.Choices)
	}
	pre := &VLLMPrefill{Answer: a, Params: a.Raw["kv_transfer_params"], agent: d.Agent()}
	delete(a.Raw, "kv_transfer_params")
	var params struct {
		DoRemotePrefill bool `json:"do_remote_prefill"`
	}
	if !apireq.IsNull(pre.Params) && json.Unmarshal(pre.Params, &params) == nil && params.DoRemotePrefill {
		return pre, nil
	}
	pre.Params = nil
	switch {
	case !FinishPending(a.Finish):
		// The model stopped on its first token and the server kept
		// nothing (request_finished of releases that hand off
		// FINISHED_LENGTH_CAPPED only).
		pre.Finished = true
		return pre, nil
	case pre.agent:
		// A release whose Messages or Responses API predates
		// kv_transfer_params: the decode server computes the request.
		return pre, nil
	}
	return nil, errors.New("no kv_transfer_params with do_remote_prefill: is the server started with --kv-transfer-config (kv_connector NixlConnector, kv_role kv_producer or kv_both)?")
}

// PatchUsageCached sets usage.prompt_tokens_details.cached_tokens.
func PatchUsageCached(usage json.RawMessage, cached int) json.RawMessage {
	if apireq.IsNull(usage) {
		return usage
	}
	b := patchCachedTokens(marshal(map[string]json.RawMessage{"usage": usage}), cached)
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil {
		return usage
	}
	return top["usage"]
}

// patchCachedTokens sets usage.prompt_tokens_details.cached_tokens in a
// response object (unchanged when it has no usage).
func patchCachedTokens(b []byte, cached int) []byte {
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil {
		return b
	}
	raw, ok := top["usage"]
	if !ok || apireq.IsNull(raw) {
		return b
	}
	var usage map[string]json.RawMessage
	if json.Unmarshal(raw, &usage) != nil {
		return b
	}
	details := map[string]json.RawMessage{}
	if d, ok := usage["prompt_tokens_details"]; ok && !apireq.IsNull(d) {
		_ = json.Unmarshal(d, &details)
	}
	details["cached_tokens"] = json.RawMessage(strconv.Itoa(cached))
	usage["prompt_tokens_details"] = marshal(details)
	top["usage"] = marshal(usage)
	return marshal(top)
}
