package agentapi

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tether-project/tether/ops/devstack"
)

// Claude Code-shaped traffic through any edge of tether dev: the Messages
// API's shapes, a tool round trip, streaming, thinking, structured output,
// count_tokens and errors; the conversation (x-claude-code-session-id)
// stays on its context instance and its later turns read the cached
// prefix as cache_read_input_tokens.
func TestMessagesAPIThroughTetherDev(t *testing.T) {
	st := startStack(t, devstack.Options{Edges: 3})
	e := st.Edges()
	model := st.Model()
	hdr := map[string]string{"x-claude-code-session-id": "cc-session-1", "anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14"}
	system := []any{map[string]any{"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0; cc_entrypoint=cli;"},
		map[string]any{"type": "text", "text": "You are Claude Code. " + words("rules", 300), "cache_control": map[string]string{"type": "ephemeral"}}}
	tools := []any{map[string]any{"name": "Bash", "description": "Run a command", "input_schema": map[string]any{"type": "object",
		"properties": map[string]any{"command": map[string]string{"type": "string"}}, "required": []string{"command"}}}}
	user1 := map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "list the files with Bash"}}}
	body := map[string]any{"model": model, "max_tokens": 64, "system": system, "tools": tools, "messages": []any{user1},
		"metadata": map[string]string{"user_id": "user_abc_account__session_1"}}

	// Turn 1: a tool call.
	r := do(t, "POST", e[0].URL()+"/v1/messages", body, hdr)
	if r.status != 200 {
		t.Fatalf("turn 1: %d %s", r.status, r.body)
	}
	ctx1, _ := route(t, r)
	var m1 struct {
		Content []struct {
			Type, ID, Name, Text string
			Input                json.RawMessage
		} `json:"content"`
		Stop  string `json:"stop_reason"`
		Usage struct {
			Input     int  `json:"input_tokens"`
			Output    int  `json:"output_tokens"`
			CacheRead *int `json:"cache_read_input_tokens"`
		} `json:"usage"`
	}
	decode(t, r.body, &m1)
	var top map[string]any
	decode(t, r.body, &top)
	if top["type"] != "message" || top["role"] != "assistant" || !strings.HasPrefix(top["id"].(string), "msg_") {
		t.Fatalf("turn 1 is not a message: %s", r.body)
	}
	if m1.Stop != "tool_use" || len(m1.Content) != 1 || m1.Content[0].Type != "tool_use" || m1.Content[0].Name != "Bash" || !strings.Contains(string(m1.Content[0].Input), `"command"`) {
		t.Fatalf("turn 1: want a Bash tool_use: %s", r.body)
	}
	if m1.Usage.CacheRead == nil || m1.Usage.Input == 0 || m1.Usage.Output == 0 {
		t.Fatalf("turn 1 usage: %s", r.body)
	}

	// Turn 2, streamed through another edge: the tool result answered.
	asst := map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": m1.Content[0].ID, "name": "Bash", "input": m1.Content[0].Input}}}
	user2 := map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": m1.Content[0].ID, "content": "README.md\ngo.mod"}}}
	body["messages"] = []any{user1, asst, user2}
	body["stream"] = true
	r = do(t, "POST", e[1].URL()+"/v1/messages", body, hdr)
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("turn 2: %d %s", r.status, r.body)
	}
	if c, _ := route(t, r); c != ctx1 {
		t.Fatalf("turn 2 on context instance %s, turn 1 on %s", c, ctx1)
	}
	evs := events(t, r.body)
	names := strings.Join(eventNames(evs), ",")
	if !strings.HasPrefix(names, "message_start,ping,content_block_start,content_block_delta") || !strings.HasSuffix(names, "content_block_stop,message_delta,message_stop") {
		t.Fatalf("turn 2 events: %s", names)
	}
	var text strings.Builder
	for _, ev := range evs {
		if ev.data["type"] != ev.name {
			t.Fatalf("event %s has type %v", ev.name, ev.data["type"])
		}
		if d, ok := ev.data["delta"].(map[string]any); ok && d["type"] == "text_delta" {
			text.WriteString(d["text"].(string))
		}
	}
	delta := evs[len(evs)-2].data
	usage := delta["usage"].(map[string]any)
	if text.Len() == 0 || delta["delta"].(map[string]any)["stop_reason"] == nil || usage["cache_read_input_tokens"].(float64) < 256 {
		t.Fatalf("turn 2: text %q, message_delta %v (the system prompt's blocks must read as cached)", text.String(), delta)
	}

	// Thinking and a structured output.
	body = map[string]any{"model": model, "max_tokens": 200, "system": system, "thinking": map[string]any{"type": "enabled", "budget_tokens": 100},
		"messages": []any{map[string]any{"role": "user", "content": "the weather as JSON"}},
		"output_config": map[string]any{"format": map[string]any{"type": "json_schema", "schema": map[string]any{"type": "object",
			"properties": map[string]any{"city": map[string]string{"type": "string"}}, "required": []string{"city"}}}}}
	r = do(t, "POST", e[2].URL()+"/v1/messages", body, hdr)
	var m3 struct {
		Content []struct{ Type, Text, Thinking, Signature string } `json:"content"`
	}
	decode(t, r.body, &m3)
	if r.status != 200 || len(m3.Content) != 2 || m3.Content[0].Type != "thinking" || m3.Content[0].Thinking == "" || m3.Content[0].Signature == "" || m3.Content[1].Type != "text" {
		t.Fatalf("thinking + structured: %d %s", r.status, r.body)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(m3.Content[1].Text), &obj); err != nil || obj["city"] == nil {
		t.Fatalf("structured output %q is not the schema's instance: %v", m3.Content[1].Text, err)
	}

	// count_tokens, and an error in Anthropic's shape.
	r = do(t, "POST", e[0].URL()+"/v1/messages/count_tokens", map[string]any{"model": model, "system": system, "messages": []any{user1}}, hdr)
	var ct struct {
		InputTokens int `json:"input_tokens"`
	}
	decode(t, r.body, &ct)
	if r.status != 200 || ct.InputTokens < 300 {
		t.Fatalf("count_tokens: %d %s", r.status, r.body)
	}
	r = do(t, "POST", e[0].URL()+"/v1/messages", map[string]any{"model": model, "messages": []any{user1}}, hdr)
	if r.status != 400 || !strings.HasPrefix(string(r.body), `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens is required"`) {
		t.Fatalf("missing max_tokens: %d %s", r.status, r.body)
	}
	r = do(t, "POST", e[0].URL()+"/v1/messages", map[string]any{"model": "other", "max_tokens": 1, "messages": []any{user1}}, hdr)
	if r.status != 404 || !strings.Contains(string(r.body), `"type":"not_found_error"`) {
		t.Fatalf("unknown model: %d %s", r.status, r.body)
	}
}
