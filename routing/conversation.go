// Package routing makes tether's routing decisions: which conversation a
// request belongs to, which key it routes by, and where a new key is placed.
// It is pure: no I/O, no clock (time is a parameter), no randomness.
package routing

import (
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

// ConversationID returns the request's conversation id: the body's
// conversation_params.conversation_id when non-blank, else the first
// non-blank session header. Blank or white-space-only values count as
// absent. Surrounding white space is trimmed. "" means no conversation.
func ConversationID(bodyConversationID string, h http.Header) string {
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

// HeaderValue returns the first non-blank value of header name
// (case-insensitive), trimmed; "" when absent or blank.
func HeaderValue(h http.Header, name string) string {
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
