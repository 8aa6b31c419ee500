package dispatch

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/edge/stored"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/routing"
)

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

// hopHeader builds a hop's headers: content type, the trace context and,
// when this hop carries sub-agent affinity, the signed hint.
func (e *Dispatcher) hopHeader(ctx context.Context, rq *route.Request, h *route.Hop, role hintauth.Role, typ hintauth.RequestType, disaggID string) http.Header {
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
func (e *Dispatcher) observeRank(rq *route.Request, h *route.Hop, role hintauth.Role, rankHeader string) {
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
// sub-agent (the affinity id is its parent's root, never its own id) on
// its parent's instance (a hop routed by its own id to another instance
// is placed there by its own conversation id, on a rank of its own: the
// hint would bind its parent's root there and put moved siblings on one
// rank), on the chat endpoint (rank affinity), with a key to sign with, to
// the generation fleet only with scope both, and never to a worker whose
// telemetry says it cannot verify hints (a legacy worker; instance
// affinity still applies).
func (e *Dispatcher) sendHint(rq *route.Request, h *route.Hop, role hintauth.Role) bool {
	if !rq.Hint || e.authKey == nil || !rq.ID.SubAgent() || role == "" || !h.OnRootInstance() {
		return false
	}
	if role == hintauth.RoleGeneration && e.cfg.Scope != routing.ScopeBoth {
		return false
	}
	if in, ok := e.edge.Fleet().Instance(h.Instance, rq.Now); ok && in.Telemetry && !in.VerifiesHints {
		return false
	}
	return true
}

// post sends one hop.
func (e *Dispatcher) post(ctx context.Context, url string, body []byte, hdr http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = hdr
	return e.client.Do(req)
}

// send sends one attempt of hop h (hctx: the hop's span) and tells the
// fleet view whether it reached the instance: a connect that failed marks
// the instance unreachable from this edge, so the next requests are
// placed elsewhere instead of each waiting out a connect (edge/fleetview
// reach.go); ctx is the request's (cancelled, nothing is learnt).
func (e *Dispatcher) send(ctx, hctx context.Context, h *route.Hop, path string, body []byte, hdr http.Header) (*http.Response, error) {
	actx, attempt := e.edge.Fleet().BeginHop(hctx, h.Instance)
	resp, err := e.post(actx, h.URL+path, body, hdr)
	attempt.End(ctx, err)
	return resp, err
}

// exchange sends a hop built by build (called per attempt with the hop to
// use), retrying connection errors and 5xx answers on another instance up
// to max_retries times. It returns the worker's 200 response (body open);
// any other answer is a hopFailure.
func (e *Dispatcher) exchange(ctx context.Context, rq *route.Request, h **route.Hop, phase string,
	build func(h *route.Hop) (body []byte, hdr http.Header)) (*http.Response, func(), *hopFailure) {
	for attempt := 0; ; attempt++ {
		cur := *h
		hctx, span := e.tracer.Start(ctx, "tether.edge "+phase+" hop", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(observe.AttrInstance.String(cur.Instance), observe.AttrFleet.String(cur.Fleet.String()), attribute.Int("tether.attempt", attempt)))
		body, hdr := build(cur)
		// The hop's span is the worker span's parent.
		observe.TraceContext.Inject(hctx, propagation.HeaderCarrier(hdr))
		done := e.noteDispatch(cur, rq.PromptTokens)
		resp, err := e.send(ctx, e.edge.Fleet().ExpectIdentity(hctx, cur.Instance), cur, rq.Path, body, hdr)
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
			span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode), observe.AttrRank.String(resp.Header.Get(api.HeaderADPRank)))
			span.End()
			return resp, done, nil
		}
		span.SetStatus(codes.Error, "hop failed")
		span.End()
		if rq.Pinned() != nil {
			// No other instance holds a stored response or a conversation:
			// unreached, the client is told so naming its id.
			if err != nil {
				failure = &hopFailure{err: rq.Refs.Unreachable(err)}
			}
			return nil, nil, failure
		}
		if attempt >= e.cfg.MaxRetries {
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

// routeHeaders sets the debug route header and relays the worker's rank.
func (e *Dispatcher) routeHeaders(w http.ResponseWriter, ctxHop *route.Hop, ctxRank string, genHop *route.Hop, genRank string) {
	if ctxHop == nil && genHop != nil && genHop.Fleet == fsm.FleetContext {
		// An aggregated engine fleet (engines.go): its one hop is
		// the context fleet's.
		ctxHop, ctxRank, genHop, genRank = genHop, genRank, nil, ""
	}
	h := w.Header()
	if genHop != nil && genRank != "" {
		h.Set(api.HeaderADPRank, genRank)
	} else if genHop == nil && ctxRank != "" {
		h.Set(api.HeaderADPRank, ctxRank)
	}
	if e.cfg.DebugRouteHeader {
		h.Set(api.HeaderRoute, "context="+route.Label(ctxHop, ctxRank)+"; generation="+route.Label(genHop, genRank)+route.Evidence(ctxHop, genHop))
	}
}

// relay passes the final worker's response to the client: JSON, or the
// SSE stream event by event, in the request's dialect (edge/api):
// its usage feeds the breaker and the shadow, after a context hop the
// usage's cached tokens are the context (prefill) worker's (that is where
// the prompt was or was not recomputed), and a Responses answer's ids are
// minted (edge/stored).
func (e *Dispatcher) relay(w http.ResponseWriter, rq *route.Request, resp *http.Response, ctxHop *route.Hop, cres *contextResult, genHop *route.Hop, span trace.Span) int {
	defer resp.Body.Close()
	ctxRank, cached, nullCached := "", -1, false
	if cres != nil {
		ctxRank, cached, nullCached = cres.rank, cres.cachedTokens, cres.nullCached
	}
	genRank := resp.Header.Get(api.HeaderADPRank)
	e.routeHeaders(w, ctxHop, ctxRank, genHop, genRank)
	span.SetAttributes(attribute.String("tether.route", "context="+route.Label(ctxHop, ctxRank)+"; generation="+route.Label(genHop, genRank)))
	ans := &api.Answer{Dialect: rq.Dialect, Cached: cached, NullCached: nullCached}
	if cres == nil && !rq.Parsed.CountTokens {
		ans.OnUsage = func(u disagg.Usage) {
			// Only a response that reports its cached tokens says
			// anything about the cache (vLLM without
			// --enable-prompt-tokens-details does not: its breaker must
			// not read that as misses).
			if u = e.engineUsage(genHop.Instance, rq.Dialect, u); u.HasCached {
				e.edge.Fleet().RecordUsage(genHop.Instance, int64(u.Prompt), int64(u.Cached), e.now())
				e.grade(rq, genHop, u.Prompt, u.Cached)
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
