package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/httpjson"
)

// contextResult is the context (prefill) phase's answer as the relay and
// the answer from the context read it.
type contextResult struct {
	raw          map[string]json.RawMessage
	text         string
	finish       string
	promptTokens int
	cachedTokens int
	hasCached    bool // usage.prompt_tokens_details was there
	// nullCached: the context phase reported no cached tokens, and the
	// final response reports none either (prompt_tokens_details null):
	// the generation worker's figure counts tokens it received, not
	// tokens that were not recomputed.
	nullCached bool
	rank       string
	// trt is trtllm-serve's verified context answer, with its handoff
	// (nil: another engine's prefill).
	trt *disagg.TRTLLMContext
}

// Dispatch sends rq's hops in its model's engines' flow (within
// upstream_timeout) and relays the answer to w; it returns the answer's
// status.
func (e *Dispatcher) Dispatch(ctx context.Context, w http.ResponseWriter, rq *route.Request, span trace.Span) int {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.UpstreamTimeout)
	defer cancel()
	switch {
	case rq.Pinned() != nil:
		return e.dispatchStored(ctx, w, rq, span) // stored.go
	case rq.Model.Cfg.Aggregated():
		return e.dispatchEngine(ctx, w, rq, span) // vLLM, SGLang (engines.go)
	case rq.Model.Cfg.PDEngine() != "":
		return e.dispatchPD(ctx, w, rq, span) // vLLM, SGLang prefill/decode (pd.go)
	}
	return e.dispatchDisagg(ctx, w, rq, span)
}

// dispatchDisagg runs the disaggregated flow of tether workers and
// trtllm-serve: context hop (unless conditional disaggregation skips it)
// then generation hop, streaming the answer back.
func (e *Dispatcher) dispatchDisagg(ctx context.Context, w http.ResponseWriter, rq *route.Request, span trace.Span) int {
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
	e.edge.Fleet().RecordUsage(ctxHop.Instance, int64(cres.promptTokens), int64(cres.cachedTokens), e.now())
	e.shadowRoute(rq, ctxHop, -1)
	if cres.hasCached {
		e.shadowCorrect(rq, ctxHop, cres.cachedTokens)
		e.grade(rq, ctxHop, cres.promptTokens, cres.cachedTokens)
	}
	e.observeRank(rq, ctxHop, hintauth.RoleContext, cres.rank)
	if !cres.trt.NeedsGeneration(rq.MaxTokens) && (rq.Dialect == apireq.Chat || rq.Dialect == apireq.Completions) {
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

// contextHop runs the prefill on the context worker and verifies its
// answer. Each attempt gets a fresh disaggregated request id (and so a
// fresh signature).
func (e *Dispatcher) contextHop(ctx context.Context, rq *route.Request, h **route.Hop) (*contextResult, *hopFailure) {
	for attempt := 0; ; attempt++ {
		var disaggID uint64
		resp, done, hf := e.exchange(ctx, rq, h, "context", func(cur *route.Hop) ([]byte, http.Header) {
			disaggID = e.newDisaggID()
			id := strconv.FormatUint(disaggID, 10)
			f := disagg.TRTLLMContextFields(disaggID)
			body := rq.HopBody(f.Set, f.Del...)
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

// readContextResult reads a context_only answer and checks it as
// TensorRT-LLM's disaggregated server does (disagg.ReadTRTLLMContext).
func readContextResult(resp *http.Response, disaggID uint64) (*contextResult, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, api.MaxUpstreamBody))
	if err != nil {
		return nil, fmt.Errorf("reading the response: %w", err)
	}
	trt, err := disagg.ReadTRTLLMContext(b, disaggID)
	if err != nil {
		return nil, err
	}
	return &contextResult{raw: trt.Raw, text: trt.Text, finish: trt.Finish, promptTokens: trt.PromptTokens, cachedTokens: trt.CachedTokens,
		hasCached: trt.HasCached, rank: resp.Header.Get(api.HeaderADPRank), trt: trt}, nil
}

// generationBody is the generation hop's body (the handoff's fields,
// disagg.TRTLLMContext.GenerationFields) and the disaggregated_params it
// sends (what x-trtllm-disagg-auth signs; nil for a worker predating the
// protocol).
func generationBody(rq *route.Request, cres *contextResult) (body []byte, params map[string]json.RawMessage) {
	f, params := cres.trt.GenerationFields(rq.Dialect.HasConversation())
	return rq.HopBody(f.Set, f.Del...), params
}

// generationHop continues on the generation worker with the context's
// state. A retry keeps the disaggregated request id (the state is bound to
// it).
func (e *Dispatcher) generationHop(ctx context.Context, w http.ResponseWriter, rq *route.Request, ctxHop *route.Hop, cres *contextResult, genHop *route.Hop, span trace.Span) int {
	id := strconv.FormatUint(cres.trt.DisaggID, 10)
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
	e.observeRank(rq, genHop, hintauth.RoleGeneration, resp.Header.Get(api.HeaderADPRank))
	return e.relay(w, rq, resp, ctxHop, cres, genHop, span)
}

// aggregated sends the whole request to the generation worker (conditional
// disaggregation: it already holds enough of the prompt).
func (e *Dispatcher) aggregated(ctx context.Context, w http.ResponseWriter, rq *route.Request, genHop *route.Hop, span trace.Span) int {
	resp, done, hf := e.exchange(ctx, rq, &genHop, "aggregated", func(cur *route.Hop) ([]byte, http.Header) {
		role := hintauth.Role("")
		if in, ok := e.edge.Fleet().Instance(cur.Instance, rq.Now); ok {
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
	if in, ok := e.edge.Fleet().Instance(genHop.Instance, rq.Now); ok {
		e.observeRank(rq, genHop, hintauth.Role(in.Role), resp.Header.Get(api.HeaderADPRank))
	}
	return e.relay(w, rq, resp, nil, nil, genHop, span)
}

// respondFromContext answers with the context phase's result when it is
// already complete (max_tokens 1, or the model stopped): as JSON, or as an
// SSE stream in the OpenAI chunk format.
func (e *Dispatcher) respondFromContext(w http.ResponseWriter, rq *route.Request, ctxHop *route.Hop, cres *contextResult) int {
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
