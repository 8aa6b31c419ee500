package oaiserve

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// vllmEngine is what vLLM's OpenAI server does its own way.
type vllmEngine struct{}

func (vllmEngine) register(mux *http.ServeMux, s *Server) {
	mux.HandleFunc("GET /health", s.vllmHealth)
}

// vllmHealth follows vllm/entrypoints/openai/api_server.py health: it
// awaits engine_client.check_health() and answers 200 with an empty body,
// 503 once the engine core died (EngineDeadError).
func (s *Server) vllmHealth(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	ok := s.healthy
	s.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// errorBody follows vllm/entrypoints/openai/serving_engine.py
// create_error_response: ErrorResponse(error=ErrorInfo(message, type,
// param, code)), the OpenAI envelope.
func (vllmEngine) errorBody(status int, typ, msg string) any {
	return map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}}
}

// rank follows serving_engine.py _get_data_parallel_rank (the header
// X-data-parallel-rank, read case-insensitively; a value that is not an
// integer is None: the balancer picks) and the engine's input processor,
// which refuses a rank outside [0, data_parallel_size) with a ValueError
// (400 BadRequestError).
func (e vllmEngine) rank(raw string, present bool, size int) (int, int, any) {
	if !present {
		return -1, 0, nil
	}
	rank, err := strconv.Atoi(strings.TrimSpace(raw))
	if err != nil {
		return -1, 0, nil
	}
	if rank < 0 || rank >= size {
		return 0, http.StatusBadRequest, e.errorBody(http.StatusBadRequest, "BadRequestError",
			fmt.Sprintf("data_parallel_rank %d is out of range [0, %d).", rank, size))
	}
	return rank, 0, nil
}

// balance follows vllm/v1/engine/core_client.py DPLBAsyncMPClient
// get_core_engine_for_request: the engine core with the lowest
// waiting × 4 + running.
func (vllmEngine) balance(s *Server) int {
	best := 0
	for i := 1; i < s.opts.DataParallelSize; i++ {
		if 4*s.waiting[i]+s.running[i] < 4*s.waiting[best]+s.running[best] {
			best = i
		}
	}
	return best
}

// usage follows serving_chat.py / serving_completion.py: UsageInfo, with
// prompt_tokens_details = PromptTokenUsageInfo(cached_tokens) only when
// --enable-prompt-tokens-details is on and num_cached_tokens is non-zero
// (VLLMZeroCachedDetails: the release that tests `is not None`).
func (vllmEngine) usage(o Options, prompt, completion, cached int) map[string]any {
	u := map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
		"prompt_tokens_details": nil}
	if o.ReportCachedTokens && (cached > 0 || o.VLLMZeroCachedDetails) {
		u["prompt_tokens_details"] = map[string]any{"cached_tokens": cached}
	}
	return u
}

// choiceExtras: vLLM's choices carry stop_reason (protocol.py
// ChatCompletionResponseChoice, CompletionResponseChoice).
func (vllmEngine) choiceExtras(choice map[string]any, _ bool) { choice["stop_reason"] = nil }

// message is protocol.py ChatMessage as vLLM fills it.
func (vllmEngine) message(text string) map[string]any {
	return map[string]any{"role": "assistant", "content": text, "tool_calls": []any{}, "reasoning_content": nil}
}

// requestID follows serving_chat.py ("chatcmpl-" + random_uuid()) and
// serving_completion.py ("cmpl-" + ...).
func (vllmEngine) requestID(chat bool) string {
	if chat {
		return "chatcmpl-" + hexID()
	}
	return "cmpl-" + hexID()
}

// modelCard follows serving_models.py show_available_models (ModelCard
// with max_model_len, parent, permission).
func (vllmEngine) modelCard(model string) map[string]any {
	return map[string]any{"id": model, "object": "model", "created": time.Now().Unix(), "owned_by": "vllm", "root": model,
		"parent": nil, "max_model_len": 32768, "permission": []any{}}
}

// eventLayout: current vLLM encodes its msgspec structs as maps
// (vllm/distributed/kv_events.py); releases up to mid-2025 used
// array_like (KVEventsOptions.Layout selects them).
func (vllmEngine) eventLayout() Layout { return LayoutMap }

// metrics follows vllm/v1/metrics/loggers.py PrometheusStatLogger: every
// gauge per engine core, labelled engine="<index>" and model_name;
// cache_config_info once per engine (log_metrics_info sets engine to each
// index).
func (vllmEngine) metrics(b *strings.Builder, s *Server, figs []rankFigures) {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	labels := func(r int) string {
		return promLabels(map[string]string{"engine": strconv.Itoa(r), "model_name": s.opts.Model})
	}
	gauge := func(name, help string, val func(r int) string) {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
		for r := range figs {
			fmt.Fprintf(b, "%s{%s} %s\n", name, labels(r), val(r))
		}
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", func(r int) string { return f(float64(figs[r].running)) })
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", func(r int) string { return f(float64(figs[r].waiting)) })
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func(r int) string {
		return f(float64(figs[r].usedBlocks) / float64(s.opts.GPUBlocks))
	})
	fmt.Fprintf(b, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n")
	for r := range figs {
		fmt.Fprintf(b, "vllm:cache_config_info{block_size=\"%d\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"%d\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"%d\"} 1.0\n",
			s.opts.BlockSize, r, s.opts.GPUBlocks)
	}
	fmt.Fprintf(b, "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n# TYPE vllm:prompt_tokens_total counter\n")
	for r := range figs {
		fmt.Fprintf(b, "vllm:prompt_tokens_total{%s} %s\n", labels(r), f(float64(figs[r].prompted)))
	}
	s.loraMetrics(b)
	// loggers.py counter_prompt_tokens_by_source: every prompt token by
	// where its KV came from (computed, this engine's prefix cache, a KV
	// connector's transfer); prometheus_client writes a counter's HELP and
	// TYPE under its _total name in the text format.
	fmt.Fprintf(b, "# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.\n# TYPE vllm:prompt_tokens_by_source_total counter\n")
	for r := range figs {
		for src, name := range sourceLabels {
			fmt.Fprintf(b, "vllm:prompt_tokens_by_source_total{%s} %s\n", promLabels(map[string]string{"engine": strconv.Itoa(r),
				"model_name": s.opts.Model, "source": name}), f(float64(figs[r].sources[src])))
		}
	}
}
