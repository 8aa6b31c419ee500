// Package enginemetrics reads the load figures vLLM and SGLang publish on
// their Prometheus /metrics, per data-parallel rank, with
// github.com/prometheus/common/expfmt. The edge (edge/fleetview, engines
// configured by URL) and the worker's proxy (worker/proxy) both scrape
// engines through it and derive their own figures from the ranks it
// returns.
//
// What it reads, per engine:
//
//   - vLLM (vllm/v1/metrics/loggers.py PrometheusStatLogger): every gauge
//     labelled engine="<index>" (one engine core per data-parallel rank)
//     and model_name; vllm:num_requests_waiting, vllm:num_requests_running,
//     vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc before v0.10);
//     vllm:cache_config_info, an info gauge whose labels carry block_size
//     and num_gpu_blocks, per engine (log_metrics_info sets engine to the
//     index; an info series without it applies to every rank).
//   - SGLang (python/sglang/srt/metrics/collector.py
//     SchedulerMetricsCollector): gauges labelled model_name, engine_type,
//     tp_rank, pp_rank, moe_ep_rank and, with data parallelism, dp_rank;
//     sglang:num_queue_reqs, sglang:num_running_reqs, sglang:num_used_tokens,
//     sglang:max_total_num_tokens, sglang:token_usage. By default only the
//     scheduler with attn_tp_rank 0 of each data-parallel group reports;
//     with --enable-metrics-for-all-schedulers every TP rank does, with the
//     same figures (one batch, one token pool per group), so the ranks are
//     de-duplicated: per dp_rank the series of the lowest (pp_rank,
//     tp_rank) scheduler counts.
package enginemetrics

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Format names the engine whose exposition is read.
type Format string

const (
	VLLM   Format = "vllm"
	SGLang Format = "sglang"
)

// MaxBytes bounds one exposition: vLLM's with its histograms is a few
// hundred KiB; anything far beyond is not an engine's answer.
const MaxBytes = 8 << 20

// MaxFigure bounds every value read: a server reporting absurd figures
// must not overflow its consumers' integers.
const MaxFigure = 1e12

// Rank is what the exposition says about one data-parallel rank. Values
// are sanitised: NaN and negatives are 0 (a server must not attract
// traffic by reporting less than nothing), +Inf and huge values MaxFigure,
// the usage fraction is clamped to [0, 1].
type Rank struct {
	// Label is the rank label's value (vLLM engine, SGLang dp_rank; ""
	// when the series carry none).
	Label string
	// Waiting and Running requests.
	Waiting, Running       float64
	HasWaiting, HasRunning bool
	// Usage is the KV cache usage fraction.
	Usage    float64
	HasUsage bool
	// UsedTokens and TotalTokens (SGLang): tokens held and the pool's
	// capacity.
	UsedTokens, TotalTokens float64
	HasUsed, HasTotal       bool
	// GPUBlocks and BlockSize (vLLM cache_config_info; 0: not stated).
	GPUBlocks, BlockSize float64
}

// Load reports whether the rank states any load figure (an info series
// alone does not make a rank).
func (r Rank) Load() bool { return r.HasWaiting || r.HasRunning || r.HasUsage }

// Exposition is one scrape: the ranks that state load figures, ordered by
// label.
type Exposition struct {
	Ranks []Rank
}

type names struct {
	rankLabel                string
	waiting, running         string
	usage                    []string // first present wins
	used, total, cacheConfig string
}

func namesOf(f Format) (names, error) {
	switch f {
	case VLLM:
		return names{rankLabel: "engine", waiting: "vllm:num_requests_waiting", running: "vllm:num_requests_running",
			usage: []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}, cacheConfig: "vllm:cache_config_info"}, nil
	case SGLang:
		return names{rankLabel: "dp_rank", waiting: "sglang:num_queue_reqs", running: "sglang:num_running_reqs",
			usage: []string{"sglang:token_usage"}, used: "sglang:num_used_tokens", total: "sglang:max_total_num_tokens"}, nil
	}
	return names{}, fmt.Errorf("enginemetrics: unknown format %q (want vllm or sglang)", f)
}

// Detect names the engine whose metric names the exposition uses ("" when
// neither's).
func Detect(families map[string]*dto.MetricFamily) Format {
	for _, f := range []Format{VLLM, SGLang} {
		n, _ := namesOf(f)
		for _, name := range append([]string{n.waiting, n.running}, n.usage...) {
			if families[name] != nil {
				return f
			}
		}
	}
	return ""
}

// Parse reads an exposition in the Prometheus text format (at most
// MaxBytes) as format f. An exposition that is not valid text format, or
// that states none of f's load figures, is an error.
func Parse(f Format, r io.Reader) (Exposition, error) {
	fams, err := Families(r)
	if err != nil {
		return Exposition{}, err
	}
	return FromFamilies(f, fams)
}

// Families parses an exposition (at most MaxBytes) into metric families.
func Families(r io.Reader) (map[string]*dto.MetricFamily, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("enginemetrics: reading the exposition: %w", err)
	}
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("enginemetrics: exposition over %d bytes", MaxBytes)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("enginemetrics: %w", err)
	}
	return fams, nil
}

// FromFamilies reads format f's figures from parsed metric families.
func FromFamilies(f Format, fams map[string]*dto.MetricFamily) (Exposition, error) {
	n, err := namesOf(f)
	if err != nil {
		return Exposition{}, err
	}
	ranks := map[string]*Rank{}
	rank := func(label string) *Rank {
		if ranks[label] == nil {
			ranks[label] = &Rank{Label: label}
		}
		return ranks[label]
	}
	each := func(name string, fn func(rk *Rank, v float64, m *dto.Metric)) {
		fam := fams[name]
		if fam == nil {
			return
		}
		for _, m := range representatives(f, n.rankLabel, fam.GetMetric()) {
			fn(rank(Label(m, n.rankLabel)), Value(m), m)
		}
	}
	each(n.waiting, func(rk *Rank, v float64, _ *dto.Metric) { rk.Waiting += sane(v); rk.HasWaiting = true })
	each(n.running, func(rk *Rank, v float64, _ *dto.Metric) { rk.Running += sane(v); rk.HasRunning = true })
	for _, u := range n.usage {
		if fams[u] == nil {
			continue
		}
		each(u, func(rk *Rank, v float64, _ *dto.Metric) { rk.Usage, rk.HasUsage = clamp01(v), true })
		break
	}
	if n.used != "" {
		each(n.used, func(rk *Rank, v float64, _ *dto.Metric) { rk.UsedTokens, rk.HasUsed = sane(v), true })
		each(n.total, func(rk *Rank, v float64, _ *dto.Metric) { rk.TotalTokens, rk.HasTotal = sane(v), true })
	}
	var shared *Rank // an info series without a rank label: every rank's
	if n.cacheConfig != "" {
		each(n.cacheConfig, func(rk *Rank, _ float64, m *dto.Metric) {
			b, err1 := strconv.ParseFloat(Label(m, "num_gpu_blocks"), 64)
			bs, err2 := strconv.ParseFloat(Label(m, "block_size"), 64)
			if b, bs = sane(b), sane(bs); err1 == nil && err2 == nil && b > 0 && bs > 0 {
				rk.GPUBlocks, rk.BlockSize = b, bs
				if rk.Label == "" {
					shared = rk
				}
			}
		})
	}
	var out Exposition
	for _, rk := range ranks {
		if !rk.Load() {
			continue
		}
		if rk.GPUBlocks == 0 && shared != nil {
			rk.GPUBlocks, rk.BlockSize = shared.GPUBlocks, shared.BlockSize
		}
		out.Ranks = append(out.Ranks, *rk)
	}
	if len(out.Ranks) == 0 {
		return out, fmt.Errorf("enginemetrics: none of %s, %s, %s in the exposition", n.waiting, n.running, n.usage[0])
	}
	sort.Slice(out.Ranks, func(i, j int) bool { return rankLess(out.Ranks[i].Label, out.Ranks[j].Label) })
	return out, nil
}

// Fetch scrapes url (an engine's /metrics) within ctx and parses it as f.
func Fetch(ctx context.Context, client *http.Client, url string, f Format) (Exposition, error) {
	fams, err := FetchFamilies(ctx, client, url)
	if err != nil {
		return Exposition{}, err
	}
	x, err := FromFamilies(f, fams)
	if err != nil {
		return Exposition{}, fmt.Errorf("GET %s: %w", url, err)
	}
	return x, nil
}

// FetchFamilies scrapes url and parses the exposition (200 only).
func FetchFamilies(ctx context.Context, client *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	fams, err := Families(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return fams, nil
}

// representatives are the series that count: all of them for vLLM (one
// per engine core and model); for SGLang, per dp_rank only the scheduler
// with the lowest (pp_rank, tp_rank) (the others repeat its figures).
func representatives(f Format, rankLabel string, ms []*dto.Metric) []*dto.Metric {
	if f != SGLang {
		return ms
	}
	type key struct{ pp, tp int }
	best := map[string]key{}
	for _, m := range ms {
		k := key{labelInt(m, "pp_rank"), labelInt(m, "tp_rank")}
		r := Label(m, rankLabel)
		if b, ok := best[r]; !ok || k.pp < b.pp || (k.pp == b.pp && k.tp < b.tp) {
			best[r] = k
		}
	}
	var out []*dto.Metric
	for _, m := range ms {
		k := key{labelInt(m, "pp_rank"), labelInt(m, "tp_rank")}
		if best[Label(m, rankLabel)] == k {
			out = append(out, m)
		}
	}
	return out
}

// Label is the value of m's label name ("": absent).
func Label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// labelInt is a rank label as a number (absent or not a number: 0).
func labelInt(m *dto.Metric, name string) int {
	n, err := strconv.Atoi(Label(m, name))
	if err != nil {
		return 0
	}
	return n
}

// Value is m's sample value, whatever its type.
func Value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// rankLess orders rank labels numerically when they are numbers.
func rankLess(a, b string) bool {
	x, errA := strconv.Atoi(a)
	y, errB := strconv.Atoi(b)
	if errA == nil && errB == nil {
		return x < y
	}
	return a < b
}

func sane(v float64) float64 {
	if math.IsNaN(v) || v < 0 {
		return 0
	}
	return min(v, MaxFigure)
}

func clamp01(v float64) float64 {
	if math.IsNaN(v) || v < 0 {
		return 0
	}
	return min(v, 1)
}
