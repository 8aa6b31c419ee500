// Package apireq is the request model of the inference APIs tether speaks:
// OpenAI chat completions and completions, the Anthropic Messages API and
// the OpenAI Responses API. Edges and workers parse a body with Parse, and
// `tether tokenize` reads a chat file with it, so the three agree on
// validation, errors and — what block keys are computed over — the prompt.
//
// Every dialect with a conversation is turned into one form, an OpenAI chat
// completions body (Request.Chat), the way vLLM serves Messages and
// Responses: it converts both to chat messages before applying the chat
// template (vllm/entrypoints/anthropic/serving.py
// _convert_anthropic_to_openai_request,
// vllm/entrypoints/openai/responses/utils.py construct_input_messages).
// The chat form's messages flattened to text (Request.Messages) are what
// the words tokenizer keys; its messages and tools are what a model's chat
// template renders. The package does no I/O.
package apireq

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/tether-project/tether/internal/httpjson"
	"github.com/tether-project/tether/internal/prefix"
)

// Dialect is the API a request body is written in.
type Dialect uint8

const (
	// Chat is POST /v1/chat/completions.
	Chat Dialect = iota
	// Completions is POST /v1/completions.
	Completions
	// Messages is the Anthropic Messages API, POST /v1/messages (and
	// /v1/messages/count_tokens).
	Messages
	// Responses is the OpenAI Responses API, POST /v1/responses.
	Responses
)

func (d Dialect) String() string {
	switch d {
	case Chat:
		return "chat"
	case Completions:
		return "completions"
	case Messages:
		return "messages"
	case Responses:
		return "responses"
	}
	return "dialect(?)"
}

// Path is the dialect's create endpoint.
func (d Dialect) Path() string {
	switch d {
	case Completions:
		return "/v1/completions"
	case Messages:
		return "/v1/messages"
	case Responses:
		return "/v1/responses"
	}
	return "/v1/chat/completions"
}

// HasConversation reports whether the dialect's prompt is a conversation
// (everything but completions), rendered through the chat form.
func (d Dialect) HasConversation() bool { return d != Completions }

// Request is one parsed and validated inference body.
type Request struct {
	Dialect Dialect
	// Top is the decoded body: every top-level field as the client sent
	// it (callers remove what they do not forward).
	Top map[string]json.RawMessage

	Model  string
	Stream bool
	// IncludeUsage: a chat or completions stream ends with a usage chunk
	// (stream_options.include_usage). Messages and Responses streams always
	// carry their usage.
	IncludeUsage bool
	// MaxTokens is the completion budget asked for, 0 when not given:
	// max_tokens or max_completion_tokens (chat, completions), max_tokens
	// (Messages), max_output_tokens (Responses).
	MaxTokens int
	// ConversationID is the body's conversation_params.conversation_id
	// ("" none); ConversationParams reports that the body has
	// conversation_params (TensorRT-LLM then signs its id as it is).
	ConversationID     string
	ConversationParams bool

	// Chat is the request as an OpenAI chat completions body: Top itself
	// for chat, the converted request for Messages and Responses, nil for
	// completions. Its messages, tools and chat_template_kwargs are what a
	// chat template renders; its tools, tool_choice, response_format,
	// parallel_tool_calls, stop and seed shape a simulated answer.
	Chat map[string]json.RawMessage
	// Messages are Chat's messages flattened to text (nil for completions).
	Messages []prefix.Message

	// Prompt is a completions prompt: its text, or (PromptIDs non-nil) its
	// token ids.
	Prompt    string
	PromptIDs []uint32

	// Responses API (Dialect Responses).
	Responses *ResponsesFields
	// Thinking: a Messages request with thinking enabled, or a Responses
	// request asking for reasoning.
	Thinking bool
	// CountTokens: a Messages count_tokens body (no max_tokens, nothing is
	// generated).
	CountTokens bool

	// anthropic is a Messages request's chat form source (WithInlineSystem
	// rebuilds the chat form from it).
	anthropic *anthropicForm
}

// ResponsesFields are the Responses API fields beyond the chat form.
type ResponsesFields struct {
	// Store: the engine keeps the response (default true, as OpenAI).
	Store bool
	// Background: the response runs after the request returns (needs Store).
	Background bool
	// PreviousResponseID names the response this one continues ("" none).
	PreviousResponseID string
	// Conversation is the conversation parameter's id ("" none).
	Conversation string
	// Instructions is the system message of this request ("" none).
	Instructions string
	// Input is the request's input as items (a string input is one user
	// message item).
	Input []json.RawMessage
	// EncryptedReasoning: include asks reasoning items to carry
	// encrypted_content (ReasoningBlob).
	EncryptedReasoning bool
	// ReasoningSummary is reasoning.summary: auto, concise, detailed or ""
	// (no summary).
	ReasoningSummary string
	// input and instructions in the chat form, kept apart so a previous
	// response's history can go between them (WithHistory).
	instr []chatMessage
	input []chatMessage
	// history is the previous response's conversation (WithHistory).
	history []json.RawMessage
	// namespaced maps the chat-form name of each namespace tool's function
	// to its namespace and name (CallName).
	namespaced map[string]ToolName
}

// knownRoles are the chat roles OpenAI-compatible servers accept.
var knownRoles = map[string]bool{
	"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true,
}

// Parse decodes and validates a body of dialect d.
func Parse(d Dialect, body []byte) (*Request, *Error) {
	top, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	r := &Request{Dialect: d, Top: top}
	if err := r.parseCommon(); err != nil {
		return nil, err
	}
	switch d {
	case Chat:
		err = r.parseChat()
	case Completions:
		err = r.parseCompletions()
	case Messages:
		err = r.parseMessages(false)
	case Responses:
		err = r.parseResponses()
	default:
		err = BadRequest("", "", "unknown dialect %d", d)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// ParseCountTokens decodes and validates a Messages count_tokens body
// (POST /v1/messages/count_tokens: the Messages request without max_tokens).
func ParseCountTokens(body []byte) (*Request, *Error) {
	top, err := decodeObject(body)
	if err != nil {
		return nil, err
	}
	r := &Request{Dialect: Messages, Top: top, CountTokens: true}
	if err := r.parseCommon(); err != nil {
		return nil, err
	}
	if err := r.parseMessages(true); err != nil {
		return nil, err
	}
	return r, nil
}

// decodeObject decodes a body that must be one JSON object, in UTF-8 (RFC
// 8259 section 8.1: JSON text exchanged between systems is UTF-8; the
// FastAPI servers of vLLM and SGLang refuse any other body with a 400 where
// Go's decoder would read invalid bytes as U+FFFD and serve a prompt the
// client never wrote).
func decodeObject(body []byte) (map[string]json.RawMessage, *Error) {
	if !utf8.Valid(body) {
		return nil, BadRequest("invalid_json", "", "request body is not valid JSON: it is not UTF-8 (an invalid byte at offset %d; JSON text must be UTF-8)", invalidUTF8At(body))
	}
	var top map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&top); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typ):
			return nil, BadRequest("", "", "request body must be a JSON object")
		case errors.As(err, &syn):
			return nil, BadRequest("invalid_json", "", "request body is not valid JSON: %v (at byte %d)", syn, syn.Offset)
		default:
			return nil, BadRequest("invalid_json", "", "request body is not valid JSON: %v", err)
		}
	}
	if top == nil {
		return nil, BadRequest("", "", "request body must be a JSON object")
	}
	if dec.More() {
		return nil, BadRequest("invalid_json", "", "request body holds more than one JSON value")
	}
	return top, nil
}

// invalidUTF8At is the offset of the first byte of b that starts no valid
// UTF-8 sequence.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// parseCommon reads the fields every dialect shares: model, stream,
// conversation_params and the sampling parameters' types.
func (r *Request) parseCommon() *Error {
	model, ok, err := r.String("model")
	if err != nil {
		return err
	}
	if !ok || strings.TrimSpace(model) == "" {
		return Missing("model")
	}
	r.Model = model
	if r.Stream, _, err = r.Bool("stream"); err != nil {
		return err
	}
	if raw, ok := r.Present("conversation_params"); ok {
		var cp map[string]json.RawMessage
		if json.Unmarshal(raw, &cp) != nil || cp == nil {
			return BadRequest("", "conversation_params", "invalid conversation_params: want an object")
		}
		r.ConversationParams = true
		if c, ok := cp["conversation_id"]; ok && !IsNull(c) {
			if json.Unmarshal(c, &r.ConversationID) != nil {
				return BadRequest("", "conversation_params.conversation_id", "invalid type for \"conversation_params.conversation_id\": want a string, got %s", Kind(c))
			}
		}
	}
	return checkSampling(r)
}

// parseOpenAICommon reads what chat and completions share: stream_options,
// max tokens and n.
func (r *Request) parseOpenAICommon() *Error {
	if raw, ok := r.Present("stream_options"); ok {
		var so struct {
			IncludeUsage *bool `json:"include_usage"`
		}
		if err := json.Unmarshal(raw, &so); err != nil || raw[0] != '{' {
			return BadRequest("", "stream_options", "invalid stream_options: want an object with a boolean include_usage")
		}
		if !r.Stream {
			return BadRequest("", "stream_options", "stream_options is only allowed when stream is true")
		}
		r.IncludeUsage = so.IncludeUsage != nil && *so.IncludeUsage
	}
	for _, name := range []string{"max_tokens", "max_completion_tokens"} {
		if err := r.maxTokens(name); err != nil {
			return err
		}
	}
	if raw, ok := r.Present("n"); ok {
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil || n != 1 {
			return BadRequest("", "n", "n must be 1 (only one choice per request is supported), got %s", truncate(string(raw), 40))
		}
	}
	return nil
}

// maxTokens reads a completion budget field into MaxTokens.
func (r *Request) maxTokens(name string) *Error {
	raw, ok := r.Present(name)
	if !ok {
		return nil
	}
	var v int64
	if err := json.Unmarshal(raw, &v); err != nil {
		return BadRequest("", name, "invalid type for %q: want an integer, got %s", name, Kind(raw))
	}
	if v < 1 {
		return BadRequest("", name, "%s must be at least 1, got %d", name, v)
	}
	r.MaxTokens = int(min(v, 1<<30))
	return nil
}

// WordTokens are the prompt's tokens by the words tokenizer
// (internal/prefix): the chat form's messages rendered with role markers, or
// the completions prompt.
func (r *Request) WordTokens() []uint32 {
	if r.Dialect == Completions {
		if r.PromptIDs != nil {
			return r.PromptIDs
		}
		return prefix.Tokenize(r.Prompt)
	}
	return prefix.Tokenize(prefix.RenderChat(r.Messages))
}

// Present returns a top-level field unless it is absent or null.
func (r *Request) Present(name string) (json.RawMessage, bool) {
	raw, ok := r.Top[name]
	if !ok || IsNull(raw) {
		return nil, false
	}
	return bytes.TrimSpace(raw), true
}

// String reads a top-level string field (absent or null: ok false).
func (r *Request) String(name string) (string, bool, *Error) {
	raw, ok := r.Present(name)
	if !ok {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, BadRequest("", name, "invalid type for %q: want a string, got %s", name, Kind(raw))
	}
	return s, true, nil
}

// Bool reads a top-level boolean field (absent or null: false, ok false).
func (r *Request) Bool(name string) (bool, bool, *Error) {
	raw, ok := r.Present(name)
	if !ok {
		return false, false, nil
	}
	var b bool
	if err := json.Unmarshal(raw, &b); err != nil {
		return false, false, BadRequest("", name, "invalid type for %q: want a boolean, got %s", name, Kind(raw))
	}
	return b, true, nil
}

// IsNull reports whether raw is JSON null (or empty).
func IsNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// Kind names a JSON value's type for error messages.
func Kind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// truncate quotes client input in a message (internal/httpjson: cut at a
// character boundary), as the edge and the worker do.
var truncate = httpjson.Clip

// marshal encodes values built by this package (maps and slices of
// strings, numbers and raw JSON the decoder validated), which cannot fail;
// null if one ever did.
func marshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		return json.RawMessage("null")
	}
	return b
}
