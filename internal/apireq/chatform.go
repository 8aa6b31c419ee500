package apireq

import (
	"encoding/json"
)

// chatMessage is one message of the chat form, as vLLM builds it from a
// Messages or Responses request.
type chatMessage struct {
	Role string `json:"role"`
	// Content is a string, a list of text parts, or nil (null: an
	// assistant turn of tool calls only).
	Content    any            `json:"content"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID *string        `json:"tool_call_id,omitempty"`
	Reasoning  *string        `json:"reasoning,omitempty"`
}

type chatToolCall struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function chatToolFunction `json:"function"`
}

type chatToolFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type textPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// contentOf is a list of texts as chat content: one text is a string,
// several are text parts, none is nil.
func contentOf(texts []string) any {
	switch len(texts) {
	case 0:
		return nil
	case 1:
		return texts[0]
	}
	parts := make([]textPart, len(texts))
	for i, t := range texts {
		parts[i] = textPart{Type: "text", Text: t}
	}
	return parts
}

// chatTool is a function tool in the chat form.
type chatTool struct {
	Type     string          `json:"type"`
	Function chatFunctionDef `json:"function"`
}

type chatFunctionDef struct {
	Name        string          `json:"name"`
	Description *string         `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// ToolCall is a function call of an assistant turn, for AssistantMessage.
type ToolCall struct {
	ID, Name, Arguments string
}

// AssistantMessage is an assistant turn in the chat form: what an engine
// keeps of a response to continue from it.
func AssistantMessage(text, reasoning string, calls []ToolCall) json.RawMessage {
	m := chatMessage{Role: "assistant"}
	if text != "" || len(calls) == 0 {
		m.Content = text
	}
	if reasoning != "" {
		m.Reasoning = &reasoning
	}
	for _, c := range calls {
		m.ToolCalls = append(m.ToolCalls, chatToolCall{ID: c.ID, Type: "function", Function: chatToolFunction{Name: c.Name, Arguments: c.Arguments}})
	}
	return marshal(m)
}

// setChatForm builds Chat from the converted messages and the dialect's
// other fields, then flattens the messages as a chat request's.
func (r *Request) setChatForm(msgs any, fields map[string]json.RawMessage) *Error {
	fields["model"] = marshal(r.Model)
	fields["messages"] = marshal(msgs)
	if r.Stream {
		fields["stream"] = json.RawMessage("true")
		fields["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	}
	if r.MaxTokens > 0 {
		fields["max_tokens"] = marshal(r.MaxTokens)
		fields["max_completion_tokens"] = fields["max_tokens"]
	}
	for _, k := range []string{"temperature", "top_p", "top_k", "chat_template_kwargs"} {
		if raw, ok := r.Present(k); ok {
			fields[k] = raw
		}
	}
	flat, err := FlattenMessages(fields["messages"])
	if err != nil {
		return err
	}
	r.Chat, r.Messages = fields, flat
	return nil
}
