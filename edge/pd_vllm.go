package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/fsm"
)

// vLLM's prefill/decode split through a KV connector (the NixlConnector,
// vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py), driven
// as vLLM's own proxy drives it
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, and the
// nixlv2 connector of llm-d's routing sidecar):
//
//  1. the prefill server gets the request for one token, not streamed,
//     with kv_transfer_params {do_remote_decode: true, do_remote_prefill:
//     false, remote_*: null}; it computes the prompt and keeps its blocks
//     (for VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s);
//  2. its answer's kv_transfer_params (do_remote_prefill true,
//     remote_block_ids, remote_engine_id, remote_request_id, remote_host,
//     remote_port, tp_size: NixlConnectorScheduler.request_finished) go,
//     as the server wrote them, into the client's request to the decode
//     server, which reads the blocks and generates; its answer (streamed or
//     not) is relayed.
//
// Both hops carry the same X-Request-Id and each the X-Data-Parallel-Rank
// of its key. Retries: a prefill that fails (no answer, 5xx, an answer
// without the handoff) is sent again, fresh, to another prefill server; a
// decode server that does not answer gets the same handoff on another
// decode server (the blocks wait on the prefill server); a decode that
// answers 5xx, or streams an error before its first token, could not read
// the blocks (the prefill server died, or its blocks were freed): the
// prompt is prefilled again on another prefill server and handed to the
// same decode server.

// nixlPrefillParams is the prefill request's kv_transfer_params.
var nixlPrefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// vllmPDFields are what a client may not send (the edge owns the handoff).
var vllmPDFields = []string{"kv_transfer_params"}

// vllmPrefill is a prefill hop's verified answer.
type vllmPrefill struct {
	answer *pdAnswer
	// params is the answer's kv_transfer_params, for the decode.
	params json.RawMessage
	// finished: the prefill's one token ended the request (EOS: vLLM
	// hands nothing off): the answer is the client's.
	finished bool
	rank     int
	id       string // the X-Request-Id both hops carry
}

func (e *Edge) dispatchVLLMPD(ctx context.Context, w http.ResponseWriter, rq *request, span trace.Span) int {
	d, ok := pdDialects[rq.path]
	if !ok || rq.maxTokens == 1 || pdBatch(rq) > 0 {
		// Nothing to hand off (one token is all prefill), or a request
		// the handoff cannot carry: a KV handoff has one consumer, and
		// n > 1 or a batch of prompts would have several pull (or
		// free) the same blocks. The prefill server answers it whole.
		span.SetAttributes(attribute.Bool("tether.context_only", true))
		for _, f := range vllmPDFields {
			delete(rq.top, f)
		}
		return e.dispatchEngine(ctx, w, rq, span)
	}
	ctxHop, aerr := e.routeFleet(ctx, rq, fsm.FleetContext, nil)
	if aerr != nil {
		return fail(w, span, aerr)
	}
	retries := e.cfg.MaxRetries
	var genHop *hop
	for round := 0; ; round++ {
		pre, hf := e.vllmPrefillHop(ctx, rq, d, &ctxHop, &retries, round)
		if hf != nil {
			return hf.write(w, span)
		}
		cached := e.prefilled(rq, ctxHop, pre.rank, pre.answer.usage)
		if pre.finished {
			return e.vllmAnswerFromPrefill(w, rq, ctxHop, pre, cached)
		}
		if genHop == nil {
			rq.now = e.now()
			if genHop, aerr = e.routeFleet(ctx, rq, fsm.FleetGeneration, nil); aerr != nil {
				return fail(w, span, aerr)
			}
		}
		a, rank := e.vllmDecodeHop(ctx, rq, pre, &genHop, &retries)
		if a.fail == nil {
			defer a.done()
			return e.relayDecode(w, rq, a.resp, ctxHop, pre.rank, cached, genHop, rank, span)
		}
		if !a.lost {
			return a.fail.write(w, span)
		}
		// The decode server could not read the blocks: prefill again,
		// elsewhere (the prefill server that held them is the suspect).
		e.metrics.upstreamErrors.WithLabelValues(fsm.FleetGeneration.String(), "transfer_lost").Inc()
		span.AddEvent("tether.kv_transfer_lost", trace.WithAttributes(attrInstance.String(ctxHop.Instance)))
		if !e.pdRetry(ctx, rq, &ctxHop, &retries) {
			return a.fail.write(w, span)
		}
	}
}

// vllmPrefillHop sends the prefill request and verifies its answer, each
// retry a fresh prefill (a new request id) on another prefill server.
func (e *Edge) vllmPrefillHop(ctx context.Context, rq *request, d pdDialect, h **hop, retries *int, round int) (*vllmPrefill, *hopFailure) {
	set, del := d.prefillFields(rq)
	set["kv_transfer_params"] = nixlPrefillParams
	body := rq.hopBody(set, del...)
	for attempt := 0; ; attempt++ {
		cur := *h
		rank := hopRank(rq.m.cfg, cur, fsm.FleetContext)
		id := fmt.Sprintf("%s-%d-%d", rq.requestID, round, attempt)
		a := e.pdSend(ctx, rq, cur, "prefill", body, pdHeader(id, rank))
		failure := a.fail
		if failure == nil {
			pre, err := readVLLMPrefill(a.resp, d)
			a.done()
			if err == nil {
				pre.rank, pre.id = rank, id
				return pre, nil
			}
			e.metrics.upstreamErrors.WithLabelValues(fsm.FleetContext.String(), "bad_response").Inc()
			failure = &hopFailure{err: newAPIError(http.StatusBadGateway, "server_error", "bad_upstream_response", "",
				"prefill instance %s answered an unusable prefill: %v", cur.Instance, err)}
		} else if !a.retryable() {
			return nil, failure
		}
		if !e.pdRetry(ctx, rq, h, retries) {
			return nil, failure
		}
	}
}

// readVLLMPrefill reads a prefill answer: one choice, and for a request
// still pending (finish_reason length: the one token it was allowed) the
// kv_transfer_params naming its blocks.
func readVLLMPrefill(resp *http.Response, d pdDialect) (*vllmPrefill, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamBody))
	if err != nil {
		return nil, fmt.Errorf("reading the response: %w", err)
	}
	a, err := d.readAnswer(b)
	if err != nil {
		return nil, err
	}
	if a.choices != 1 {
		return nil, fmt.Errorf("%d choices, want 1", a.choices)
	}
	pre := &vllmPrefill{answer: a, params: a.raw["kv_transfer_params"]}
	delete(a.raw, "kv_transfer_params")
	if !finishPending(a.finish) {
		// The model stopped on its first token: request_finished hands
		// nothing off for a request that did not finish length-capped.
		pre.finished = true
		return pre, nil
	}
	var params struct {
		DoRemotePrefill bool `json:"do_remote_prefill"`
	}
	if isNullOrAbsent(pre.params) || json.Unmarshal(pre.params, &params) != nil || !params.DoRemotePrefill {
		return nil, errors.New("no kv_transfer_params with do_remote_prefill: is the server started with --kv-transfer-config (kv_connector NixlConnector, kv_role kv_producer or kv_both)?")
	}
	return pre, nil
}

// vllmAnswerFromPrefill answers with the prefill's own result: the model
// stopped on the one token the prefill generated.
func (e *Edge) vllmAnswerFromPrefill(w http.ResponseWriter, rq *request, h *hop, pre *vllmPrefill, cached int) int {
	cres := &contextResult{raw: pre.answer.raw, text: pre.answer.text, finish: pre.answer.finish}
	if pre.rank >= 0 {
		cres.rank = strconv.Itoa(pre.rank)
	}
	if cached >= 0 {
		cres.raw["usage"] = patchUsageCached(cres.raw["usage"], cached)
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
func (e *Edge) vllmDecodeHop(ctx context.Context, rq *request, pre *vllmPrefill, h **hop, retries *int) (vllmDecodeAttempt, int) {
	body := rq.hopBody(map[string]json.RawMessage{"kv_transfer_params": pre.params})
	for {
		cur := *h
		rank := hopRank(rq.m.cfg, cur, fsm.FleetGeneration)
		a := vllmDecodeAttempt{pdAttempt: e.pdSend(ctx, rq, cur, "decode", body, pdHeader(pre.id, rank))}
		if a.fail == nil && rq.stream {
			if err := peekStream(a.resp); err != nil {
				a.resp.Body.Close()
				a.done()
				a.resp, a.status = nil, http.StatusBadGateway
				a.fail = &hopFailure{err: newAPIError(http.StatusBadGateway, "server_error", "upstream_failed", "",
					"decode instance %s failed the request: %v", cur.Instance, err)}
			}
		}
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

// patchUsageCached sets usage.prompt_tokens_details.cached_tokens.
func patchUsageCached(usage json.RawMessage, cached int) json.RawMessage {
	if isNullOrAbsent(usage) {
		return usage
	}
	b := patchCachedTokens(mustMarshal(map[string]json.RawMessage{"usage": usage}), cached)
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil {
		return usage
	}
	return top["usage"]
}
