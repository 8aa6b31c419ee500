package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/edge/stored"
	"github.com/tether-project/tether/edge/tokenize"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/httpjson"
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
	return e.dispatch(ctx, w, rq, span)
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

// hopFailure is why a hop ended without a usable response: either an
// error the edge reports, or the worker's own answer passed through.
type hopFailure struct {
	err  *api.Error
	pass *api.UpstreamAnswer
}

func (f *hopFailure) write(w http.ResponseWriter, span trace.Span) int {
	if f.pass != nil {
		span.SetAttributes(attribute.Int("tether.upstream_status", f.pass.Status))
		return f.pass.Write(w)
	}
	return api.Fail(w, span, f.err)
}

// contextResult is a verified context-phase response.
type contextResult struct {
	raw      map[string]json.RawMessage
	disaggID uint64
	// handoff is choices[0].disaggregated_params of the context response
	// (TensorRT-LLM's protocol), every field as the worker sent it. nil
	// for a worker predating it, whose top-level disaggregated_params
	// (legacy) filled ctxRequestID, opaqueState and firstTokens.
	handoff map[string]json.RawMessage
	// promptTokenIDs is the response's prompt_token_ids (nil: absent).
	promptTokenIDs json.RawMessage
	ctxRequestID   json.RawMessage
	opaqueState    string
	firstTokens    json.RawMessage
	text           string
	finish         string
	promptTokens   int
	cachedTokens   int
	hasCached      bool // usage.prompt_tokens_details was there
	// nullCached: the context phase reported no cached tokens, and the
	// final response reports none either (prompt_tokens_details null):
	// the generation worker's figure counts tokens it received, not
	// tokens that were not recomputed.
	nullCached bool
	rank       string
}

// dispatch runs the disaggregated flow: context hop (unless conditional
// disaggregation skips it) then generation hop, streaming the answer back.
func (e *Edge) dispatch(ctx context.Context, w http.ResponseWriter, rq *route.Request, span trace.Span) int {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.UpstreamTimeout)
	defer cancel()
	if rq.Pinned() != nil {
		return e.dispatchStored(ctx, w, rq, span) // edge/stored.go
	}
	if rq.Model.Cfg.Aggregated() {
		return e.dispatchEngine(ctx, w, rq, span) // vLLM, SGLang (edge/engines.go)
	}
	if rq.Model.Cfg.PDEngine() != "" {
		return e.dispatchPD(ctx, w, rq, span) // vLLM, SGLang prefill/decode (edge/pd.go)
	}
	if rq.Parsed.CountTokens {
		// Nothing is prefilled: any context worker counts, unbound.
		h, aerr := e.router.Route(ctx, rq, fsm.FleetContext, nil)
		if aerr != nil {
			return api.Fail(w, span, aerr)
		}
		return e.aggregated(ctx, w, rq, h, span)
	}
	var genHop *route.Hop
	if max := e.cfg.ConditionalDisagg.MaxLocalPrefillLength; max > 0 {
		h, aerr := e.router.Route(ctx, rq, fsm.FleetGeneration, nil)
		if aerr != nil {
			return api.Fail(w, span, aerr)
		}
		genHop = h
		if uncached := rq.PromptTokens - h.Cached; uncached < max {
			span.SetAttributes(attribute.Bool("tether.context_skipped", true), attribute.Int("tether.uncached_tokens", uncached))
			return e.aggregated(ctx, w, rq, genHop, span)
		}
	}
	ctxHop, aerr := e.router.Route(ctx, rq, fsm.FleetContext, nil)
	if aerr != nil {
		return api.Fail(w, span, aerr)
	}
	cres, hf := e.contextHop(ctx, rq, &ctxHop)
	if hf != nil {
		return hf.write(w, span)
	}
	e.fleet.RecordUsage(ctxHop.Instance, int64(cres.promptTokens), int64(cres.cachedTokens), e.now())
	e.shadowRoute(rq, ctxHop, -1)
	if cres.hasCached {
		e.shadowCorrect(rq, ctxHop, cres.cachedTokens)
	}
	e.observeRank(rq, ctxHop, hintauth.RoleContext, cres.rank)
	if !cres.needsGeneration(rq.MaxTokens) && (rq.Dialect == apireq.Chat || rq.Dialect == apireq.Completions) {
		// (A Messages or Responses answer always comes from the generation
		// worker: it writes the dialect's shape and keeps what it stores.)
		// The prefill already produced the whole answer.
		return e.respondFromContext(w, rq, ctxHop, cres)
	}
	if genHop == nil {
		rq.Now = e.now()
		if genHop, aerr = e.router.Route(ctx, rq, fsm.FleetGeneration, nil); aerr != nil {
			return api.Fail(w, span, aerr)
		}
	}
	return e.generationHop(ctx, w, rq, ctxHop, cres, genHop, span)
}

func (e *Edge) newDisaggID() uint64 {
	return e.disagg.base | (e.disagg.seq.Add(1) & (1<<disaggIDSeqBits - 1))
}

// hopHeader builds a hop's headers: content type, the trace context and,
// when this hop carries sub-agent affinity, the signed hint.
func (e *Edge) hopHeader(ctx context.Context, rq *route.Request, h *route.Hop, role hintauth.Role, typ hintauth.RequestType, disaggID string) http.Header {
	hdr := make(http.Header, 6+len(rq.PassHeaders))
	for k, v := range rq.PassHeaders {
		hdr[k] = v
	}
	hdr.Set("Content-Type", "application/json")
	observe.TraceContext.Inject(ctx, propagation.HeaderCarrier(hdr))
	setLogRank(hdr, h)
	if e.sendHint(rq, h, role) {
		sig, err := hintauth.SignAs(e.cfg.HintSignatureFormat, e.authKey, hintauth.Fields{
			Role: role, Model: rq.ModelName, ConversationID: rq.ID.ConversationID, AffinityID: rq.ID.Root,
			RequestType: typ, DisaggRequestID: disaggID,
		})
		if err != nil {
			// Not reachable with the edge's own integer request ids; the
			// hop then goes without a hint (instance affinity still holds).
			e.log.Warn("cannot sign the sub-agent hint", "error", err)
			return hdr
		}
		hdr.Set(hintauth.HeaderAffinityID, rq.ID.Root)
		hdr.Set(hintauth.HeaderAffinityAuth, sig)
	}
	return hdr
}

// observeRank records, off the request path, the attention-DP rank a
// worker reported (x-tether-adp-rank) for the binding hop h followed, when
// the rank belongs to the key: the key's own conversation, or a sub-agent
// whose hint put it on its parent's rank (route.Router.RecordRank records
// it when the log says another).
func (e *Edge) observeRank(rq *route.Request, h *route.Hop, role hintauth.Role, rankHeader string) {
	if h == nil || !rq.Hint {
		return
	}
	if rq.Model.Key(rq.ID.ConversationID) != h.Key && !e.sendHint(rq, h, role) {
		return
	}
	rank, err := strconv.ParseUint(rankHeader, 10, 32)
	if err != nil {
		return
	}
	e.router.RecordRank(h, uint32(rank), true)
}

// sendHint decides whether a hop carries the sub-agent hint: only for a
// sub-agent (the affinity id is its parent's root, never its own id), on
// the chat endpoint (rank affinity), with a key to sign with, to the
// generation fleet only with scope both, and never to a worker whose
// telemetry says it cannot verify hints (a legacy worker; instance
// affinity still applies).
func (e *Edge) sendHint(rq *route.Request, h *route.Hop, role hintauth.Role) bool {
	if !rq.Hint || e.authKey == nil || !rq.ID.SubAgent() || role == "" {
		return false
	}
	if role == hintauth.RoleGeneration && e.cfg.Scope != routing.ScopeBoth {
		return false
	}
	if in, ok := e.fleet.Instance(h.Instance, rq.Now); ok && in.Telemetry && !in.VerifiesHints {
		return false
	}
	return true
}

// post sends one hop.
func (e *Edge) post(ctx context.Context, url string, body []byte, hdr http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = hdr
	return e.client.Do(req)
}

// exchange sends a hop built by build (called per attempt with the hop to
// use), retrying connection errors and 5xx answers on another instance up
// to max_retries times. It returns the worker's 200 response (body open);
// any other answer is a hopFailure.
func (e *Edge) exchange(ctx context.Context, rq *route.Request, h **route.Hop, phase string,
	build func(h *route.Hop) (body []byte, hdr http.Header)) (*http.Response, func(), *hopFailure) {
	for attempt := 0; ; attempt++ {
		cur := *h
		hctx, span := e.tracing.tracer.Start(ctx, "tether.edge "+phase+" hop", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(observe.AttrInstance.String(cur.Instance), observe.AttrFleet.String(cur.Fleet.String()), attribute.Int("tether.attempt", attempt)))
		body, hdr := build(cur)
		// The hop's span is the worker span's parent.
		observe.TraceContext.Inject(hctx, propagation.HeaderCarrier(hdr))
		done := e.noteDispatch(cur.Fleet, cur.Instance, rq.PromptTokens)
		resp, err := e.post(e.fleet.ExpectIdentity(hctx, cur.Instance), cur.URL+rq.Path, body, hdr)
		if err != nil || resp.StatusCode != http.StatusOK {
			done()
		}
		var failure *hopFailure
		switch {
		case err != nil:
			if ctx.Err() != nil {
				span.End()
				return nil, nil, &hopFailure{err: api.NewError(api.StatusClientClosed, "server_error", "cancelled", "", "request cancelled: %v", ctx.Err())}
			}
			e.metrics.UpstreamErrors.WithLabelValues(cur.Fleet.String(), "connect").Inc()
			failure = &hopFailure{err: api.NewError(http.StatusBadGateway, "server_error", "upstream_unavailable", "",
				"%s instance %s (%s) failed: %v", cur.Fleet, cur.Instance, cur.URL, err)}
		case resp.StatusCode >= 500:
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			e.metrics.UpstreamErrors.WithLabelValues(cur.Fleet.String(), "status_5xx").Inc()
			failure = &hopFailure{pass: stored.ClientAnswer(rq.Refs, resp.StatusCode, resp.Header, b)}
		case resp.StatusCode != http.StatusOK:
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
			span.End()
			return nil, nil, &hopFailure{pass: stored.ClientAnswer(rq.Refs, resp.StatusCode, resp.Header, b)}
		default:
			span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode), observe.AttrRank.String(resp.Header.Get(HeaderADPRank)))
			span.End()
			return resp, done, nil
		}
		span.SetStatus(codes.Error, "hop failed")
		span.End()
		if attempt >= e.cfg.MaxRetries || rq.Pinned() != nil {
			// (No other instance holds a stored response or a conversation.)
			return nil, nil, failure
		}
		next, aerr := e.router.Reroute(ctx, rq, cur)
		if aerr != nil {
			return nil, nil, failure
		}
		e.metrics.Retries.WithLabelValues(cur.Fleet.String()).Inc()
		e.log.Info("retrying a failed hop on another instance", "fleet", cur.Fleet, "from", cur.Instance, "to", next.Instance)
		*h = next
	}
}

// contextHop runs the prefill on the context worker and verifies its
// answer. Each attempt gets a fresh disaggregated request id (and so a
// fresh signature).
func (e *Edge) contextHop(ctx context.Context, rq *route.Request, h **route.Hop) (*contextResult, *hopFailure) {
	for attempt := 0; ; attempt++ {
		var disaggID uint64
		resp, done, hf := e.exchange(ctx, rq, h, "context", func(cur *route.Hop) ([]byte, http.Header) {
			disaggID = e.newDisaggID()
			id := strconv.FormatUint(disaggID, 10)
			dp := api.MustMarshal(map[string]any{"request_type": "context_only", "disagg_request_id": disaggID})
			body := rq.HopBody(map[string]json.RawMessage{"disaggregated_params": dp, "stream": json.RawMessage("false")}, "stream_options")
			return body, e.hopHeader(ctx, rq, cur, hintauth.RoleContext, hintauth.RequestContextOnly, id)
		})
		if hf != nil {
			return nil, hf
		}
		res, err := readContextResult(resp, disaggID)
		done()
		if err == nil {
			return res, nil
		}
		e.metrics.UpstreamErrors.WithLabelValues("context", "bad_response").Inc()
		cur := *h
		failure := &hopFailure{err: api.NewError(http.StatusBadGateway, "server_error", "bad_upstream_response", "",
			"context instance %s answered an unusable context phase: %v", cur.Instance, err)}
		if attempt >= e.cfg.MaxRetries {
			return nil, failure
		}
		next, aerr := e.router.Reroute(ctx, rq, cur)
		if aerr != nil {
			return nil, failure
		}
		e.metrics.Retries.WithLabelValues("context").Inc()
		*h = next
	}
}

// readContextResult parses and checks a context_only answer the way
// TensorRT-LLM's disaggregated server does (openai_disagg_service.py
// _verify_ctx_response): exactly one choice whose disaggregated_params
// carry a ctx_request_id and our disagg_request_id. A worker predating
// that protocol answers with a top-level disaggregated_params carrying
// opaque_state; it is still understood (rolling upgrades).
func readContextResult(resp *http.Response, disaggID uint64) (*contextResult, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, api.MaxUpstreamBody))
	if err != nil {
		return nil, fmt.Errorf("reading the response: %w", err)
	}
	res := &contextResult{rank: resp.Header.Get(HeaderADPRank), disaggID: disaggID}
	if err := json.Unmarshal(b, &res.raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	var body struct {
		Choices []struct {
			Message      *struct{ Content *string } `json:"message"`
			Text         *string                    `json:"text"`
			FinishReason *string                    `json:"finish_reason"`
			DP           map[string]json.RawMessage `json:"disaggregated_params"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
		PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
		DP             *struct {
			RequestType     string          `json:"request_type"`
			CtxRequestID    json.RawMessage `json:"ctx_request_id"`
			DisaggRequestID json.RawMessage `json:"disagg_request_id"`
			OpaqueState     string          `json:"opaque_state"`
			FirstGenTokens  json.RawMessage `json:"first_gen_tokens"`
		} `json:"disaggregated_params"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, fmt.Errorf("unexpected shape: %w", err)
	}
	if len(body.Choices) != 1 {
		return nil, fmt.Errorf("%d choices, want 1", len(body.Choices))
	}
	c := body.Choices[0]
	if c.FinishReason != nil {
		res.finish = *c.FinishReason
	}
	wantID := strconv.FormatUint(disaggID, 10)
	switch {
	case !disagg.FinishPending(res.finish):
		// The context phase already finished the request (the model
		// stopped on its first token): nothing is handed off, so the
		// worker leaves ctx_request_id and the opaque state null, and the
		// answer is this response (openai_disagg_service.py checks the
		// handoff only when a generation phase is pending, as _need_gen).
	case c.DP != nil:
		dp := c.DP
		if apireq.IsNull(dp["ctx_request_id"]) {
			return nil, errors.New("choices[0].disaggregated_params.ctx_request_id is missing")
		}
		if got := strings.Trim(string(bytes.TrimSpace(dp["disagg_request_id"])), `"`); got != wantID {
			return nil, fmt.Errorf("choices[0].disaggregated_params.disagg_request_id %s, want %d", dp["disagg_request_id"], disaggID)
		}
		res.handoff = dp
		if !apireq.IsNull(body.PromptTokenIDs) {
			res.promptTokenIDs = body.PromptTokenIDs
		}
	case body.DP != nil:
		dp := body.DP
		switch {
		case dp.RequestType != "context_only":
			return nil, fmt.Errorf("disaggregated_params.request_type %q, want context_only", dp.RequestType)
		case strings.Trim(string(dp.DisaggRequestID), `"`) != wantID:
			return nil, fmt.Errorf("disaggregated_params.disagg_request_id %s, want %d", dp.DisaggRequestID, disaggID)
		case dp.OpaqueState == "":
			return nil, errors.New("no disaggregated_params.opaque_state")
		}
		res.ctxRequestID, res.opaqueState, res.firstTokens = dp.CtxRequestID, dp.OpaqueState, dp.FirstGenTokens
	default:
		return nil, errors.New("no disaggregated_params in choices[0]")
	}
	switch {
	case c.Message != nil && c.Message.Content != nil:
		res.text = *c.Message.Content
	case c.Text != nil:
		res.text = *c.Text
	}
	if u := body.Usage; u != nil {
		res.promptTokens = u.PromptTokens
		if u.PromptTokensDetails != nil {
			res.cachedTokens, res.hasCached = u.PromptTokensDetails.CachedTokens, true
		}
	}
	return res, nil
}

// needsGeneration: as TensorRT-LLM's disaggregated server (_need_gen), the
// generation hop runs when the context phase stopped for length (or is not
// finished); any other finish reason, or a one-token request, makes the
// context response the answer.
func (cres *contextResult) needsGeneration(maxTokens int) bool {
	return maxTokens != 1 && disagg.FinishPending(cres.finish)
}

// generationBody is the generation hop's body. TensorRT-LLM protocol: the
// context's choices[0].disaggregated_params with request_type
// generation_only and our disagg_request_id, every other field passed
// through untouched, and the context's prompt_token_ids (chat:
// prompt_token_ids; completions: the prompt). It also returns the
// disaggregated_params it sends (what x-trtllm-disagg-auth signs; nil for a
// worker predating the protocol).
func generationBody(rq *route.Request, cres *contextResult) (body []byte, params map[string]json.RawMessage) {
	id := json.RawMessage(strconv.FormatUint(cres.disaggID, 10))
	if cres.handoff == nil {
		dp := map[string]json.RawMessage{
			"request_type":      json.RawMessage(`"generation_only"`),
			"disagg_request_id": id,
			"opaque_state":      api.MustMarshal(cres.opaqueState),
		}
		if len(cres.ctxRequestID) > 0 {
			dp["ctx_request_id"] = cres.ctxRequestID
		}
		if len(cres.firstTokens) > 0 && !apireq.IsNull(cres.firstTokens) {
			dp["first_gen_tokens"] = cres.firstTokens
		}
		return rq.HopBody(map[string]json.RawMessage{"disaggregated_params": api.MustMarshal(dp)}), nil
	}
	dp := make(map[string]json.RawMessage, len(cres.handoff)+2)
	for k, v := range cres.handoff {
		dp[k] = v
	}
	dp["request_type"] = json.RawMessage(`"generation_only"`)
	dp["disagg_request_id"] = id
	set := map[string]json.RawMessage{"disaggregated_params": api.MustMarshal(dp)}
	if cres.promptTokenIDs != nil {
		if rq.Dialect.HasConversation() {
			set["prompt_token_ids"] = cres.promptTokenIDs
		} else {
			set["prompt"] = cres.promptTokenIDs
		}
	}
	return rq.HopBody(set), dp
}

// generationHop continues on the generation worker with the context's
// state. A retry keeps the disaggregated request id (the state is bound to
// it).
func (e *Edge) generationHop(ctx context.Context, w http.ResponseWriter, rq *route.Request, ctxHop *route.Hop, cres *contextResult, genHop *route.Hop, span trace.Span) int {
	id := strconv.FormatUint(cres.disaggID, 10)
	body, params := generationBody(rq, cres)
	var disaggAuth string
	if e.authKey != nil && params != nil {
		// Protects the KV-transfer fields as TensorRT-LLM does
		// (disagg_auth.py build_internal_disagg_auth_headers), in the
		// payload of the workers' release (disagg_auth_format).
		var err error
		if disaggAuth, err = hintauth.SignDisaggAs(e.cfg.DisaggAuthFormat, e.authKey, params); err != nil {
			e.metrics.UpstreamErrors.WithLabelValues("context", "bad_response").Inc()
			return api.Fail(w, span, api.NewError(http.StatusBadGateway, "server_error", "bad_upstream_response", "",
				"context instance %s answered disaggregated_params that cannot be signed: %v", ctxHop.Instance, err))
		}
	}
	resp, done, hf := e.exchange(ctx, rq, &genHop, "generation", func(cur *route.Hop) ([]byte, http.Header) {
		hdr := e.hopHeader(ctx, rq, cur, hintauth.RoleGeneration, hintauth.RequestGenerationOnly, id)
		if disaggAuth != "" {
			hdr.Set(hintauth.HeaderDisaggAuth, disaggAuth)
		}
		return body, hdr
	})
	if hf != nil {
		return hf.write(w, span)
	}
	defer done()
	e.observeRank(rq, genHop, hintauth.RoleGeneration, resp.Header.Get(HeaderADPRank))
	return e.relay(w, rq, resp, ctxHop, cres, genHop, span)
}

// aggregated sends the whole request to the generation worker (conditional
// disaggregation: it already holds enough of the prompt).
func (e *Edge) aggregated(ctx context.Context, w http.ResponseWriter, rq *route.Request, genHop *route.Hop, span trace.Span) int {
	resp, done, hf := e.exchange(ctx, rq, &genHop, "aggregated", func(cur *route.Hop) ([]byte, http.Header) {
		role := hintauth.Role("")
		if in, ok := e.fleet.Instance(cur.Instance, rq.Now); ok {
			// A worker without a configured role ignores hints on
			// aggregated requests; one with a role verifies them as it.
			role = hintauth.Role(in.Role)
		}
		return rq.HopBody(nil), e.hopHeader(ctx, rq, cur, role, hintauth.RequestAggregated, "")
	})
	if hf != nil {
		return hf.write(w, span)
	}
	defer done()
	if in, ok := e.fleet.Instance(genHop.Instance, rq.Now); ok {
		e.observeRank(rq, genHop, hintauth.Role(in.Role), resp.Header.Get(HeaderADPRank))
	}
	return e.relay(w, rq, resp, nil, nil, genHop, span)
}

// routeHeaders sets the debug route header and relays the worker's rank.
func (e *Edge) routeHeaders(w http.ResponseWriter, ctxHop *route.Hop, ctxRank string, genHop *route.Hop, genRank string) {
	if ctxHop == nil && genHop != nil && genHop.Fleet == fsm.FleetContext {
		// An aggregated engine fleet (edge/engines.go): its one hop is
		// the context fleet's.
		ctxHop, ctxRank, genHop, genRank = genHop, genRank, nil, ""
	}
	h := w.Header()
	if genHop != nil && genRank != "" {
		h.Set(HeaderADPRank, genRank)
	} else if genHop == nil && ctxRank != "" {
		h.Set(HeaderADPRank, ctxRank)
	}
	if e.cfg.DebugRouteHeader {
		h.Set(HeaderRoute, "context="+route.Label(ctxHop, ctxRank)+"; generation="+route.Label(genHop, genRank)+route.Evidence(ctxHop, genHop))
	}
}

// relay passes the final worker's response to the client: JSON, or the
// SSE stream event by event, in the request's dialect (edge/dialect.go):
// its usage feeds the breaker and the shadow, after a context hop the
// usage's cached tokens are the context (prefill) worker's (that is where
// the prompt was or was not recomputed), and a Responses answer's ids are
// minted (edge/stored.go).
func (e *Edge) relay(w http.ResponseWriter, rq *route.Request, resp *http.Response, ctxHop *route.Hop, cres *contextResult, genHop *route.Hop, span trace.Span) int {
	defer resp.Body.Close()
	ctxRank, cached, nullCached := "", -1, false
	if cres != nil {
		ctxRank, cached, nullCached = cres.rank, cres.cachedTokens, cres.nullCached
	}
	genRank := resp.Header.Get(HeaderADPRank)
	e.routeHeaders(w, ctxHop, ctxRank, genHop, genRank)
	span.SetAttributes(attribute.String("tether.route", "context="+route.Label(ctxHop, ctxRank)+"; generation="+route.Label(genHop, genRank)))
	ans := &api.Answer{Dialect: rq.Dialect, Cached: cached, NullCached: nullCached}
	if cres == nil && !rq.Parsed.CountTokens {
		ans.OnUsage = func(u disagg.Usage) {
			// Only a response that reports its cached tokens says
			// anything about the cache (vLLM without
			// --enable-prompt-tokens-details does not: its breaker must
			// not read that as misses).
			if u = e.engineUsage(genHop.Instance, u); u.HasCached {
				e.fleet.RecordUsage(genHop.Instance, int64(u.Prompt), int64(u.Cached), e.now())
				if rq.Pinned() == nil {
					e.shadowCorrect(rq, genHop, u.Cached)
				}
			}
		}
	}
	if rq.Dialect == apireq.Responses {
		ans.IDs = e.stored.Minter(rq.Refs, stored.Holder{Fleet: genHop.Fleet, Instance: genHop.Instance, Rank: genRank}, rq.ID.ConversationID, rq.Now)
	}
	return e.answers.Copy(w, resp, ans, rq.Stream, genHop.Fleet, rq.Dialect.String(), genHop.Instance, span)
}

// respondFromContext answers with the context phase's result when it is
// already complete (max_tokens 1, or the model stopped): as JSON, or as an
// SSE stream in the OpenAI chunk format.
func (e *Edge) respondFromContext(w http.ResponseWriter, rq *route.Request, ctxHop *route.Hop, cres *contextResult) int {
	e.routeHeaders(w, ctxHop, cres.rank, nil, "")
	out := make(map[string]json.RawMessage, len(cres.raw))
	for k, v := range cres.raw {
		if k != "disaggregated_params" && k != "prompt_token_ids" {
			out[k] = v
		}
	}
	// As TensorRT-LLM's _need_gen: the handoff is internal.
	var choices []map[string]json.RawMessage
	if json.Unmarshal(cres.raw["choices"], &choices) == nil {
		for _, c := range choices {
			delete(c, "disaggregated_params")
		}
		out["choices"] = api.MustMarshal(choices)
	}
	if !rq.Stream {
		httpjson.Write(w, http.StatusOK, out)
		return http.StatusOK
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	object := "text_completion"
	chat := rq.Dialect == apireq.Chat
	if chat {
		object = "chat.completion.chunk"
	}
	base := map[string]json.RawMessage{"object": api.MustMarshal(object)}
	for _, k := range []string{"id", "created", "model"} {
		if v, ok := cres.raw[k]; ok {
			base[k] = v
		}
	}
	chunk := func(choice any, usage json.RawMessage) []byte {
		m := make(map[string]json.RawMessage, len(base)+2)
		for k, v := range base {
			m[k] = v
		}
		if choice != nil {
			m["choices"] = api.MustMarshal([]any{choice})
		} else {
			m["choices"] = json.RawMessage("[]")
		}
		if usage != nil {
			m["usage"] = usage
		}
		return api.MustMarshal(m)
	}
	finish := cres.finish
	var events [][]byte
	if chat {
		events = append(events,
			chunk(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": cres.text}, "finish_reason": nil}, nil),
			chunk(map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": finish}, nil))
	} else {
		events = append(events,
			chunk(map[string]any{"index": 0, "text": cres.text, "finish_reason": nil}, nil),
			chunk(map[string]any{"index": 0, "text": "", "finish_reason": finish}, nil))
	}
	if u, ok := cres.raw["usage"]; ok && rq.IncludeUsage {
		events = append(events, chunk(nil, u))
	}
	events = append(events, []byte("[DONE]"))
	for _, ev := range events {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", ev); err != nil {
			return api.StatusClientClosed
		}
	}
	_ = http.NewResponseController(w).Flush()
	return http.StatusOK
}
