package dispatch

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/fsm"
)

// vLLM's prefill/decode split through a KV connector (the NixlConnector),
// driven as vLLM's own proxy drives it
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, and the
// nixlv2 connector of llm-d's routing sidecar); the handoff itself (the
// prefill's fields, its answer, the decode's fields) is edge/disagg's. The
// Messages and Responses APIs go to both servers in their own API, as
// SGLang's gateway sends them (disagg agentapis.go); their answer always
// comes from the decode server.
//
// Retries: a prefill that fails (no answer, 5xx, an answer without the
// handoff) is sent again, fresh, to another prefill server; a decode
// server that does not answer gets the same handoff on another decode
// server (the blocks wait on the prefill server); a decode that answers
// 5xx, or streams an error before its first token, could not read the
// blocks (the prefill server died, or its blocks were freed): the prompt
// is prefilled again on another prefill server and handed to the same
// decode server.

func (e *Dispatcher) dispatchVLLMPD(ctx context.Context, w http.ResponseWriter, rq *route.Request, span trace.Span) int {
	d, ok := disagg.VLLMHandoff(rq.Path, rq.MaxTokens, rq.Top, rq.Dialect)
	if !ok {
		// Nothing to hand off, or a request the handoff cannot carry:
		// the prefill server answers it whole.
		span.SetAttributes(attribute.Bool("tether.context_only", true))
		for _, f := range disagg.VLLMOwnedFields {
			delete(rq.Top, f)
		}
		h, aerr := e.router.Route(ctx, rq, fsm.FleetContext, nil)
		if aerr != nil {
			return api.Fail(w, span, aerr)
		}
		return e.engineExchange(ctx, w, rq, h, span)
	}
	ctxHop, aerr := e.router.Route(ctx, rq, fsm.FleetContext, nil)
	if aerr != nil {
		return api.Fail(w, span, aerr)
	}
	retries := e.cfg.MaxRetries
	var genHop *route.Hop
	for round := 0; ; round++ {
		pre, hf := e.vllmPrefillHop(ctx, rq, d, &ctxHop, &retries, round)
		if hf != nil {
			return hf.write(w, span)
		}
		cached := e.prefilled(rq, ctxHop, pre.Rank, pre.Answer.Usage)
		if pre.Relayed(rq.Top) {
			return e.vllmAnswerFromPrefill(w, rq, ctxHop, pre, cached)
		}
		if pre.Params == nil && !pre.Finished {
			// (An agent API of a release that carries no handoff on it.)
			span.AddEvent("tether.no_handoff", trace.WithAttributes(observe.AttrInstance.String(ctxHop.Instance)))
			if _, warned := e.noHandoff.LoadOrStore(ctxHop.Instance+" "+rq.Path, true); !warned {
				e.log.Warn("the prefill server handed nothing off: the decode server computes such requests whole (a vLLM release whose API predates kv_transfer_params?)",
					"instance", ctxHop.Instance, "path", rq.Path)
			}
		}
		if genHop == nil {
			rq.Now = e.now()
			if genHop, aerr = e.router.Route(ctx, rq, fsm.FleetGeneration, nil); aerr != nil {
				return api.Fail(w, span, aerr)
			}
		}
		a, rank := e.vllmDecodeHop(ctx, rq, pre, &genHop, &retries)
		if a.fail == nil {
			defer a.done()
			return e.relayDecode(w, rq, a.resp, ctxHop, pre.Rank, cached, genHop, rank, span)
		}
		if !a.lost {
			return a.fail.write(w, span)
		}
		// The decode server could not read the blocks: prefill again,
		// elsewhere (the prefill server that held them is the suspect).
		e.metrics.UpstreamErrors.WithLabelValues(fsm.FleetGeneration.String(), "transfer_lost").Inc()
		span.AddEvent("tether.kv_transfer_lost", trace.WithAttributes(observe.AttrInstance.String(ctxHop.Instance)))
		if !e.pdRetry(ctx, rq, &ctxHop, &retries) {
			return a.fail.write(w, span)
		}
	}
}

// vllmPrefillHop sends the prefill request and verifies its answer, each
// retry a fresh prefill (a new request id) on another prefill server.
func (e *Dispatcher) vllmPrefillHop(ctx context.Context, rq *route.Request, d disagg.Dialect, h **route.Hop, retries *int, round int) (*disagg.VLLMPrefill, *hopFailure) {
	f := disagg.VLLMPrefillFields(d, rq.Top)
	body := rq.HopBody(f.Set, f.Del...)
	for attempt := 0; ; attempt++ {
		cur := *h
		rank := hopRank(rq.Model.Cfg, cur, fsm.FleetContext)
		id := fmt.Sprintf("%s-%d-%d", rq.RequestID, round, attempt)
		a := e.pdSend(ctx, rq, cur, "prefill", body, disagg.Header(id, rank))
		failure := a.fail
		if failure == nil {
			pre, err := disagg.ReadVLLMPrefill(a.resp, api.MaxUpstreamBody, d)
			a.done()
			if err == nil {
				pre.Rank, pre.ID = rank, id
				return pre, nil
			}
			e.metrics.UpstreamErrors.WithLabelValues(fsm.FleetContext.String(), "bad_response").Inc()
			failure = &hopFailure{err: api.NewError(http.StatusBadGateway, "server_error", "bad_upstream_response", "",
				"prefill instance %s answered an unusable prefill: %v", cur.Instance, err)}
		} else if !a.retryable() {
			return nil, failure
		}
		if !e.pdRetry(ctx, rq, h, retries) {
			return nil, failure
		}
	}
}

// vllmAnswerFromPrefill answers with the prefill's own result: the model
// stopped on the one token the prefill generated, and the server handed
// nothing off (disagg.VLLMPrefill.Relayed).
func (e *Dispatcher) vllmAnswerFromPrefill(w http.ResponseWriter, rq *route.Request, h *route.Hop, pre *disagg.VLLMPrefill, cached int) int {
	cres := &contextResult{raw: pre.Answer.Raw, text: pre.Answer.Text, finish: pre.Answer.Finish}
	if pre.Rank >= 0 {
		cres.rank = strconv.Itoa(pre.Rank)
	}
	if cached >= 0 {
		cres.raw["usage"] = disagg.PatchUsageCached(cres.raw["usage"], cached)
	}
	return e.respondFromContext(w, rq, h, cres)
}

// vllmDecodeAttempt is a decode hop's outcome: lost means the decode
// server answered but could not use the handoff.
type vllmDecodeAttempt struct {
	pdAttempt
	lost bool
}

// vllmDecodeHop sends the client's request with the prefill's handoff to
// the decode fleet: a server that does not answer gets the same handoff on
// another decode server; an answer that shows the blocks could not be read
// (5xx, or an error event before the first token of a stream) is lost.
func (e *Dispatcher) vllmDecodeHop(ctx context.Context, rq *route.Request, pre *disagg.VLLMPrefill, h **route.Hop, retries *int) (vllmDecodeAttempt, int) {
	f := pre.DecodeFields()
	body := rq.HopBody(f.Set, f.Del...)
	for {
		cur := *h
		rank := hopRank(rq.Model.Cfg, cur, fsm.FleetGeneration)
		a := vllmDecodeAttempt{pdAttempt: e.decodeSend(ctx, rq, cur, body, disagg.Header(pre.ID, rank))}
		switch {
		case a.fail == nil:
			return a, rank
		case a.unreachable:
			if e.pdRetry(ctx, rq, h, retries) {
				continue
			}
		case a.status >= 500:
			a.lost = true
		}
		return a, rank
	}
}
