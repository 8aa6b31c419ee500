package edge

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/kvshadow"
	"github.com/tether-project/tether/fsm"
)

// EngineKind is what serves a fleet (context_servers.engine,
// generation_servers.engine). docs/engines.md says what works with each.
type EngineKind string

const (
	// EngineTether: tether workers (the default): telemetry over NATS,
	// hint verification, ranks chosen by the worker's scheduler.
	EngineTether EngineKind = "tether"
	// EngineTRTLLM: trtllm-serve workers.
	EngineTRTLLM EngineKind = "trtllm"
	// EngineVLLM: `vllm serve`, aggregated: the context fleet takes whole
	// requests; load from its /metrics; ranks by X-Data-Parallel-Rank.
	EngineVLLM EngineKind = "vllm"
	// EngineSGLang: an SGLang server, aggregated like vLLM.
	EngineSGLang EngineKind = "sglang"
)

// HeaderDataParallelRank pins a request to one data-parallel rank of a vLLM
// or SGLang server. Both read it case-insensitively and parse it as an
// integer (vLLM: serving's _get_data_parallel_rank, a non-integer is
// ignored and its own balancer picks; SGLang: serving_base's
// extract_routed_dp_rank_from_header, a non-integer is a 400); a rank
// outside [0, data-parallel size) is refused with 400 by both.
const HeaderDataParallelRank = "X-Data-Parallel-Rank"

// maxDataParallelSize bounds data_parallel_size (vLLM and SGLang
// deployments run a few dozen ranks at most).
const maxDataParallelSize = 1024

// Kind is the engine with the default applied.
func (k EngineKind) Kind() EngineKind {
	if k == "" {
		return EngineTether
	}
	return k
}

// aggregatedOnly: the engine serves whole requests only (no disaggregated
// protocol tether speaks with it).
func (k EngineKind) aggregatedOnly() bool {
	return k == EngineVLLM || k == EngineSGLang
}

// metricsFormat is the /metrics format the edge scrapes ("" none).
func (k EngineKind) metricsFormat() string {
	switch k {
	case EngineVLLM:
		return fleetview.MetricsVLLM
	case EngineSGLang:
		return fleetview.MetricsSGLang
	}
	return ""
}

// Aggregated reports whether requests are served whole by the context
// fleet (a vLLM or SGLang fleet): no context/generation split, the
// generation fleet is empty.
func (c *Config) Aggregated() bool { return c.ContextServers.Engine.aggregatedOnly() }

// servedFleets are the fleets requests go to: the context fleet alone when
// aggregated, else both.
func (c *Config) servedFleets() []fsm.Fleet {
	if c.Aggregated() {
		return []fsm.Fleet{fsm.FleetContext}
	}
	return []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration}
}

// dataParallelSize is fleet f's configured rank count (1: none).
func (c *Config) dataParallelSize(f fsm.Fleet) int {
	return max(c.servers(f).DataParallelSize, 1)
}

// validateEngine checks a fleet's engine keys.
func (c *Config) validateEngine(key string, s *ServersConfig) []error {
	var errs []error
	bad := func(k, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", k, fmt.Sprintf(format, args...)))
	}
	kind := s.Engine.Kind()
	switch kind {
	case EngineTether, EngineTRTLLM, EngineVLLM, EngineSGLang:
	default:
		bad(key+".engine", "unknown engine %q (want tether, trtllm, vllm or sglang)", string(s.Engine))
		return errs
	}
	if s.DataParallelSize < 0 || s.DataParallelSize > maxDataParallelSize {
		bad(key+".data_parallel_size", "must be 0..%d, got %d", maxDataParallelSize, s.DataParallelSize)
	}
	if s.KVShadowBlocks < 0 || s.KVShadowBlocks > kvshadow.MaxBlocksPerRank {
		bad(key+".kv_shadow_blocks", "must be 0..%d (0: no shadow cache), got %d", kvshadow.MaxBlocksPerRank, s.KVShadowBlocks)
	}
	if s.DataParallelSize > 1 && !kind.aggregatedOnly() {
		bad(key+".data_parallel_size", "only for engine vllm or sglang (the edge picks their rank); %s workers place requests on ranks themselves", kind)
	}
	if !kind.aggregatedOnly() {
		return errs
	}
	if s == &c.GenerationServers {
		bad(key+".engine", "%s is served aggregated: configure its servers under context_servers (docs/engines.md)", kind)
		return errs
	}
	if len(s.URLs) == 0 {
		bad(key+".urls", "engine %s needs its servers' URLs (they do not register over NATS)", kind)
	}
	g := &c.GenerationServers
	if len(g.URLs) > 0 || g.NumInstances != 0 || (g.Engine != "" && g.Engine != s.Engine) {
		bad("generation_servers", "must be empty with context_servers.engine: %s (served aggregated: the context fleet takes whole requests)", kind)
	}
	if c.ConditionalDisagg.MaxLocalPrefillLength > 0 {
		bad("conditional_disagg_config", "does not apply to context_servers.engine: %s (served aggregated)", kind)
	}
	return errs
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
		return fail(w, span, aerr)
	}
	return e.engineExchange(ctx, w, rq, h, span)
}

// engineExchange sends rq to the engine instance of h and relays the answer.
func (e *Edge) engineExchange(ctx context.Context, w http.ResponseWriter, rq *request, h *hop, span trace.Span) int {
	size := e.cfg.dataParallelSize(fsm.FleetContext)
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
		span.SetAttributes(attrRank.Int(rank))
		e.recordEngineRank(h, rank)
		// The engine does not name its rank: relay the one the edge chose.
		resp.Header.Set(HeaderADPRank, strconv.Itoa(rank))
	} else {
		resp.Header.Del(HeaderADPRank)
	}
	span.SetAttributes(attribute.String("tether.engine", string(e.cfg.ContextServers.Engine.Kind())))
	e.shadowRoute(rq, h, rank)
	return e.relay(w, rq, resp, nil, nil, h, span)
}

// recordEngineRank records the rank the edge chose for a binding that has
// none yet (RankObserved, feature level 2), so the log holds the whole
// placement — instance and rank — and every edge keeps using that rank
// even if data_parallel_size or the hash inputs change later.
func (e *Edge) recordEngineRank(h *hop, rank int) {
	if !h.Bound || h.Binding.Epoch == 0 || h.Instance != h.Binding.Instance ||
		(h.Outcome != outcomeSticky && h.Outcome != outcomeNewBind) {
		return
	}
	if e.featureLevel() < fsm.FeatureLevelRanks {
		return
	}
	st := e.node.State()
	if st.FeatureLevel() < fsm.FeatureLevelRanks {
		return // an older edge may still be a voter: it could not apply the event
	}
	b, ok := st.Lookup(h.Fleet, h.Key)
	if !ok || b.Epoch != h.Binding.Epoch || b.Instance != h.Instance || b.HasRank {
		return
	}
	e.recorder.addRank(fsm.RankObserved{Fleet: h.Fleet, Key: h.Key, Epoch: b.Epoch, Rank: uint32(rank)})
}
