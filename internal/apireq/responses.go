package apireq

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// OpenAI Responses API (https://platform.openai.com/docs/api-reference/responses),
// converted to the chat form as vLLM converts it
// (vllm/entrypoints/openai/responses/utils.py construct_input_messages):
// instructions become a system message; a string input one user message;
// input items in order — a message item a chat message (its text parts
// joined), a function_call item a tool call of the assistant message
// before it (or of a new one), a function_call_output item a tool message,
// a reasoning item the reasoning of the assistant message before it (or of
// a new one); function tools become chat function tools, text.format the
// response_format, max_output_tokens the completion budget. A previous
// response's history (or a conversation's items) goes between the
// instructions and the input (WithHistory): the previous request's input
// items carry over, system and developer messages among them; its
// instructions do not (History leaves them out), as OpenAI's
// Response.instructions says.

func (r *Request) parseResponses() *Error {
	rf := &ResponsesFields{Store: true}
	r.Responses = rf
	r.IncludeUsage = r.Stream
	if err := r.maxTokens("max_output_tokens"); err != nil {
		return err
	}
	var err *Error
	var ok bool
	if v, set, e := r.Bool("store"); e != nil {
		return e
	} else if set {
		rf.Store = v
	}
	if rf.Background, _, err = r.Bool("background"); err != nil {
		return err
	}
	if rf.Background && !rf.Store {
		return BadRequest("", "background", "background mode needs store: true (a background response is retrieved by id)")
	}
	if rf.PreviousResponseID, ok, err = r.String("previous_response_id"); err != nil {
		return err
	} else if ok && strings.TrimSpace(rf.PreviousResponseID) == "" {
		return BadRequest("", "previous_response_id", "previous_response_id must not be empty")
	}
	if raw, ok := r.Present("conversation"); ok {
		var id string
		if json.Unmarshal(raw, &id) != nil {
			var obj struct {
				ID *string `json:"id"`
			}
			if json.Unmarshal(raw, &obj) != nil || obj.ID == nil {
				return BadRequest("", "conversation", "invalid conversation: want a conversation id or {\"id\": ...}")
			}
			id = *obj.ID
		}
		rf.Conversation = strings.TrimSpace(id)
		if rf.PreviousResponseID != "" && rf.Conversation != "" {
			return BadRequest("", "previous_response_id", "previous_response_id and conversation cannot be used together")
		}
	}
	if rf.Instructions, _, err = r.String("instructions"); err != nil {
		return err
	}
	if rf.Instructions != "" {
		rf.instr = []chatMessage{{Role: "system", Content: rf.Instructions}}
	}
	raw, ok := r.Present("input")
	if !ok {
		return Missing("input")
	}
	if raw[0] == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		rf.Input = []json.RawMessage{marshal(map[string]any{"type": "message", "role": "user", "content": s})}
		rf.input = []chatMessage{{Role: "user", Content: s}}
	} else {
		if json.Unmarshal(raw, &rf.Input) != nil {
			return BadRequest("", "input", "invalid type for \"input\": want a string or an array of input items, got %s", Kind(raw))
		}
		if len(rf.Input) == 0 {
			return BadRequest("", "input", "input must contain at least one item")
		}
		if rf.input, err = responsesItems(rf.Input, "input"); err != nil {
			return err
		}
	}
	if err := r.parseReasoning(rf); err != nil {
		return err
	}
	if err := r.parseInclude(rf); err != nil {
		return err
	}
	if err := r.parseEchoed(); err != nil {
		return err
	}
	fields := map[string]json.RawMessage{}
	if err := r.responsesTools(fields); err != nil {
		return err
	}
	if raw, ok := r.Present("parallel_tool_calls"); ok {
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return BadRequest("", "parallel_tool_calls", "invalid type for \"parallel_tool_calls\": want a boolean, got %s", Kind(raw))
		}
		fields["parallel_tool_calls"] = raw
	}
	if err := r.responsesFormat(fields); err != nil {
		return err
	}
	r.Chat = fields
	return r.rebuildResponses(nil)
}

// WithHistory puts a previous response's conversation (chat messages, as
// History returned them for it) before this request's input.
func (r *Request) WithHistory(history []json.RawMessage) *Error {
	if r.Responses == nil {
		return BadRequest("", "", "not a Responses request")
	}
	return r.rebuildResponses(history)
}

// History is this request's conversation in the chat form without its
// instructions: what an engine keeps to continue from the response (the
// response's own output appended, AssistantMessage).
func (r *Request) History() []json.RawMessage {
	var msgs []json.RawMessage
	if err := json.Unmarshal(r.Chat["messages"], &msgs); err != nil {
		return nil
	}
	if len(r.Responses.instr) > 0 && len(msgs) > 0 {
		msgs = msgs[1:]
	}
	return msgs
}

func (r *Request) rebuildResponses(history []json.RawMessage) *Error {
	rf := r.Responses
	msgs := make([]any, 0, len(rf.instr)+len(history)+len(rf.input))
	for _, m := range rf.instr {
		msgs = append(msgs, m)
	}
	for _, h := range history {
		msgs = append(msgs, h)
	}
	for _, m := range rf.input {
		msgs = append(msgs, m)
	}
	if err := r.setChatForm(msgs, r.Chat); err != nil {
		err.Param = strings.Replace(err.Param, "messages", "input", 1)
		return err
	}
	return nil
}

// responseItem is one input item.
type responseItem struct {
	Type      *string         `json:"type"`
	Role      *string         `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    *string         `json:"call_id"`
	Name      *string         `json:"name"`
	Namespace *string         `json:"namespace"`
	Arguments *string         `json:"arguments"`
	Output    json.RawMessage `json:"output"`
	Summary   []struct {
		Text string `json:"text"`
	} `json:"summary"`
	EncryptedContent *string `json:"encrypted_content"`
}

// responsesInput converts input items to chat messages.
func responsesInput(items []json.RawMessage) ([]chatMessage, *Error) {
	var out []chatMessage
	lastAssistant := func() *chatMessage {
		if n := len(out); n > 0 && out[n-1].Role == "assistant" {
			return &out[n-1]
		}
		return nil
	}
	for i, raw := range items {
		param := fmt.Sprintf("input[%d]", i)
		var it responseItem
		if json.Unmarshal(raw, &it) != nil {
			return nil, BadRequest("", param, "%s must be an object", param)
		}
		typ := "message"
		if it.Type != nil {
			typ = *it.Type
		}
		switch typ {
		case "message":
			if it.Role == nil {
				return nil, BadRequest("", param+".role", "%s.role is required", param)
			}
			role := *it.Role
			if role != "user" && role != "assistant" && role != "system" && role != "developer" {
				return nil, BadRequest("", param+".role", "%s.role %q is not user, assistant, system or developer", param, truncate(role, 40))
			}
			texts, err := responsesContent(it.Content, param+".content")
			if err != nil {
				return nil, err
			}
			if role == "assistant" {
				text := strings.Join(texts, "")
				if prev := lastAssistant(); prev != nil && prev.Content == nil {
					prev.Content = text
					continue
				}
				out = append(out, chatMessage{Role: "assistant", Content: text})
				continue
			}
			out = append(out, chatMessage{Role: role, Content: contentOf(texts)})
			if out[len(out)-1].Content == nil {
				out[len(out)-1].Content = ""
			}
		case "function_call":
			if it.CallID == nil || it.Name == nil || it.Arguments == nil {
				return nil, BadRequest("", param, "%s: a function_call item needs call_id, name and arguments", param)
			}
			name := *it.Name
			if it.Namespace != nil && *it.Namespace != "" {
				name = *it.Namespace + "." + name
			}
			call := chatToolCall{ID: *it.CallID, Type: "function", Function: chatToolFunction{Name: name, Arguments: *it.Arguments}}
			if prev := lastAssistant(); prev != nil {
				prev.ToolCalls = append(prev.ToolCalls, call)
				continue
			}
			out = append(out, chatMessage{Role: "assistant", ToolCalls: []chatToolCall{call}})
		case "function_call_output":
			if it.CallID == nil {
				return nil, BadRequest("", param+".call_id", "%s.call_id is required", param)
			}
			texts, err := responsesContent(it.Output, param+".output")
			if err != nil {
				return nil, err
			}
			id := *it.CallID
			out = append(out, chatMessage{Role: "tool", ToolCallID: &id, Content: strings.Join(texts, "\n")})
		case "reasoning":
			if it.EncryptedContent != nil && *it.EncryptedContent != "" {
				return nil, BadRequest("", param+".encrypted_content", "%s: encrypted reasoning content is not supported", param)
			}
			texts, err := responsesContent(it.Content, param+".content")
			if err != nil {
				return nil, err
			}
			text := ""
			if len(texts) > 0 {
				text = texts[0]
			} else if len(it.Summary) > 0 {
				text = it.Summary[0].Text
			}
			if prev := lastAssistant(); prev != nil && prev.Reasoning == nil {
				prev.Reasoning = &text
				continue
			}
			out = append(out, chatMessage{Role: "assistant", Reasoning: &text})
		default:
			return nil, BadRequest("", param+".type", "%s: input item type %q is not supported (message, function_call, function_call_output, reasoning)", param, truncate(typ, 40))
		}
	}
	return out, nil
}

// responsesContent reads a message's (or a function output's) content as
// texts: a string, or input_text / output_text / text parts.
func responsesContent(raw json.RawMessage, param string) ([]string, *Error) {
	raw = bytes.TrimSpace(raw)
	if IsNull(raw) {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		return []string{s}, nil
	}
	var parts []struct {
		Type    *string `json:"type"`
		Text    *string `json:"text"`
		Refusal *string `json:"refusal"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return nil, BadRequest("", param, "invalid type for %q: want a string or an array of content parts, got %s", param, Kind(raw))
	}
	texts := make([]string, 0, len(parts))
	for j, p := range parts {
		pp := fmt.Sprintf("%s[%d]", param, j)
		t := "missing"
		if p.Type != nil {
			t = *p.Type
		}
		switch {
		case (t == "input_text" || t == "output_text" || t == "text" || t == "reasoning_text" || t == "summary_text") && p.Text != nil:
			texts = append(texts, *p.Text)
		case t == "refusal" && p.Refusal != nil:
			texts = append(texts, *p.Refusal)
		default:
			return nil, BadRequest("", pp+".type", "%s: content part type %q is not supported (input_text, output_text)", pp, truncate(t, 40))
		}
	}
	return texts, nil
}

// responsesTools converts function tools and tool_choice.
func (r *Request) responsesTools(fields map[string]json.RawMessage) *Error {
	if raw, ok := r.Present("tools"); ok {
		var tools []struct {
			Type        string          `json:"type"`
			Name        *string         `json:"name"`
			Description *string         `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      *bool           `json:"strict"`
		}
		if json.Unmarshal(raw, &tools) != nil {
			return BadRequest("", "tools", "invalid type for \"tools\": want an array of tools, got %s", Kind(raw))
		}
		out := make([]chatTool, 0, len(tools))
		for i, t := range tools {
			if t.Type != "function" {
				return BadRequest("", fmt.Sprintf("tools[%d].type", i), "tools[%d]: tool type %q is not supported (only function tools)", i, truncate(t.Type, 40))
			}
			if t.Name == nil || *t.Name == "" {
				return BadRequest("", fmt.Sprintf("tools[%d].name", i), "tools[%d].name is required", i)
			}
			params := t.Parameters
			if IsNull(params) {
				params = nil
			}
			out = append(out, chatTool{Type: "function", Function: chatFunctionDef{Name: *t.Name, Description: t.Description, Parameters: params, Strict: t.Strict}})
		}
		fields["tools"] = marshal(out)
	}
	raw, ok := r.Present("tool_choice")
	if !ok {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s != "auto" && s != "none" && s != "required" {
			return BadRequest("", "tool_choice", "tool_choice %q is not auto, none or required", truncate(s, 40))
		}
		fields["tool_choice"] = raw
		return nil
	}
	var tc struct {
		Type string  `json:"type"`
		Name *string `json:"name"`
	}
	if json.Unmarshal(raw, &tc) != nil || tc.Type != "function" || tc.Name == nil {
		return BadRequest("", "tool_choice", "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...}")
	}
	fields["tool_choice"] = marshal(map[string]any{"type": "function", "function": map[string]string{"name": *tc.Name}})
	return nil
}

// responsesFormat converts text.format.
func (r *Request) responsesFormat(fields map[string]json.RawMessage) *Error {
	raw, ok := r.Present("text")
	if !ok {
		return nil
	}
	var text struct {
		Format *struct {
			Type   string          `json:"type"`
			Name   *string         `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"format"`
	}
	if json.Unmarshal(raw, &text) != nil {
		return BadRequest("", "text", "invalid text: want an object")
	}
	f := text.Format
	if f == nil {
		return nil
	}
	switch f.Type {
	case "text":
		fields["response_format"] = json.RawMessage(`{"type":"text"}`)
	case "json_object":
		fields["response_format"] = json.RawMessage(`{"type":"json_object"}`)
	case "json_schema":
		if !isObject(f.Schema) {
			return BadRequest("", "text.format.schema", "text.format.schema must be a JSON schema object")
		}
		js := map[string]any{"schema": f.Schema}
		if f.Name != nil {
			js["name"] = *f.Name
		}
		if f.Strict != nil {
			js["strict"] = *f.Strict
		}
		fields["response_format"] = marshal(map[string]any{"type": "json_schema", "json_schema": js})
	default:
		return BadRequest("", "text.format.type", "text.format.type %q is not text, json_object or json_schema", truncate(f.Type, 40))
	}
	return nil
}
