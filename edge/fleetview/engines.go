package fleetview

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// Metrics formats of the engines whose Prometheus /metrics the edge scrapes
// for load (docs/engines.md). tether workers report over NATS instead.
const (
	MetricsVLLM   = "vllm"
	MetricsSGLang = "sglang"
)

// maxMetricsBytes bounds one scrape: vLLM's exposition with its histograms
// is a few hundred KiB; anything far beyond is not an engine's answer.
const maxMetricsBytes = 8 << 20

// EngineLoad is one scrape of an engine's /metrics, summed over its
// data-parallel ranks (vLLM labels each engine core `engine="<rank>"`,
// SGLang each scheduler `dp_rank="<rank>"`).
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
}

type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// ParseEngineMetrics reads a Prometheus text exposition in format
// (MetricsVLLM or MetricsSGLang) and sums the load figures over ranks.
// Lines it does not need are skipped unparsed.
func ParseEngineMetrics(format string, r io.Reader) (EngineLoad, error) {
	var waiting, running, usage, used, total, cacheInfo string
	rankLabel := ""
	switch format {
	case MetricsVLLM:
		waiting, running, usage, cacheInfo = "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:cache_config_info"
		rankLabel = "engine"
	case MetricsSGLang:
		waiting, running, usage = "sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"
		used, total = "sglang:num_used_tokens", "sglang:max_total_num_tokens"
		rankLabel = "dp_rank"
	default:
		return EngineLoad{}, fmt.Errorf("unknown metrics format %q", format)
	}
	want := map[string]bool{waiting: true, running: true, usage: true}
	for _, n := range []string{used, total, cacheInfo} {
		if n != "" {
			want[n] = true
		}
	}
	type rankFigures struct {
		usage, used, total     float64
		hasUsed, hasTotal      bool
		hasUsage               bool
		gpuBlocks, blockSize   float64
		hasBlocks              bool
		waiting, running       float64
		hasWaiting, hasRunning bool
	}
	ranks := map[string]*rankFigures{}
	rank := func(s sample) *rankFigures {
		k := s.labels[rankLabel]
		if ranks[k] == nil {
			ranks[k] = &rankFigures{}
		}
		return ranks[k]
	}
	sc := bufio.NewScanner(io.LimitReader(r, maxMetricsBytes))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		if !want[name] {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return EngineLoad{}, err
		}
		rf := rank(s)
		switch s.name {
		case waiting:
			rf.waiting += sane(s.value)
			rf.hasWaiting = true
		case running:
			rf.running += sane(s.value)
			rf.hasRunning = true
		case usage:
			rf.usage, rf.hasUsage = s.value, true
		case used:
			rf.used, rf.hasUsed = sane(s.value), true
		case total:
			rf.total, rf.hasTotal = sane(s.value), true
		case cacheInfo:
			b, err1 := strconv.ParseFloat(s.labels["num_gpu_blocks"], 64)
			bs, err2 := strconv.ParseFloat(s.labels["block_size"], 64)
			if b, bs = sane(b), sane(bs); err1 == nil && err2 == nil && b > 0 && bs > 0 {
				rf.gpuBlocks, rf.blockSize, rf.hasBlocks = b, bs, true
			}
		}
	}
	if err := sc.Err(); err != nil {
		return EngineLoad{}, fmt.Errorf("reading metrics: %w", err)
	}
	var out EngineLoad
	// vLLM's cache_config_info carries no engine label: it applies to
	// every rank.
	var shared *rankFigures
	if rf, ok := ranks[""]; ok && rf.hasBlocks {
		shared = rf
	}
	for k, rf := range ranks {
		if !rf.hasWaiting && !rf.hasRunning && !rf.hasUsage {
			continue
		}
		if k != "" || !rf.hasBlocks || rf.hasWaiting || rf.hasRunning {
			out.Ranks++
		}
		out.Found = true
		out.Waiting += rf.waiting
		out.Running += rf.running
		blocks, blockSize := rf.gpuBlocks, rf.blockSize
		if !rf.hasBlocks && shared != nil {
			blocks, blockSize = shared.gpuBlocks, shared.blockSize
		}
		switch {
		case rf.hasUsed && rf.hasTotal && rf.total > 0:
			out.KVUsed += rf.used
			out.KVTotal += rf.total
			out.ActiveTokens += rf.used
			out.RankKVTokens = max(out.RankKVTokens, rf.total)
		case blocks > 0:
			out.KVUsed += clamp01(rf.usage) * blocks
			out.KVTotal += blocks
			out.ActiveTokens += clamp01(rf.usage) * blocks * blockSize
			out.RankKVTokens = max(out.RankKVTokens, blocks*blockSize)
		default:
			out.KVUsed += clamp01(rf.usage) * 1000
			out.KVTotal += 1000
		}
	}
	if !out.Found {
		return out, fmt.Errorf("none of %s, %s, %s in the exposition", waiting, running, usage)
	}
	out.Ranks = max(out.Ranks, 1)
	out.Waiting, out.Running = min(out.Waiting, maxFigure), min(out.Running, maxFigure)
	out.KVUsed, out.KVTotal, out.ActiveTokens = min(out.KVUsed, maxFigure), min(out.KVTotal, maxFigure), min(out.ActiveTokens, maxFigure)
	out.RankKVTokens = min(out.RankKVTokens, maxFigure)
	return out, nil
}

// maxFigure bounds every figure a scrape yields: a server reporting
// absurd values must not overflow the instance view's integers.
const maxFigure = 1e12

// sane maps a gauge's value to a usable load figure: NaN and negatives
// (a server must not attract traffic by reporting less than nothing) are
// 0, +Inf and huge values are capped.
func sane(v float64) float64 {
	if math.IsNaN(v) || v < 0 {
		return 0
	}
	return min(v, maxFigure)
}

func clamp01(v float64) float64 {
	if math.IsNaN(v) || v < 0 {
		return 0
	}
	return min(v, 1)
}

// parseSample parses `name{l="v",...} value [timestamp]`.
func parseSample(line string) (sample, error) {
	s := sample{labels: map[string]string{}}
	rest := line
	i := strings.IndexAny(rest, "{ ")
	if i < 0 {
		return s, fmt.Errorf("metrics line %q: no value", trunc(line))
	}
	s.name, rest = rest[:i], rest[i:]
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, " ,")
			if rest == "" {
				return s, fmt.Errorf("metrics line %q: unterminated labels", trunc(line))
			}
			if rest[0] == '}' {
				rest = rest[1:]
				break
			}
			eq := strings.IndexByte(rest, '=')
			if eq <= 0 || eq+1 >= len(rest) || rest[eq+1] != '"' {
				return s, fmt.Errorf("metrics line %q: malformed label", trunc(line))
			}
			key := strings.TrimSpace(rest[:eq])
			rest = rest[eq+2:]
			var val strings.Builder
			closed := false
			for j := 0; j < len(rest); j++ {
				c := rest[j]
				if c == '\\' && j+1 < len(rest) {
					j++
					switch rest[j] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(rest[j])
					}
					continue
				}
				if c == '"' {
					rest, closed = rest[j+1:], true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return s, fmt.Errorf("metrics line %q: unterminated label value", trunc(line))
			}
			s.labels[key] = val.String()
		}
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return s, fmt.Errorf("metrics line %q: no value", trunc(line))
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, fmt.Errorf("metrics line %q: value: %w", trunc(line), err)
	}
	s.value = v
	return s, nil
}

func trunc(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return EngineLoad{}, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return EngineLoad{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return EngineLoad{}, fmt.Errorf("GET %s/metrics: status %d", base, resp.StatusCode)
	}
	load, err := ParseEngineMetrics(format, resp.Body)
	if err != nil {
		return EngineLoad{}, fmt.Errorf("GET %s/metrics: %w", base, err)
	}
	return load, nil
}
