package edge

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/bodybudget"
	"github.com/tether-project/tether/internal/convid"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/routing"
)

// apiError is an API error answer (internal/apireq), written in the shape
// of the endpoint's dialect.
type apiError = apireq.Error

func newAPIError(status int, typ, code, param, format string, args ...any) *apiError {
	return apireq.NewError(status, typ, code, param, format, args...)
}

func badRequest(code, param, format string, args ...any) *apiError {
	return apireq.BadRequest(code, param, format, args...)
}

// writeAPIError writes e in the shape of the dialect of the endpoint w
// serves (apiWriter; OpenAI's when w is not one).
func writeAPIError(w http.ResponseWriter, e *apiError) {
	e.Write(w, dialectOf(w))
}

// request is one inference request after parsing: its sanitized body, its
// identity and the prompt's block hashes.
type request struct {
	dialect      apireq.Dialect
	parsed       *apireq.Request
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
	// passHeaders are client headers every hop forwards (Anthropic's).
	passHeaders http.Header
	// prev is the stored response a Responses request continues (its
	// previous_response_id): the request goes to the instance holding it.
	prev *storedRef
	// continued is the conversation of prev when it is the request's
	// conversation ("" none): routing.ResolveContinuing resolves it.
	continued string
	// conv is the conversation a Responses request names (its
	// conversation parameter): the request goes to the instance holding it.
	conv *storedRef
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
		e.metrics.BodyRefused.Inc()
		aerr := newAPIError(http.StatusTooManyRequests, "rate_limit_error", "request_body_budget_exhausted", "",
			"this edge holds its limit of %d request-body bytes in flight (max_inflight_body_bytes); retry after 1s", e.bodies.Limit())
		aerr.RetryAfter = time.Second
		return nil, nil, aerr
	}
	return nil, nil, badRequest("", "", "reading the request body: %v", err)
}

// parseBody validates an inference body of dialect d (internal/apireq,
// the request model workers share) and extracts what routing needs: model,
// stream, max tokens, the conversation id in the body, and the prompt's
// tokens by the words tokenizer. Internal fields are removed from top.
func parseBody(body []byte, d apireq.Dialect) (rq *request, bodyConv string, tokens []uint32, aerr *apiError) {
	p, aerr := apireq.Parse(d, body)
	if aerr != nil {
		return nil, "", nil, aerr
	}
	return fromParsed(p), p.ConversationID, p.WordTokens(), nil
}

// fromParsed is the edge's request for a parsed body.
func fromParsed(p *apireq.Request) *request {
	top := p.Top
	for _, k := range internalBodyFields {
		delete(top, k)
	}
	if raw, ok := top["scheduling_params"]; ok && !apireq.IsNull(raw) {
		// The affinity id may also hide in scheduling_params: drop it there.
		var sp map[string]json.RawMessage
		if json.Unmarshal(raw, &sp) == nil {
			if _, ok := sp["subagent_affinity_id"]; ok {
				delete(sp, "subagent_affinity_id")
				top["scheduling_params"] = mustMarshal(sp)
			}
		}
	}
	return &request{dialect: p.Dialect, parsed: p, top: top, model: p.Model, stream: p.Stream,
		includeUsage: p.IncludeUsage, maxTokens: p.MaxTokens}
}

func isNull(raw json.RawMessage) bool { return apireq.IsNull(raw) }

// stripHeaders enforces the gateway trust boundary on the incoming headers:
// the internal hint headers are always removed (only the edge signs
// hints); the headers that make a request a sub-agent — the parent-session
// header and, when client_subagent_headers is on, the agent CLIs' own
// (routing.ClientParentHeaders) — are removed unless the request comes
// from a trusted gateway (when trusted_gateway is enabled).
func (e *Edge) stripHeaders(r *http.Request) {
	h := r.Header
	for _, name := range []string{hintauth.HeaderAffinityID, hintauth.HeaderAffinityAuth} {
		if _, ok := h[http.CanonicalHeaderKey(name)]; ok {
			h.Del(name)
			e.metrics.StrippedHeaders.WithLabelValues(name).Inc()
		}
	}
	g := &e.cfg.TrustedGateway
	if !g.Enabled {
		return
	}
	guarded := make([]string, 0, 1+len(routing.ClientParentHeaders))
	if e.cfg.ParentHeader != "" {
		guarded = append(guarded, e.cfg.ParentHeader)
	}
	if e.cfg.ClientSubagentHeaders {
		guarded = append(guarded, routing.ClientParentHeaders...)
	}
	if len(guarded) == 0 {
		return
	}
	token := ""
	if g.TokenHeader != "" {
		token = h.Get(g.TokenHeader)
		h.Del(g.TokenHeader) // a shared secret never travels further
	}
	trusted, judged := false, false
	for _, name := range guarded {
		if h.Get(name) == "" {
			continue
		}
		if !judged {
			trusted, judged = g.Trusted(r.RemoteAddr, token), true
		}
		if !trusted {
			h.Del(name)
			e.metrics.StrippedHeaders.WithLabelValues(strings.ToLower(name)).Inc()
		}
	}
}

// identity resolves the request's conversation id, routing keys and parent
// link against the replicated state.
func (e *Edge) identity(rq *request, bodyConv string, h http.Header) *apiError {
	if strings.TrimSpace(bodyConv) == "" && convid.Resolve("", h) == "" {
		// Last, as TensorRT-LLM: a client-native body field (Codex).
		bodyConv = convid.FromClientFields(rq.top)
	}
	var id routing.Identity
	var err error
	if rq.continued != "" && bodyConv == rq.continued {
		// The conversation of the stored response the request continues.
		id, err = routing.ResolveContinuing(e.route.identity, bodyConv, h, e.node.State())
	} else {
		id, err = routing.ResolveIdentity(e.route.identity, bodyConv, h, e.node.State())
	}
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
			return badRequest("invalid_subagent_affinity", ie.Header, "%v", err)
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

// PromptBlocks are the block keys this edge computes for an inference
// body sent to path (/v1/chat/completions, /v1/completions, /v1/messages,
// /v1/responses) under the words tokenizer: the request path's own parse
// (parseInference) and tokens. Workers compute theirs with
// worker.PromptBlocks; test/agentapi requires the two equal over a corpus.
func PromptBlocks(path string, body []byte, blockSize int) ([]uint64, error) {
	if _, ok := dialectOfPath(path); !ok {
		return nil, fmt.Errorf("%s is not an inference path", path)
	}
	_, _, tokens, aerr := parseInference(body, path)
	if aerr != nil {
		return nil, aerr
	}
	return prefix.BlockHashes(tokens, blockSize), nil
}
