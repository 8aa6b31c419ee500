package proxy

import (
	"context"
	"errors"
	"io"
	"math"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/tether-project/tether/internal/enginemetrics"
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
	fams, err := enginemetrics.FetchFamilies(ctx, e.client, url)
	if err != nil {
		return nil, err
	}
	return upstreamFigures(fams, e.cfg.BlockSize)
}

// parseUpstreamMetrics reads an upstream's exposition (tests).
func parseUpstreamMetrics(r io.Reader, blockSize int) (*upstreamMetrics, error) {
	fams, err := enginemetrics.Families(r)
	if err != nil {
		return nil, err
	}
	return upstreamFigures(fams, blockSize)
}

// upstreamFigures turns a vLLM or SGLang exposition (the engine told by
// its metric names; internal/enginemetrics) into the rank's figures:
// waiting requests summed over the engine's data-parallel ranks, KV usage
// fractions averaged, and the pool's size in tether blocks of blockSize
// tokens (vLLM: num_gpu_blocks of cache_config_info, summed over engines;
// SGLang: max_total_num_tokens / blockSize).
func upstreamFigures(fams map[string]*dto.MetricFamily, blockSize int) (*upstreamMetrics, error) {
	f := enginemetrics.Detect(fams)
	if f == "" {
		return nil, errors.New("metrics: neither vLLM's nor SGLang's load gauges")
	}
	x, err := enginemetrics.FromFamilies(f, fams)
	if err != nil {
		return nil, err
	}
	var waiting, usageSum, blocksTotal, maxTokens float64
	usageN := 0
	for _, rk := range x.Ranks {
		waiting += rk.Waiting
		if rk.HasUsage {
			usageSum += rk.Usage
			usageN++
		}
		blocksTotal += rk.GPUBlocks
		maxTokens += rk.TotalTokens
	}
	m := &upstreamMetrics{waiting: clampInt(waiting)}
	if blocksTotal == 0 && maxTokens > 0 {
		blocksTotal = math.Ceil(maxTokens / float64(max(blockSize, 1)))
	}
	m.blocksTotal = clampInt(blocksTotal)
	if usageN > 0 {
		m.blocksUsed = clampInt(math.Round(usageSum / float64(usageN) * blocksTotal))
	}
	return m, nil
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
