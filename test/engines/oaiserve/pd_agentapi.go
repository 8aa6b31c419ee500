package oaiserve

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"

	"github.com/tether-project/tether/internal/prefix"
)

// The agents' APIs on one side of a prefill/decode split.
//
// vLLM: POST /v1/messages and /v1/responses take kv_transfer_params and
// answer theirs as chat does — vllm/entrypoints/anthropic/protocol.py
// AnthropicMessagesRequest.kv_transfer_params, passed into the chat request
// (serving.py _build_base_request) and back into AnthropicMessagesResponse
// (messages_full_converter; api_router.py dumps it with exclude_none);
// vllm/entrypoints/openai/responses/protocol.py ResponsesRequest and
// ResponsesResponse.kv_transfer_params (vllm-project/vllm#37424). So a
// prefill server keeps the prompt's blocks and names them, a decode server
// reads them, as for chat (pd_vllm.go). Releases before those fields
// (PDOptions.AgentAPIsIgnoreKVTransfer) drop kv_transfer_params on both
// APIs: every request is computed whole and nothing is handed off.
//
// SGLang: the Messages and Responses request models have no bootstrap
// fields (python/sglang/srt/entrypoints/anthropic/protocol.py
// AnthropicMessagesRequest, and serving.py builds its ChatCompletionRequest
// from the Anthropic fields alone; openai/protocol.py ResponsesRequest,
// serving_responses.py builds GenerateReqInput without them), so the
// request reaches the scheduler without a bootstrap room, which a split
// server aborts with 400 ("Disaggregated request received without
// boostrap room id"): the Anthropic handler answers any error of the chat
// handler as 500 internal_error "Internal processing error"
// (_handle_non_streaming), the Responses handler the abort's 400.

// Agent APIs, as pdRequest.agent names them ("" chat and completions).
const (
	agentMessages  = "messages"
	agentResponses = "responses"
)

// HandoffRefused: a split server refused a request it could not take part
// in a handoff with (SGLang: no bootstrap room).
const HandoffRefused = "refused"

// agentTurn is one Messages or Responses request as the model runs it.
type agentTurn struct {
	rank, prompt, cached int
	words                []string
	// finish is length, or stop when the model's first token was EOS.
	finish string
	h      *handoff
	done   func()
}

// runAgent runs one agent-API prompt on a rank: its part in a split, its
// cached tokens, the words of the answer. ok=false: the error is written.
func (s *Server) runAgent(w http.ResponseWriter, r *http.Request, top map[string]json.RawMessage, agent, prompt, last string, maxTokens int, stream bool) (*agentTurn, bool) {
	rank, header, ok := s.rankFor(w, r)
	if !ok {
		return nil, false
	}
	tokens := prefix.Tokenize(prompt)
	req := request{Stream: stream}
	var h *handoff
	if s.pd != nil {
		rq := pdRequest{r: r, req: req, agent: agent, tokens: tokens, last: last}
		if h, ok = s.agentHandoff(w, rq, top, rank); !ok {
			return nil, false
		}
	}
	fields := make([]string, 0, len(top))
	for k := range top {
		fields = append(fields, k)
	}
	sort.Strings(fields)
	t := &agentTurn{rank: rank, prompt: len(tokens), h: h, finish: h.finishReason()}
	t.cached = s.admit(r, req, rank, header, "", last, tokens, fields, h)
	t.done = func() {
		s.mu.Lock()
		s.running[rank]--
		s.endAdapterLocked(rank, "")
		s.mu.Unlock()
	}
	n := h.outputTokens(min(max(maxTokens, 1), 4096))
	if t.finish == "stop" {
		n = 1 // the first token was EOS
	}
	t.words = make([]string, n)
	for i := range t.words {
		t.words[i] = fmt.Sprintf("w%d", i)
	}
	return t, true
}

// agentHandoff resolves an agent-API request's part in the split; ok=false
// when the engine's answer (an error) is written.
func (s *Server) agentHandoff(w http.ResponseWriter, rq pdRequest, top map[string]json.RawMessage, rank int) (*handoff, bool) {
	if s.opts.Engine == SGLang {
		s.recordFailed(rq, rank, HandoffRefused)
		msg := "Invalid request: Disaggregated request received without boostrap room id."
		if rq.agent == agentMessages {
			writeJSON(w, http.StatusInternalServerError, anthropicError("internal_error", "Internal processing error"))
			return nil, false
		}
		writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "BadRequestError", msg))
		return nil, false
	}
	if s.pd.opts.AgentAPIsIgnoreKVTransfer {
		return nil, true
	}
	return s.vllmHandoff(w, rq, top, rank)
}

func anthropicError(typ, msg string) map[string]any {
	return map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}}
}

// stopReason is the Messages stop reason of a finish (serving.py
// messages_full_converter).
func stopReason(finish string) string {
	if finish == "stop" {
		return "end_turn"
	}
	return "max_tokens"
}

// responseStatus is a response's status for a finish: incomplete when the
// output was cut at max_output_tokens (ResponsesResponse.from_request).
func responseStatus(finish string) string {
	if finish == "stop" {
		return "completed"
	}
	return "incomplete"
}

// agentGenerationError answers an agent-API request whose KV could not be
// read (kv_load_failure_policy fail): vLLM's GenerationError, 500
// "Internal server error". Messages: translated by api_router.py
// translate_error_response to {"type": "error", "error": {type, message}};
// streamed, the chat stream's first chunk has become message_start and its
// error chunk fails the converter's parse, which yields an error event
// (serving.py message_stream_converter). Responses: the OpenAI envelope;
// streamed, the API's error event (openai-python
// types/responses/response_error_event.py) after response.created.
func (s *Server) agentGenerationError(w http.ResponseWriter, rq pdRequest) {
	if !rq.req.Stream {
		if rq.agent == agentMessages {
			writeJSON(w, http.StatusInternalServerError, anthropicError("InternalServerError", "Internal server error"))
			return
		}
		writeJSON(w, http.StatusInternalServerError, s.errorBody(http.StatusInternalServerError, "InternalServerError", "Internal server error"))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	ev := func(name string, v map[string]any) {
		v["type"] = name
		data, _ := json.Marshal(v)
		fmt.Fprintf(bw, "event: %s\ndata: %s\n\n", name, data)
	}
	if rq.agent == agentMessages {
		ev("message_start", map[string]any{"message": map[string]any{"id": "chatcmpl-" + randHex(), "type": "message", "role": "assistant",
			"content": []any{}, "model": s.opts.Model, "stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": 0, "output_tokens": 0}}})
		ev("error", map[string]any{"error": map[string]any{"type": "internal_error", "message": "Internal server error"}})
	} else {
		ev("response.created", map[string]any{"sequence_number": 0, "response": map[string]any{"id": "resp_" + randHex(), "object": "response",
			"model": s.opts.Model, "status": "in_progress", "output": []any{}, "usage": nil}})
		ev("error", map[string]any{"sequence_number": 1, "code": "InternalServerError", "message": "Internal server error", "param": nil})
	}
	_ = bw.Flush()
}
