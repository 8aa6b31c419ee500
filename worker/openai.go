package worker

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/engine"
	"github.com/tether-project/tether/worker/proxy"
)

// apiError is an API error answer (internal/apireq, the request model the
// edges share), written in the shape of the endpoint's dialect.
type apiError = apireq.Error

func newAPIError(status int, typ, code, param, format string, args ...any) *apiError {
	return apireq.NewError(status, typ, code, param, format, args...)
}

func badRequest(param, format string, args ...any) *apiError {
	return apireq.BadRequest("", param, format, args...)
}

// writeAPIError writes e in OpenAI's shape (the paths of no dialect).
func writeAPIError(w http.ResponseWriter, e *apiError) { e.Write(w, apireq.Chat) }

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

// parsedRequest is a validated request, ready for hint verification and
// scheduling.
type parsedRequest struct {
	dialect        apireq.Dialect
	req            *apireq.Request
	chat           bool // answered in the chat completions shape
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

// requestRules are what the worker's configuration brings to a request's
// parse: the context length it checks, the bound of an answer without max
// tokens, and the tools that start sub-agents.
type requestRules struct {
	// maxModelLen is max_model_len; 0: not checked here (a proxied engine
	// checks its own context, with its own tokenizer).
	maxModelLen int
	// defaultMax is default_max_tokens; 0: max_model_len − prompt (when
	// maxModelLen is 0 as well: the engine's own default).
	defaultMax    int
	subagentTools []string
}

// rules are this worker's request rules.
func (s *Server) rules() requestRules {
	r := requestRules{defaultMax: s.cfg.DefaultMaxTokens, subagentTools: s.cfg.Engine.SubagentTools}
	if _, proxied := s.eng.(*proxy.Engine); !proxied {
		r.maxModelLen = s.cfg.MaxModelLen
	}
	return r
}

// parseRequest decodes and validates an inference request body of dialect
// d with the request model edges share (internal/apireq), then what only
// a worker reads: the token budget, the answer-shaping options and the
// disaggregated phase.
func parseRequest(body []byte, d apireq.Dialect, rules requestRules) (*parsedRequest, *apiError) {
	req, aerr := apireq.Parse(d, body)
	if aerr != nil {
		return nil, aerr
	}
	return parsedFrom(req, body, rules)
}

// parsedFrom completes a parsed request (also after a Responses history
// was put before its input: the prompt is recomputed).
func parsedFrom(req *apireq.Request, body []byte, rules requestRules) (*parsedRequest, *apiError) {
	d := req.Dialect
	p := &parsedRequest{dialect: d, req: req, chat: d == apireq.Chat, model: req.Model,
		stream: req.Stream, includeUsage: req.IncludeUsage, prompt: req.WordTokens()}
	if len(p.prompt) == 0 {
		param := "prompt"
		if d.HasConversation() {
			param = "messages"
		}
		return nil, badRequest(param, "the prompt is empty (no tokens)")
	}
	var aerr *apiError
	if p.maxTokens, aerr = rules.budget(req, len(p.prompt)); aerr != nil {
		return nil, aerr
	}
	form := req.Chat
	if form == nil {
		form = req.Top
	}
	out, aerr := outputOptions(form, d.HasConversation(), req.Messages, toolNameLimit(d))
	if aerr != nil {
		return nil, aerr
	}
	if aerr := vllmSampling(req.Top, out, p.maxTokens); aerr != nil {
		return nil, aerr
	}
	for i := range out.Tools {
		t := &out.Tools[i]
		if rf := req.Responses; rf != nil {
			if own := rf.CallName(t.Name); own.Namespace != "" {
				t.Own = own.Name
			}
		}
		t.Subagent = slices.Contains(rules.subagentTools, t.Mention())
	}
	p.output = out
	p.convParams, p.bodyConvID = req.ConversationParams, req.ConversationID
	p.phase = engine.PhaseAggregated
	if raw, ok := req.Present("disaggregated_params"); ok {
		var dp disaggParams
		if err := json.Unmarshal(raw, &dp); err != nil {
			return nil, badRequest("disaggregated_params", "invalid disaggregated_params: %v", err)
		}
		if aerr := p.disaggregated(&dp); aerr != nil {
			return nil, aerr
		}
	}
	if d.HasConversation() && d != apireq.Chat && p.phase == engine.PhaseContextOnly {
		p.chat = true // the context phase answers the edge in the chat shape
	}
	sb, err := sanitizeBody(body, req.Top)
	if err != nil {
		return nil, newAPIError(http.StatusInternalServerError, "server_error", "", "", "re-encoding request: %v", err)
	}
	p.sanitizedBody = sb
	return p, nil
}

// disaggregated reads the disaggregated phase of a request.
func (p *parsedRequest) disaggregated(d *disaggParams) *apiError {
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
			return badRequest("disaggregated_params.encoded_opaque_state", "generation_only requests need disaggregated_params.encoded_opaque_state from the context phase (choices[0].disaggregated_params of its response)")
		}
		st, err := base64.StdEncoding.DecodeString(*state)
		if err != nil {
			return badRequest(param, "%s is not valid base64: %v", param, err)
		}
		p.contextState = st
	case "", "aggregated":
		// An explicit aggregated type is the same as none.
	default:
		return badRequest("disaggregated_params.request_type", "unknown disaggregated_params.request_type %q (want context_only or generation_only)", d.RequestType)
	}
	if p.phase != engine.PhaseAggregated && !d.DisaggRequestID.set() {
		return newAPIError(http.StatusBadRequest, "invalid_request_error", "missing_required_parameter", "disaggregated_params.disagg_request_id", "%s requests need disaggregated_params.disagg_request_id", d.RequestType)
	}
	for i, t := range d.FirstGenTokens {
		if t < 0 || t > 1<<31-1 {
			return badRequest(fmt.Sprintf("disaggregated_params.first_gen_tokens[%d]", i), "token id %d out of range", t)
		}
	}
	return nil
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

// PromptBlocks are the block keys this worker's simulated engine caches
// for an inference body sent to path: the request path's own parse
// (parseRequest) and prompt. Edges compute theirs with edge.PromptBlocks;
// test/agentapi requires the two equal over a corpus.
func PromptBlocks(path string, body []byte, blockSize int) ([]uint64, error) {
	var d apireq.Dialect
	switch path {
	case "/v1/chat/completions":
		d = apireq.Chat
	case "/v1/completions":
		d = apireq.Completions
	case "/v1/messages":
		d = apireq.Messages
	case "/v1/responses":
		d = apireq.Responses
	default:
		return nil, fmt.Errorf("%s is not an inference path", path)
	}
	p, aerr := parseRequest(body, d, requestRules{})
	if aerr != nil {
		return nil, aerr
	}
	return prefix.BlockHashes(p.prompt, blockSize), nil
}
