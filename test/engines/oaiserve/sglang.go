package oaiserve

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// sglangEngine is what SGLang's OpenAI server does its own way.
type sglangEngine struct{}

// sglangHealthTick is the sleep of SGLang's health loop
// (http_server.py health_generate: await asyncio.sleep(1) before each check).
const sglangHealthTick = time.Second

func (sglangEngine) register(mux *http.ServeMux, s *Server) {
	mux.HandleFunc("GET /health", s.sglangHealth)
	mux.HandleFunc("GET /health_generate", s.sglangHealth)
}

// sglangHealth follows python/sglang/srt/entrypoints/http_server.py
// health_generate, which serves both /health and /health_generate: 503
// while the server is starting; with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION
// off, /health answers 200 at once; otherwise it submits a one-token
// generation and, every second (asyncio.sleep(1) first), checks whether the
// scheduler answered since: 200 then, 503 after SGLANG_HEALTH_CHECK_TIMEOUT.
// A live server therefore never answers in less than a second.
func (s *Server) sglangHealth(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	starting := s.starting
	s.mu.Unlock()
	if starting {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if s.opts.SGLangFastHealth && r.URL.Path == "/health" {
		w.WriteHeader(http.StatusOK)
		return
	}
	deadline := time.Now().Add(s.opts.SGLangHealthTimeout)
	t := time.NewTicker(sglangHealthTick)
	defer t.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		ok := s.healthy
		s.mu.Unlock()
		if ok {
			w.WriteHeader(http.StatusOK)
			return
		}
	}
	w.WriteHeader(http.StatusServiceUnavailable)
}

// errorBody follows python/sglang/srt/entrypoints/openai/serving_base.py
// create_error_response: the flat ErrorResponse
// {"object": "error", "message", "type", "param", "code"}.
func (sglangEngine) errorBody(status int, typ, msg string) any {
	return map[string]any{"object": "error", "message": msg, "type": typ, "param": nil, "code": status}
}

// rank follows serving_base.py extract_routed_dp_rank_from_header: a
// header that is not an integer raises HTTPException(400, "Invalid
// X-Data-Parallel-Rank header: ..."), which handle_request answers as
// create_error_response(e.detail, err_type=str(status)); a rank outside
// [0, dp_size) is refused by the tokenizer manager with ValueError
// "routed_dp_rank=R out of range [0, N)" (400 BadRequestError).
func (e sglangEngine) rank(raw string, present bool, size int) (int, int, any) {
	if !present {
		return -1, 0, nil
	}
	rank, err := strconv.Atoi(strings.TrimSpace(raw))
	if err != nil {
		return 0, http.StatusBadRequest, e.errorBody(http.StatusBadRequest, "400",
			fmt.Sprintf("Invalid X-Data-Parallel-Rank header: must be an integer, got '%s'", raw))
	}
	if rank < 0 || rank >= size {
		return 0, http.StatusBadRequest, e.errorBody(http.StatusBadRequest, "BadRequestError",
			fmt.Sprintf("routed_dp_rank=%d out of range [0, %d)", rank, size))
	}
	return rank, 0, nil
}

// balance follows the data-parallel controller's default
// --load-balance-method round_robin.
func (sglangEngine) balance(s *Server) int {
	rank := s.rr % s.opts.DataParallelSize
	s.rr++
	return rank
}

// usage follows python/sglang/srt/entrypoints/openai/usage_processor.py
// calculate_response_usage: with --enable-cache-report,
// prompt_tokens_details is _details_if_cached(cached): {"cached_tokens": N}
// only when N > 0, else null.
func (sglangEngine) usage(o Options, prompt, completion, cached int) map[string]any {
	u := map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
		"prompt_tokens_details": nil}
	if o.ReportCachedTokens && cached > 0 {
		u["prompt_tokens_details"] = map[string]any{"cached_tokens": cached}
	}
	return u
}

// choiceExtras: SGLang's choices carry matched_stop (protocol.py).
func (sglangEngine) choiceExtras(choice map[string]any, _ bool) { choice["matched_stop"] = nil }

// message is protocol.py ChatMessage as serving_chat.py fills it.
func (sglangEngine) message(text string) map[string]any {
	return map[string]any{"role": "assistant", "content": text, "tool_calls": nil, "reasoning_content": nil}
}

// requestID: SGLang's responses carry the request's rid, a uuid4 hex.
func (sglangEngine) requestID(bool) string { return hexID() }

// modelCard follows http_server.py available_models (ModelCard with
// root and max_model_len).
func (sglangEngine) modelCard(model string) map[string]any {
	return map[string]any{"id": model, "object": "model", "created": time.Now().Unix(), "owned_by": "sglang", "root": model,
		"max_model_len": 32768}
}

// eventLayout: SGLang's kv_events.py keeps array_like structs, with its
// own fields after lora_id (LayoutSGLang).
func (sglangEngine) eventLayout() Layout { return LayoutSGLang }

// metrics follows python/sglang/srt/metrics/collector.py
// SchedulerMetricsCollector, labels from scheduler_metrics_mixin.py
// init_metrics: model_name, engine_type, tp_rank, pp_rank, moe_ep_rank and,
// with data parallelism, dp_rank. Only schedulers with attn_tp_rank 0
// export unless --enable-metrics-for-all-schedulers, when every TP rank of
// a group exports the group's figures.
func (sglangEngine) metrics(b *strings.Builder, s *Server, figs []rankFigures) {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	type series struct {
		rank   int
		labels string
	}
	var all []series
	tps := 1
	if s.opts.SGLangAllSchedulers {
		tps = s.opts.SGLangTPSize
	}
	for r := range figs {
		for t := range tps {
			tp := r*s.opts.SGLangTPSize + t
			kv := map[string]string{"model_name": s.opts.Model, "engine_type": "unified", "tp_rank": strconv.Itoa(tp), "pp_rank": "0",
				"moe_ep_rank": strconv.Itoa(tp)}
			if s.opts.DataParallelSize > 1 {
				kv["dp_rank"] = strconv.Itoa(r)
			}
			all = append(all, series{r, promLabels(kv)})
		}
	}
	gauge := func(name, help string, val func(r int) string) {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
		for _, x := range all {
			fmt.Fprintf(b, "%s{%s} %s\n", name, x.labels, val(x.rank))
		}
	}
	gauge("sglang:num_running_reqs", "The number of running requests.", func(r int) string { return f(float64(figs[r].running)) })
	gauge("sglang:num_used_tokens", "The number of used tokens.", func(r int) string { return f(float64(figs[r].usedBlocks * s.opts.BlockSize)) })
	gauge("sglang:token_usage", "The token usage.", func(r int) string { return f(float64(figs[r].usedBlocks) / float64(s.opts.GPUBlocks)) })
	gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", func(r int) string { return f(float64(figs[r].waiting)) })
	gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", func(int) string {
		return f(float64(s.opts.GPUBlocks * s.opts.BlockSize))
	})
}
