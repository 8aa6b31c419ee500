package edge

import (
	"bufio"
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

	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/routing"
)

// Response headers.
const (
	// HeaderRoute names the instances and ranks of both hops
	// ("context=<instance>/<rank>; generation=<instance>/<rank>", "-" for
	// a hop that did not happen) when debug_route_header is on, then the
	// request's id as the log records it in its decisions
	// ("; request=<id>") and, per hop, the index of the replica state its
	// decision read ("; context_state=<n>; generation_state=<n>"), and
	// "; context_key=own" for a sub-agent's hop routed by its own
	// conversation id rather than its parent's root: what a checker judges
	// the answer against.
	HeaderRoute = "x-tether-route"
	// HeaderADPRank relays the final worker's attention-DP rank.
	HeaderADPRank = "x-tether-adp-rank"
)

// statusClientClosed is recorded (never sent) when the client went away.
const statusClientClosed = 499

// maxUpstreamBody bounds a non-streaming worker response the edge reads.
const maxUpstreamBody = 64 << 20

var traceProp = propagation.TraceContext{}

// handleInference serves the create endpoints of every dialect: POST
// /v1/chat/completions, /v1/completions, /v1/messages, /v1/responses.
func (e *Edge) handleInference(w http.ResponseWriter, r *http.Request, d apireq.Dialect) {
	endpoint := d.String()
	if r.Method != http.MethodPost {
		e.metrics.Requests.WithLabelValues(endpoint, "405").Inc()
		methodNotAllowed(&apiWriter{ResponseWriter: w, dialect: d}, r, http.MethodPost)
		return
	}
	start := time.Now()
	if d := e.cfg.WriteTimeout; d > 0 {
		w = &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: d}
	}
	aw := &apiWriter{ResponseWriter: w, dialect: d}
	ctx := traceProp.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
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
	if aw.aborted {
		// The stream ended with an error event; the connection ends
		// without a clean chunked end, so no client reads it as complete.
		panic(http.ErrAbortHandler)
	}
}

// deadlineWriter moves the connection's write deadline write_timeout ahead
// before every write: the limit is on a stalled client, not on a long
// generation or stream (http.Server.WriteTimeout alone would count the
// time spent waiting for the workers).
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *deadlineWriter) WriteHeader(status int) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	w.ResponseWriter.WriteHeader(status)
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (Flush).
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func fail(w http.ResponseWriter, span trace.Span, aerr *apiError) int {
	span.SetAttributes(attribute.String("tether.error", aerr.Message))
	writeAPIError(w, aerr)
	return aerr.Status
}

func (e *Edge) serveInference(ctx context.Context, w http.ResponseWriter, r *http.Request, d apireq.Dialect, span trace.Span) (status int) {
	e.stripHeaders(r)
	body, release, aerr := e.readBody(r)
	if aerr != nil {
		return fail(w, span, aerr)
	}
	defer release()
	rq, bodyConv, tokens, aerr := parseInference(body, r.URL.Path)
	if aerr != nil {
		return fail(w, span, aerr)
	}
	// The request's model selects its fleets (a model, or an adapter of one).
	m, adapter, ok := e.lookupModel(rq.model)
	if !ok {
		return fail(w, span, e.modelNotFound(rq.model))
	}
	rq.m, rq.adapter = m, adapter
	e.engineAdapter(rq)
	span.SetAttributes(attribute.String("tether.model", m.name), attribute.String("tether.lora_adapter", adapter))
	defer func() { e.metrics.ModelRequests.WithLabelValues(m.name, adapter, strconv.Itoa(status)).Inc() }()
	if aerr := e.dialectServed(rq.m, d); aerr != nil {
		return fail(w, span, aerr)
	}
	if tokens, aerr = rq.placeInlineSystem(tokens); aerr != nil {
		return fail(w, span, aerr)
	}
	rq.path = r.URL.Path
	rq.hint = routing.HintForEndpoint(rq.path)
	rq.requestID = e.nodeID + "-" + strconv.FormatUint(e.reqSeq.Add(1), 10)
	rq.now = e.now()
	rq.passHeaders = passThroughHeaders(d, r.Header)
	if d == apireq.Responses {
		if bodyConv, aerr = e.prepareResponses(rq, bodyConv); aerr != nil {
			return fail(w, span, aerr)
		}
	}
	if !rq.parsed.CountTokens {
		if aerr := e.identity(rq, bodyConv, r.Header); aerr != nil {
			return fail(w, span, aerr)
		}
	}
	if rq.id.DepthLimited {
		w.Header().Set(HeaderDepthLimited, depthLimitedValue(rq.id, e.route.identity))
	}
	if rq.pinned() == nil && !rq.parsed.CountTokens {
		e.promptKeys(rq, tokens)
	} else {
		// The prompt continues a stored response or a conversation (only
		// the instance holding it can expand it), or nothing is
		// generated: no keys to place by.
		rq.prompts[fsm.FleetContext] = prompt{tokens: len(tokens)}
		rq.prompts[fsm.FleetGeneration] = rq.prompts[fsm.FleetContext]
		rq.promptTokens = len(tokens)
	}
	if conv := rq.id.ConversationID; conv != "" && !rq.m.cfg.ContextServers.Engine.AggregatedOnly() {
		// The workers read the same conversation id the hint signs
		// (vLLM and SGLang read none: their body goes as the client sent it).
		rq.setConversation(conv)
	}
	rq.m.decider.RecordIdentity(rq.id) // a new sub-agent's link, or a use of its link
	span.SetAttributes(attribute.String("tether.conversation_id", rq.id.ConversationID), attribute.Bool("tether.subagent", rq.id.SubAgent()),
		attribute.Int("tether.prompt_tokens", rq.promptTokens), attribute.String("tether.api", d.String()))
	return e.dispatch(ctx, w, rq, span)
}

// placeInlineSystem places a Messages request's inline system messages as
// its model's anthropic_inline_system says (the engine's placement: the
// prompt keyed is the one it renders) and returns the prompt's words
// tokens; other requests keep theirs.
func (rq *request) placeInlineSystem(tokens []uint32) ([]uint32, *apiError) {
	mode := rq.m.cfg.InlineSystem()
	if rq.dialect != apireq.Messages || mode == apireq.InlineSystemPreserve {
		return tokens, nil
	}
	if aerr := rq.parsed.WithInlineSystem(mode); aerr != nil {
		return nil, aerr
	}
	return rq.parsed.WordTokens(), nil
}

// parseInference parses a body by its path's dialect (count_tokens is a
// Messages body without max_tokens).
func parseInference(body []byte, path string) (*request, string, []uint32, *apiError) {
	if strings.TrimSuffix(path, "/") == countTokensPath {
		p, aerr := apireq.ParseCountTokens(body)
		if aerr != nil {
			return nil, "", nil, aerr
		}
		return fromParsed(p), "", p.WordTokens(), nil
	}
	d, _ := dialectOfPath(path)
	return parseBody(body, d)
}

// countTokensPath is the Messages API's token count.
const countTokensPath = "/v1/messages/count_tokens"

// dialectOfPath is the dialect of a create endpoint.
func dialectOfPath(path string) (apireq.Dialect, bool) {
	switch strings.TrimSuffix(path, "/") {
	case "/v1/chat/completions":
		return apireq.Chat, true
	case "/v1/completions":
		return apireq.Completions, true
	case "/v1/messages", countTokensPath:
		return apireq.Messages, true
	case "/v1/responses":
		return apireq.Responses, true
	}
	return 0, false
}

// passThroughHeaders are the client's headers an engine reads that the
// edge forwards on every hop: the Anthropic API version and beta flags
// (vLLM and SGLang accept and ignore them; an engine that reads them gets
// what the client sent).
func passThroughHeaders(d apireq.Dialect, h http.Header) http.Header {
	if d != apireq.Messages {
		return nil
	}
	var out http.Header
	for _, k := range []string{"Anthropic-Version", "Anthropic-Beta"} {
		if v := h.Values(k); len(v) > 0 {
			if out == nil {
				out = http.Header{}
			}
			out[k] = append([]string(nil), v...)
		}
	}
	return out
}

// setConversation writes the conversation id into the body's
// conversation_params (keeping other fields).
func (rq *request) setConversation(conv string) {
	cp := map[string]json.RawMessage{}
	if raw, ok := rq.top["conversation_params"]; ok && !isNull(raw) {
		_ = json.Unmarshal(raw, &cp)
	}
	v, _ := json.Marshal(conv)
	cp["conversation_id"] = v
	rq.top["conversation_params"] = mustMarshal(cp)
}

func mustMarshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		// Only maps of raw JSON and plain values are marshalled here.
		return json.RawMessage("null")
	}
	return b
}

// hopBody is the request body for one hop: the client's body with fields
// set or removed. Values are copied as the decoder validated them (no
// re-encoding: the prompt is the bulk of the body and is written once).
func (rq *request) hopBody(set map[string]json.RawMessage, del ...string) []byte {
	n := 2
	for k, v := range rq.top {
		n += len(k) + len(v) + 4
	}
	for k, v := range set {
		n += len(k) + len(v) + 4
	}
	b := make([]byte, 0, n+16)
	b = append(b, '{')
	first := true
	write := func(k string, v json.RawMessage) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, k)
		b = append(b, ':')
		b = append(b, v...)
	}
outer:
	for k, v := range rq.top {
		if _, replaced := set[k]; replaced {
			continue
		}
		for _, d := range del {
			if k == d {
				continue outer
			}
		}
		write(k, v)
	}
	for k, v := range set {
		write(k, v)
	}
	return append(b, '}')
}

// appendJSONString appends s as a JSON string (keys of a decoded object:
// any valid UTF-8, escaped as encoding/json would).
func appendJSONString(b []byte, s string) []byte {
	simple := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 || c == '<' || c == '>' || c == '&' {
			simple = false
			break
		}
	}
	if simple {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	return append(b, mustMarshal(s)...)
}

// upstreamAnswer is a worker's non-success answer passed to the client.
type upstreamAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (u *upstreamAnswer) write(w http.ResponseWriter) int {
	ct := u.header.Get("Content-Type")
	if ct == "" {
		ct = "application/json"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(u.status)
	_, _ = w.Write(u.body)
	return u.status
}

// clientAnswer is a worker's (or engine's) answer other than 200 as the
// client reads it: the ids it names are the ones the client sent, never
// the engine's own (a stored response's, a conversation's), and an
// engine's 404 for the previous_response_id (vLLM's answer: its store no
// longer holds it) is OpenAI's 400 previous_response_not_found.
func (rq *request) clientAnswer(status int, header http.Header, b []byte) *upstreamAnswer {
	for _, ref := range []*storedRef{rq.prev, rq.conv} {
		if ref != nil {
			b = bytes.ReplaceAll(b, []byte(ref.id.Upstream), []byte(ref.client))
		}
	}
	if rq.prev != nil && status == http.StatusNotFound && bytes.Contains(b, []byte(rq.prev.client)) {
		aerr := refPrevious.notFound(rq.prev.client, "The %s instance %s that stored it no longer holds it (evicted, deleted, or its engine restarted).",
			fsm.Fleet(rq.prev.id.Fleet), rq.prev.id.Instance)
		h := header.Clone()
		h.Set("Content-Type", "application/json")
		return &upstreamAnswer{status: aerr.Status, header: h, body: aerr.JSON(apireq.Responses)}
	}
	return &upstreamAnswer{status: status, header: header, body: b}
}

// hopFailure is why a hop ended without a usable response: either an
// error the edge reports, or the worker's own answer passed through.
type hopFailure struct {
	err  *apiError
	pass *upstreamAnswer
}

func (f *hopFailure) write(w http.ResponseWriter, span trace.Span) int {
	if f.pass != nil {
		span.SetAttributes(attribute.Int("tether.upstream_status", f.pass.status))
		return f.pass.write(w)
	}
	return fail(w, span, f.err)
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
func (e *Edge) dispatch(ctx context.Context, w http.ResponseWriter, rq *request, span trace.Span) int {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.UpstreamTimeout)
	defer cancel()
	if rq.pinned() != nil {
		return e.dispatchStored(ctx, w, rq, span) // edge/stored.go
	}
	if rq.m.cfg.Aggregated() {
		return e.dispatchEngine(ctx, w, rq, span) // vLLM, SGLang (edge/engines.go)
	}
	if rq.m.cfg.PDEngine() != "" {
		return e.dispatchPD(ctx, w, rq, span) // vLLM, SGLang prefill/decode (edge/pd.go)
	}
	if rq.parsed.CountTokens {
		// Nothing is prefilled: any context worker counts, unbound.
		h, aerr := e.routeFleet(ctx, rq, fsm.FleetContext, nil)
		if aerr != nil {
			return fail(w, span, aerr)
		}
		return e.aggregated(ctx, w, rq, h, span)
	}
	var genHop *hop
	if max := e.cfg.ConditionalDisagg.MaxLocalPrefillLength; max > 0 {
		h, aerr := e.routeFleet(ctx, rq, fsm.FleetGeneration, nil)
		if aerr != nil {
			return fail(w, span, aerr)
		}
		genHop = h
		if uncached := rq.promptTokens - h.Cached; uncached < max {
			span.SetAttributes(attribute.Bool("tether.context_skipped", true), attribute.Int("tether.uncached_tokens", uncached))
			return e.aggregated(ctx, w, rq, genHop, span)
		}
	}
	ctxHop, aerr := e.routeFleet(ctx, rq, fsm.FleetContext, nil)
	if aerr != nil {
		return fail(w, span, aerr)
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
	if !cres.needsGeneration(rq.maxTokens) && (rq.dialect == apireq.Chat || rq.dialect == apireq.Completions) {
		// (A Messages or Responses answer always comes from the generation
		// worker: it writes the dialect's shape and keeps what it stores.)
		// The prefill already produced the whole answer.
		return e.respondFromContext(w, rq, ctxHop, cres)
	}
	if genHop == nil {
		rq.now = e.now()
		if genHop, aerr = e.routeFleet(ctx, rq, fsm.FleetGeneration, nil); aerr != nil {
			return fail(w, span, aerr)
		}
	}
	return e.generationHop(ctx, w, rq, ctxHop, cres, genHop, span)
}

func (e *Edge) newDisaggID() uint64 {
	return e.disagg.base | (e.disagg.seq.Add(1) & (1<<disaggIDSeqBits - 1))
}

// hopHeader builds a hop's headers: content type, the trace context and,
// when this hop carries sub-agent affinity, the signed hint.
func (e *Edge) hopHeader(ctx context.Context, rq *request, h *hop, role hintauth.Role, typ hintauth.RequestType, disaggID string) http.Header {
	hdr := make(http.Header, 6+len(rq.passHeaders))
	for k, v := range rq.passHeaders {
		hdr[k] = v
	}
	hdr.Set("Content-Type", "application/json")
	traceProp.Inject(ctx, propagation.HeaderCarrier(hdr))
	setLogRank(hdr, h)
	if e.sendHint(rq, h, role) {
		sig, err := hintauth.SignAs(e.cfg.HintSignatureFormat, e.authKey, hintauth.Fields{
			Role: role, Model: rq.model, ConversationID: rq.id.ConversationID, AffinityID: rq.id.Root,
			RequestType: typ, DisaggRequestID: disaggID,
		})
		if err != nil {
			// Not reachable with the edge's own integer request ids; the
			// hop then goes without a hint (instance affinity still holds).
			e.log.Warn("cannot sign the sub-agent hint", "error", err)
			return hdr
		}
		hdr.Set(hintauth.HeaderAffinityID, rq.id.Root)
		hdr.Set(hintauth.HeaderAffinityAuth, sig)
	}
	return hdr
}

// sendHint decides whether a hop carries the sub-agent hint: only for a
// sub-agent (the affinity id is its parent's root, never its own id), on
// the chat endpoint (rank affinity), with a key to sign with, to the
// generation fleet only with scope both, and never to a worker whose
// telemetry says it cannot verify hints (a legacy worker; instance
// affinity still applies).
func (e *Edge) sendHint(rq *request, h *hop, role hintauth.Role) bool {
	if !rq.hint || e.authKey == nil || !rq.id.SubAgent() || role == "" {
		return false
	}
	if role == hintauth.RoleGeneration && e.cfg.Scope != routing.ScopeBoth {
		return false
	}
	if in, ok := e.fleet.Instance(h.Instance, rq.now); ok && in.Telemetry && !in.VerifiesHints {
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
func (e *Edge) exchange(ctx context.Context, rq *request, h **hop, phase string,
	build func(h *hop) (body []byte, hdr http.Header)) (*http.Response, func(), *hopFailure) {
	for attempt := 0; ; attempt++ {
		cur := *h
		hctx, span := e.tracing.tracer.Start(ctx, "tether.edge "+phase+" hop", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(observe.AttrInstance.String(cur.Instance), observe.AttrFleet.String(cur.Fleet.String()), attribute.Int("tether.attempt", attempt)))
		body, hdr := build(cur)
		// The hop's span is the worker span's parent.
		traceProp.Inject(hctx, propagation.HeaderCarrier(hdr))
		done := e.noteDispatch(cur.Fleet, cur.Instance, rq.promptTokens)
		resp, err := e.post(e.fleet.ExpectIdentity(hctx, cur.Instance), cur.URL+rq.path, body, hdr)
		if err != nil || resp.StatusCode != http.StatusOK {
			done()
		}
		var failure *hopFailure
		switch {
		case err != nil:
			if ctx.Err() != nil {
				span.End()
				return nil, nil, &hopFailure{err: newAPIError(statusClientClosed, "server_error", "cancelled", "", "request cancelled: %v", ctx.Err())}
			}
			e.metrics.UpstreamErrors.WithLabelValues(cur.Fleet.String(), "connect").Inc()
			failure = &hopFailure{err: newAPIError(http.StatusBadGateway, "server_error", "upstream_unavailable", "",
				"%s instance %s (%s) failed: %v", cur.Fleet, cur.Instance, cur.URL, err)}
		case resp.StatusCode >= 500:
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			e.metrics.UpstreamErrors.WithLabelValues(cur.Fleet.String(), "status_5xx").Inc()
			failure = &hopFailure{pass: rq.clientAnswer(resp.StatusCode, resp.Header, b)}
		case resp.StatusCode != http.StatusOK:
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
			span.End()
			return nil, nil, &hopFailure{pass: rq.clientAnswer(resp.StatusCode, resp.Header, b)}
		default:
			span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode), observe.AttrRank.String(resp.Header.Get(HeaderADPRank)))
			span.End()
			return resp, done, nil
		}
		span.SetStatus(codes.Error, "hop failed")
		span.End()
		if attempt >= e.cfg.MaxRetries || rq.pinned() != nil {
			// (No other instance holds a stored response or a conversation.)
			return nil, nil, failure
		}
		next, aerr := e.reroute(ctx, rq, cur)
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
func (e *Edge) contextHop(ctx context.Context, rq *request, h **hop) (*contextResult, *hopFailure) {
	for attempt := 0; ; attempt++ {
		var disaggID uint64
		resp, done, hf := e.exchange(ctx, rq, h, "context", func(cur *hop) ([]byte, http.Header) {
			disaggID = e.newDisaggID()
			id := strconv.FormatUint(disaggID, 10)
			dp := mustMarshal(map[string]any{"request_type": "context_only", "disagg_request_id": disaggID})
			body := rq.hopBody(map[string]json.RawMessage{"disaggregated_params": dp, "stream": json.RawMessage("false")}, "stream_options")
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
		failure := &hopFailure{err: newAPIError(http.StatusBadGateway, "server_error", "bad_upstream_response", "",
			"context instance %s answered an unusable context phase: %v", cur.Instance, err)}
		if attempt >= e.cfg.MaxRetries {
			return nil, failure
		}
		next, aerr := e.reroute(ctx, rq, cur)
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
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamBody))
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
		if isNull(dp["ctx_request_id"]) {
			return nil, errors.New("choices[0].disaggregated_params.ctx_request_id is missing")
		}
		if got := strings.Trim(string(bytes.TrimSpace(dp["disagg_request_id"])), `"`); got != wantID {
			return nil, fmt.Errorf("choices[0].disaggregated_params.disagg_request_id %s, want %d", dp["disagg_request_id"], disaggID)
		}
		res.handoff = dp
		if !isNull(body.PromptTokenIDs) {
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
func (rq *request) generationBody(cres *contextResult) (body []byte, params map[string]json.RawMessage) {
	id := json.RawMessage(strconv.FormatUint(cres.disaggID, 10))
	if cres.handoff == nil {
		dp := map[string]json.RawMessage{
			"request_type":      json.RawMessage(`"generation_only"`),
			"disagg_request_id": id,
			"opaque_state":      mustMarshal(cres.opaqueState),
		}
		if len(cres.ctxRequestID) > 0 {
			dp["ctx_request_id"] = cres.ctxRequestID
		}
		if len(cres.firstTokens) > 0 && !isNull(cres.firstTokens) {
			dp["first_gen_tokens"] = cres.firstTokens
		}
		return rq.hopBody(map[string]json.RawMessage{"disaggregated_params": mustMarshal(dp)}), nil
	}
	dp := make(map[string]json.RawMessage, len(cres.handoff)+2)
	for k, v := range cres.handoff {
		dp[k] = v
	}
	dp["request_type"] = json.RawMessage(`"generation_only"`)
	dp["disagg_request_id"] = id
	set := map[string]json.RawMessage{"disaggregated_params": mustMarshal(dp)}
	if cres.promptTokenIDs != nil {
		if rq.dialect.HasConversation() {
			set["prompt_token_ids"] = cres.promptTokenIDs
		} else {
			set["prompt"] = cres.promptTokenIDs
		}
	}
	return rq.hopBody(set), dp
}

// generationHop continues on the generation worker with the context's
// state. A retry keeps the disaggregated request id (the state is bound to
// it).
func (e *Edge) generationHop(ctx context.Context, w http.ResponseWriter, rq *request, ctxHop *hop, cres *contextResult, genHop *hop, span trace.Span) int {
	id := strconv.FormatUint(cres.disaggID, 10)
	body, params := rq.generationBody(cres)
	var disaggAuth string
	if e.authKey != nil && params != nil {
		// Protects the KV-transfer fields as TensorRT-LLM does
		// (disagg_auth.py build_internal_disagg_auth_headers), in the
		// payload of the workers' release (disagg_auth_format).
		var err error
		if disaggAuth, err = hintauth.SignDisaggAs(e.cfg.DisaggAuthFormat, e.authKey, params); err != nil {
			e.metrics.UpstreamErrors.WithLabelValues("context", "bad_response").Inc()
			return fail(w, span, newAPIError(http.StatusBadGateway, "server_error", "bad_upstream_response", "",
				"context instance %s answered disaggregated_params that cannot be signed: %v", ctxHop.Instance, err))
		}
	}
	resp, done, hf := e.exchange(ctx, rq, &genHop, "generation", func(cur *hop) ([]byte, http.Header) {
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
func (e *Edge) aggregated(ctx context.Context, w http.ResponseWriter, rq *request, genHop *hop, span trace.Span) int {
	resp, done, hf := e.exchange(ctx, rq, &genHop, "aggregated", func(cur *hop) ([]byte, http.Header) {
		role := hintauth.Role("")
		if in, ok := e.fleet.Instance(cur.Instance, rq.now); ok {
			// A worker without a configured role ignores hints on
			// aggregated requests; one with a role verifies them as it.
			role = hintauth.Role(in.Role)
		}
		return rq.hopBody(nil), e.hopHeader(ctx, rq, cur, role, hintauth.RequestAggregated, "")
	})
	if hf != nil {
		return hf.write(w, span)
	}
	defer done()
	if in, ok := e.fleet.Instance(genHop.Instance, rq.now); ok {
		e.observeRank(rq, genHop, hintauth.Role(in.Role), resp.Header.Get(HeaderADPRank))
	}
	return e.relay(w, rq, resp, nil, nil, genHop, span)
}

// routeHeaders sets the debug route header and relays the worker's rank.
func (e *Edge) routeHeaders(w http.ResponseWriter, ctxHop *hop, ctxRank string, genHop *hop, genRank string) {
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
		h.Set(HeaderRoute, "context="+hopLabel(ctxHop, ctxRank)+"; generation="+hopLabel(genHop, genRank)+routeEvidence(ctxHop, genHop))
	}
}

// relay passes the final worker's response to the client: JSON, or the
// SSE stream event by event, in the request's dialect (edge/dialect.go):
// its usage feeds the breaker and the shadow, after a context hop the
// usage's cached tokens are the context (prefill) worker's (that is where
// the prompt was or was not recomputed), and a Responses answer's ids are
// minted (edge/stored.go).
func (e *Edge) relay(w http.ResponseWriter, rq *request, resp *http.Response, ctxHop *hop, cres *contextResult, genHop *hop, span trace.Span) int {
	defer resp.Body.Close()
	ctxRank, cached, nullCached := "", -1, false
	if cres != nil {
		ctxRank, cached, nullCached = cres.rank, cres.cachedTokens, cres.nullCached
	}
	genRank := resp.Header.Get(HeaderADPRank)
	e.routeHeaders(w, ctxHop, ctxRank, genHop, genRank)
	span.SetAttributes(attribute.String("tether.route", "context="+hopLabel(ctxHop, ctxRank)+"; generation="+hopLabel(genHop, genRank)))
	ans := &answer{d: rq.dialect, cached: cached, nullCached: nullCached}
	if cres == nil && !rq.parsed.CountTokens {
		ans.onUsage = func(u usageFigures) {
			// Only a response that reports its cached tokens says
			// anything about the cache (vLLM without
			// --enable-prompt-tokens-details does not: its breaker must
			// not read that as misses).
			if u = e.engineUsage(genHop.Instance, u); u.HasCached {
				e.fleet.RecordUsage(genHop.Instance, int64(u.Prompt), int64(u.Cached), e.now())
				if rq.pinned() == nil {
					e.shadowCorrect(rq, genHop, u.Cached)
				}
			}
		}
	}
	if rq.dialect == apireq.Responses {
		ans.ids = e.minter(rq, genHop, genRank)
	}
	return e.copyAnswer(w, resp, ans, rq.stream, genHop.Fleet, rq.dialect.String(), genHop.Instance, span)
}

// copyAnswer writes a worker's 200 answer to the client through ans. A
// stream that ends before its last event (the worker died, the connection
// broke) ends with an error event in the dialect's shape and an aborted
// connection, counted in tether_edge_streams_aborted_total: never a clean
// end a client would take for a model that stopped.
func (e *Edge) copyAnswer(w http.ResponseWriter, resp *http.Response, ans *answer, stream bool, fleet fsm.Fleet, endpoint, instance string, span trace.Span) int {
	if !stream {
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamBody))
		if err != nil {
			return fail(w, span, newAPIError(http.StatusBadGateway, "server_error", "upstream_read_failed", "",
				"reading the response of %s: %v", instance, err))
		}
		b = ans.body(b)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
		return http.StatusOK
	}
	h := w.Header()
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		ct = "text/event-stream"
	}
	h.Set("Content-Type", ct)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	atBoundary := true // the last line written ended an event
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			// (A partial last line is dropped: half an event is no event.)
			line = ans.line(line)
			atBoundary = len(bytes.TrimSpace(line)) == 0
			if _, werr := w.Write(line); werr != nil {
				return statusClientClosed
			}
			if len(bytes.TrimSpace(line)) == 0 {
				if rc.Flush() != nil {
					return statusClientClosed
				}
			}
		}
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) && ans.terminal {
			_ = rc.Flush()
			return http.StatusOK
		}
		cause := "the stream ended before its last event"
		if !errors.Is(err, io.EOF) {
			cause = "the stream broke: " + err.Error()
		}
		msg := fmt.Sprintf("%s instance %s did not finish the response: %s", fleet, instance, cause)
		span.SetAttributes(attribute.String("tether.error", "stream cut: "+cause))
		e.metrics.UpstreamErrors.WithLabelValues(fleet.String(), "stream_cut").Inc()
		e.metrics.StreamsAborted.WithLabelValues(endpoint, fleet.String()).Inc()
		e.log.Warn("aborting a stream the worker did not finish", "instance", instance, "cause", cause)
		if !atBoundary {
			_, _ = w.Write([]byte("\n")) // the error is an event of its own
		}
		_, _ = w.Write(ans.failEvent(msg))
		_ = rc.Flush()
		abortStream(w)
		return http.StatusBadGateway
	}
}

// usageFigures is what an answer's usage says of its prompt.
type usageFigures = disagg.Usage

// respondFromContext answers with the context phase's result when it is
// already complete (max_tokens 1, or the model stopped): as JSON, or as an
// SSE stream in the OpenAI chunk format.
func (e *Edge) respondFromContext(w http.ResponseWriter, rq *request, ctxHop *hop, cres *contextResult) int {
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
		out["choices"] = mustMarshal(choices)
	}
	if !rq.stream {
		writeJSON(w, http.StatusOK, out)
		return http.StatusOK
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	object := "text_completion"
	chat := rq.dialect == apireq.Chat
	if chat {
		object = "chat.completion.chunk"
	}
	base := map[string]json.RawMessage{"object": mustMarshal(object)}
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
			m["choices"] = mustMarshal([]any{choice})
		} else {
			m["choices"] = json.RawMessage("[]")
		}
		if usage != nil {
			m["usage"] = usage
		}
		return mustMarshal(m)
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
	if u, ok := cres.raw["usage"]; ok && rq.includeUsage {
		events = append(events, chunk(nil, u))
	}
	events = append(events, []byte("[DONE]"))
	for _, ev := range events {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", ev); err != nil {
			return statusClientClosed
		}
	}
	_ = http.NewResponseController(w).Flush()
	return http.StatusOK
}
