package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// hitWindow sums prompt tokens looked up and hit over a rolling window,
// in fixed buckets so memory stays constant.
type hitWindow struct {
	mu      sync.Mutex
	bucket  time.Duration
	buckets []hitBucket
}

type hitBucket struct {
	slot         int64 // window slot number (time / bucket), identifies staleness
	lookup, hits int64
}

func newHitWindow(window time.Duration, n int) *hitWindow {
	b := window / time.Duration(n)
	if b <= 0 {
		b = time.Millisecond
	}
	return &hitWindow{bucket: b, buckets: make([]hitBucket, n)}
}

func (w *hitWindow) add(now time.Time, lookup, hits int64) {
	slot := now.UnixNano() / int64(w.bucket)
	w.mu.Lock()
	defer w.mu.Unlock()
	b := &w.buckets[int(slot%int64(len(w.buckets)))]
	if b.slot != slot {
		*b = hitBucket{slot: slot}
	}
	b.lookup += lookup
	b.hits += hits
}

func (w *hitWindow) sum(now time.Time) (lookup, hits int64) {
	slot := now.UnixNano() / int64(w.bucket)
	oldest := slot - int64(len(w.buckets)) + 1
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range w.buckets {
		if b.slot >= oldest && b.slot <= slot {
			lookup += b.lookup
			hits += b.hits
		}
	}
	return lookup, hits
}

// upstreamMetrics are the gauges read from an upstream's /metrics.
type upstreamMetrics struct {
	waiting     int
	blocksUsed  int
	blocksTotal int
}

func (e *Engine) scrapeLoop(ctx context.Context, rs *rankState) {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.ScrapeInterval)
	defer t.Stop()
	for {
		if m, err := e.scrape(ctx, rs.metrics); err == nil {
			rs.upstreamM.Store(m)
		}
		// Best effort: a failed scrape keeps the last figures.
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (e *Engine) scrape(ctx context.Context, url string) (*upstreamMetrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics %s: HTTP %d", url, resp.StatusCode)
	}
	return parseUpstreamMetrics(io.LimitReader(resp.Body, 16<<20), e.cfg.BlockSize), nil
}

// parseUpstreamMetrics reads the few gauges that vLLM and SGLang export in
// the Prometheus text format:
//
//	vLLM:   vllm:num_requests_waiting, vllm:kv_cache_usage_perc (or the older
//	        vllm:gpu_cache_usage_perc), vllm:cache_config_info{num_gpu_blocks="N"}
//	SGLang: sglang:num_queue_reqs, sglang:token_usage, sglang:max_total_num_tokens
//
// Series of one name (e.g. per model or engine label) are summed, usage
// fractions averaged. Unknown lines are ignored.
func parseUpstreamMetrics(r io.Reader, blockSize int) *upstreamMetrics {
	var waiting, usageSum, blocksTotal, maxTokens float64
	usageN := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, ok := splitSample(line)
		if !ok {
			continue
		}
		switch name {
		case "vllm:num_requests_waiting", "sglang:num_queue_reqs":
			waiting += value
		case "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage":
			usageSum += value
			usageN++
		case "vllm:cache_config_info":
			if v, ok := labelValue(labels, "num_gpu_blocks"); ok {
				if n, err := strconv.ParseFloat(v, 64); err == nil {
					blocksTotal += n
				}
			}
		case "sglang:max_total_num_tokens":
			maxTokens += value
		}
	}
	m := &upstreamMetrics{waiting: clampInt(waiting)}
	if blocksTotal == 0 && maxTokens > 0 {
		blocksTotal = math.Ceil(maxTokens / float64(blockSize))
	}
	m.blocksTotal = clampInt(blocksTotal)
	if usageN > 0 {
		frac := min(max(usageSum/float64(usageN), 0), 1)
		m.blocksUsed = clampInt(math.Round(frac * blocksTotal))
	}
	return m
}

func clampInt(v float64) int {
	if !(v > 0) {
		return 0
	}
	if v > 1<<40 {
		return 1 << 40
	}
	return int(v)
}

// splitSample splits `name{labels} value [timestamp]`.
func splitSample(line string) (name, labels string, value float64, ok bool) {
	rest := line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", "", 0, false
		}
		name, labels, rest = line[:i], line[i+1:j], line[j+1:]
	} else {
		sp := strings.IndexAny(line, " \t")
		if sp < 0 {
			return "", "", 0, false
		}
		name, rest = line[:sp], line[sp:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return "", "", 0, false
	}
	return name, labels, v, true
}

// labelValue finds key="value" in a label list (values without escaped quotes).
func labelValue(labels, key string) (string, bool) {
	for _, part := range strings.Split(labels, ",") {
		k, v, found := strings.Cut(strings.TrimSpace(part), "=")
		if found && k == key {
			return strings.Trim(v, `"`), true
		}
	}
	return "", false
}
