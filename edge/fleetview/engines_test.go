package fleetview

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/enginemetrics"
	"github.com/tether-project/tether/routing"

	"github.com/tether-project/tether/test/engines/sglang"
	"github.com/tether-project/tether/test/engines/vllm"
)

// An exposition as vLLM serves it with --data-parallel-size 2: every gauge
// labelled engine="<rank>", cache_config_info without an engine label,
// histograms and counters the parser skips.
const vllmExposition = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_gpu_blocks="1000",prefix_caching_hash_algo="sha256"} 1.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="m"} 1.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0
`

// SGLang without data parallelism: no dp_rank label.
const sglangExposition = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 2.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 5.0
sglang:token_usage{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.1
sglang:num_used_tokens{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 800.0
sglang:max_total_num_tokens{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 8000.0
sglang:gen_throughput{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1.5e+02
`

func TestParseEngineMetrics(t *testing.T) {
	v, err := ParseEngineMetrics(MetricsVLLM, strings.NewReader(vllmExposition))
	if err != nil {
		t.Fatal(err)
	}
	want := EngineLoad{Waiting: 7, Running: 4, KVUsed: 750, KVTotal: 2000, ActiveTokens: 750 * 16, RankKVTokens: 1000 * 16, Ranks: 2, Found: true}
	if v != want {
		t.Fatalf("vllm: %+v, want %+v", v, want)
	}
	s, err := ParseEngineMetrics(MetricsSGLang, strings.NewReader(sglangExposition))
	if err != nil {
		t.Fatal(err)
	}
	want = EngineLoad{Waiting: 5, Running: 2, KVUsed: 800, KVTotal: 8000, ActiveTokens: 800, RankKVTokens: 8000, Ranks: 1, Found: true}
	if s != want {
		t.Fatalf("sglang: %+v, want %+v", s, want)
	}
}

func TestParseEngineMetricsRejects(t *testing.T) {
	for name, in := range map[string]string{
		"none of the gauges":  "# just a comment\nother_metric 1\n",
		"value not a number":  `vllm:num_requests_waiting{engine="0"} many` + "\n",
		"unterminated labels": `vllm:num_requests_waiting{engine="0" 1` + "\n",
		"unterminated value":  `vllm:num_requests_waiting{engine="0} 1` + "\n",
		"no value":            "vllm:num_requests_waiting\n",
		"beyond 8 MiB":        "vllm:num_requests_waiting{engine=\"" + strings.Repeat("x", 9<<20) + "\"} 1\n",
		"two TYPE lines":      "# TYPE vllm:num_requests_waiting gauge\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1\n",
	} {
		if _, err := ParseEngineMetrics(MetricsVLLM, strings.NewReader(in)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	if _, err := ParseEngineMetrics("tgi", strings.NewReader(vllmExposition)); err == nil {
		t.Error("unknown format parsed")
	}
	// NaN and out-of-range usage are clamped, never propagated.
	l, err := ParseEngineMetrics(MetricsVLLM, strings.NewReader("vllm:kv_cache_usage_perc{engine=\"0\"} NaN\nvllm:num_requests_waiting{engine=\"0\"} 1\n"))
	if err != nil || math.IsNaN(l.KVUsed) || l.KVUsed != 0 {
		t.Fatalf("NaN usage: %+v %v", l, err)
	}
}

// vLLM labels cache_config_info with each engine core (log_metrics_info
// sets engine to the index): every rank gets its own pool size. An info
// series without the label (a scrape through a proxy that drops it) still
// applies to every rank.
func TestParseVLLMCacheConfigPerEngine(t *testing.T) {
	perEngine := `vllm:num_requests_waiting{engine="0",model_name="m"} 1
vllm:num_requests_waiting{engine="1",model_name="m"} 2
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="3000"} 1.0
`
	l, err := ParseEngineMetrics(MetricsVLLM, strings.NewReader(perEngine))
	want := EngineLoad{Waiting: 3, KVUsed: 2000, KVTotal: 4000, ActiveTokens: 2000 * 16, RankKVTokens: 3000 * 16, Ranks: 2, Found: true}
	if err != nil || l != want {
		t.Fatalf("%+v %v, want %+v", l, err, want)
	}
}

// With --enable-metrics-for-all-schedulers every TP rank of a data-parallel
// group exports the group's figures: they count once (the lowest tp_rank's
// series), per dp_rank. Before, they were summed over TP ranks: a TP-4
// server looked four times as busy.
func TestParseSGLangAllSchedulersCountsEachRankOnce(t *testing.T) {
	var b strings.Builder
	for dp := range 2 {
		for tp := range 4 {
			l := fmt.Sprintf(`{dp_rank="%d",engine_type="unified",model_name="m",moe_ep_rank="%d",pp_rank="0",tp_rank="%d"}`, dp, tp, dp*4+tp)
			fmt.Fprintf(&b, "sglang:num_queue_reqs%s %d\nsglang:num_running_reqs%s 2\nsglang:num_used_tokens%s 100\nsglang:max_total_num_tokens%s 1000\n", l, dp+3, l, l, l)
		}
	}
	l, err := ParseEngineMetrics(MetricsSGLang, strings.NewReader(b.String()))
	want := EngineLoad{Waiting: 3 + 4, Running: 4, KVUsed: 200, KVTotal: 2000, ActiveTokens: 200, RankKVTokens: 1000, Ranks: 2, Found: true}
	if err != nil || l != want {
		t.Fatalf("%+v %v, want %+v", l, err, want)
	}
}

// The stand-ins' /metrics parse to what they were told to report.
func TestParseStandInMetrics(t *testing.T) {
	get := func(url string) io.Reader {
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return bytes.NewReader(b)
	}
	v := vllm.Start(vllm.Options{Model: "m", DataParallelSize: 4})
	defer v.Close()
	v.SetWaiting(2, 9)
	l, err := ParseEngineMetrics(MetricsVLLM, get(v.URL()))
	if err != nil || l.Waiting != 9 || l.Ranks != 4 {
		t.Fatalf("vllm stand-in: %+v %v", l, err)
	}
	for _, all := range []bool{false, true} {
		s := sglang.Start(sglang.Options{Model: "m", DPSize: 2, TPSize: 4, AllSchedulers: all})
		defer s.Close()
		s.SetWaiting(1, 3)
		l, err = ParseEngineMetrics(MetricsSGLang, get(s.URL()))
		if err != nil || l.Waiting != 3 || l.Ranks != 2 || l.KVTotal != 2*4096 {
			t.Fatalf("sglang stand-in (all schedulers %v): %+v %v", all, l, err)
		}
	}
}

// A static engine's scraped /metrics fill its load like a report: queued,
// active and ranks; a scrape resets what the edge counted as dispatched;
// once scrapes keep failing past staleness the load is dropped while the
// health probe still decides health.
func TestEngineScrapeFeedsLoad(t *testing.T) {
	var waiting, failing atomic.Int64
	waiting.Store(6)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == DefaultHealthPath:
			w.WriteHeader(http.StatusOK)
		case r.URL.Path == "/metrics" && failing.Load() == 0:
			fmt.Fprintf(w, "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} %d\nvllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0\n", waiting.Load())
			fmt.Fprint(w, "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2\nvllm:num_requests_running{engine=\"1\",model_name=\"m\"} 1\n")
			fmt.Fprint(w, "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0\n")
		default:
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)
	f, _ := newFleet(t, Config{ProbeInterval: 20 * time.Millisecond, MinStaleAfter: 200 * time.Millisecond,
		Static: []Static{{ID: "vllm-0", URL: srv.URL, Fleet: fsm.FleetContext, Metrics: MetricsVLLM, Ranks: 2}}})
	view := func() routing.InstanceView {
		for _, v := range f.Views(time.Now(), nil) {
			if v.ID == "vllm-0" {
				return v
			}
		}
		t.Fatal("no view")
		return routing.InstanceView{}
	}
	waitFor(t, "the scraped queue", 5*time.Second, func() bool { v := view(); return v.Healthy && v.QueuedRequests == 6 })
	if v := view(); v.ActiveRequests != 3 || v.Ranks != 2 || v.KVUsedBlocks != 500 || v.KVTotalBlocks != 2000 {
		t.Fatalf("view %+v", v)
	}
	done := f.NoteDispatch("vllm-0", 100)
	defer done()
	if v := view(); v.QueuedRequests < 7 {
		t.Fatalf("a dispatched request does not count until the next scrape: %+v", v)
	}
	waiting.Store(1)
	waitFor(t, "the next scrape to replace the dispatched count", 5*time.Second, func() bool { return view().QueuedRequests == 1 })
	failing.Store(1)
	waitFor(t, "stale scraped figures dropped", 5*time.Second, func() bool { v := view(); return v.QueuedRequests == 0 && v.ActiveRequests == 0 })
	if !view().Healthy {
		t.Fatal("a failing scrape made the instance unhealthy; /health decides that")
	}
}

// BenchmarkParseEngineMetrics parses a vLLM exposition of 8 engine cores
// with their histograms (~0.5 MiB), what one scrape per probe interval
// costs the edge.
func BenchmarkParseEngineMetrics(b *testing.B) {
	var sb strings.Builder
	for r := range 8 {
		for _, g := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} {
			fmt.Fprintf(&sb, "%s{engine=\"%d\",model_name=\"m\"} 3.0\n", g, r)
		}
		for _, h := range []string{"vllm:e2e_request_latency_seconds", "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:request_prompt_tokens"} {
			for le := range 200 {
				fmt.Fprintf(&sb, "%s_bucket{engine=\"%d\",le=\"%d.0\",model_name=\"m\"} %d.0\n", h, r, le, le*7)
			}
		}
	}
	data := []byte(sb.String())
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for range b.N {
		if _, err := ParseEngineMetrics(MetricsVLLM, bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(data)), "exposition_bytes")
}

// FuzzParseEngineMetrics: whatever a server answers on /metrics, the
// parser returns figures or an error, never panics, and never reports
// negative or NaN load.
func FuzzParseEngineMetrics(f *testing.F) {
	f.Add(vllmExposition, true)
	f.Add(sglangExposition, false)
	f.Add(`vllm:num_requests_waiting{engine="0",x="a\"b\\c"} -3`+"\n", true)
	f.Add("sglang:token_usage{dp_rank=\"1\"} +Inf\nsglang:num_queue_reqs 1e308\n", false)
	f.Fuzz(func(t *testing.T, text string, isVLLM bool) {
		format := MetricsSGLang
		if isVLLM {
			format = MetricsVLLM
		}
		l, err := ParseEngineMetrics(format, strings.NewReader(text))
		if err != nil {
			return
		}
		for _, v := range []float64{l.Waiting, l.Running, l.KVUsed, l.KVTotal, l.ActiveTokens} {
			if math.IsNaN(v) || v < 0 || v > enginemetrics.MaxFigure {
				t.Fatalf("load %+v from %q", l, text)
			}
		}
	})
}
