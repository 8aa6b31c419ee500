package dispatch

import (
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/kvshadow"
	"github.com/tether-project/tether/edge/route"
)

// shadowRoute models rq's prompt in the shadow cache of h's instance when
// that instance is a static engine without KV events (no telemetry): the
// edge's KV index then credits the next request sharing the prefix
// (edge/kvshadow, docs/engines.md). rank is the data-parallel rank the
// request was pinned to (-1: none). The placement is kept on h for the
// response's correction (shadowCorrect).
func (e *Dispatcher) shadowRoute(rq *route.Request, h *route.Hop, rank int) {
	if e.shadow == nil || h == nil || len(rq.Prompts[h.Fleet].Blocks) == 0 {
		return
	}
	sc := rq.Model.Cfg.Servers(h.Fleet)
	if sc.KVShadowBlocks <= 0 || sc.Engine.Kind() == config.EngineTether {
		// tether workers publish their KV events over NATS: one
		// configured by URL without NATS is a test or dev setup.
		return
	}
	in, ok := e.edge.Fleet().Instance(h.Instance, rq.Now)
	if !ok || !in.Static {
		return
	}
	if in.Telemetry || in.EngineEvents {
		// A worker that reports over NATS, or an engine whose own KV
		// events the edge reads: they (or their absence) are the truth,
		// never a model.
		e.shadow.Forget(h.Instance)
		return
	}
	capacity := sc.KVShadowBlocks
	if bs := int64(rq.Model.Cfg.RoutingConfig(h.Fleet).BlockSize); in.RankKVTokens > 0 && bs > 0 {
		capacity = int(min(in.RankKVTokens/bs, kvshadow.MaxBlocksPerRank))
	}
	p, ok, err := e.shadow.Route(h.Instance, rank, rq.Model.Cfg.DataParallelSize(h.Fleet), capacity, rq.Prompts[h.Fleet].Blocks)
	if err != nil {
		e.log.Warn("shadow KV cache update failed (it starts over)", "instance", h.Instance, "err", err)
		return
	}
	if ok {
		h.Shadow = &p
	}
}

// shadowCorrect applies a response's usage.prompt_tokens_details.cached_tokens
// to the shadow the request was modelled in: fewer cached tokens than the
// shadow predicted evict the prompt's chain beyond them.
func (e *Dispatcher) shadowCorrect(rq *route.Request, h *route.Hop, cachedTokens int) {
	bs := rq.Model.Cfg.RoutingConfig(h.Fleet).BlockSize
	if e.shadow == nil || h == nil || h.Shadow == nil || bs <= 0 {
		return
	}
	if in, ok := e.edge.Fleet().Instance(h.Instance, rq.Now); ok && in.Telemetry {
		e.shadow.Forget(h.Instance) // its own reports took over meanwhile
		return
	}
	if err := e.shadow.Correct(*h.Shadow, rq.Prompts[h.Fleet].Blocks, cachedTokens/bs); err != nil {
		e.log.Warn("shadow KV cache correction failed (it starts over)", "instance", h.Instance, "err", err)
	}
}
