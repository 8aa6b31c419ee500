package dispatch

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/fsm"
)

// SGLang's prefill/decode split, driven as its router drives it
// (sgl-router src/routers/http/pd_router.rs execute_dual_dispatch; the
// bootstrap fields and ranks are edge/disagg's): the edge picks the
// prefill and the decode server (each its fleet's decision) and sends both
// the client's request at once. The decode's answer is relayed; the
// prefill's is read only for its usage, which says what the prefill found
// cached. Unlike the router, the edge asks the prefill for a non-streamed
// answer (it has one token and its usage) and, when either request fails
// before the client saw any output, cancels the other and sends both again
// with a new room: the prefill to another server when it did not answer or
// its bootstrap server is gone (the check a decode's heartbeat makes, GET
// /health), else the decode to another server.

// sglangBootstrap is the bootstrap fields for a request going to prefill
// instance h: one set, or arrays of batch sets.
func (e *Dispatcher) sglangBootstrap(h *route.Hop, batch, rank int) map[string]json.RawMessage {
	return disagg.SGLangBootstrap(h.URL, e.catalogue.BootstrapPort(h.Instance), e.cfg.DataParallelSize(fsm.FleetContext), batch, rank)
}

// sglangPrefillResult is the prefill request's outcome.
type sglangPrefillResult struct {
	pdAttempt
	usage disagg.Usage
}

func (e *Dispatcher) dispatchSGLangPD(ctx context.Context, w http.ResponseWriter, rq *route.Request, span trace.Span) int {
	ctxHop, aerr := e.router.Route(ctx, rq, fsm.FleetContext, nil)
	if aerr != nil {
		return api.Fail(w, span, aerr)
	}
	rq.Now = e.now()
	genHop, aerr := e.router.Route(ctx, rq, fsm.FleetGeneration, nil)
	if aerr != nil {
		return api.Fail(w, span, aerr)
	}
	retries := e.cfg.MaxRetries
	batch := disagg.Batch(rq.Top, rq.Dialect)
	for attempt := 0; ; attempt++ {
		r := e.sglangSend(ctx, rq, ctxHop, genHop, batch, attempt, span)
		pre, dec := r.pre, r.dec
		if dec != nil && dec.fail == nil {
			// The decode has the KV (its first output is in): the
			// prefill's answer, with its usage, follows the transfer.
			if pre == nil {
				pre = e.awaitPrefill(r.pch)
			}
			cached := -1
			if pre != nil && pre.fail == nil {
				cached = e.prefilled(rq, ctxHop, r.pRank, pre.usage)
			}
			defer r.cancel()
			defer dec.done()
			return e.relayDecode(w, rq, dec.resp, ctxHop, r.pRank, cached, genHop, r.dRank, span)
		}
		// One of them failed before the client saw any output: stop the
		// other, and retry the pair with a new room.
		r.cancel()
		decodeFirst, prefillBefore := dec != nil, pre != nil
		if pre == nil {
			p := <-r.pch
			pre = &p
		}
		if dec == nil {
			d := <-r.dch
			dec = &d
		}
		if dec.fail == nil {
			dec.resp.Body.Close()
			dec.done()
		}
		failure, move := e.sglangBlame(ctx, &ctxHop, &genHop, pre, dec, decodeFirst, prefillBefore)
		if move == nil || !e.pdRetry(ctx, rq, move, &retries) {
			return failure.write(w, span)
		}
	}
}

// sglangRound is one attempt of an SGLang pair: the ranks of its hops, the
// answers as they come (pre, dec: nil until they do), and the cancellation
// of both requests.
type sglangRound struct {
	pRank, dRank int
	pch          chan sglangPrefillResult
	dch          chan pdAttempt
	cancel       context.CancelFunc
	pre          *sglangPrefillResult
	dec          *pdAttempt
}

// sglangSend sends attempt's pair (the prefill to ctxHop with its
// bootstrap fields and a new room, the decode to genHop) at once and waits
// until the decode streams or either fails.
func (e *Dispatcher) sglangSend(ctx context.Context, rq *route.Request, ctxHop, genHop *route.Hop, batch, attempt int, span trace.Span) *sglangRound {
	r := &sglangRound{pRank: hopRank(rq.Model.Cfg, ctxHop, fsm.FleetContext), dRank: hopRank(rq.Model.Cfg, genHop, fsm.FleetGeneration),
		pch: make(chan sglangPrefillResult, 1), dch: make(chan pdAttempt, 1)}
	boot := e.sglangBootstrap(ctxHop, batch, r.pRank)
	pf, df := disagg.SGLangHopFields(boot, r.pRank, r.dRank)
	pbody := rq.HopBody(pf.Set, pf.Del...)
	dbody := rq.HopBody(df.Set, df.Del...)
	id := rq.RequestID + "-" + strconv.Itoa(attempt)
	span.SetAttributes(attribute.String("tether.bootstrap_room", string(boot["bootstrap_room"])))

	actx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	go func(h *route.Hop) { r.pch <- e.sglangPrefillHop(actx, rq, h, pbody, id) }(ctxHop)
	go func(h *route.Hop) { r.dch <- e.decodeSend(actx, rq, h, dbody, disagg.Header(id, r.dRank)) }(genHop)
	for r.dec == nil && (r.pre == nil || r.pre.fail == nil) {
		select {
		case p := <-r.pch:
			r.pre = &p
		case d := <-r.dch:
			r.dec = &d
		}
	}
	return r
}

// awaitPrefill waits briefly for the prefill's answer once the decode
// streams: SGLang's prefill request finishes when its KV is sent, which is
// before the decode's first token; an answer that takes longer is not
// waited for (its usage is then not known).
func (e *Dispatcher) awaitPrefill(pch <-chan sglangPrefillResult) *sglangPrefillResult {
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case p := <-pch:
		return &p
	case <-t.C:
		return nil
	}
}

// sglangBlame decides which hop a failed attempt moves to another
// instance: the prefill when it failed first, or failed before the decode
// did, or its bootstrap server no longer answers (the decode could not
// reach it); the decode when it did not answer or failed with the
// prefill's bootstrap server alive; none for the client's own errors (4xx)
// and cancellation. The failure is the one the client gets if no retry is
// left.
func (e *Dispatcher) sglangBlame(ctx context.Context, ctxHop, genHop **route.Hop, pre *sglangPrefillResult, dec *pdAttempt, decodeFirst, prefillBefore bool) (*hopFailure, **route.Hop) {
	if !decodeFirst {
		if !pre.retryable() {
			return pre.fail, nil
		}
		return pre.fail, ctxHop
	}
	switch {
	case !dec.retryable():
		return dec.fail, nil
	case prefillBefore && pre.fail != nil && pre.retryable():
		return dec.fail, ctxHop
	case dec.unreachable:
		return dec.fail, genHop
	case ctx.Err() == nil && !disagg.SGLangBootstrapAlive(ctx, (*ctxHop).URL, e.catalogue.BootstrapPort((*ctxHop).Instance)):
		return dec.fail, ctxHop
	}
	return dec.fail, genHop
}

// sglangPrefillHop sends the prefill request and reads its answer's usage.
func (e *Dispatcher) sglangPrefillHop(ctx context.Context, rq *route.Request, h *route.Hop, body []byte, id string) sglangPrefillResult {
	a := e.pdSend(ctx, rq, h, "prefill", body, disagg.Header(id, -1))
	res := sglangPrefillResult{pdAttempt: a}
	if a.fail != nil {
		return res
	}
	b, err := io.ReadAll(io.LimitReader(a.resp.Body, api.MaxUpstreamBody))
	a.resp.Body.Close()
	a.done()
	res.resp = nil
	if err != nil {
		res.unreachable = true
		res.fail = &hopFailure{err: api.NewError(http.StatusBadGateway, "server_error", "upstream_unavailable", "",
			"prefill instance %s failed: %v", h.Instance, err)}
		return res
	}
	res.usage = disagg.ReadUsage(b)
	return res
}
