package edge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/flow"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/edge/tokenize"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/convid"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/httpjson"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/routing"
)

// The inference endpoints: a request is admitted (edge/admission), its
// body read and parsed (edge/api), its model found (edge/catalog), the
// stored response or conversation it names resolved (edge/stored), its
// identity resolved against the replicated state, its prompt keyed per
// fleet (edge/tokenize), its turn taken (edge/flow), then dispatched
// (edge/dispatch, each hop routed by edge/route).

// handleInference serves the create endpoints of every dialect: POST
// /v1/chat/completions, /v1/completions, /v1/messages, /v1/responses.
func (e *Edge) handleInference(w http.ResponseWriter, r *http.Request, d apireq.Dialect) {
	endpoint := d.String()
	if r.Method != http.MethodPost {
		e.metrics.Requests.WithLabelValues(endpoint, "405").Inc()
		api.MethodNotAllowed(api.NewWriter(w, d), r, http.MethodPost)
		return
	}
	if d := e.cfg.WriteTimeout; d > 0 {
		w = api.NewDeadlineWriter(w, d)
	}
	e.served.Serve(w, r, api.Endpoint{Label: endpoint, Span: "tether.edge " + r.URL.Path, Dialect: d, Route: true},
		func(ctx context.Context, w http.ResponseWriter, span trace.Span) int {
			return e.serveInference(ctx, w, r, d, span)
		})
}

func (e *Edge) serveInference(ctx context.Context, w http.ResponseWriter, r *http.Request, d apireq.Dialect, span trace.Span) (status int) {
	e.stripHeaders(r)
	body, release, aerr := e.readBody(r)
	if aerr != nil {
		return api.Fail(w, span, aerr)
	}
	defer release()
	rq, bodyConv, tokens, aerr := parseInference(body, r.URL.Path)
	if aerr != nil {
		return api.Fail(w, span, aerr)
	}
	// The request's model selects its fleets (a model, or an adapter of one).
	m, adapter, ok := e.catalogue.Lookup(rq.ModelName)
	if !ok {
		return api.Fail(w, span, e.catalogue.NotFound(rq.ModelName))
	}
	rq.Model, rq.Adapter = m, adapter
	rq.Model.EngineAdapter(rq.Adapter, rq.Top)
	span.SetAttributes(attribute.String("tether.model", m.Name), attribute.String("tether.lora_adapter", adapter))
	defer func() { e.metrics.ModelRequests.WithLabelValues(m.Name, adapter, strconv.Itoa(status)).Inc() }()
	if aerr := rq.Model.ServesRequest(rq.Parsed); aerr != nil {
		return api.Fail(w, span, aerr)
	}
	if tokens, aerr = placeInlineSystem(rq, tokens); aerr != nil {
		return api.Fail(w, span, aerr)
	}
	rq.Path = r.URL.Path
	rq.Hint = routing.HintForEndpoint(rq.Path)
	rq.RequestID = e.nodeID + "-" + strconv.FormatUint(e.reqSeq.Add(1), 10)
	rq.Now = e.now()
	rq.PassHeaders = api.PassThroughHeaders(d, r.Header)
	if d == apireq.Responses {
		if rq.Refs, bodyConv, aerr = e.stored.Prepare(rq.Parsed.Responses, rq.Top, bodyConv, rq.Now); aerr != nil {
			return api.Fail(w, span, aerr)
		}
	}
	if !rq.Parsed.CountTokens {
		if aerr := e.identity(rq, bodyConv, r.Header); aerr != nil {
			return api.Fail(w, span, aerr)
		}
	}
	if rq.ID.DepthLimited {
		w.Header().Set(HeaderDepthLimited, depthLimitedValue(rq.ID, e.identityConfig))
	}
	if rq.Pinned() == nil && !rq.Parsed.CountTokens {
		e.promptKeys(rq, tokens)
	} else {
		// The prompt continues a stored response or a conversation (only
		// the instance holding it can expand it), or nothing is
		// generated: no keys to place by.
		rq.Prompts[fsm.FleetContext] = tokenize.Prompt{Tokens: len(tokens)}
		rq.Prompts[fsm.FleetGeneration] = rq.Prompts[fsm.FleetContext]
		rq.PromptTokens = len(tokens)
	}
	if !rq.Parsed.CountTokens {
		if aerr := e.admitFlow(ctx, w, rq, r.Header, span); aerr != nil {
			return api.Fail(w, span, aerr)
		}
	}
	if conv := rq.ID.ConversationID; conv != "" && !rq.Model.Cfg.ContextServers.Engine.AggregatedOnly() {
		// The workers read the same conversation id the hint signs
		// (vLLM and SGLang read none: their body goes as the client sent it).
		rq.SetConversation(conv)
	}
	rq.Model.Decider.RecordIdentity(rq.ID) // a new sub-agent's link, or a use of its link
	span.SetAttributes(attribute.String("tether.conversation_id", rq.ID.ConversationID), attribute.Bool("tether.subagent", rq.ID.SubAgent()),
		attribute.Int("tether.prompt_tokens", rq.PromptTokens), attribute.String("tether.api", d.String()))
	return e.dispatcher.Dispatch(ctx, w, rq, span)
}

// HeaderQueueWait answers a request flow control admitted (edge/flow,
// flow_control.enabled): the milliseconds it waited at the edge for the
// fleet to have room, 0 when it had room at once.
const HeaderQueueWait = "x-tether-queue-wait-ms"

// admitFlow passes rq through flow control (edge/flow): its tenant (h)
// and band (x-tether-priority, service_tier), then its turn. A batch
// request is placed as background work (routing weighs its cache affinity
// more than its wait).
func (e *Edge) admitFlow(ctx context.Context, w http.ResponseWriter, rq *route.Request, h http.Header, span trace.Span) *api.Error {
	tenant, aerr := e.flow.Tenant(h)
	if aerr != nil {
		return aerr
	}
	band := flow.BandOf(rq.Priority, rq.Top["service_tier"])
	if band == flow.Batch {
		rq.Priority = routing.PriorityBackground
	}
	waited, aerr := e.flow.Admit(ctx, flow.Request{Model: rq.Model.Name, Tenant: tenant, Band: band, Tokens: rq.PromptTokens, Dialect: rq.Dialect})
	span.SetAttributes(attribute.String("tether.tenant", tenant), attribute.String("tether.band", band.String()),
		attribute.Int64("tether.queue_wait_ms", waited.Milliseconds()))
	if aerr != nil {
		return aerr
	}
	if e.flow.Enabled() {
		w.Header().Set(HeaderQueueWait, strconv.FormatInt(waited.Milliseconds(), 10))
	}
	return nil
}

// placeInlineSystem places a Messages request rq's inline system messages as
// its model's anthropic_inline_system says (the engine's placement: the
// prompt keyed is the one it renders) and returns the prompt's words
// tokens; other requests keep theirs.
func placeInlineSystem(rq *route.Request, tokens []uint32) ([]uint32, *api.Error) {
	mode := rq.Model.Cfg.InlineSystem()
	if rq.Dialect != apireq.Messages || mode == apireq.InlineSystemPreserve {
		return tokens, nil
	}
	if aerr := rq.Parsed.WithInlineSystem(mode); aerr != nil {
		return nil, aerr
	}
	return rq.Parsed.WordTokens(), nil
}

// parseInference parses a body by its path's dialect (count_tokens is a
// Messages body without max_tokens, and names no conversation).
func parseInference(body []byte, path string) (*route.Request, string, []uint32, *api.Error) {
	p, aerr := api.Parse(body, path)
	if aerr != nil {
		return nil, "", nil, aerr
	}
	bodyConv := p.ConversationID
	if p.CountTokens {
		bodyConv = ""
	}
	return fromParsed(p), bodyConv, p.WordTokens(), nil
}

// readBody reads the request's body (max_body_bytes, held against
// max_inflight_body_bytes until release: api.ReadBody).
func (e *Edge) readBody(r *http.Request) (body []byte, release func(), aerr *api.Error) {
	return api.ReadBody(r, e.bodies, e.cfg.MaxBodyBytes, e.metrics.BodyRefused)
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
// (routing.ClientParentHeaders) — and the tenant header
// (flow_control.tenant_header) are removed unless the request comes from a
// trusted gateway (when trusted_gateway is enabled).
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
	guarded := make([]string, 0, 2+len(routing.ClientParentHeaders))
	guarded = append(guarded, e.cfg.FlowControl.TenantHeader) // a tenant is the gateway's to say
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

// HeaderDepthLimited answers a sub-agent request whose parent was at the
// nesting limit (max_subagent_depth): instead of refusing it, the edge
// routed it as a child of the parent's deepest ancestor within the limit
// (same root, so the same context placement). README, "Sub-agent depth".
const HeaderDepthLimited = "x-tether-subagent-depth-limited"

// depthLimitedValue is `depth=5; limit=4; parent="<ancestor>"`: the depth
// the header asked for, the limit, and the parent the link records.
func depthLimitedValue(id routing.Identity, cfg routing.IdentityConfig) string {
	limit := cfg.MaxDepth
	if limit <= 0 {
		limit = routing.DefaultMaxDepth
	}
	return fmt.Sprintf("depth=%d; limit=%d; parent=%q", id.RequestedDepth, limit, httpjson.Clip(id.Parent, 200))
}

// promptKeys computes each fleet's prompt tokens and block keys of rq
// (edge/tokenize); words are the words tokenizer's tokens of its body.
func (e *Edge) promptKeys(rq *route.Request, words []uint32) {
	if rq.Model == nil {
		rq.Model = e.catalogue.First()
	}
	rq.Prompts = rq.Model.Tokenizers.Keys(tokenize.Request{Parsed: rq.Parsed, Words: words, Conversation: rq.ID.ConversationID,
		Adapter: rq.Adapter, Now: rq.Now}, rq.Model.Cfg.Aggregated(), e.log)
	rq.PromptTokens = rq.Prompts[fsm.FleetContext].Tokens
}
