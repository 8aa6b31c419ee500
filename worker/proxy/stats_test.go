package proxy

import (
	"strings"
	"testing"
	"time"
)

func TestParseUpstreamMetrics(t *testing.T) {
	cases := []struct {
		name, text string
		want       upstreamMetrics
	}{
		{"vllm v1", `vllm:num_requests_waiting{model_name="m"} 4
vllm:kv_cache_usage_perc{model_name="m"} 0.5
vllm:cache_config_info{block_size="16",num_gpu_blocks="2000"} 1.0
`, upstreamMetrics{waiting: 4, blocksUsed: 1000, blocksTotal: 2000}},
		{"vllm older gauge", `vllm:gpu_cache_usage_perc 0.1
vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1
`, upstreamMetrics{blocksUsed: 10, blocksTotal: 100}},
		{"vllm data parallel, info per engine", `vllm:num_requests_waiting{engine="0",model_name="m"} 1
vllm:num_requests_waiting{engine="1",model_name="m"} 2
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.4
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="100"} 1
`, upstreamMetrics{waiting: 3, blocksUsed: 60, blocksTotal: 200}},
		{"sglang", `sglang:num_queue_reqs{model_name="m"} 2
sglang:token_usage{model_name="m"} 0.75
sglang:max_total_num_tokens{model_name="m"} 6400
`, upstreamMetrics{waiting: 2, blocksUsed: 75, blocksTotal: 100}},
		{"sglang, every TP rank's scheduler", `sglang:num_queue_reqs{model_name="m",pp_rank="0",tp_rank="0"} 2
sglang:num_queue_reqs{model_name="m",pp_rank="0",tp_rank="1"} 2
sglang:token_usage{model_name="m",pp_rank="0",tp_rank="0"} 0.75
sglang:token_usage{model_name="m",pp_rank="0",tp_rank="1"} 0.75
sglang:max_total_num_tokens{model_name="m",pp_rank="0",tp_rank="0"} 6400
sglang:max_total_num_tokens{model_name="m",pp_rank="0",tp_rank="1"} 6400
`, upstreamMetrics{waiting: 2, blocksUsed: 75, blocksTotal: 100}},
		{"NaN and negatives are zero", "vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc -3\n", upstreamMetrics{}},
		{"negative clamped", "vllm:num_requests_waiting -5\n", upstreamMetrics{}},
	}
	for _, c := range cases {
		got, err := parseUpstreamMetrics(strings.NewReader(c.text), 64)
		if err != nil || *got != c.want {
			t.Errorf("%s: %+v %v, want %+v", c.name, got, err, c.want)
		}
	}
	// An exposition that is not the text format, or states no load, is a
	// failed scrape (the proxy keeps the last figures).
	for _, bad := range []string{"vllm:num_requests_waiting{broken 7\n", "just_a_name\n", "other_metric 1\n"} {
		if m, err := parseUpstreamMetrics(strings.NewReader(bad), 64); err == nil {
			t.Errorf("%q parsed as %+v", bad, m)
		}
	}
}

func TestHitWindowRolls(t *testing.T) {
	w := newHitWindow(10*time.Second, 10)
	t0 := time.Unix(1000, 0)
	w.add(t0, 100, 50)
	w.add(t0.Add(3*time.Second), 10, 10)
	if l, h := w.sum(t0.Add(5 * time.Second)); l != 110 || h != 60 {
		t.Fatalf("within window: %d/%d", h, l)
	}
	if l, h := w.sum(t0.Add(11 * time.Second)); l != 10 || h != 10 {
		t.Fatalf("after the first bucket left the window: %d/%d", h, l)
	}
	if l, h := w.sum(t0.Add(time.Minute)); l != 0 || h != 0 {
		t.Fatalf("after the window: %d/%d", h, l)
	}
	// A bucket reused after a full lap starts from zero.
	w.add(t0.Add(20*time.Second), 1, 0)
	if l, _ := w.sum(t0.Add(20 * time.Second)); l != 1 {
		t.Fatalf("reused bucket kept stale counts: %d", l)
	}
}
