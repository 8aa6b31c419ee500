package disagg

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The agents' APIs through a vLLM split, relayed as they are to both
// servers, as SGLang's gateway relays them (smg model_gateway
// src/routers/http/pd_router.rs route_messages, route_responses,
// sanitize_prefill_for_kv_handoff): vLLM converts a Messages or Responses
// request to its chat form itself and carries kv_transfer_params through
// it both ways — vllm/entrypoints/anthropic/protocol.py
// AnthropicMessagesRequest and AnthropicMessagesResponse
// (kv_transfer_params, passed to the chat request and back by serving.py
// _build_base_request and messages_full_converter), and
// vllm/entrypoints/openai/responses/protocol.py ResponsesRequest and
// ResponsesResponse (vllm-project/vllm#37424: into the sampling params'
// extra_args, and back from the engine's output). Releases before those
// fields ignore kv_transfer_params on these APIs and answer none: the
// decode server then computes the request whole, as the gateway lets it.
//
// SGLang's Messages and Responses request models carry no bootstrap fields
// (python/sglang/srt/entrypoints/anthropic/protocol.py
// AnthropicMessagesRequest; openai/protocol.py ResponsesRequest, whose
// serving_responses.py builds GenerateReqInput without them:
// sgl-project/sglang#35497), so neither API can be split there.

// messagesDialect is the Anthropic Messages API (POST /v1/messages).
type messagesDialect struct{}

// PrefillFields: one token (max_tokens 1), not streamed; the Messages API
// has no stream_options and no min_tokens (AnthropicMessagesRequest).
func (messagesDialect) PrefillFields(map[string]json.RawMessage) Fields {
	return Fields{Set: map[string]json.RawMessage{"max_tokens": json.RawMessage("1"), "stream": json.RawMessage("false")}}
}

// messagesFinish maps a Messages stop_reason back to the engine's finish
// reason (serving.py messages_full_converter maps stop → end_turn, length
// → max_tokens, tool_calls → tool_use).
var messagesFinish = map[string]string{"end_turn": "stop", "max_tokens": "length", "tool_use": "tool_calls", "stop_sequence": "stop"}

func (messagesDialect) ReadAnswer(b []byte) (*Answer, error) {
	a := &Answer{}
	if err := json.Unmarshal(b, &a.Raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	var body struct {
		Type       string  `json:"type"`
		StopReason *string `json:"stop_reason"`
		Content    []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		Usage *struct {
			InputTokens     int  `json:"input_tokens"`
			CacheReadTokens *int `json:"cache_read_input_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, fmt.Errorf("unexpected shape: %w", err)
	}
	if body.Type != "message" {
		return nil, fmt.Errorf("type %q, want a message", body.Type)
	}
	a.Choices = 1
	if body.StopReason != nil {
		a.Finish = messagesFinish[*body.StopReason]
	}
	var text strings.Builder
	for _, c := range body.Content {
		if c.Type == "text" {
			text.WriteString(c.Text)
		}
	}
	a.Text = text.String()
	if u := body.Usage; u != nil && u.CacheReadTokens != nil {
		// input_tokens are the uncached part where the cache is reported.
		// vLLM's usage has input and output tokens only
		// (messages_full_converter): it says nothing of the cache, and is
		// not read as a miss.
		a.Usage = Usage{OK: true, Prompt: u.InputTokens + *u.CacheReadTokens, Cached: *u.CacheReadTokens, HasCached: true}
	}
	return a, nil
}

func (messagesDialect) Agent() bool { return true }

// responsesDialect is the OpenAI Responses API (POST /v1/responses).
type responsesDialect struct{}

// PrefillFields: one token (max_output_tokens 1, as the gateway's
// sanitize_prefill_for_kv_handoff), not streamed, and neither stored nor
// run in the background: the prefill's one-token response is no
// client's (background needs store: ResponsesRequest validate_background).
func (responsesDialect) PrefillFields(map[string]json.RawMessage) Fields {
	return Fields{Set: map[string]json.RawMessage{"max_output_tokens": json.RawMessage("1"), "stream": json.RawMessage("false"),
		"store": json.RawMessage("false"), "background": json.RawMessage("false")}}
}

func (responsesDialect) ReadAnswer(b []byte) (*Answer, error) {
	a := &Answer{}
	if err := json.Unmarshal(b, &a.Raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	var body struct {
		Object string `json:"object"`
		Status string `json:"status"`
		Output []struct {
			Type    string `json:"type"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
		Usage *struct {
			InputTokens  int `json:"input_tokens"`
			InputDetails *struct {
				CachedTokens *int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, fmt.Errorf("unexpected shape: %w", err)
	}
	if body.Object != "response" {
		return nil, fmt.Errorf("object %q, want a response", body.Object)
	}
	a.Choices = 1
	// ResponsesResponse.from_request: status incomplete (incomplete_details
	// max_output_tokens) when the output was cut at its bound.
	switch body.Status {
	case "incomplete":
		a.Finish = "length"
	case "completed":
		a.Finish = "stop"
	default:
		a.Finish = body.Status
	}
	var text strings.Builder
	for _, it := range body.Output {
		for _, c := range it.Content {
			if it.Type == "message" && c.Type == "output_text" {
				text.WriteString(c.Text)
			}
		}
	}
	a.Text = text.String()
	if u := body.Usage; u != nil {
		a.Usage = Usage{OK: true, Prompt: u.InputTokens}
		if d := u.InputDetails; d != nil && d.CachedTokens != nil {
			a.Usage.Cached, a.Usage.HasCached = *d.CachedTokens, true
		}
	}
	return a, nil
}

func (responsesDialect) Agent() bool { return true }
