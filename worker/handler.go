package worker

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/bodybudget"
	"github.com/tether-project/tether/internal/convid"
	"github.com/tether-project/tether/internal/httpjson"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/adp"
	"github.com/tether-project/tether/worker/engine"
	"github.com/tether-project/tether/worker/engine/sim"
	"github.com/tether-project/tether/worker/proxy"
)

// randomID is 24 random alphanumerics: completion ids are globally unique
// (a counter repeated them after every restart, which clients that key
// logs or caches by id would conflate).
func randomID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	var b [24]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

// statusClientClosed is recorded (never sent) when the client went away.
const statusClientClosed = 499

type route struct {
	methods []string
	handle  http.HandlerFunc
}

// Handler is the worker's HTTP API. Unknown paths answer 404 and wrong
// methods 405, both as OpenAI error JSON.
func (s *Server) Handler() http.Handler {
	metricsHandler := promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{ErrorLog: nil})
	routes := map[string]route{
		"/v1/chat/completions": {[]string{http.MethodPost}, func(w http.ResponseWriter, r *http.Request) { s.handleInference(w, r, apireq.Chat) }},
		"/v1/completions":      {[]string{http.MethodPost}, func(w http.ResponseWriter, r *http.Request) { s.handleInference(w, r, apireq.Completions) }},
		"/v1/messages":         {[]string{http.MethodPost}, func(w http.ResponseWriter, r *http.Request) { s.handleInference(w, r, apireq.Messages) }},
		countTokensPath:        {[]string{http.MethodPost}, func(w http.ResponseWriter, r *http.Request) { s.handleInference(w, r, apireq.Messages) }},
		"/v1/responses":        {[]string{http.MethodPost}, func(w http.ResponseWriter, r *http.Request) { s.handleInference(w, r, apireq.Responses) }},
		"/v1/models":           {[]string{http.MethodGet, http.MethodHead}, s.handleModels},
		"/healthz":             {[]string{http.MethodGet, http.MethodHead}, s.handleHealth},
		"/health":              {[]string{http.MethodGet, http.MethodHead}, s.handleEngineHealth},
		"/readyz":              {[]string{http.MethodGet, http.MethodHead}, s.handleReady},
		"/metrics":             {[]string{http.MethodGet, http.MethodHead}, metricsHandler.ServeHTTP},
	}
	// A simulated engine speaking trtllm-serve's KV event endpoint
	// (engine.publish_kv_events.serve_trtllm).
	if k, ok := s.eng.(interface{ KVCacheEventsHandler() http.HandlerFunc }); ok && k.KVCacheEventsHandler() != nil {
		routes["/kv_cache_events"] = route{[]string{http.MethodPost}, k.KVCacheEventsHandler()}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			// A bug must not take the worker down with it; net/http would
			// recover too, but would drop the connection without an answer.
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("handler panic", "path", r.URL.Path, "panic", v)
				writeAPIError(w, newAPIError(http.StatusInternalServerError, "server_error", "internal_error", "", "internal error"))
			}
		}()
		rt, ok := routes[r.URL.Path]
		if id, found := strings.CutPrefix(r.URL.Path, "/v1/models/"); !ok && found {
			rt, ok = route{[]string{http.MethodGet, http.MethodHead}, func(w http.ResponseWriter, r *http.Request) { s.handleModel(w, id) }}, true
		}
		if rest, found := strings.CutPrefix(r.URL.Path, "/v1/responses/"); !ok && found {
			rt, ok = s.storedResponseRoute(rest)
		}
		if rest, found := strings.CutPrefix(r.URL.Path, "/v1/conversations"); !ok && found && (rest == "" || rest[0] == '/') {
			rt, ok = s.conversationRoute(strings.TrimPrefix(rest, "/"))
		}
		if !ok {
			s.metrics.requests.WithLabelValues("other", "404").Inc()
			writeAPIError(w, newAPIError(http.StatusNotFound, "invalid_request_error", "unknown_url", "",
				"unknown path %s %s (this worker serves POST /v1/chat/completions, /v1/completions, /v1/messages, /v1/messages/count_tokens, /v1/responses, GET/DELETE /v1/responses/{id}, /v1/conversations[/{id}[/items[/{item_id}]]], GET /v1/models, /health, /healthz, /readyz, /metrics)", r.Method, truncate(r.URL.Path, 200)))
			return
		}
		for _, m := range rt.methods {
			if r.Method == m {
				rt.handle(w, r)
				return
			}
		}
		s.metrics.requests.WithLabelValues("other", "405").Inc()
		w.Header().Set("Allow", strings.Join(rt.methods, ", "))
		writeAPIError(w, newAPIError(http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "",
			"method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(rt.methods, ", ")))
	})
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": s.modelCards()})
}

// handleModel is GET /v1/models/{id}: the served model or one of its
// adapters, or 404 as OpenAI answers an unknown one.
func (s *Server) handleModel(w http.ResponseWriter, id string) {
	for _, c := range s.modelCards() {
		if c["id"] == id {
			writeJSON(w, http.StatusOK, c)
			return
		}
	}
	writeAPIError(w, s.modelNotFound(id))
}

// modelNotFound is OpenAI's answer to a model this worker does not serve.
func (s *Server) modelNotFound(name string) *apiError {
	served := make([]string, 0, 1+len(s.cfg.ModelAliases))
	for _, n := range s.modelNames() {
		served = append(served, strconv.Quote(n))
	}
	return newAPIError(http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
		"the model %q does not exist on this worker (it serves %s)", truncate(name, 200), strings.Join(served, ", "))
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// handleEngineHealth answers GET /health the way trtllm-serve, vLLM and
// SGLang do, so an edge (or any router built for those engines) probes a
// tether worker like one of them: 200 while it takes requests, 503 while
// it is not (here: shutting down). Its NATS connection does not matter, as
// with /readyz?telemetry=optional; /readyz keeps the richer answer.
func (s *Server) handleEngineHealth(w http.ResponseWriter, r *http.Request) {
	if !s.Serving() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": "shutting down"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("telemetry") == "optional" {
		// Asked by an edge whose own NATS link is down: can this worker
		// serve? Its telemetry connection does not matter then.
		if !s.Serving() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": "shutting down"})
			return
		}
		out := map[string]string{"status": "ready"}
		if s.pub != nil && !s.pub.connected() {
			out["nats"] = "disconnected"
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	if !s.Ready() {
		reason := "shutting down"
		if s.pub != nil && !s.pub.connected() && !s.closing.Load() {
			reason = "not connected to NATS"
		}
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": reason})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// writeJSON and truncate are the shared JSON answer and message quoting.
var (
	writeJSON = httpjson.Write
	truncate  = httpjson.Clip
)

// handleInference serves the create endpoints of every dialect: POST
// /v1/chat/completions, /v1/completions, /v1/messages (and its
// count_tokens), /v1/responses.
func (s *Server) handleInference(w http.ResponseWriter, r *http.Request, d apireq.Dialect) {
	endpoint := d.String()
	if !s.enter() {
		s.metrics.requests.WithLabelValues(endpoint, "503").Inc()
		newAPIError(http.StatusServiceUnavailable, "server_error", "shutting_down", "", "worker is shutting down").Write(w, d)
		return
	}
	defer s.handlers.Done()
	if limit := s.cfg.MaxConcurrentRequests; limit > 0 {
		n := s.inflight.Add(1)
		defer s.inflight.Add(-1)
		if n > int64(limit) {
			// Refused before reading the body: a flood costs little.
			s.metrics.requests.WithLabelValues(endpoint, "429").Inc()
			e := newAPIError(http.StatusTooManyRequests, "rate_limit_error", "too_many_concurrent_requests", "",
				"this worker is serving its limit of %d concurrent requests (max_concurrent_requests); retry after 1s", limit)
			e.RetryAfter = time.Second
			e.Write(w, d)
			return
		}
	}
	start := time.Now()
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := s.tracer.Start(ctx, "tether.worker "+r.URL.Path,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("http.route", r.URL.Path),
			attribute.String("tether.instance", s.cfg.InstanceID),
		))
	defer span.End()
	x := &exchange{s: s, w: w, r: r, ctx: ctx, span: span, dialect: d, chat: d == apireq.Chat}
	status, phase := x.serve()
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 400 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	s.metrics.requests.WithLabelValues(endpoint, strconv.Itoa(status)).Inc()
	if phase != "" {
		s.metrics.duration.WithLabelValues(endpoint, phase).Observe(time.Since(start).Seconds())
	}
}

// exchange is one inference request/response.
type exchange struct {
	s       *Server
	w       http.ResponseWriter
	r       *http.Request
	ctx     context.Context
	span    trace.Span
	dialect apireq.Dialect
	chat    bool // answered in the chat completions shape

	p        *parsedRequest
	affinity string
	adapter  string // the LoRA adapter the request names ("" for the base model)
	// chain places a continued response's rank when the request names
	// no conversation (respStore's chain key).
	chain   string
	ans     answerer
	id      string
	created int64
	seq     uint64
	// streaming state
	headerSent bool
	writeErr   error
}

func (x *exchange) fail(e *apiError) int {
	x.span.SetAttributes(attribute.String("tether.error", e.Message))
	e.Write(x.w, x.dialect)
	return e.Status
}

// parse reads an inference body of x's dialect (count_tokens: a Messages
// body without max_tokens), a Messages request's inline system messages
// placed as anthropic_inline_system says.
func (s *Server) parse(x *exchange, body []byte) (*parsedRequest, *apiError) {
	var req *apireq.Request
	var aerr *apiError
	if strings.TrimSuffix(x.r.URL.Path, "/") == countTokensPath {
		req, aerr = apireq.ParseCountTokens(body)
	} else {
		req, aerr = apireq.Parse(x.dialect, body)
	}
	if aerr == nil {
		aerr = req.WithInlineSystem(s.cfg.inlineSystem())
	}
	if aerr != nil {
		return nil, aerr
	}
	return parsedFrom(req, body, s.rules())
}

// serve runs the request and returns the HTTP status it answered (or 499
// when the client went away) and the phase it ran ("" if it never ran).
func (x *exchange) serve() (int, string) {
	s := x.s
	body, release, aerr := s.readBody(x.r)
	if aerr != nil {
		if aerr.Status == http.StatusTooManyRequests {
			aerr.RetryAfter = time.Second
		}
		return x.fail(aerr), ""
	}
	defer release()
	p, aerr := s.parse(x, body)
	if aerr != nil {
		return x.fail(aerr), ""
	}
	adapter, ok := s.servedAdapter(p.model)
	if !ok {
		return x.fail(s.modelNotFound(p.model)), ""
	}
	// A proxy worker relays the agents' APIs to its engine untouched
	// (worker/passthrough.go); the simulated engine answers them here.
	px, proxied := s.eng.(*proxy.Engine)
	relay := proxied && (x.dialect == apireq.Messages || x.dialect == apireq.Responses) && p.phase != engine.PhaseContextOnly
	if p.req.CountTokens && !relay {
		writeJSON(x.w, http.StatusOK, map[string]int{"input_tokens": len(p.prompt)})
		return http.StatusOK, ""
	}
	var prev *storedResponse
	if !relay {
		if p, prev, aerr = s.expandStored(p, body); aerr != nil {
			return x.fail(aerr), ""
		}
	}
	x.p, x.chat = p, p.chat
	p.conversationID = convid.Resolve(p.bodyConvID, x.r.Header)
	if rf := p.req.Responses; p.conversationID == "" && rf != nil && rf.Conversation != "" {
		p.conversationID = rf.Conversation // (an edge names it in conversation_params)
	}
	if aerr := s.verifyDisaggAuth(x.r.Header, p); aerr != nil {
		return x.fail(aerr), ""
	}
	affinity, aerr := s.verifyHint(x.r.Header, p)
	if aerr != nil {
		return x.fail(aerr), ""
	}
	x.affinity, x.adapter = affinity, adapter
	if relay {
		return x.passThrough(px)
	}
	if prev != nil && p.conversationID == "" {
		x.chain = prev.chain
	}
	x.seq = s.reqSeq.Add(1)
	x.created = time.Now().Unix()
	if ra := x.answer(prev); ra != nil && p.req.Responses.Background {
		return s.startBackground(x, ra), p.phase.String()
	}
	return x.run(x.ctx)
}

// expandStored puts into a Responses request what it refers to: the stored
// responses and items it names (previous_response_id, item references),
// then its conversation's items, and parses it again. It returns the
// request and the previous response (nil when none).
func (s *Server) expandStored(p *parsedRequest, body []byte) (*parsedRequest, *storedResponse, *apiError) {
	var prev *storedResponse
	var aerr *apiError
	if rf := p.req.Responses; rf != nil && (rf.PreviousResponseID != "" || len(rf.ItemReferences()) > 0) {
		if prev, aerr = s.expandResponses(p); aerr != nil {
			return nil, nil, aerr
		}
		if p, aerr = parsedFrom(p.req, body, s.rules()); aerr != nil {
			return nil, nil, aerr
		}
	}
	if rf := p.req.Responses; rf != nil && rf.Conversation != "" {
		if aerr = s.conversationInput(p); aerr != nil {
			return nil, nil, aerr
		}
		if p, aerr = parsedFrom(p.req, body, s.rules()); aerr != nil {
			return nil, nil, aerr
		}
	}
	return p, prev, nil
}

// answer gives the exchange its id and the answer of its dialect; for a
// Responses request it returns that answer (nil otherwise).
func (x *exchange) answer(prev *storedResponse) *responsesAnswer {
	switch {
	case x.chat || x.dialect == apireq.Completions:
		kind := "cmpl"
		if x.chat {
			kind = "chatcmpl"
		}
		x.id = kind + "-" + randomID()
		x.ans = chatAnswer{x}
	case x.dialect == apireq.Messages:
		x.id = "msg_" + randomID()
		x.ans = &messagesAnswer{x: x}
	default:
		x.id = "resp_" + randomID()
		if x.chain == "" && x.p.conversationID == "" {
			x.chain = "response:" + x.id // its continuations find its rank
		}
		ra := x.s.newResponsesAnswer(x, prev)
		x.ans = ra
		return ra
	}
	return nil
}

// run places the request on a rank, runs it on the engine and answers.
func (x *exchange) run(ctx context.Context) (int, string) {
	s, p := x.s, x.p
	d := s.sched.Place(x.placeRequest())
	defer func() {
		s.sched.Finish(&d.Ticket)
		s.nudgeTelemetry()
	}()
	if d.Overflow {
		s.overflows[d.Rank].Add(1)
	}
	s.nudgeTelemetry()
	phase := p.phase.String()
	x.span.SetAttributes(
		attribute.Int("tether.rank", d.Rank),
		attribute.String("tether.phase", phase),
		attribute.String("tether.placement", d.Reason.String()),
		attribute.Bool("tether.subagent", d.Subagent),
		attribute.Bool("tether.overflow", d.Overflow),
		attribute.Int("tether.prompt_tokens", len(p.prompt)),
	)
	h := x.w.Header()
	h.Set(HeaderADPRank, strconv.Itoa(d.Rank))
	h.Set(HeaderInstance, s.cfg.InstanceID)

	path, raw := x.r.URL.Path, p.sanitizedBody
	if _, ok := s.eng.(*proxy.Engine); ok && p.dialect != apireq.Chat && p.dialect != apireq.Completions {
		// The context phase of a Messages or Responses request through a
		// proxy: its emulation (the first token) asks the upstream's chat
		// completions for the same conversation, the chat form.
		path = "/v1/chat/completions"
		if raw, _ = json.Marshal(p.req.Chat); raw == nil {
			raw = p.sanitizedBody
		}
	}
	req := engine.Request{
		ID:           x.id,
		Rank:         d.Rank,
		Model:        p.model,
		Prompt:       p.prompt,
		MaxTokens:    p.maxTokens,
		Phase:        p.phase,
		ContextState: p.contextState,
		Raw:          raw,
		Path:         path,
		Output:       p.output,
		Adapter:      x.adapter,
	}
	s.sched.Start(&d.Ticket)
	emit := func(engine.Chunk) error { return nil }
	if p.stream {
		emit = x.ans.emit
	}
	comp, err := s.eng.Run(ctx, req, emit)
	if err != nil {
		return x.engineFailed(err), phase
	}
	s.metrics.promptTokens.WithLabelValues(strconv.Itoa(d.Rank)).Add(float64(comp.PromptTokens))
	s.metrics.cachedTokens.WithLabelValues(strconv.Itoa(d.Rank)).Add(float64(comp.CachedTokens))
	x.span.SetAttributes(
		attribute.Int("tether.cached_tokens", comp.CachedTokens),
		attribute.Int("tether.completion_tokens", comp.CompletionTokens),
		attribute.Int("tether.transfer_tokens", comp.TransferTokens),
	)
	if p.stream {
		return x.ans.finish(comp), phase
	}
	return x.ans.respond(comp), phase
}

// placeRequest is what the rank scheduler places x's request by: its
// conversation (or a continued response's chain) and sub-agent affinity
// (without either, its prompt, which may continue a recent one's),
// the rank the log recorded, the prompt's cached prefix per rank and the
// ranks holding its adapter.
func (x *exchange) placeRequest() adp.Request {
	s, p, adapter := x.s, x.p, x.adapter
	placeReq := adp.Request{ConversationID: p.conversationID, AffinityID: x.affinity, PromptTokens: len(p.prompt)}
	if placeReq.ConversationID == "" {
		placeReq.ConversationID = x.chain
	}
	if !p.dialect.HasConversation() {
		// Spec: /v1/completions supports instance affinity only (the edge
		// routes it by conversation); ranks are chosen by the placement
		// policy, without conversation or sub-agent bindings.
		placeReq.ConversationID, placeReq.AffinityID = "", ""
	} else if placeReq.ConversationID == "" && placeReq.AffinityID == "" {
		// No key: a prompt continuing a recent one follows its rank.
		placeReq.Prompt = p.prompt
	}
	if v := x.r.Header.Get(HeaderLogRank); v != "" && placeReq.ConversationID+placeReq.AffinityID != "" {
		if r, err := strconv.Atoi(v); err == nil && r >= 0 {
			placeReq.LogRank, placeReq.HasLogRank = r, true
		}
	}
	if rp, ok := s.eng.(engine.RankPrefixer); ok && s.sched.Placement() == adp.KVAware && adapter == "" {
		placeReq.CachedTokens = rp.CachedPrefix(p.prompt)
	}
	if ah, ok := s.eng.(engine.AdapterHolder); ok && adapter != "" {
		placeReq.AdapterRanks = ah.AdapterRanks(adapter) // prefer a rank holding it
	}
	return placeReq
}

func (x *exchange) usage(c engine.Completion) *usage {
	prompt := c.PromptTokens
	if prompt == 0 {
		prompt = len(x.p.prompt)
	}
	return &usage{
		PromptTokens:        prompt,
		CompletionTokens:    c.CompletionTokens,
		TotalTokens:         prompt + c.CompletionTokens,
		PromptTokensDetails: promptTokensDetails{CachedTokens: c.CachedTokens},
	}
}

func (x *exchange) object(chunk bool) string {
	switch {
	case x.chat && chunk:
		return "chat.completion.chunk"
	case x.chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (x *exchange) choice(text *string, finish *string, delta bool) chatChoice {
	c := chatChoice{FinishReason: finish}
	switch {
	case !x.chat:
		if text == nil {
			empty := ""
			text = &empty
		}
		c.Text = text
	case delta:
		c.Delta = &chatOutput{Content: text}
	default:
		c.Message = &chatOutput{Role: "assistant", Content: text}
	}
	return c
}

// respond writes a non-streaming response.
func (x *exchange) respond(c engine.Completion) int {
	seq := x.seq
	finish := c.FinishReason
	text := c.Text
	choice := x.choice(&text, &finish, false)
	if x.chat && len(c.ToolCalls) > 0 {
		choice.Message = &chatOutput{Role: "assistant", nullContent: true}
		for _, tc := range c.ToolCalls {
			choice.Message.ToolCalls = append(choice.Message.ToolCalls, toolCallJSON{
				ID: tc.ID, Type: "function", Function: toolFunctionJSON{Name: tc.Name, Arguments: tc.Arguments},
			})
		}
	}
	resp := completionResponse{
		ID:      x.id,
		Object:  x.object(false),
		Created: x.created,
		Model:   x.p.model,
		Choices: []chatChoice{choice},
		Usage:   x.usage(c),
	}
	if x.p.phase == engine.PhaseContextOnly {
		ctxID := x.p.disagg.CtxRequestID
		if !ctxID.set() {
			ctxID = flexID{raw: strconv.AppendUint(nil, seq, 10), text: strconv.FormatUint(seq, 10)}
		}
		first := prefix.Tokenize(c.Text)
		firstIDs := make([]int64, len(first))
		for i, t := range first {
			firstIDs[i] = int64(t)
		}
		resp.Choices[0].DisaggregatedParams = &disaggResponse{
			RequestType:        "context_only",
			CtxRequestID:       ctxID,
			DisaggRequestID:    x.p.disagg.DisaggRequestID,
			EncodedOpaqueState: base64.StdEncoding.EncodeToString(c.ContextState),
			FirstGenTokens:     firstIDs,
		}
		resp.PromptTokenIDs = x.p.prompt
	}
	x.extendDeadline()
	writeJSON(x.w, http.StatusOK, resp)
	return http.StatusOK
}

func (x *exchange) extendDeadline() {
	_ = http.NewResponseController(x.w).SetWriteDeadline(time.Now().Add(x.s.cfg.WriteTimeout))
}

// sendEvent writes one unnamed SSE event (chat, completions) and flushes it.
func (x *exchange) sendEvent(v any) error { return x.sendNamed("", v) }

// sendNamed writes one SSE event, named when name is not "" (Messages,
// Responses), and flushes it; v is a value to encode or raw JSON bytes.
func (x *exchange) sendNamed(name string, v any) error {
	if x.writeErr != nil {
		return x.writeErr
	}
	if name != "" && !x.headerSent {
		x.sendHeaders()
	}
	var data []byte
	if raw, ok := v.([]byte); ok {
		data = raw
	} else {
		var err error
		if data, err = json.Marshal(v); err != nil {
			x.writeErr = err
			return err
		}
	}
	x.extendDeadline()
	buf := make([]byte, 0, len(data)+len(name)+16)
	if name != "" {
		buf = append(append(append(buf, "event: "...), name...), '\n')
	}
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := x.w.Write(buf); err != nil {
		x.writeErr = err
		return err
	}
	if err := http.NewResponseController(x.w).Flush(); err != nil {
		x.writeErr = err
		return err
	}
	return nil
}

// startStream sends the SSE headers and, for chat, the role chunk; when
// the answer starts with a tool call, that chunk carries its first piece
// (as OpenAI streams it) and first reports true.
func (x *exchange) startStream(first *engine.Chunk) (bool, error) {
	if x.headerSent {
		return false, x.writeErr
	}
	if x.chat && first != nil && first.ToolCall != nil {
		x.sendHeaders()
		delta := &chatOutput{Role: "assistant", nullContent: true, ToolCalls: []toolCallJSON{toolCallDelta(*first)}}
		return true, x.sendEvent(completionResponse{
			ID: x.id, Object: x.object(true), Created: x.created, Model: x.p.model,
			Choices: []chatChoice{{Delta: delta}},
		})
	}
	return false, x.startTextStream()
}

// toolCallDelta is a tool call piece as a stream delta.
func toolCallDelta(c engine.Chunk) toolCallJSON {
	i := c.ToolIndex
	d := toolCallJSON{Index: &i, Function: toolFunctionJSON{Name: c.ToolCall.Name, Arguments: c.ToolCall.Arguments}}
	if c.ToolCall.ID != "" {
		d.ID, d.Type = c.ToolCall.ID, "function"
	}
	return d
}

func (x *exchange) sendHeaders() {
	x.headerSent = true
	h := x.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	x.w.WriteHeader(http.StatusOK)
}

func (x *exchange) startTextStream() error {
	if x.headerSent {
		return x.writeErr
	}
	x.sendHeaders()
	if x.chat {
		empty := ""
		return x.sendEvent(completionResponse{
			ID: x.id, Object: x.object(true), Created: x.created, Model: x.p.model,
			Choices: []chatChoice{{Delta: &chatOutput{Role: "assistant", Content: &empty}}},
		})
	}
	return x.writeErr
}

func (x *exchange) emitChunk(c engine.Chunk) error {
	sent, err := x.startStream(&c)
	if err != nil || sent {
		return err
	}
	if c.ToolCall != nil && x.chat {
		return x.sendEvent(completionResponse{
			ID: x.id, Object: x.object(true), Created: x.created, Model: x.p.model,
			Choices: []chatChoice{{Delta: &chatOutput{ToolCalls: []toolCallJSON{toolCallDelta(c)}}}},
		})
	}
	if c.Text == "" {
		return nil
	}
	text := c.Text
	return x.sendEvent(completionResponse{
		ID: x.id, Object: x.object(true), Created: x.created, Model: x.p.model,
		Choices: []chatChoice{x.choice(&text, nil, true)},
	})
}

func (x *exchange) finishStream(c engine.Completion) int {
	if _, err := x.startStream(nil); err != nil {
		return statusClientClosed
	}
	finish := c.FinishReason
	var events []any
	events = append(events, completionResponse{
		ID: x.id, Object: x.object(true), Created: x.created, Model: x.p.model,
		Choices: []chatChoice{x.choice(nil, &finish, true)},
	})
	if x.p.includeUsage {
		events = append(events, completionResponse{
			ID: x.id, Object: x.object(true), Created: x.created, Model: x.p.model,
			Choices: []chatChoice{}, Usage: x.usage(c),
		})
	}
	events = append(events, []byte("[DONE]"))
	for _, ev := range events {
		if err := x.sendEvent(ev); err != nil {
			return statusClientClosed
		}
	}
	return http.StatusOK
}

// engineFailed answers an engine error: as an HTTP error if nothing was
// streamed yet, else as an SSE error event.
func (x *exchange) engineFailed(err error) int {
	s := x.s
	var e *apiError
	var ue *proxy.UpstreamError
	switch {
	case x.r.Context().Err() != nil && s.baseCtx.Err() == nil, x.writeErr != nil:
		// The client went away; nobody is listening.
		x.span.SetAttributes(attribute.String("tether.error", "client closed request"))
		return statusClientClosed
	case errors.Is(err, sim.ErrClosed), s.baseCtx.Err() != nil:
		e = newAPIError(http.StatusServiceUnavailable, "server_error", "shutting_down", "", "worker is shutting down")
	case errors.Is(err, sim.ErrPromptTooLarge):
		param := "prompt"
		if x.chat {
			param = "messages"
		}
		e = newAPIError(http.StatusBadRequest, "invalid_request_error", "context_length_exceeded", param, "%v", err)
	case errors.Is(err, sim.ErrInvalidRequest):
		e = badRequest("", "%v", err)
	case errors.As(err, &ue):
		status := http.StatusBadGateway
		if ue.Status >= 400 && ue.Status < 500 {
			status = ue.Status
		}
		e = newAPIError(status, "upstream_error", "upstream_error", "", "%v", err)
	default:
		s.log.Error("engine run failed", "id", x.id, "err", err)
		e = newAPIError(http.StatusInternalServerError, "server_error", "engine_error", "", "engine error: %v", err)
	}
	if !x.headerSent {
		return x.fail(e)
	}
	x.span.SetAttributes(attribute.String("tether.error", e.Message))
	if x.ans.streamError(e) != nil {
		return statusClientClosed
	}
	return e.Status
}

// inflightBodyBytes is max_inflight_body_bytes, defaulted.
func (c *Config) inflightBodyBytes() int64 {
	if c.MaxInflightBodyBytes > 0 {
		return c.MaxInflightBodyBytes
	}
	return max(DefaultMaxInflightBodyBytes, c.MaxBodyBytes)
}

// readBody reads at most max_body_bytes (413 beyond), held against
// max_inflight_body_bytes until release (429 with Retry-After when the
// budget is exhausted: many concurrent large bodies must not take the
// process's memory).
func (s *Server) readBody(r *http.Request) ([]byte, func(), *apiError) {
	limit := s.cfg.MaxBodyBytes
	body, release, err := s.bodies.Read(r.Body, r.ContentLength, limit)
	switch {
	case err == nil:
		return body, release, nil
	case errors.Is(err, bodybudget.ErrTooLarge):
		if r.ContentLength > limit {
			return nil, nil, newAPIError(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "", "request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, limit)
		}
		return nil, nil, newAPIError(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "", "request body exceeds the limit of %d bytes", limit)
	case errors.Is(err, bodybudget.ErrExceeded):
		return nil, nil, newAPIError(http.StatusTooManyRequests, "rate_limit_error", "request_body_budget_exhausted", "",
			"this worker holds its limit of %d request-body bytes in flight (max_inflight_body_bytes); retry after 1s", s.bodies.Limit())
	}
	return nil, nil, badRequest("", "reading request body: %v", err)
}
