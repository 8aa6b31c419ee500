package edge

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing/kvindex"
)

// HeaderDataParallelRank pins a request to one data-parallel rank of a vLLM
// or SGLang server (edge/disagg, which documents how each engine reads it).
const HeaderDataParallelRank = disagg.HeaderDataParallelRank

// Disaggregated request ids (disagg_request_id) are TensorRT-LLM global
// ids: llmapi/disagg_utils.py keeps [0, MIN_GLOBAL_ID = 2^40) for a
// worker's local request ids (get_local_request_id) and draws global ids
// from [2^40, 2^63) so the two never collide. The edge's ids are
// disaggIDFloor | a random 31-bit prefix per edge process << 21 | a 21-bit
// counter: in [2^52, 2^53), above the floor whatever the prefix, unique
// across edges and restarts in practice, and exact in float64-based JSON
// parsers (below 2^53).
const (
	disaggIDFloor   = uint64(1) << 52
	disaggIDSeqBits = 21
)

// disaggIDBase is an edge process's disaggregated request id prefix from
// 32 random bits.
func disaggIDBase(random uint32) uint64 {
	return disaggIDFloor | uint64(random&0x7fffffff)<<disaggIDSeqBits
}

// metricsFormat is the /metrics format the edge scrapes of engine k ("" none).
func metricsFormat(k EngineKind) string {
	switch k {
	case EngineVLLM:
		return fleetview.MetricsVLLM
	case EngineSGLang:
		return fleetview.MetricsSGLang
	}
	return ""
}

// engineRank is the data-parallel rank of key on instance among size
// ranks: the rank the log records for the binding when it has one and it
// is in range, else a rendezvous hash of (key, instance), so every edge
// picks the same rank before the first RankObserved is applied. -1 when the
// fleet has no ranks or the request has no key (the engine's own balancer
// picks).
func engineRank(h *hop, size int) int {
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
func (e *Edge) dispatchEngine(ctx context.Context, w http.ResponseWriter, rq *request, span trace.Span) int {
	h, aerr := e.routeFleet(ctx, rq, fsm.FleetContext, nil)
	if aerr != nil {
		return api.Fail(w, span, aerr)
	}
	return e.engineExchange(ctx, w, rq, h, span)
}

// engineExchange sends rq to the engine instance of h and relays the answer.
func (e *Edge) engineExchange(ctx context.Context, w http.ResponseWriter, rq *request, h *hop, span trace.Span) int {
	size := rq.m.cfg.DataParallelSize(fsm.FleetContext)
	rank := -1
	resp, done, hf := e.exchange(ctx, rq, &h, "aggregated", func(cur *hop) ([]byte, http.Header) {
		hdr := make(http.Header, 4+len(rq.passHeaders))
		for k, v := range rq.passHeaders {
			hdr[k] = v
		}
		hdr.Set("Content-Type", "application/json")
		rank = engineRank(cur, size)
		if rq.prev != nil && rq.prev.id.Rank < size {
			rank = rq.prev.id.Rank // where the stored response was made
		}
		e.ensureAdapter(ctx, rq, cur) // lora.runtime_load (lora.go)
		if rank >= 0 {
			hdr.Set(HeaderDataParallelRank, strconv.Itoa(rank))
		}
		return rq.hopBody(nil), hdr
	})
	if hf != nil {
		return hf.write(w, span)
	}
	defer done()
	if rank >= 0 {
		span.SetAttributes(observe.AttrRank.Int(rank))
		e.recordEngineRank(h, rank)
		// The engine does not name its rank: relay the one the edge chose.
		resp.Header.Set(HeaderADPRank, strconv.Itoa(rank))
	} else {
		resp.Header.Del(HeaderADPRank)
	}
	span.SetAttributes(attribute.String("tether.engine", string(rq.m.cfg.ContextServers.Engine.Kind())))
	e.shadowRoute(rq, h, rank)
	return e.relay(w, rq, resp, nil, nil, h, span)
}

// recordEngineRank records the rank the edge chose for a binding that has
// none yet (RankObserved, feature level 2), so the log holds the whole
// placement — instance and rank — and every edge keeps using that rank
// even if data_parallel_size or the hash inputs change later.
func (e *Edge) recordEngineRank(h *hop, rank int) {
	if !h.Bound || h.Instance != h.Binding.Instance ||
		(h.Outcome != outcomeSticky && h.Outcome != outcomeNewBind && h.Outcome != outcomeDegraded) {
		return
	}
	if e.featureLevel() < fsm.FeatureLevelRanks {
		return
	}
	st := e.node.State()
	if st.FeatureLevel() < fsm.FeatureLevelRanks {
		return // an older edge may still be a voter: it could not apply the event
	}
	if h.Binding.Epoch == 0 {
		// Served on this edge's own proposal: recorded once the log
		// answers it with this placement (placements.settle).
		if ev, now := e.placements.NoteRank(h.Fleet, h.Key, h.Instance, uint32(rank)); now {
			e.recorder.AddRank(ev)
		}
		return
	}
	b, ok := st.Lookup(h.Fleet, h.Key)
	if !ok || b.Epoch != h.Binding.Epoch || b.Instance != h.Instance || b.HasRank {
		return
	}
	e.recorder.AddRank(fsm.RankObserved{Fleet: h.Fleet, Key: h.Key, Epoch: b.Epoch, Rank: uint32(rank)})
}

// engineUsage completes a response's usage as the engine means it: vLLM
// (serving_chat.py: `if self.enable_prompt_tokens_details and
// num_cached_tokens`) and SGLang (usage_processor.py _details_if_cached)
// leave prompt_tokens_details null when nothing was cached, and also when
// reporting is off. Once an instance has reported cached tokens, reporting
// is on there, so a later null means none were: the shadow cache and the
// circuit breaker learn of the miss.
func (e *Edge) engineUsage(instance string, u disagg.Usage) disagg.Usage {
	if !u.OK {
		return u
	}
	if u.HasCached {
		e.engines.cacheReporters.Store(instance, true)
		return u
	}
	if _, ok := e.engines.cacheReporters.Load(instance); ok {
		u.Cached, u.HasCached = 0, true
	}
	return u
}

// engineKVSources are the engines' own KV event sources this edge reads
// (internal/enginekv, the mapping the worker's proxy uses too).
type engineKVSources struct {
	mu      sync.Mutex
	sources []*enginekv.Source
}

// startEngineEvents subscribes to the KV event publishers of the static
// vLLM and SGLang instances that name one (urls[].kv_events): rank r of an
// instance with data_parallel_size N on the endpoint's port + r, as the
// engines offset it. Each change becomes an exact batch of the instance in
// this edge's KV index.
func (e *Edge) startEngineEvents() error {
	e.engines.kv.mu.Lock()
	defer e.engines.kv.mu.Unlock()
	for _, m := range e.models {
		for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
			if err := e.startFleetEngineEvents(m.cfg, f); err != nil {
				return err
			}
		}
	}
	e.wg.Add(1)
	go e.runTRTLLMDrains()
	return nil
}

// startFleetEngineEvents subscribes to the publishers of one model's fleet
// (e.engines.kv.mu held).
func (e *Edge) startFleetEngineEvents(mc *Config, f fsm.Fleet) error {
	sc := mc.Servers(f)
	kind := sc.Engine.Kind()
	size := mc.DataParallelSize(f)
	for _, si := range sc.URLs {
		ev := si.KVEvents
		if ev == nil || !kind.AggregatedOnly() {
			continue
		}
		cfg := enginekv.Config{Format: string(kind), Topic: ev.Topic, Ranks: size,
			BlockSize: mc.RoutingConfig(f).BlockSize, Log: e.log.With("instance", si.ID()), Undecodable: e.countUndecodable(si.ID())}
		for r := range size {
			ep, err := enginekv.OffsetEndpoint(ev.Endpoint, r)
			if err != nil {
				return fmt.Errorf("%s kv_events: %w", si.ID(), err)
			}
			cfg.Endpoints = append(cfg.Endpoints, ep)
			if ev.ReplayEndpoint != "" {
				rep, err := enginekv.OffsetEndpoint(ev.ReplayEndpoint, r)
				if err != nil {
					return fmt.Errorf("%s kv_events: %w", si.ID(), err)
				}
				cfg.ReplayEndpoints = append(cfg.ReplayEndpoints, rep)
			}
		}
		id := si.ID()
		src, err := enginekv.Start(cfg, func(k enginekv.RankKeys) {
			e.fleet.ApplyEngineKV(id, engineRankEvents(k)...)
		})
		if err != nil {
			return fmt.Errorf("%s kv_events: %w", id, err)
		}
		e.engines.kv.sources = append(e.engines.kv.sources, src)
		e.log.Info("reading the engine's KV events", "instance", id, "endpoints", cfg.Endpoints)
	}
	return nil
}

// countUndecodable counts the engine KV events of instance id that did
// not decode (tether_edge_kv_events_undecodable_total).
func (e *Edge) countUndecodable(id string) func(string) {
	return func(reason string) {
		if e.metrics != nil {
			e.metrics.KVUndecodable.WithLabelValues(id, reason).Inc()
		}
	}
}

// engineRankEvents is one engine change as KV index events: the rank's GPU
// tier, then its offloaded tier (kvindex RankEvent.Offloaded), when either
// changed.
func engineRankEvents(k enginekv.RankKeys) []kvindex.RankEvent {
	evs := make([]kvindex.RankEvent, 0, 2)
	if len(k.Stored)+len(k.Removed) > 0 {
		evs = append(evs, kvindex.RankEvent{Rank: k.Rank, Stored: k.Stored, Removed: k.Removed})
	}
	if len(k.OffloadedStored)+len(k.OffloadedRemoved) > 0 {
		evs = append(evs, kvindex.RankEvent{Rank: k.Rank, Stored: k.OffloadedStored, Removed: k.OffloadedRemoved, Offloaded: true})
	}
	return evs
}

// stopEngineEvents closes every source.
func (e *Edge) stopEngineEvents() {
	e.engines.kv.mu.Lock()
	srcs := e.engines.kv.sources
	e.engines.kv.sources = nil
	e.engines.kv.mu.Unlock()
	for _, s := range srcs {
		s.Close()
	}
}

// trtllmRanks bounds the attention-DP ranks of a trtllm-serve whose
// /kv_cache_events the edge drains (attention_dp_rank picks the rank; the
// edge does not choose trtllm ranks, so the count only sizes the mappers).
const trtllmRanks = 64

// trtDrain is the leader's drain of one trtllm-serve's /kv_cache_events.
// The endpoint hands each event out once, so one edge drains; it shares the
// blocks over NATS as KV batches of the instance (internal/telemetry), and
// answers the instance's dump requests from what it mapped, so every edge's
// KV index follows (fleetview, Static.SharedEvents). Without NATS only the
// draining edge's index learns them.
type trtDrain struct {
	e    *Edge
	id   string
	src  *enginekv.Source
	sub  *nats.Subscription
	boot uint64

	mu  sync.Mutex
	seq uint64
}

// runTRTLLMDrains starts the drains while this edge is the leader and stops
// them when it is not (a new leader starts over with a new boot: the edges
// take its first batch as the baseline).
func (e *Edge) runTRTLLMDrains() {
	defer e.wg.Done()
	type target struct {
		id, url string
		f       fsm.Fleet
	}
	var targets []target
	for _, m := range e.models {
		for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
			sc := m.cfg.Servers(f)
			if !sc.KVCacheEvents || sc.Engine.Kind() != EngineTRTLLM {
				continue
			}
			for _, si := range sc.URLs {
				targets = append(targets, target{si.ID(), trimSlash(si.URL), f})
			}
		}
	}
	if len(targets) == 0 {
		return
	}
	var drains []*trtDrain
	stop := func() {
		for _, d := range drains {
			d.close()
		}
		drains = nil
	}
	defer stop()
	t := time.NewTicker(e.cfg.Leader.Interval)
	defer t.Stop()
	for {
		leader := e.node.IsLeader()
		switch {
		case leader && drains == nil:
			for _, tg := range targets {
				d, err := e.startTRTDrain(tg.id, tg.url, tg.f)
				if err != nil {
					e.log.Warn("cannot drain the trtllm-serve KV cache events", "instance", tg.id, "err", err)
					continue
				}
				drains = append(drains, d)
			}
		case !leader && drains != nil:
			stop()
		}
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (e *Edge) startTRTDrain(id, url string, f fsm.Fleet) (*trtDrain, error) {
	d := &trtDrain{e: e, id: id, boot: rand.Uint64() | 1}
	cfg := enginekv.Config{Format: enginekv.FormatTRTLLM, URLs: []string{url}, Ranks: trtllmRanks,
		BlockSize: e.cfg.RoutingConfig(f).BlockSize, Log: e.log.With("instance", id), Undecodable: e.countUndecodable(id)}
	if e.nats.conn != nil {
		sub, err := e.nats.conn.Subscribe(telemetry.KVDumpSubject(id), d.answerDump)
		if err != nil {
			return nil, err
		}
		d.sub = sub
	}
	src, err := enginekv.Start(cfg, d.publish)
	if err != nil {
		if d.sub != nil {
			_ = d.sub.Unsubscribe()
		}
		return nil, err
	}
	d.src = src
	e.log.Info("draining the trtllm-serve KV cache events (leader)", "instance", id, "url", url)
	return d, nil
}

// publish shares one change: a KV batch of the instance over NATS (every
// edge applies it, this one included), else this edge's index alone.
func (d *trtDrain) publish(k enginekv.RankKeys) {
	if len(k.Stored)+len(k.Removed) == 0 {
		return // the KV batches edges share carry the GPU tier only
	}
	if d.e.nats.conn == nil {
		d.e.fleet.ApplyEngineKV(d.id, kvindex.RankEvent{Rank: k.Rank, Stored: k.Stored, Removed: k.Removed})
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	data, err := telemetry.AppendKVEvents(nil, telemetry.KVEventBatch{Instance: d.id, BootID: d.boot, Seq: d.seq,
		Events: []telemetry.KVEvent{{Rank: k.Rank, Removed: k.Removed, Stored: k.Stored}}})
	if err == nil {
		err = d.e.nats.conn.Publish(telemetry.KVSubject(d.id), data)
	}
	if err != nil {
		d.e.log.Warn("sharing trtllm-serve KV events failed (the edges resync by dump)", "instance", d.id, "err", err)
	}
}

// answerDump replies to an edge's dump request with every block mapped so
// far, as of the last batch shared.
func (d *trtDrain) answerDump(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	d.mu.Lock()
	dump := telemetry.KVDump{Instance: d.id, BootID: d.boot, Seq: d.seq}
	for r, ks := range d.src.Keys() {
		slices.Sort(ks)
		dump.Ranks = append(dump.Ranks, telemetry.RankBlocks{Rank: r, Blocks: ks})
	}
	d.mu.Unlock()
	slices.SortFunc(dump.Ranks, func(a, b telemetry.RankBlocks) int { return a.Rank - b.Rank })
	limit := int64(1 << 20)
	if mp := d.e.nats.conn.MaxPayload(); mp > 0 {
		limit = mp
	}
	for _, part := range telemetry.SplitKVDump(dump, int(max((limit-4096)/12, 1))) {
		data, err := telemetry.EncodeKVDump(part)
		if err == nil {
			err = d.e.nats.conn.Publish(m.Reply, data)
		}
		if err != nil {
			d.e.log.Warn("answering a KV dump request failed", "instance", d.id, "err", err)
			return
		}
	}
}

func (d *trtDrain) close() {
	if d.sub != nil {
		_ = d.sub.Unsubscribe()
	}
	d.src.Close()
}
