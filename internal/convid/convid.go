// Package convid resolves a request's conversation id the way trtllm-serve
// does (body, then session headers, then client-native body fields), and
// reads header values. Edges and workers both need it; it is a package of
// its own so a worker does not link the routing decisions (routing, fsm,
// routing/kvindex) to read two headers.
package convid

import (
	"encoding/json"
	"net/http"
	"strings"
)

// SessionHeaders are the request headers that may carry a conversation id,
// in precedence order, after the body's conversation_params.conversation_id:
// TensorRT-LLM's CONVERSATION_ID_HEADERS (tensorrt_llm/serve/conversation_id.py),
// which puts Claude Code's session headers first, so an edge and a
// trtllm-serve worker resolve the same id.
var SessionHeaders = []string{
	"x-claude-code-session-id",
	"x-claude-session-id",
	"x-session-id",
	"x-correlation-id",
	"x-session-affinity",
	"x-multi-turn-session-id",
}

// Resolve returns the request's conversation id: the body's
// conversation_params.conversation_id when non-blank, else the first
// non-blank session header. Blank or white-space-only values count as
// absent. Surrounding white space is trimmed. "" means no conversation.
func Resolve(bodyConversationID string, h http.Header) string {
	if id := strings.TrimSpace(bodyConversationID); id != "" {
		return id
	}
	for _, name := range SessionHeaders {
		for _, v := range h.Values(name) {
			if id := strings.TrimSpace(v); id != "" {
				return id
			}
		}
	}
	return ""
}

// Header returns the first non-blank value of header name
// (case-insensitive), trimmed; "" when absent or blank.
func Header(h http.Header, name string) string {
	if name == "" {
		return ""
	}
	for _, v := range h.Values(name) {
		if s := strings.TrimSpace(v); s != "" {
			return s
		}
	}
	return ""
}

// ClientFields are body fields that carry a conversation id
// for clients that send no session header, consulted only after the
// body's conversation_params and SessionHeaders: TensorRT-LLM's
// CONVERSATION_ID_BODY_FIELDS (tensorrt_llm/serve/conversation_id.py).
// Codex CLI sets prompt_cache_key (Responses API) or
// client_metadata.thread_id (chat completions) to its thread id;
// client_metadata.session_id is one run, possibly of several threads, so
// it comes last.
var ClientFields = [][]string{
	{"prompt_cache_key"},
	{"client_metadata", "thread_id"},
	{"client_metadata", "session_id"},
}

// FromClientFields returns the first non-blank string at one of
// ClientFields in a decoded request body, trimmed ("" none).
func FromClientFields(top map[string]json.RawMessage) string {
	for _, path := range ClientFields {
		raw, ok := top[path[0]]
		for _, name := range path[1:] {
			var obj map[string]json.RawMessage
			if !ok || json.Unmarshal(raw, &obj) != nil {
				ok = false
				break
			}
			raw, ok = obj[name]
		}
		var s string
		if ok && json.Unmarshal(raw, &s) == nil {
			if s = strings.TrimSpace(s); s != "" {
				return s
			}
		}
	}
	return ""
}
