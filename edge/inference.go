package edge

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/edge/tokenize"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/routing"
)

// handleInference serves the create endpoints of every dialect: POST
// /v1/chat/completions, /v1/completions, /v1/messages, /v1/responses.
func (e *Edge) handleInference(w http.ResponseWriter, r *http.Request, d apireq.Dialect) {
	endpoint := d.String()
	if r.Method != http.MethodPost {
		e.metrics.Requests.WithLabelValues(endpoint, "405").Inc()
		api.MethodNotAllowed(api.NewWriter(w, d), r, http.MethodPost)
		return
	}
	start := time.Now()
	if d := e.cfg.WriteTimeout; d > 0 {
		w = api.NewDeadlineWriter(w, d)
	}
	aw := api.NewWriter(w, d)
	ctx := observe.TraceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := e.tracing.tracer.Start(ctx, "tether.edge "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("http.route", r.URL.Path),
			attribute.String("tether.edge", e.nodeID)))
	defer span.End()
	status := e.serveInference(ctx, aw, r, d, span)
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 400 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	e.metrics.Requests.WithLabelValues(endpoint, strconv.Itoa(status)).Inc()
	e.metrics.RequestSeconds.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
	if aw.Aborted() {
		// The stream ended with an error event; the connection ends
		// without a clean chunked end, so no client reads it as complete.
		panic(http.ErrAbortHandler)
	}
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
	if aerr := rq.Model.Serves(d); aerr != nil {
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
