package worker

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/tether-project/tether/routing/prefix"
	"github.com/tether-project/tether/worker/engine"
)

// apiError is an OpenAI-style error: written as
// {"error":{"message","type","param","code"}} with its HTTP status.
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

func newAPIError(status int, typ, code, param, format string, args ...any) *apiError {
	e := &apiError{Status: status, Type: typ, Message: fmt.Sprintf(format, args...)}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	return e
}

func badRequest(param, format string, args ...any) *apiError {
	return newAPIError(http.StatusBadRequest, "invalid_request_error", "invalid_value", param, format, args...)
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(struct {
		Error *apiError `json:"error"`
	}{e})
}

// textContent is a chat message's content: a string, an array of
// {"type":"text","text":...} parts, or null.
type textContent string

func (c *textContent) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case len(b) == 0 || string(b) == "null":
		*c = ""
		return nil
	case b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = textContent(s)
		return nil
	case b[0] == '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(b, &parts); err != nil {
			return err
		}
		var sb strings.Builder
		for i, raw := range parts {
			var p struct {
				Type *string `json:"type"`
				Text *string `json:"text"`
			}
			if err := json.Unmarshal(raw, &p); err != nil {
				return fmt.Errorf("part %d: want an object with type and text", i)
			}
			if p.Type == nil || *p.Type != "text" {
				t := "missing"
				if p.Type != nil {
					t = strconv.Quote(*p.Type)
				}
				return fmt.Errorf("part %d: content part type %s is not supported (only \"text\")", i, t)
			}
			if p.Text == nil {
				return fmt.Errorf("part %d: text part without a text string", i)
			}
			if i > 0 {
				sb.WriteByte('\n')
			}
			sb.WriteString(*p.Text)
		}
		*c = textContent(sb.String())
		return nil
	}
	return errors.New("want a string or an array of content parts")
}

type chatMessage struct {
	Role    *string     `json:"role"`
	Content textContent `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type conversationParams struct {
	ConversationID *string `json:"conversation_id"`
}

// flexID is a request id that may arrive as a JSON string or integer; it is
// echoed in the form it came and signed as text.
type flexID struct {
	raw  json.RawMessage
	text string
}

func (f *flexID) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if string(b) == "null" {
		*f = flexID{}
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		f.raw, f.text = append(json.RawMessage(nil), b...), s
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return errors.New("want a string or an integer")
	}
	if _, err := strconv.ParseInt(n.String(), 10, 64); err != nil {
		if _, err := strconv.ParseUint(n.String(), 10, 64); err != nil {
			return errors.New("want a string or an integer")
		}
	}
	f.raw, f.text = append(json.RawMessage(nil), b...), n.String()
	return nil
}

func (f flexID) MarshalJSON() ([]byte, error) {
	if f.raw == nil {
		return []byte("null"), nil
	}
	return f.raw, nil
}

func (f flexID) set() bool { return f.raw != nil }

// disaggParams is the body's disaggregated_params: TensorRT-LLM's
// DisaggregatedParams (tensorrt_llm/serve/openai_protocol.py); fields the
// worker does not use (schedule_style, conversation_id, ctx_usage,
// draft_tokens, ...) are accepted and ignored. OpaqueState is the handoff
// field of edges predating that protocol.
type disaggParams struct {
	RequestType        string          `json:"request_type"`
	CtxRequestID       flexID          `json:"ctx_request_id"`
	DisaggRequestID    flexID          `json:"disagg_request_id"`
	EncodedOpaqueState *string         `json:"encoded_opaque_state"`
	CtxInfoEndpoint    json.RawMessage `json:"ctx_info_endpoint"`
	OpaqueState        *string         `json:"opaque_state"`
	FirstGenTokens     []int64         `json:"first_gen_tokens"`
}

// requestBody holds the fields of both endpoints the worker reads; the rest
// of the body is forwarded untouched to proxied upstreams.
type requestBody struct {
	Model               *string             `json:"model"`
	Messages            *[]chatMessage      `json:"messages"`
	Prompt              json.RawMessage     `json:"prompt"`
	Stream              *bool               `json:"stream"`
	StreamOptions       *streamOptions      `json:"stream_options"`
	MaxTokens           *int64              `json:"max_tokens"`
	MaxCompletionTokens *int64              `json:"max_completion_tokens"`
	N                   *int64              `json:"n"`
	ConversationParams  *conversationParams `json:"conversation_params"`
	DisaggregatedParams *disaggParams       `json:"disaggregated_params"`
}

// parsedRequest is a validated request, ready for hint verification and
// scheduling.
type parsedRequest struct {
	chat           bool
	model          string
	prompt         []uint32
	stream         bool
	includeUsage   bool
	maxTokens      int
	output         *engine.OutputOptions
	bodyConvID     string
	convParams     bool // the body has conversation_params (TensorRT-LLM then signs its id as is)
	legacyHandoff  bool // generation_only with the pre-trtllm opaque_state field
	phase          engine.Phase
	disagg         *disaggParams
	contextState   []byte
	sanitizedBody  []byte
	conversationID string // filled by the handler from body + headers
}

// internalBodyFields are stripped from a request body before any engine or
// upstream sees it: routing and disaggregation state is the worker's, never
// a client's to inject into the engine.
var internalBodyFields = []string{
	"disaggregated_params",
	"scheduling_params",
	"subagent_affinity_id",
	"subagent_affinity_auth",
	"conversation_params",
	// Set by a disaggregated front from the context response (TensorRT-LLM's
	// protocol); not an OpenAI field, so upstream engines never see it.
	"prompt_token_ids",
}

// parseRequest decodes and validates an inference request body.
func parseRequest(body []byte, chat bool, limit, defaultMax int) (*parsedRequest, *apiError) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typ):
			return nil, badRequest("", "request body must be a JSON object")
		case errors.As(err, &syn):
			return nil, newAPIError(http.StatusBadRequest, "invalid_request_error", "invalid_json", "", "request body is not valid JSON: %v (at byte %d)", syn, syn.Offset)
		default:
			return nil, newAPIError(http.StatusBadRequest, "invalid_request_error", "invalid_json", "", "request body is not valid JSON: %v", err)
		}
	}
	if top == nil {
		return nil, badRequest("", "request body must be a JSON object")
	}
	var rb requestBody
	if err := json.Unmarshal(body, &rb); err != nil {
		return nil, typeError(err)
	}
	p := &parsedRequest{chat: chat}
	if rb.Model == nil || strings.TrimSpace(*rb.Model) == "" {
		return nil, newAPIError(http.StatusBadRequest, "invalid_request_error", "missing_required_parameter", "model", "model is required")
	}
	p.model = *rb.Model
	if rb.N != nil && *rb.N != 1 {
		return nil, badRequest("n", "n=%d is not supported (only 1)", *rb.N)
	}
	if chat {
		if _, ok := top["prompt"]; ok {
			return nil, badRequest("prompt", "prompt is not a chat completions parameter (use messages, or POST /v1/completions)")
		}
		if rb.Messages == nil {
			return nil, newAPIError(http.StatusBadRequest, "invalid_request_error", "missing_required_parameter", "messages", "messages is required")
		}
		if len(*rb.Messages) == 0 {
			return nil, badRequest("messages", "messages must contain at least one message")
		}
		msgs := make([]prefix.Message, len(*rb.Messages))
		for i, m := range *rb.Messages {
			if m.Role == nil || strings.TrimSpace(*m.Role) == "" {
				return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d].role is required", i)
			}
			if !knownRoles[*m.Role] {
				return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d].role %q is not a chat role (system, developer, user, assistant, tool)", i, truncate(*m.Role, 40))
			}
			msgs[i] = prefix.Message{Role: *m.Role, Content: string(m.Content)}
		}
		p.prompt = prefix.Tokenize(prefix.RenderChat(msgs))
	} else {
		if _, ok := top["messages"]; ok {
			return nil, badRequest("messages", "messages is not a completions parameter (use prompt, or POST /v1/chat/completions)")
		}
		toks, err := parsePrompt(rb.Prompt)
		if err != nil {
			return nil, err
		}
		p.prompt = toks
	}
	if len(p.prompt) == 0 {
		param := "prompt"
		if chat {
			param = "messages"
		}
		return nil, badRequest(param, "the prompt is empty (no tokens)")
	}
	p.stream = rb.Stream != nil && *rb.Stream
	if rb.StreamOptions != nil {
		if !p.stream {
			return nil, badRequest("stream_options", "stream_options is only allowed when stream is true")
		}
		p.includeUsage = rb.StreamOptions.IncludeUsage
	}
	p.maxTokens = defaultMax
	for _, mt := range []struct {
		name string
		v    *int64
	}{{"max_tokens", rb.MaxTokens}, {"max_completion_tokens", rb.MaxCompletionTokens}} {
		if mt.v == nil {
			continue
		}
		if *mt.v < 1 {
			return nil, badRequest(mt.name, "%s must be at least 1, got %d", mt.name, *mt.v)
		}
		// Beyond the limit is refused, as vLLM refuses max_tokens beyond
		// its context length: a silent clamp hides the client's mistake.
		if *mt.v > int64(limit) {
			return nil, badRequest(mt.name, "%s is too large: %d; this worker produces at most %d completion tokens per request (max_tokens_limit)", mt.name, *mt.v, limit)
		}
		p.maxTokens = int(*mt.v)
	}
	var msgs []chatMessage
	if rb.Messages != nil {
		msgs = *rb.Messages
	}
	out, aerr := outputOptions(top, chat, msgs)
	if aerr != nil {
		return nil, aerr
	}
	if rb.MaxTokens == nil && rb.MaxCompletionTokens == nil {
		// The default bounds free text only; tool calls and JSON are
		// produced whole up to the limit, as a model stops on its own.
		out.StructuredMaxTokens = limit
	}
	p.output = out
	if rb.ConversationParams != nil {
		p.convParams = true
		if c := rb.ConversationParams.ConversationID; c != nil {
			p.bodyConvID = *c
		}
	}
	p.phase = engine.PhaseAggregated
	if d := rb.DisaggregatedParams; d != nil {
		p.disagg = d
		switch d.RequestType {
		case "context_only":
			p.phase = engine.PhaseContextOnly
			// The context phase produces exactly the first token, never
			// streamed; the edge streams from the generation worker.
			p.stream, p.includeUsage, p.maxTokens = false, false, 1
		case "generation_only":
			p.phase = engine.PhaseGenerationOnly
			state, param := d.EncodedOpaqueState, "disaggregated_params.encoded_opaque_state"
			if state == nil && d.OpaqueState != nil {
				state, param, p.legacyHandoff = d.OpaqueState, "disaggregated_params.opaque_state", true
			}
			if state == nil || *state == "" {
				return nil, badRequest("disaggregated_params.encoded_opaque_state", "generation_only requests need disaggregated_params.encoded_opaque_state from the context phase (choices[0].disaggregated_params of its response)")
			}
			st, err := base64.StdEncoding.DecodeString(*state)
			if err != nil {
				return nil, badRequest(param, "%s is not valid base64: %v", param, err)
			}
			p.contextState = st
		case "", "aggregated":
			// An explicit aggregated type is the same as none.
		default:
			return nil, badRequest("disaggregated_params.request_type", "unknown disaggregated_params.request_type %q (want context_only or generation_only)", d.RequestType)
		}
		if p.phase != engine.PhaseAggregated && !d.DisaggRequestID.set() {
			return nil, newAPIError(http.StatusBadRequest, "invalid_request_error", "missing_required_parameter", "disaggregated_params.disagg_request_id", "%s requests need disaggregated_params.disagg_request_id", d.RequestType)
		}
		for i, t := range d.FirstGenTokens {
			if t < 0 || t > 1<<31-1 {
				return nil, badRequest(fmt.Sprintf("disaggregated_params.first_gen_tokens[%d]", i), "token id %d out of range", t)
			}
		}
	}
	sb, err := sanitizeBody(body, top)
	if err != nil {
		return nil, newAPIError(http.StatusInternalServerError, "server_error", "", "", "re-encoding request: %v", err)
	}
	p.sanitizedBody = sb
	return p, nil
}

// sanitizeBody returns the body without internal fields: the original
// bytes when it has none (the common case, and no re-encoding cost), else a
// re-encoding of the remaining fields.
func sanitizeBody(body []byte, top map[string]json.RawMessage) ([]byte, error) {
	found := false
	for _, k := range internalBodyFields {
		if _, ok := top[k]; ok {
			delete(top, k)
			found = true
		}
	}
	if !found {
		return body, nil
	}
	return json.Marshal(top)
}

// parsePrompt accepts a string, an array of one string, or an array of
// token ids.
func parsePrompt(raw json.RawMessage) ([]uint32, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, newAPIError(http.StatusBadRequest, "invalid_request_error", "missing_required_parameter", "prompt", "prompt is required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("prompt", "prompt: %v", err)
		}
		return prefix.Tokenize(s), nil
	case '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return nil, badRequest("prompt", "prompt: %v", err)
		}
		if len(elems) == 0 {
			return nil, badRequest("prompt", "prompt must not be an empty array")
		}
		first := bytes.TrimSpace(elems[0])
		if len(first) > 0 && first[0] == '"' {
			if len(elems) != 1 {
				return nil, badRequest("prompt", "batched prompts (%d strings) are not supported; send one request per prompt", len(elems))
			}
			var s string
			if err := json.Unmarshal(first, &s); err != nil {
				return nil, badRequest("prompt", "prompt[0]: %v", err)
			}
			return prefix.Tokenize(s), nil
		}
		if len(first) > 0 && first[0] == '[' {
			return nil, badRequest("prompt", "batched token prompts are not supported; send one request per prompt")
		}
		toks := make([]uint32, len(elems))
		for i, e := range elems {
			var v int64
			if err := json.Unmarshal(e, &v); err != nil {
				return nil, badRequest("prompt", "prompt[%d]: want a token id (integer), got %s", i, truncate(string(e), 40))
			}
			if v < 0 || v > 1<<31-1 {
				return nil, badRequest("prompt", "prompt[%d]: token id %d out of range (0..%d)", i, v, 1<<31-1)
			}
			toks[i] = uint32(v)
		}
		return toks, nil
	}
	return nil, badRequest("prompt", "prompt must be a string, an array of one string, or an array of token ids")
}

// typeError turns a json type mismatch into a 400 naming the field.
func typeError(err error) *apiError {
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		field := typ.Field
		return badRequest(field, "invalid type for %q: got JSON %s, want %s", field, typ.Value, jsonTypeName(typ.Type.String()))
	}
	// Errors from the custom unmarshalers (content parts, ids) carry their
	// own message; json does not say which field, so name the likely ones.
	msg := err.Error()
	param := ""
	switch {
	case strings.Contains(msg, "part "), strings.Contains(msg, "content part"), strings.Contains(msg, "content parts"):
		param = "messages.content"
	case strings.Contains(msg, "string or an integer"):
		param = "disaggregated_params"
	}
	return badRequest(param, "invalid request: %s", msg)
}

func jsonTypeName(goType string) string {
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.Contains(goType, "int"):
		return "an integer"
	case strings.Contains(goType, "float"):
		return "a number"
	case strings.Contains(goType, "string"):
		return "a string"
	case strings.Contains(goType, "bool"):
		return "a boolean"
	}
	return "an object"
}

// Response shapes (OpenAI).

type usage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	PromptTokensDetails promptTokensDetails `json:"prompt_tokens_details"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      *chatOutput `json:"message,omitempty"`
	Delta        *chatOutput `json:"delta,omitempty"`
	Text         *string     `json:"text,omitempty"`
	FinishReason *string     `json:"finish_reason"`
	Logprobs     *struct{}   `json:"logprobs"`
	// DisaggregatedParams: the handoff of a context_only response.
	DisaggregatedParams *disaggResponse `json:"disaggregated_params,omitempty"`
}

type chatOutput struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
	// ToolCalls are a message's calls, or a stream delta's call pieces.
	ToolCalls []toolCallJSON `json:"tool_calls,omitempty"`
	// nullContent writes "content": null (an answer of tool calls).
	nullContent bool
}

func (o chatOutput) MarshalJSON() ([]byte, error) {
	type plain chatOutput
	if !o.nullContent || o.Content != nil {
		return json.Marshal(plain(o))
	}
	return json.Marshal(struct {
		Role      string         `json:"role,omitempty"`
		Content   *string        `json:"content"`
		ToolCalls []toolCallJSON `json:"tool_calls,omitempty"`
	}{o.Role, nil, o.ToolCalls})
}

// toolCallJSON is a tool call as OpenAI writes it; in a stream delta,
// index names the call and id, type and name come only in its first piece.
type toolCallJSON struct {
	Index    *int             `json:"index,omitempty"`
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"`
	Function toolFunctionJSON `json:"function"`
}

type toolFunctionJSON struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// disaggResponse is choices[0].disaggregated_params in a context_only
// response: the fields of TensorRT-LLM's DisaggregatedParams that a
// context server fills (tensorrt_llm/serve/openai_protocol.py), which a
// TensorRT-LLM disaggregated server forwards to the generation server.
type disaggResponse struct {
	RequestType        string  `json:"request_type"`
	FirstGenTokens     []int64 `json:"first_gen_tokens"`
	CtxRequestID       flexID  `json:"ctx_request_id"`
	EncodedOpaqueState string  `json:"encoded_opaque_state"`
	DraftTokens        []int64 `json:"draft_tokens"`
	DisaggRequestID    flexID  `json:"disagg_request_id"`
}

type completionResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
	// PromptTokenIDs: the prompt's tokens, in a context_only response
	// (TensorRT-LLM's disaggregated server sends them to the generation
	// server).
	PromptTokenIDs []uint32 `json:"prompt_token_ids,omitempty"`
}
