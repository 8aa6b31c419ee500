package apireq

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/tether-project/tether/internal/pyjson"
)

// Anthropic Messages API (https://docs.anthropic.com/en/api/messages),
// converted to the chat form as vLLM converts it
// (vllm/entrypoints/anthropic/serving.py to_chat_completion_request): the
// system prompt (a string, or text blocks concatenated, Claude Code's
// x-anthropic-billing-header block dropped) becomes the system message,
// followed by the text of the system messages leading messages; the other
// inline system messages are kept in place or folded into their
// neighbours (inline_system.go); text blocks become the message's content;
// thinking blocks its reasoning; tool_use blocks assistant tool calls with
// the input as JSON arguments; each tool_result block a tool message
// placed where the block was, before the rest of its user message;
// redacted_thinking and tool_reference blocks are dropped. Tools become
// function tools, tool_choice auto/any/none/tool auto/required/none/the
// named function, output_config.format json_schema the response_format,
// stop_sequences the stop sequences.

// anthropicBlock is one content block.
type anthropicBlock struct {
	Type      *string         `json:"type"`
	Text      *string         `json:"text"`
	Thinking  *string         `json:"thinking"`
	ID        *string         `json:"id"`
	Name      *string         `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID *string         `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

// billingHeader starts the per-request block Claude Code puts in the
// system prompt (it carries a hash that changes every request).
const billingHeader = "x-anthropic-billing-header"

func (r *Request) parseMessages(count bool) *Error {
	if !count {
		raw, ok := r.Present("max_tokens")
		if !ok {
			return Missing("max_tokens")
		}
		var v int64
		if err := json.Unmarshal(raw, &v); err != nil {
			return BadRequest("", "max_tokens", "invalid type for \"max_tokens\": want an integer, got %s", Kind(raw))
		}
		if v < 1 {
			return BadRequest("", "max_tokens", "max_tokens must be at least 1, got %d", v)
		}
		r.MaxTokens = int(min(v, 1<<30))
	}
	r.IncludeUsage = r.Stream
	a := &anthropicForm{}
	if raw, ok := r.Present("system"); ok {
		texts, err := anthropicSystem(raw, "system")
		if err != nil {
			return err
		}
		a.system = strings.Join(texts, "")
	}
	raw, ok := r.Present("messages")
	if !ok {
		return Missing("messages")
	}
	var err *Error
	if a.msgs, err = anthropicMessages(raw); err != nil {
		return err
	}
	fields := map[string]json.RawMessage{}
	if err := r.anthropicTools(fields); err != nil {
		return err
	}
	if err := r.anthropicOutput(fields); err != nil {
		return err
	}
	a.fields = fields
	r.anthropic = a
	return r.messagesChatForm(InlineSystemPreserve)
}

// anthropicOutput converts stop_sequences, output_config.format and
// thinking; output_config.effort, thinking.display and the fields an
// engine alone reads (metadata, context_management, service_tier, ...)
// are accepted and left to the engine.
func (r *Request) anthropicOutput(fields map[string]json.RawMessage) *Error {
	if raw, ok := r.Present("stop_sequences"); ok {
		var stop []string
		if json.Unmarshal(raw, &stop) != nil {
			return BadRequest("", "stop_sequences", "invalid type for \"stop_sequences\": want an array of strings, got %s", Kind(raw))
		}
		fields["stop"] = marshal(stop)
	}
	if raw, ok := r.Present("output_config"); ok {
		var oc struct {
			Format *struct {
				Type   string          `json:"type"`
				Schema json.RawMessage `json:"schema"`
			} `json:"format"`
		}
		if json.Unmarshal(raw, &oc) != nil {
			return BadRequest("", "output_config", "invalid output_config: want an object")
		}
		if f := oc.Format; f != nil {
			if f.Type != "json_schema" || !isObject(f.Schema) {
				return BadRequest("", "output_config.format", "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}")
			}
			fields["response_format"] = marshal(map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "json_schema", "schema": f.Schema}})
		}
	}
	if raw, ok := r.Present("thinking"); ok {
		var th struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(raw, &th) != nil {
			return BadRequest("", "thinking", "invalid thinking: want an object with a type")
		}
		r.Thinking = th.Type == "enabled" || th.Type == "adaptive"
	}
	return nil
}

// messagesChatForm builds the chat form with the inline system messages
// placed by mode (inline_system.go): the system message first (the system
// prompt and the text of the system messages leading messages, joined by
// a blank line, as vLLM's _convert_system_message), then the messages.
func (r *Request) messagesChatForm(mode InlineSystem) *Error {
	a := r.anthropic
	leading, rest, err := normalizeInlineSystem(a.system, a.msgs, mode)
	if err != nil {
		return err
	}
	var msgs []chatMessage
	if s := joinText(a.system, leading); s != "" {
		msgs = append(msgs, chatMessage{Role: "system", Content: s})
	}
	for _, m := range rest {
		if m.role == "system" {
			text, err := systemText(m)
			if err != nil {
				return err
			}
			if text != "" {
				msgs = append(msgs, chatMessage{Role: "system", Content: text})
			}
			continue
		}
		out, err := anthropicMessage(m.role, m.content, m.param)
		if err != nil {
			return err
		}
		msgs = append(msgs, out...)
	}
	if len(msgs) == 0 {
		return BadRequest("", "messages", "messages hold no content to send")
	}
	a.mode = mode
	return r.setChatForm(msgs, a.fields)
}

// anthropicMessages reads the messages array: each message's role and
// content, checked as far as placing system messages needs.
func anthropicMessages(raw json.RawMessage) ([]anthropicMsg, *Error) {
	var in []struct {
		Role    *string         `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, BadRequest("", "messages", "invalid type for \"messages\": want an array of messages with role and content, got %s", Kind(raw))
	}
	if len(in) == 0 {
		return nil, BadRequest("", "messages", "messages must contain at least one message")
	}
	msgs := make([]anthropicMsg, len(in))
	for i, m := range in {
		param := fmt.Sprintf("messages[%d]", i)
		if m.Role == nil {
			return nil, BadRequest("", param+".role", "%s.role is required (user or assistant)", param)
		}
		role := *m.Role
		switch role {
		case "system", "user", "assistant":
		default:
			return nil, BadRequest("", param+".role", "%s.role %q is not a Messages role (user or assistant)", param, truncate(role, 40))
		}
		msgs[i] = anthropicMsg{role: role, content: bytes.TrimSpace(m.Content), param: param}
		if role == "system" {
			if _, err := systemText(msgs[i]); err != nil {
				return nil, err
			}
			continue
		}
		if c := msgs[i].content; len(c) == 0 || (c[0] != '"' && c[0] != '[') {
			return nil, BadRequest("", param+".content", "invalid type for \"%s.content\": want a string or an array of content blocks, got %s", param, Kind(c))
		}
	}
	return msgs, nil
}

// anthropicSystem reads a system prompt: a string or text blocks.
func anthropicSystem(raw json.RawMessage, param string) ([]string, *Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		if s == "" {
			return nil, nil
		}
		return []string{s}, nil
	}
	var blocks []anthropicBlock
	if json.Unmarshal(raw, &blocks) != nil {
		return nil, BadRequest("", param, "invalid type for %q: want a string or an array of text blocks, got %s", param, Kind(raw))
	}
	var out []string
	for i, b := range blocks {
		if b.Type == nil || *b.Type != "text" || b.Text == nil {
			return nil, BadRequest("", fmt.Sprintf("%s[%d]", param, i), "%s[%d]: a system prompt holds text blocks only", param, i)
		}
		if *b.Text == "" || strings.HasPrefix(*b.Text, billingHeader) {
			continue
		}
		out = append(out, *b.Text)
	}
	return out, nil
}

// anthropicMessage converts one user or assistant message to chat
// messages: its tool results first (one tool message each), then the
// message itself.
func anthropicMessage(role string, raw json.RawMessage, param string) ([]chatMessage, *Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		return []chatMessage{{Role: role, Content: s}}, nil
	}
	var blocks []anthropicBlock
	if json.Unmarshal(raw, &blocks) != nil {
		return nil, BadRequest("", param+".content", "invalid type for \"%s.content\": want a string or an array of content blocks, got %s", param, Kind(raw))
	}
	var out []chatMessage
	var texts, reasoning []string
	var calls []chatToolCall
	for j, b := range blocks {
		bp := fmt.Sprintf("%s.content[%d]", param, j)
		if b.Type == nil {
			return nil, BadRequest("", bp+".type", "%s.type is required", bp)
		}
		switch *b.Type {
		case "text":
			if b.Text == nil {
				return nil, BadRequest("", bp+".text", "%s: a text block needs a text string", bp)
			}
			if *b.Text != "" {
				texts = append(texts, *b.Text)
			}
		case "thinking":
			if b.Thinking != nil {
				reasoning = append(reasoning, *b.Thinking)
			}
		case "redacted_thinking", "tool_reference":
			// Opaque to the template: vLLM accepts and drops them.
		case "tool_use":
			if b.ID == nil || b.Name == nil {
				return nil, BadRequest("", bp, "%s: a tool_use block needs an id and a name", bp)
			}
			args := "{}"
			if !IsNull(b.Input) {
				if !isObject(b.Input) {
					return nil, BadRequest("", bp+".input", "%s.input must be an object", bp)
				}
				args = pyjson.Dumps(b.Input)
			}
			calls = append(calls, chatToolCall{ID: *b.ID, Type: "function", Function: chatToolFunction{Name: *b.Name, Arguments: args}})
		case "tool_result":
			text, err := toolResultText(b.Content, bp+".content")
			if err != nil {
				return nil, err
			}
			if role != "user" {
				texts = append(texts, "Tool result: "+text)
				continue
			}
			id := ""
			if b.ToolUseID != nil {
				id = *b.ToolUseID
			}
			out = append(out, chatMessage{Role: "tool", ToolCallID: &id, Content: text})
		case "image", "document":
			return nil, BadRequest("", bp+".type", "%s: %s blocks are not supported (only text, thinking, tool_use and tool_result)", bp, *b.Type)
		default:
			return nil, BadRequest("", bp+".type", "%s: content block type %q is not supported", bp, truncate(*b.Type, 40))
		}
	}
	msg := chatMessage{Role: role, Content: contentOf(texts), ToolCalls: calls}
	if len(reasoning) > 0 {
		s := strings.Join(reasoning, "")
		msg.Reasoning = &s
	}
	if role == "user" && msg.Content == nil {
		return out, nil // tool results only
	}
	return append(out, msg), nil
}

// toolResultText is a tool_result's content as text: a string, or its
// text blocks joined by newlines.
func toolResultText(raw json.RawMessage, param string) (string, *Error) {
	raw = bytes.TrimSpace(raw)
	if IsNull(raw) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		return s, nil
	}
	var blocks []anthropicBlock
	if json.Unmarshal(raw, &blocks) != nil {
		return "", BadRequest("", param, "invalid type for %q: want a string or an array of text blocks, got %s", param, Kind(raw))
	}
	var texts []string
	for i, b := range blocks {
		switch {
		case b.Type != nil && *b.Type == "text" && b.Text != nil:
			texts = append(texts, *b.Text)
		case b.Type != nil && *b.Type == "tool_reference":
		default:
			return "", BadRequest("", fmt.Sprintf("%s[%d]", param, i), "%s[%d]: only text blocks are supported in a tool result", param, i)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// anthropicTools converts tools and tool_choice.
func (r *Request) anthropicTools(fields map[string]json.RawMessage) *Error {
	var names map[string]bool
	if raw, ok := r.Present("tools"); ok {
		var tools []struct {
			Name        *string         `json:"name"`
			Description *string         `json:"description"`
			InputSchema json.RawMessage `json:"input_schema"`
			Type        *string         `json:"type"`
		}
		if json.Unmarshal(raw, &tools) != nil {
			return BadRequest("", "tools", "invalid type for \"tools\": want an array of tools, got %s", Kind(raw))
		}
		names = map[string]bool{}
		out := make([]chatTool, 0, len(tools))
		for i, t := range tools {
			if t.Name == nil || *t.Name == "" {
				return BadRequest("", fmt.Sprintf("tools[%d].name", i), "tools[%d].name is required", i)
			}
			if !isObject(t.InputSchema) {
				typ := "custom"
				if t.Type != nil {
					typ = *t.Type
				}
				return BadRequest("", fmt.Sprintf("tools[%d].input_schema", i), "tools[%d] (%q, type %s): input_schema is required (server tools are not supported)", i, truncate(*t.Name, 64), truncate(typ, 40))
			}
			names[*t.Name] = true
			out = append(out, chatTool{Type: "function", Function: chatFunctionDef{Name: *t.Name, Description: t.Description, Parameters: t.InputSchema}})
		}
		fields["tools"] = marshal(out)
	}
	raw, ok := r.Present("tool_choice")
	if !ok {
		if names != nil {
			fields["tool_choice"] = json.RawMessage(`"auto"`)
		}
		return nil
	}
	var tc struct {
		Type                   string  `json:"type"`
		Name                   *string `json:"name"`
		DisableParallelToolUse *bool   `json:"disable_parallel_tool_use"`
	}
	if json.Unmarshal(raw, &tc) != nil {
		return BadRequest("", "tool_choice", "invalid tool_choice: want an object with a type")
	}
	switch tc.Type {
	case "auto":
		fields["tool_choice"] = json.RawMessage(`"auto"`)
	case "any":
		fields["tool_choice"] = json.RawMessage(`"required"`)
	case "none":
		fields["tool_choice"] = json.RawMessage(`"none"`)
	case "tool":
		if tc.Name == nil || *tc.Name == "" {
			return BadRequest("", "tool_choice.name", "tool_choice.name is required when type is \"tool\"")
		}
		fields["tool_choice"] = marshal(map[string]any{"type": "function", "function": map[string]string{"name": *tc.Name}})
	default:
		return BadRequest("", "tool_choice.type", "tool_choice.type %q is not auto, any, tool or none", truncate(tc.Type, 40))
	}
	if tc.DisableParallelToolUse != nil && *tc.DisableParallelToolUse {
		fields["parallel_tool_calls"] = json.RawMessage("false")
	}
	return nil
}

func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{' && json.Valid(raw)
}
