package edge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/bodybudget"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/routing/convid"
	"github.com/tether-project/tether/routing/hintauth"
	"github.com/tether-project/tether/routing/prefix"
)

// apiError is an OpenAI-style error answer.
type apiError struct {
	Status     int    `json:"-"`
	Message    string `json:"message"`
	Type       string `json:"type"`
	Param      any    `json:"param"`
	Code       any    `json:"code"`
	retryAfter time.Duration
}

func (e *apiError) Error() string { return e.Message }

func newAPIError(status int, typ, code, param, format string, args ...any) *apiError {
	e := &apiError{Status: status, Message: fmt.Sprintf(format, args...), Type: typ}
	if param != "" {
		e.Param = param
	}
	if code != "" {
		e.Code = code
	}
	return e
}

func badRequest(code, param, format string, args ...any) *apiError {
	if code == "" {
		code = "invalid_value"
	}
	return newAPIError(http.StatusBadRequest, "invalid_request_error", code, param, format, args...)
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((e.retryAfter+time.Second-1)/time.Second)))
		// The OpenAI SDKs read retry-after-ms first: sub-second hints (an
		// election) need not round up to a whole second.
		h.Set("Retry-After-Ms", strconv.FormatInt(e.retryAfter.Milliseconds(), 10))
	}
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(struct {
		Error *apiError `json:"error"`
	}{e})
}

// request is one inference request after parsing: its sanitized body, its
// identity and the prompt's block hashes.
type request struct {
	chat         bool
	path         string
	top          map[string]json.RawMessage // the body, without internal fields
	model        string
	m            *servedModel // the model's fleets (models.go)
	adapter      string       // the LoRA adapter the model names ("" the base model)
	stream       bool
	includeUsage bool
	maxTokens    int // requested completion tokens (0: not given)

	id           routing.Identity
	priority     routing.Priority
	promptTokens int       // the context fleet's
	prompts      [3]prompt // by fsm.Fleet: tokens and block keys (tokenize.go)
	requestID    string
	now          time.Time
	hint         bool // the endpoint gets rank affinity (signed hint) when a sub-agent
}

// internalBodyFields never come from a client: the edge owns
// disaggregation and the affinity hint (docs/subagent-routing.md: "the internal affinity
// field is excluded from the serialized request body").
var internalBodyFields = []string{"disaggregated_params", "subagent_affinity_id", "subagent_affinity_auth"}

// readBody reads at most max_body_bytes (413 beyond), held against the
// edge's max_inflight_body_bytes until release (429 with Retry-After when
// the budget is exhausted).
func (e *Edge) readBody(r *http.Request) (body []byte, release func(), aerr *apiError) {
	limit := e.cfg.MaxBodyBytes
	body, release, err := e.bodies.Read(r.Body, r.ContentLength, limit)
	switch {
	case err == nil:
		return body, release, nil
	case errors.Is(err, bodybudget.ErrTooLarge):
		if r.ContentLength > limit {
			return nil, nil, newAPIError(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
				"request body of %d bytes exceeds the limit of %d bytes (max_body_bytes)", r.ContentLength, limit)
		}
		return nil, nil, newAPIError(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
			"request body exceeds the limit of %d bytes (max_body_bytes)", limit)
	case errors.Is(err, bodybudget.ErrExceeded):
		e.metrics.bodyRefused.Inc()
		aerr := newAPIError(http.StatusTooManyRequests, "rate_limit_error", "request_body_budget_exhausted", "",
			"this edge holds its limit of %d request-body bytes in flight (max_inflight_body_bytes); retry after 1s", e.bodies.Limit())
		aerr.retryAfter = time.Second
		return nil, nil, aerr
	}
	return nil, nil, badRequest("", "", "reading the request body: %v", err)
}

// parseBody validates an inference body and extracts what routing needs:
// model, stream, max tokens, the conversation id in the body, and the
// prompt's tokens. Internal fields are removed from top.
func parseBody(body []byte, chat bool) (rq *request, bodyConv string, tokens []uint32, aerr *apiError) {
	var top map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&top); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typ):
			return nil, "", nil, badRequest("", "", "request body must be a JSON object")
		case errors.As(err, &syn):
			return nil, "", nil, badRequest("invalid_json", "", "request body is not valid JSON: %v (at byte %d)", syn, syn.Offset)
		default:
			return nil, "", nil, badRequest("invalid_json", "", "request body is not valid JSON: %v", err)
		}
	}
	if top == nil {
		return nil, "", nil, badRequest("", "", "request body must be a JSON object")
	}
	if dec.More() {
		return nil, "", nil, badRequest("invalid_json", "", "request body holds more than one JSON value")
	}
	for _, k := range internalBodyFields {
		delete(top, k)
	}
	rq = &request{chat: chat, top: top}

	model, ok, aerr := stringField(top, "model")
	if aerr != nil {
		return nil, "", nil, aerr
	}
	if !ok || strings.TrimSpace(model) == "" {
		return nil, "", nil, badRequest("missing_required_parameter", "model", "model is required")
	}
	rq.model = model
	if raw, ok := top["stream"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &rq.stream); err != nil {
			return nil, "", nil, badRequest("", "stream", "invalid type for \"stream\": want a boolean, got %s", jsonKind(raw))
		}
	}
	if raw, ok := top["stream_options"]; ok && !isNull(raw) {
		var so struct {
			IncludeUsage *bool `json:"include_usage"`
		}
		if err := json.Unmarshal(raw, &so); err != nil {
			return nil, "", nil, badRequest("", "stream_options", "invalid stream_options: want an object with a boolean include_usage")
		}
		if !rq.stream {
			return nil, "", nil, badRequest("", "stream_options", "stream_options is only allowed when stream is true")
		}
	}
	for _, name := range []string{"max_tokens", "max_completion_tokens"} {
		raw, ok := top[name]
		if !ok || isNull(raw) {
			continue
		}
		var v int64
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, "", nil, badRequest("", name, "invalid type for %q: want an integer, got %s", name, jsonKind(raw))
		}
		if v < 1 {
			return nil, "", nil, badRequest("", name, "%s must be at least 1, got %d", name, v)
		}
		rq.maxTokens = int(min(v, 1<<30))
	}
	if raw, ok := top["n"]; ok && !isNull(raw) {
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil || n != 1 {
			return nil, "", nil, badRequest("", "n", "n must be 1 (only one choice per request is supported)")
		}
	}
	if raw, ok := top["conversation_params"]; ok && !isNull(raw) {
		var cp map[string]json.RawMessage
		if err := json.Unmarshal(raw, &cp); err != nil {
			return nil, "", nil, badRequest("", "conversation_params", "invalid conversation_params: want an object")
		}
		if c, ok := cp["conversation_id"]; ok && !isNull(c) {
			if err := json.Unmarshal(c, &bodyConv); err != nil {
				return nil, "", nil, badRequest("", "conversation_params.conversation_id", "invalid type for \"conversation_params.conversation_id\": want a string, got %s", jsonKind(c))
			}
		}
	}
	if raw, ok := top["scheduling_params"]; ok && !isNull(raw) {
		// The affinity id may also hide in scheduling_params: drop it there.
		var sp map[string]json.RawMessage
		if err := json.Unmarshal(raw, &sp); err != nil {
			return nil, "", nil, badRequest("", "scheduling_params", "invalid scheduling_params: want an object")
		}
		if _, ok := sp["subagent_affinity_id"]; ok {
			delete(sp, "subagent_affinity_id")
			b, _ := json.Marshal(sp)
			top["scheduling_params"] = b
		}
	}

	if chat {
		if _, ok := top["prompt"]; ok {
			return nil, "", nil, badRequest("", "prompt", "prompt is not a chat completions parameter (use messages, or POST /v1/completions)")
		}
		raw, ok := top["messages"]
		if !ok || isNull(raw) {
			return nil, "", nil, badRequest("missing_required_parameter", "messages", "messages is required")
		}
		var msgs []struct {
			Role    json.RawMessage `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(raw, &msgs); err != nil {
			var typ *json.UnmarshalTypeError
			if errors.As(err, &typ) && typ.Field != "" {
				return nil, "", nil, badRequest("", "messages", "every message must be an object with role and content: %v", err)
			}
			return nil, "", nil, badRequest("", "messages", "invalid type for \"messages\": want an array of messages, got %s", jsonKind(raw))
		}
		if len(msgs) == 0 {
			return nil, "", nil, badRequest("", "messages", "messages must contain at least one message")
		}
		pm := make([]prefix.Message, len(msgs))
		for i, msg := range msgs {
			var role string
			if err := json.Unmarshal(msg.Role, &role); err != nil || strings.TrimSpace(role) == "" {
				return nil, "", nil, badRequest("", fmt.Sprintf("messages[%d].role", i), "messages[%d].role is required (a non-empty string)", i)
			}
			if !knownRoles[role] {
				return nil, "", nil, badRequest("invalid_value", fmt.Sprintf("messages[%d].role", i), "messages[%d].role %q is not a chat role (system, developer, user, assistant, tool)", i, truncate(role, 40))
			}
			content, err := flattenContent(msg.Content)
			if err != nil {
				return nil, "", nil, badRequest("", fmt.Sprintf("messages[%d].content", i), "messages[%d].content: %v", i, err)
			}
			pm[i] = prefix.Message{Role: role, Content: content}
		}
		tokens = prefix.Tokenize(prefix.RenderChat(pm))
	} else {
		if _, ok := top["messages"]; ok {
			return nil, "", nil, badRequest("", "messages", "messages is not a completions parameter (use prompt, or POST /v1/chat/completions)")
		}
		var err *apiError
		if tokens, err = promptTokens(top["prompt"]); err != nil {
			return nil, "", nil, err
		}
	}
	if len(tokens) == 0 {
		param := "prompt"
		if chat {
			param = "messages"
		}
		return nil, "", nil, badRequest("", param, "the prompt is empty (no tokens)")
	}
	return rq, bodyConv, tokens, nil
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func stringField(top map[string]json.RawMessage, name string) (string, bool, *apiError) {
	raw, ok := top[name]
	if !ok || isNull(raw) {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, badRequest("", name, "invalid type for %q: want a string, got %s", name, jsonKind(raw))
	}
	return s, true, nil
}

// jsonKind names a JSON value's type for error messages.
func jsonKind(raw json.RawMessage) string {
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

// flattenContent turns a chat message's content into text exactly as the
// workers do (a string, or text parts joined by newlines), so the edge's
// block hashes equal the ones the workers' caches store.
func flattenContent(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return "", nil
	case raw[0] == '"':
		// Fast path: no escapes and valid UTF-8 (the decoder already
		// validated the JSON) is the text between the quotes.
		if len(raw) >= 2 && raw[len(raw)-1] == '"' {
			if inner := raw[1 : len(raw)-1]; bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
				return string(inner), nil
			}
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		return s, nil
	case raw[0] == '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", err
		}
		var sb strings.Builder
		for i, p := range parts {
			var part struct {
				Type *string `json:"type"`
				Text *string `json:"text"`
			}
			if err := json.Unmarshal(p, &part); err != nil {
				return "", fmt.Errorf("part %d: want an object with type and text", i)
			}
			if part.Type == nil || *part.Type != "text" {
				t := "missing"
				if part.Type != nil {
					t = strconv.Quote(*part.Type)
				}
				return "", fmt.Errorf("part %d: content part type %s is not supported (only \"text\")", i, t)
			}
			if part.Text == nil {
				return "", fmt.Errorf("part %d: text part without a text string", i)
			}
			if i > 0 {
				sb.WriteByte('\n')
			}
			sb.WriteString(*part.Text)
		}
		return sb.String(), nil
	}
	return "", errors.New("want a string or an array of content parts")
}

// promptTokens tokenizes a completions prompt: a string, an array of one
// string, or an array of token ids.
func promptTokens(raw json.RawMessage) ([]uint32, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("missing_required_parameter", "prompt", "prompt is required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("", "prompt", "prompt: %v", err)
		}
		return prefix.Tokenize(s), nil
	case '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return nil, badRequest("", "prompt", "prompt: %v", err)
		}
		if len(elems) == 0 {
			return nil, badRequest("", "prompt", "prompt must not be an empty array")
		}
		first := bytes.TrimSpace(elems[0])
		if len(first) > 0 && first[0] == '"' {
			if len(elems) != 1 {
				return nil, badRequest("", "prompt", "batched prompts (%d strings) are not supported; send one request per prompt", len(elems))
			}
			var s string
			if err := json.Unmarshal(first, &s); err != nil {
				return nil, badRequest("", "prompt", "prompt[0]: %v", err)
			}
			return prefix.Tokenize(s), nil
		}
		toks := make([]uint32, len(elems))
		for i, e := range elems {
			var v int64
			if err := json.Unmarshal(e, &v); err != nil || v < 0 || v > 1<<31-1 {
				return nil, badRequest("", "prompt", "prompt[%d]: want a token id (an integer 0..%d), got %s", i, 1<<31-1, jsonKind(e))
			}
			toks[i] = uint32(v)
		}
		return toks, nil
	}
	return nil, badRequest("", "prompt", "prompt must be a string, an array of one string, or an array of token ids; got %s", jsonKind(raw))
}

// stripHeaders enforces the gateway trust boundary on the incoming headers:
// the internal hint headers are always removed (only the edge signs
// hints); the parent-session header is removed unless the request comes
// from a trusted gateway (when trusted_gateway is enabled).
func (e *Edge) stripHeaders(r *http.Request) {
	h := r.Header
	for _, name := range []string{hintauth.HeaderAffinityID, hintauth.HeaderAffinityAuth} {
		if _, ok := h[http.CanonicalHeaderKey(name)]; ok {
			h.Del(name)
			e.metrics.strippedHeaders.WithLabelValues(name).Inc()
		}
	}
	g := &e.cfg.TrustedGateway
	if e.cfg.ParentHeader == "" || !g.Enabled {
		return
	}
	token := ""
	if g.TokenHeader != "" {
		token = h.Get(g.TokenHeader)
		h.Del(g.TokenHeader) // a shared secret never travels further
	}
	if h.Get(e.cfg.ParentHeader) != "" && !g.trusted(r.RemoteAddr, token) {
		h.Del(e.cfg.ParentHeader)
		e.metrics.strippedHeaders.WithLabelValues(strings.ToLower(e.cfg.ParentHeader)).Inc()
	}
}

// identity resolves the request's conversation id, routing keys and parent
// link against the replicated state.
func (e *Edge) identity(rq *request, bodyConv string, h http.Header) *apiError {
	if strings.TrimSpace(bodyConv) == "" && convid.Resolve("", h) == "" {
		// Last, as TensorRT-LLM: a client-native body field (Codex).
		bodyConv = convid.FromClientFields(rq.top)
	}
	id, err := routing.ResolveIdentity(e.identityCfg, bodyConv, h, e.node.State())
	if err != nil {
		var ie *routing.IdentityError
		if errors.As(err, &ie) {
			switch {
			case errors.Is(err, routing.ErrIDTooLong) && ie.SessionHeader != "":
				return badRequest("invalid_header", ie.SessionHeader, "%v", err)
			case errors.Is(err, routing.ErrIDTooLong) && ie.Header == "":
				return badRequest("invalid_value", "conversation_params.conversation_id", "%v", err)
			case errors.Is(err, routing.ErrIDTooLong):
				return badRequest("invalid_header", ie.Header, "%v", err)
			}
			return badRequest("invalid_subagent_affinity", e.cfg.ParentHeader, "%v", err)
		}
		return badRequest("", "", "%v", err)
	}
	if strings.Contains(id.ConversationID, fsm.ModelKeySep) || strings.Contains(id.Root, fsm.ModelKeySep) {
		// The separator of a model's routing-key namespace (fsm.ModelKey):
		// a key holding it could name another model's binding.
		return badRequest("invalid_value", "conversation_params.conversation_id", "conversation ids must not contain U+001F")
	}
	rq.id = id
	p, err := routing.PriorityFromHeader(h)
	if err != nil {
		return badRequest("", routing.PriorityHeader, "%v", err)
	}
	rq.priority = p
	return nil
}
