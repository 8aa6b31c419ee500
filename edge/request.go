package edge

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/convid"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/routing"
)

// readBody reads the request's body (max_body_bytes, held against
// max_inflight_body_bytes until release: api.ReadBody).
func (e *Edge) readBody(r *http.Request) (body []byte, release func(), aerr *api.Error) {
	return api.ReadBody(r, e.bodies, e.cfg.MaxBodyBytes, e.metrics.BodyRefused)
}

// parseBody validates an inference body of dialect d (internal/apireq,
// the request model workers share) and extracts what routing needs: model,
// stream, max tokens, the conversation id in the body, and the prompt's
// tokens by the words tokenizer. Internal fields are removed from top.
func parseBody(body []byte, d apireq.Dialect) (rq *route.Request, bodyConv string, tokens []uint32, aerr *api.Error) {
	p, aerr := api.ParseDialect(body, d)
	if aerr != nil {
		return nil, "", nil, aerr
	}
	return fromParsed(p), p.ConversationID, p.WordTokens(), nil
}

// fromParsed is the edge's request for a parsed body (api.Parse).
func fromParsed(p *apireq.Request) *route.Request {
	return &route.Request{Dialect: p.Dialect, Parsed: p, Top: p.Top, ModelName: p.Model, Stream: p.Stream,
		IncludeUsage: p.IncludeUsage, MaxTokens: p.MaxTokens}
}

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
func (e *Edge) identity(rq *route.Request, bodyConv string, h http.Header) *api.Error {
	if strings.TrimSpace(bodyConv) == "" && convid.Resolve("", h) == "" {
		// Last, as TensorRT-LLM: a client-native body field (Codex).
		bodyConv = convid.FromClientFields(rq.Top)
	}
	var id routing.Identity
	var err error
	if rq.Refs.Continued != "" && bodyConv == rq.Refs.Continued {
		// The conversation of the stored response the request continues.
		id, err = routing.ResolveContinuing(e.identityConfig, bodyConv, h, e.node.State())
	} else {
		id, err = routing.ResolveIdentity(e.identityConfig, bodyConv, h, e.node.State())
	}
	if err != nil {
		var ie *routing.IdentityError
		if errors.As(err, &ie) {
			switch {
			case errors.Is(err, routing.ErrIDTooLong) && ie.SessionHeader != "":
				return api.BadRequest("invalid_header", ie.SessionHeader, "%v", err)
			case errors.Is(err, routing.ErrIDTooLong) && ie.Header == "":
				return api.BadRequest("invalid_value", "conversation_params.conversation_id", "%v", err)
			case errors.Is(err, routing.ErrIDTooLong):
				return api.BadRequest("invalid_header", ie.Header, "%v", err)
			}
			return api.BadRequest("invalid_subagent_affinity", ie.Header, "%v", err)
		}
		return api.BadRequest("", "", "%v", err)
	}
	if strings.Contains(id.ConversationID, fsm.ModelKeySep) || strings.Contains(id.Root, fsm.ModelKeySep) {
		// The separator of a model's routing-key namespace (fsm.ModelKey):
		// a key holding it could name another model's binding.
		return api.BadRequest("invalid_value", "conversation_params.conversation_id", "conversation ids must not contain U+001F")
	}
	rq.ID = id
	p, err := routing.PriorityFromHeader(h)
	if err != nil {
		return api.BadRequest("", routing.PriorityHeader, "%v", err)
	}
	rq.Priority = p
	return nil
}

// PromptBlocks are the block keys this edge computes for an inference
// body sent to path (/v1/chat/completions, /v1/completions, /v1/messages,
// /v1/responses) under the words tokenizer: the request path's own parse
// (parseInference) and tokens. Workers compute theirs with
// worker.PromptBlocks; test/agentapi requires the two equal over a corpus.
func PromptBlocks(path string, body []byte, blockSize int) ([]uint64, error) {
	if _, ok := api.DialectOfPath(path); !ok {
		return nil, fmt.Errorf("%s is not an inference path", path)
	}
	_, _, tokens, aerr := parseInference(body, path)
	if aerr != nil {
		return nil, aerr
	}
	return prefix.BlockHashes(tokens, blockSize), nil
}
