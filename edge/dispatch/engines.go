package dispatch

import (
	"context"
	"hash/fnv"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
)

// engineRank is the data-parallel rank of key on instance among size
// ranks: the rank the log records for the binding when it has one and it
// is in range, else a rendezvous hash of (key, instance), so every edge
// picks the same rank before the first RankObserved is applied. -1 when the
// fleet has no ranks or the request has no key (the engine's own balancer
// picks).
func engineRank(h *route.Hop, size int) int {
	if size <= 1 || h.Key == "" {
		return -1
	}
	if h.Bound && h.Binding.HasRank && h.Binding.Instance == h.Instance && int(h.Binding.Rank) < size {
		return int(h.Binding.Rank)
	}
	best, bestScore := 0, uint64(0)
	for r := range size {
		hs := fnv.New64a()
		_, _ = hs.Write([]byte(h.Key))
		_, _ = hs.Write([]byte{0})
		_, _ = hs.Write([]byte(h.Instance))
		_, _ = hs.Write([]byte{0, byte(r), byte(r >> 8)})
		if s := hs.Sum64(); r == 0 || s > bestScore {
			best, bestScore = r, s
		}
	}
	return best
}

// dispatchEngine serves a request on an aggregated engine fleet (vLLM,
// SGLang): one hop to the context fleet's instance, pinned to the key's
// data-parallel rank, the answer relayed as is.
func (e *Dispatcher) dispatchEngine(ctx context.Context, w http.ResponseWriter, rq *route.Request, span trace.Span) int {
	h, aerr := e.router.Route(ctx, rq, fsm.FleetContext, nil)
	if aerr != nil {
		return api.Fail(w, span, aerr)
	}
	if !rq.Model.Cfg.EngineAggregated() {
		return e.aggregated(ctx, w, rq, h, span) // tether workers: hints, their scheduler's rank
	}
	return e.engineExchange(ctx, w, rq, h, span)
}

// engineExchange sends rq to the engine instance of h and relays the answer.
func (e *Dispatcher) engineExchange(ctx context.Context, w http.ResponseWriter, rq *route.Request, h *route.Hop, span trace.Span) int {
	size := rq.Model.Cfg.DataParallelSize(h.Fleet)
	rank := -1
	resp, done, hf := e.exchange(ctx, rq, &h, "aggregated", func(cur *route.Hop) ([]byte, http.Header) {
		hdr := make(http.Header, 4+len(rq.PassHeaders))
		for k, v := range rq.PassHeaders {
			hdr[k] = v
		}
		hdr.Set("Content-Type", "application/json")
		rank = engineRank(cur, size)
		if rq.Refs.Prev != nil && rq.Refs.Prev.ID.Rank < size {
			rank = rq.Refs.Prev.ID.Rank // where the stored response was made
		}
		e.catalogue.EnsureAdapter(ctx, rq.Model, rq.Adapter, cur.Instance, cur.URL) // lora.runtime_load (edge/catalog)
		if rank >= 0 {
			hdr.Set(disagg.HeaderDataParallelRank, strconv.Itoa(rank))
		}
		return rq.HopBody(nil), hdr
	})
	if hf != nil {
		return hf.write(w, span)
	}
	defer done()
	if rank >= 0 {
		span.SetAttributes(observe.AttrRank.Int(rank))
		e.router.RecordRank(h, uint32(rank), false)
		// The engine does not name its rank: relay the one the edge chose.
		resp.Header.Set(api.HeaderADPRank, strconv.Itoa(rank))
	} else {
		resp.Header.Del(api.HeaderADPRank)
	}
	span.SetAttributes(attribute.String("tether.engine", string(rq.Model.Cfg.ContextServers.Engine.Kind())))
	e.shadowRoute(rq, h, rank)
	return e.relay(w, rq, resp, nil, nil, h, span)
}

// engineUsage completes a response's usage as the engine means it: vLLM
// (serving_chat.py: `if self.enable_prompt_tokens_details and
// num_cached_tokens`) and SGLang (usage_processor.py _details_if_cached)
// leave prompt_tokens_details null when nothing was cached, and also when
// reporting is off. Once an instance has reported cached tokens in a
// dialect's answers, reporting is on there, so a later null in that
// dialect means none were: the shadow cache and the circuit breaker learn
// of the miss. Dialects are told apart: an engine may report cached tokens
// in one (chat completions) and never in another (its Messages answers).
func (e *Dispatcher) engineUsage(instance string, dialect apireq.Dialect, u disagg.Usage) disagg.Usage {
	if !u.OK {
		return u
	}
	k := reporterKey{instance, dialect}
	if u.HasCached {
		e.cacheReporters.Store(k, true)
		return u
	}
	if _, ok := e.cacheReporters.Load(k); ok {
		u.Cached, u.HasCached = 0, true
	}
	return u
}

// reporterKey is an instance's answers in one dialect.
type reporterKey struct {
	instance string
	dialect  apireq.Dialect
}
