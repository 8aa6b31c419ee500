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
// vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py), spoken
// as vLLM's own proxy speaks it
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, and the
// nixlv2 connector of llm-d's routing sidecar):
//
//  1. the prefill server gets the request for one token, not streamed,
//     with kv_transfer_params {do_remote_decode: true, do_remote_prefill:
//     false, remote_*: null}; it computes the prompt and keeps its blocks
//     (for VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s);
//  2. its answer's kv_transfer_params (do_remote_prefill true,
//     remote_block_ids, remote_engine_id, remote_request_id, remote_host,
//     remote_port, tp_size: NixlConnectorScheduler.request_finished) go,
//     as the server wrote them, into the client's request to the decode
//     server, which reads the blocks and generates; its answer (streamed or
//     not) is relayed.
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
	// Params is the answer's kv_transfer_params, for the decode.
	Params json.RawMessage
	// Finished: the prefill's one token ended the request (EOS: vLLM
	// hands nothing off): the answer is the client's.
	Finished bool
	// Rank is the prefill's data-parallel rank (-1: none), set by the
	// caller.
	Rank int
	// ID is the X-Request-Id both hops carry, set by the caller.
	ID string
}

// DecodeFields are the decode request's fields: the client's body with
// the prefill's kv_transfer_params as the server wrote them.
func (p *VLLMPrefill) DecodeFields() Fields {
	return Fields{Set: map[string]json.RawMessage{"kv_transfer_params": p.Params}}
}

// ReadVLLMPrefill reads a prefill answer (at most limit bytes of it, the
// body closed): one choice, and for a request still pending (finish_reason
// length: the one token it was allowed) the kv_transfer_params naming its
// blocks.
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
	pre := &VLLMPrefill{Answer: a, Params: a.Raw["kv_transfer_params"]}
	delete(a.Raw, "kv_transfer_params")
	if !FinishPending(a.Finish) {
		// The model stopped on its first token: request_finished hands
		// nothing off for a request that did not finish length-capped.
		pre.Finished = true
		return pre, nil
	}
	var params struct {
		DoRemotePrefill bool `json:"do_remote_prefill"`
	}
	if apireq.IsNull(pre.Params) || json.Unmarshal(pre.Params, &params) != nil || !params.DoRemotePrefill {
		return nil, errors.New("no kv_transfer_params with do_remote_prefill: is the server started with --kv-transfer-config (kv_connector NixlConnector, kv_role kv_producer or kv_both)?")
	}
	return pre, nil
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
