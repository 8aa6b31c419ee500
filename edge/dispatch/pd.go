package dispatch

import (
	"context"
	"io"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/fsm"
)

// Prefill/decode disaggregation of vLLM and SGLang, driven by the edges: a
// deployment whose context_servers and generation_servers both name engine
// vllm (or both sglang) has prefill servers in the context fleet and decode
// servers in the generation fleet. Each fleet is routed with the decision
// every request takes (bindings in the log, sub-agents by their parent on
// the context fleet, KV-aware placement), each hop pinned to the key's
// data-parallel rank; what goes over the wire is the engine's own
// protocol (edge/disagg): vLLM's KV connector handoff (driven in
// pd_vllm.go) or SGLang's bootstrap rendezvous (driven in pd_sglang.go).

// dispatchPD serves a request through the engines' prefill/decode split.
// A Messages count_tokens request generates nothing: any prefill server
// counts it, unbound (both engines serve /v1/messages/count_tokens on
// every server).
func (e *Dispatcher) dispatchPD(ctx context.Context, w http.ResponseWriter, rq *route.Request, span trace.Span) int {
	kind := rq.Model.Cfg.PDEngine()
	span.SetAttributes(attribute.String("tether.engine", string(kind)))
	if rq.Parsed.CountTokens {
		h, aerr := e.router.Route(ctx, rq, fsm.FleetContext, nil)
		if aerr != nil {
			return api.Fail(w, span, aerr)
		}
		return e.engineExchange(ctx, w, rq, h, span)
	}
	if kind == config.EngineSGLang {
		return e.dispatchSGLangPD(ctx, w, rq, span)
	}
	return e.dispatchVLLMPD(ctx, w, rq, span)
}

// pdAttempt is one attempt of a hop: the server's 200 response (body
// open; done ends the dispatch accounting), or why there is none.
type pdAttempt struct {
	resp *http.Response
	done func()
	fail *hopFailure
	// unreachable: no answer came (a connection error): the instance is
	// gone or not listening, and nothing it held can be used.
	unreachable bool
	// status is the server's answer when it was not 200.
	status int
}

// retryable: the attempt failed the instance's way (no answer, or a 5xx),
// not the client's (4xx) or by cancellation.
func (a *pdAttempt) retryable() bool { return a.unreachable || a.status >= 500 }

// pdSend sends one attempt of a hop to h.
func (e *Dispatcher) pdSend(ctx context.Context, rq *route.Request, h *route.Hop, phase string, body []byte, hdr http.Header) pdAttempt {
	hctx, span := e.tracer.Start(ctx, "tether.edge "+phase+" hop", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(observe.AttrInstance.String(h.Instance), observe.AttrFleet.String(h.Fleet.String())))
	defer span.End()
	observe.TraceContext.Inject(hctx, propagation.HeaderCarrier(hdr))
	done := e.noteDispatch(h, rq.PromptTokens)
	resp, err := e.send(ctx, hctx, h, rq.Path, body, hdr)
	if err != nil {
		done()
		if ctx.Err() != nil {
			return pdAttempt{fail: &hopFailure{err: api.NewError(api.StatusClientClosed, "server_error", "cancelled", "", "request cancelled: %v", ctx.Err())}}
		}
		span.SetStatus(codes.Error, "hop failed")
		e.metrics.UpstreamErrors.WithLabelValues(h.Fleet.String(), "connect").Inc()
		return pdAttempt{unreachable: true, fail: &hopFailure{err: api.NewError(http.StatusBadGateway, "server_error", "upstream_unavailable", "",
			"%s instance %s (%s) failed: %v", h.Fleet, h.Instance, h.URL, err)}}
	}
	span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	if resp.StatusCode == http.StatusOK {
		return pdAttempt{resp: resp, done: done}
	}
	done()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode >= 500 {
		span.SetStatus(codes.Error, "hop failed")
		e.metrics.UpstreamErrors.WithLabelValues(h.Fleet.String(), "status_5xx").Inc()
	}
	return pdAttempt{status: resp.StatusCode, fail: &hopFailure{pass: &api.UpstreamAnswer{Status: resp.StatusCode, Header: resp.Header, Body: b}}}
}

// decodeSend sends one attempt of a decode hop to h: a stream is read up
// to its first output (disagg.PeekStream), so a failed handoff (an error
// event, or the end before any output) is still a failure that can be
// retried rather than an answer.
func (e *Dispatcher) decodeSend(ctx context.Context, rq *route.Request, h *route.Hop, body []byte, hdr http.Header) pdAttempt {
	a := e.pdSend(ctx, rq, h, "decode", body, hdr)
	if a.fail == nil && rq.Stream {
		if err := disagg.PeekStream(a.resp); err != nil {
			a.resp.Body.Close()
			a.done()
			return pdAttempt{status: http.StatusBadGateway, fail: &hopFailure{err: api.NewError(http.StatusBadGateway, "server_error",
				"upstream_failed", "", "decode instance %s failed the request: %v", h.Instance, err)}}
		}
	}
	return a
}

// pdRetry moves a failed hop to another instance when retries are left
// (max_retries counts every retry of the request, on either fleet): a
// bound key overflows (recorded as unhealthy), an unbound request is
// placed again.
func (e *Dispatcher) pdRetry(ctx context.Context, rq *route.Request, h **route.Hop, retries *int) bool {
	if *retries <= 0 {
		return false
	}
	next, aerr := e.router.Reroute(ctx, rq, *h)
	if aerr != nil {
		return false
	}
	*retries--
	e.metrics.Retries.WithLabelValues((*h).Fleet.String()).Inc()
	e.log.Info("retrying a failed hop on another instance", "fleet", (*h).Fleet, "from", (*h).Instance, "to", next.Instance)
	*h = next
	return true
}

// prefilled records what a prefill hop taught the edge: its usage feeds
// the instance's cache breaker and the shadow of its cache, and the rank
// the edge chose joins the binding in the log. It returns the cached
// tokens to report to the client (-1: the prefill reported none).
func (e *Dispatcher) prefilled(rq *route.Request, h *route.Hop, rank int, u disagg.Usage) int {
	u = e.engineUsage(h.Instance, rq.Dialect, u)
	e.shadowRoute(rq, h, rank)
	if rank >= 0 {
		e.router.RecordRank(h, uint32(rank), false)
	}
	if !u.OK || !u.HasCached {
		return -1
	}
	e.edge.Fleet().RecordUsage(h.Instance, int64(u.Prompt), int64(u.Cached), e.now())
	e.grade(rq, h, u.Prompt, u.Cached)
	e.shadowCorrect(rq, h, u.Cached)
	return u.Cached
}

// relayDecode relays the decode's answer: the ranks the edge chose in the
// route headers, the prefill's cached tokens in the usage (the prompt was
// or was not recomputed there; -1: the prefill reported none, and the
// client gets none either).
func (e *Dispatcher) relayDecode(w http.ResponseWriter, rq *route.Request, resp *http.Response, ctxHop *route.Hop, ctxRank, cached int, genHop *route.Hop, genRank int, span trace.Span) int {
	resp.Header.Del(api.HeaderADPRank)
	if genRank >= 0 {
		// The engines do not name their rank: relay the one the edge chose.
		resp.Header.Set(api.HeaderADPRank, strconv.Itoa(genRank))
	}
	cres := &contextResult{cachedTokens: cached, nullCached: cached < 0}
	if ctxRank >= 0 {
		cres.rank = strconv.Itoa(ctxRank)
	}
	if genRank >= 0 {
		e.router.RecordRank(genHop, uint32(genRank), false)
	}
	return e.relay(w, rq, resp, ctxHop, cres, genHop, span)
}

// hopRank is the data-parallel rank of h's key in fleet f of c (-1: none).
func hopRank(c *config.Config, h *route.Hop, f fsm.Fleet) int {
	return engineRank(h, c.DataParallelSize(f))
}
