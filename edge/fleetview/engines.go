package fleetview

import (
	"context"
	"fmt"
	"io"
	"math"

	"github.com/tether-project/tether/internal/enginemetrics"
)

// Metrics formats of the engines whose Prometheus /metrics the edge scrapes
// for load (docs/engines.md). tether workers report over NATS instead.
const (
	MetricsVLLM   = string(enginemetrics.VLLM)
	MetricsSGLang = string(enginemetrics.SGLang)
)

// EngineLoad is one scrape of an engine's /metrics, summed over its
// data-parallel ranks (vLLM labels each engine core `engine="<rank>"`,
// SGLang each scheduler `dp_rank="<rank>"`, one scheduler per rank
// counted).
type EngineLoad struct {
	Waiting float64 // vllm:num_requests_waiting, sglang:num_queue_reqs
	Running float64 // vllm:num_requests_running, sglang:num_running_reqs
	// KV: used and total in the engine's units: vLLM blocks (from
	// vllm:kv_cache_usage_perc × num_gpu_blocks of vllm:cache_config_info,
	// or per-mille of the usage fraction when that info is absent),
	// SGLang tokens (sglang:num_used_tokens, sglang:max_total_num_tokens,
	// or per-mille of sglang:token_usage).
	KVUsed, KVTotal float64
	// ActiveTokens: tokens held by running requests (SGLang's used
	// tokens; vLLM's used blocks × block_size when known).
	ActiveTokens float64
	// RankKVTokens: one rank's KV cache capacity in tokens (vLLM
	// num_gpu_blocks × block_size of vllm:cache_config_info, SGLang
	// sglang:max_total_num_tokens; the largest rank's), 0 when the
	// exposition does not say. It sizes the edge's shadow of the cache
	// (edge/kvshadow).
	RankKVTokens float64
	Ranks        int // distinct rank labels seen (at least 1)
	Found        bool
	// LoRA: vLLM's adapters (lora.go; nil: none reported).
	LoRA *LoRAState
}

// ParseEngineMetrics reads a Prometheus text exposition in format
// (MetricsVLLM or MetricsSGLang, internal/enginemetrics) and sums the load
// figures over ranks.
func ParseEngineMetrics(format string, r io.Reader) (EngineLoad, error) {
	x, err := enginemetrics.Parse(enginemetrics.Format(format), r)
	if err != nil {
		return EngineLoad{}, err
	}
	return engineLoad(x), nil
}

// engineLoad sums a scrape's ranks: requests, and KV in the engine's units
// (SGLang tokens; vLLM blocks, or per-mille of the usage fraction when the
// exposition does not state the pool's size).
func engineLoad(x enginemetrics.Exposition) EngineLoad {
	out := EngineLoad{Found: true, Ranks: max(len(x.Ranks), 1)}
	for _, rk := range x.Ranks {
		out.Waiting += rk.Waiting
		out.Running += rk.Running
		switch {
		case rk.HasUsed && rk.HasTotal && rk.TotalTokens > 0:
			out.KVUsed += rk.UsedTokens
			out.KVTotal += rk.TotalTokens
			out.ActiveTokens += rk.UsedTokens
			out.RankKVTokens = max(out.RankKVTokens, rk.TotalTokens)
		case rk.GPUBlocks > 0:
			out.KVUsed += rk.Usage * rk.GPUBlocks
			out.KVTotal += rk.GPUBlocks
			out.ActiveTokens += rk.Usage * rk.GPUBlocks * rk.BlockSize
			out.RankKVTokens = max(out.RankKVTokens, rk.GPUBlocks*rk.BlockSize)
		default:
			out.KVUsed += rk.Usage * 1000
			out.KVTotal += 1000
		}
	}
	m := enginemetrics.MaxFigure
	out.Waiting, out.Running = min(out.Waiting, m), min(out.Running, m)
	out.KVUsed, out.KVTotal, out.ActiveTokens = min(out.KVUsed, m), min(out.KVTotal, m), min(out.ActiveTokens, m)
	out.RankKVTokens = min(out.RankKVTokens, m)
	return out
}

// scrape fetches and applies instance id's engine metrics. A failed scrape
// keeps the last figures until they are stale (then they are dropped: the
// instance's load is unknown, as for a static worker without telemetry).
func (f *View) scrape(id, base, format string) {
	load, err := f.fetchMetrics(base, format)
	now := f.cfg.Now()
	f.mu.Lock()
	in, ok := f.byID[id]
	if !ok {
		f.mu.Unlock()
		return
	}
	if err != nil {
		stale := in.scraped && now.Sub(in.lastScrape) > f.staleAfter(f.cfg.ProbeInterval)
		if stale {
			in.scraped = false
			in.queued, in.active, in.activeTok, in.kvUsed, in.kvTotal = 0, 0, 0, 0, 0
			in.rankKVTok = 0
		}
		first := !in.scrapeFailed
		in.scrapeFailed = true
		f.mu.Unlock()
		f.metrics.scrapes.WithLabelValues("failed").Inc()
		if first {
			f.log.Warn("engine metrics scrape failed (load unknown until it succeeds)", "instance", id, "err", err)
		}
		if stale {
			f.bump()
		}
		return
	}
	in.scraped, in.scrapeFailed, in.lastScrape = true, false, now
	in.queued, in.active = int(math.Round(load.Waiting)), int(math.Round(load.Running))
	in.activeTok = int64(load.ActiveTokens)
	in.kvUsed, in.kvTotal = int64(load.KVUsed), int64(load.KVTotal)
	in.rankKVTok = int64(load.RankKVTokens)
	in.lora = load.LoRA
	// The engine's figures now count what this edge dispatched so far,
	// as a worker's load report does.
	in.reportGen.Add(1)
	in.pendingReq.Store(0)
	in.pendingTok.Store(0)
	f.mu.Unlock()
	f.metrics.scrapes.WithLabelValues("ok").Inc()
	f.bump()
}

func (f *View) fetchMetrics(base, format string) (EngineLoad, error) {
	ctx, cancel := context.WithTimeout(f.ctx, f.cfg.ProbeInterval)
	defer cancel()
	url := base + "/metrics"
	fams, err := enginemetrics.FetchFamilies(ctx, f.client, url)
	if err != nil {
		return EngineLoad{}, err
	}
	x, err := enginemetrics.FromFamilies(enginemetrics.Format(format), fams)
	if err != nil {
		return EngineLoad{}, fmt.Errorf("GET %s: %w", url, err)
	}
	load := engineLoad(x)
	if format == MetricsVLLM {
		load.LoRA = LoRAFromFamilies(fams)
	}
	return load, nil
}
