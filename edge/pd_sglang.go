package edge

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/fsm"
)

// SGLang's prefill/decode split, driven as its router drives it
// (sgl-router src/routers/http/pd_router.rs execute_dual_dispatch,
// bootstrap_injector.rs inject_bootstrap_fields; the DP-aware gateway adds
// the ranks): the edge picks the prefill and the decode server (each its
// fleet's decision) and sends both the client's request at once, with
//
//	bootstrap_host   the prefill server's host (its URL's),
//	bootstrap_port   its --disaggregation-bootstrap-port (urls[].bootstrap_port),
//	bootstrap_room   a random room in [0, 2^63),
//
// arrays of those for n > 1 or a batch of prompts, one room each; the
// prefill request carries routed_dp_rank (the prefill key's rank), the
// decode request routed_dp_rank (its own key's) and disagg_prefill_dp_rank
// (the prefill's). The room is drawn ≡ the prefill rank modulo the
// prefill's data_parallel_size, so a server that places by the room
// (follow_bootstrap_room, a prefill server's default) and a decode that
// finds the prefill rank by it agree with the rank the edge chose. The
// decode's answer is relayed; the prefill's is read only for its usage,
// which says what the prefill found cached. Unlike the router, the edge
// asks the prefill for a non-streamed answer (it has one token and its
// usage) and, when either request fails before the client saw any output,
// cancels the other and sends both again with a new room: the prefill to
// another server when it did not answer or its bootstrap server is gone
// (the check a decode's heartbeat makes, GET /health), else the decode to
// another server.

// sglangPDFields are what a client may not send (the edge owns the
// rendezvous and the ranks).
var sglangPDFields = []string{"bootstrap_host", "bootstrap_port", "bootstrap_room", "routed_dp_rank", "disagg_prefill_dp_rank", "data_parallel_rank"}

// sglangRoom draws a bootstrap room in [0, 2^63) that is ≡ rank modulo
// size (rank < 0: any room).
func sglangRoom(rank, size int) uint64 {
	r := rand.Uint64() >> 1
	if rank < 0 || size <= 1 {
		return r
	}
	s := uint64(size)
	r = r - r%s + uint64(rank)
	if r >= 1<<63 {
		r -= s
	}
	return r
}

// sglangBootstrap is the bootstrap fields for a request going to prefill
// instance h: one set, or arrays of batch sets.
func (e *Edge) sglangBootstrap(h *hop, batch, rank int) map[string]json.RawMessage {
	host := h.URL
	if u, err := url.Parse(h.URL); err == nil && u.Hostname() != "" {
		host = u.Hostname() // pd_types.rs get_hostname
	}
	port := e.bootstrapPort(h.Instance)
	size := e.cfg.dataParallelSize(fsm.FleetContext)
	if batch == 0 {
		return map[string]json.RawMessage{"bootstrap_host": mustMarshal(host), "bootstrap_port": mustMarshal(port),
			"bootstrap_room": mustMarshal(sglangRoom(rank, size))}
	}
	hosts, ports, rooms := make([]string, batch), make([]int, batch), make([]uint64, batch)
	for i := range batch {
		hosts[i], ports[i], rooms[i] = host, port, sglangRoom(rank, size)
	}
	return map[string]json.RawMessage{"bootstrap_host": mustMarshal(hosts), "bootstrap_port": mustMarshal(ports),
		"bootstrap_room": mustMarshal(rooms)}
}

// sglangPrefillResult is the prefill request's outcome.
type sglangPrefillResult struct {
	pdAttempt
	usage usageFigures
}

func (e *Edge) dispatchSGLangPD(ctx context.Context, w http.ResponseWriter, rq *request, span trace.Span) int {
	ctxHop, aerr := e.routeFleet(ctx, rq, fsm.FleetContext, nil)
	if aerr != nil {
		return fail(w, span, aerr)
	}
	rq.now = e.now()
	genHop, aerr := e.routeFleet(ctx, rq, fsm.FleetGeneration, nil)
	if aerr != nil {
		return fail(w, span, aerr)
	}
	retries := e.cfg.MaxRetries
	batch := pdBatch(rq)
	for attempt := 0; ; attempt++ {
		pRank, dRank := hopRank(rq.m.cfg, ctxHop, fsm.FleetContext), hopRank(rq.m.cfg, genHop, fsm.FleetGeneration)
		boot := e.sglangBootstrap(ctxHop, batch, pRank)
		pset := map[string]json.RawMessage{"stream": json.RawMessage("false")}
		dset := map[string]json.RawMessage{}
		for k, v := range boot {
			pset[k], dset[k] = v, v
		}
		if pRank >= 0 {
			pset["routed_dp_rank"] = mustMarshal(pRank)
			dset["disagg_prefill_dp_rank"] = mustMarshal(pRank)
		}
		if dRank >= 0 {
			dset["routed_dp_rank"] = mustMarshal(dRank)
		}
		pbody := rq.hopBody(pset, append([]string{"stream_options"}, sglangPDFields...)...)
		dbody := rq.hopBody(dset, sglangPDFields...)
		id := rq.requestID + "-" + strconv.Itoa(attempt)
		span.SetAttributes(attribute.String("tether.bootstrap_room", string(boot["bootstrap_room"])))

		actx, cancel := context.WithCancel(ctx)
		pch := make(chan sglangPrefillResult, 1)
		dch := make(chan pdAttempt, 1)
		go func(h *hop) { pch <- e.sglangPrefillHop(actx, rq, h, pbody, id) }(ctxHop)
		go func(h *hop) {
			a := e.pdSend(actx, rq, h, "decode", dbody, pdHeader(id, dRank))
			if a.fail == nil && rq.stream {
				if err := peekStream(a.resp); err != nil {
					a.resp.Body.Close()
					a.done()
					a = pdAttempt{status: http.StatusBadGateway, fail: &hopFailure{err: newAPIError(http.StatusBadGateway, "server_error",
						"upstream_failed", "", "decode instance %s failed the request: %v", h.Instance, err)}}
				}
			}
			dch <- a
		}(genHop)

		var pre *sglangPrefillResult
		var dec *pdAttempt
		for dec == nil && (pre == nil || pre.fail == nil) {
			select {
			case p := <-pch:
				pre = &p
			case d := <-dch:
				dec = &d
			}
		}
		if dec != nil && dec.fail == nil {
			// The decode has the KV (its first output is in): the
			// prefill's answer, with its usage, follows the transfer.
			if pre == nil {
				pre = e.awaitPrefill(pch)
			}
			cached := -1
			if pre != nil && pre.fail == nil {
				cached = e.prefilled(rq, ctxHop, pRank, pre.usage)
			}
			defer cancel()
			defer dec.done()
			return e.relayDecode(w, rq, dec.resp, ctxHop, pRank, cached, genHop, dRank, span)
		}
		// One of them failed before the client saw any output: stop the
		// other, and retry the pair with a new room.
		cancel()
		decodeFirst, prefillBefore := dec != nil, pre != nil
		if pre == nil {
			p := <-pch
			pre = &p
		}
		if dec == nil {
			d := <-dch
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

// awaitPrefill waits briefly for the prefill's answer once the decode
// streams: SGLang's prefill request finishes when its KV is sent, which is
// before the decode's first token; an answer that takes longer is not
// waited for (its usage is then not known).
func (e *Edge) awaitPrefill(pch <-chan sglangPrefillResult) *sglangPrefillResult {
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
func (e *Edge) sglangBlame(ctx context.Context, ctxHop, genHop **hop, pre *sglangPrefillResult, dec *pdAttempt, decodeFirst, prefillBefore bool) (*hopFailure, **hop) {
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
	case ctx.Err() == nil && !e.sglangBootstrapAlive(ctx, *ctxHop):
		return dec.fail, ctxHop
	}
	return dec.fail, genHop
}

// bootstrapProbe is the client of sglangBootstrapAlive: the bootstrap
// server speaks plain HTTP whatever the hops do, and a probe keeps no
// connection.
var bootstrapProbe = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true,
	DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext, ResponseHeaderTimeout: 3 * time.Second}}

// sglangBootstrapAlive asks the prefill's bootstrap server for /health, as
// a decode's heartbeat does (disaggregation/common/conn.py
// heartbeat_checker, a 2 s connect and 3 s read timeout).
func (e *Edge) sglangBootstrapAlive(ctx context.Context, h *hop) bool {
	u, err := url.Parse(h.URL)
	if err != nil {
		return false
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addr := net.JoinHostPort(u.Hostname(), strconv.Itoa(e.bootstrapPort(h.Instance)))
	req, err := http.NewRequestWithContext(hctx, http.MethodGet, "http://"+addr+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := bootstrapProbe.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// sglangPrefillHop sends the prefill request and reads its answer's usage.
func (e *Edge) sglangPrefillHop(ctx context.Context, rq *request, h *hop, body []byte, id string) sglangPrefillResult {
	a := e.pdSend(ctx, rq, h, "prefill", body, pdHeader(id, -1))
	res := sglangPrefillResult{pdAttempt: a}
	if a.fail != nil {
		return res
	}
	b, err := io.ReadAll(io.LimitReader(a.resp.Body, maxUpstreamBody))
	a.resp.Body.Close()
	a.done()
	res.resp = nil
	if err != nil {
		res.unreachable = true
		res.fail = &hopFailure{err: newAPIError(http.StatusBadGateway, "server_error", "upstream_unavailable", "",
			"prefill instance %s failed: %v", h.Instance, err)}
		return res
	}
	res.usage = readUsage(b)
	return res
}
