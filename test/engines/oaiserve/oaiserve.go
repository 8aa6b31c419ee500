// Package oaiserve is the shared core of the vLLM and SGLang stand-ins
// (test/engines/vllm, test/engines/sglang): an HTTP server that serves what
// those OpenAI-compatible servers serve — /health, /v1/models,
// /v1/chat/completions and /v1/completions (JSON and SSE), /metrics in the
// engine's Prometheus names and labels — and honours X-Data-Parallel-Rank as
// the engine does, recording which rank served each request. Each rank keeps
// a prefix cache of whole blocks, so usage reports cached tokens the way the
// engine would (when the engine is configured to report them).
//
// Nothing else is served: a path the real server does not serve is a 404,
// a header it does not read is ignored.
package oaiserve

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Engine selects the flavour of the stand-in.
type Engine string

const (
	VLLM   Engine = "vllm"
	SGLang Engine = "sglang"
)

// Options configure a stand-in.
type Options struct {
	Engine Engine
	// Model is the served model name (vllm serve --served-model-name,
	// sglang --served-model-name).
	Model string
	// DataParallelSize: vLLM --data-parallel-size, SGLang --dp-size
	// (default 1).
	DataParallelSize int
	// ReportCachedTokens: usage.prompt_tokens_details.cached_tokens is
	// returned (vLLM --enable-prompt-tokens-details, SGLang
	// --enable-cache-report); otherwise prompt_tokens_details is null.
	ReportCachedTokens bool
	// BlockSize is the prefix-cache granularity in tokens (vLLM's block
	// size, default 16; SGLang's page size, default 1).
	BlockSize int
	// GPUBlocks is the KV capacity per rank in blocks (default 4096).
	GPUBlocks int
	// ResponsesStore keeps Responses API responses (vLLM:
	// VLLM_ENABLE_RESPONSES_API_STORE=1): agentapi.go.
	ResponsesStore bool
}

// Served is one request the stand-in answered.
type Served struct {
	Path   string
	Rank   int
	Header string // the X-Data-Parallel-Rank header as received ("" absent)
	// LastUser is the content of the last user message (chat) or the
	// prompt (completions): tests name their conversations by it.
	LastUser     string
	PromptTokens int
	CachedTokens int
	Stream       bool
	// Fields are the body's top-level keys, sorted (the engine ignores
	// the ones it does not know).
	Fields []string
}

// Server is a running stand-in.
type Server struct {
	opts Options
	ts   *httptest.Server

	mu       sync.Mutex
	healthy  bool
	served   []Served
	rr       int
	running  []int
	waiting  []int // reported on /metrics on top of what is running
	blocks   []map[uint64]bool
	prompted []int64
	stored   map[string]*storedResp // Responses API store (agentapi.go)
}

// Start starts a stand-in on a loopback port; Close stops it.
func Start(opts Options) *Server {
	if opts.DataParallelSize <= 0 {
		opts.DataParallelSize = 1
	}
	if opts.BlockSize <= 0 {
		opts.BlockSize = 16
		if opts.Engine == SGLang {
			opts.BlockSize = 1
		}
	}
	if opts.GPUBlocks <= 0 {
		opts.GPUBlocks = 4096
	}
	n := opts.DataParallelSize
	s := &Server{opts: opts, healthy: true, running: make([]int, n), waiting: make([]int, n),
		blocks: make([]map[uint64]bool, n), prompted: make([]int64, n), stored: map[string]*storedResp{}}
	for i := range s.blocks {
		s.blocks[i] = map[uint64]bool{}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, false) })
	mux.HandleFunc("GET /metrics", s.metrics)
	s.agentRoutes(mux)
	s.ts = httptest.NewServer(mux)
	return s
}

// URL is the server's base URL.
func (s *Server) URL() string { return s.ts.URL }

// Close stops the server.
func (s *Server) Close() { s.ts.Close() }

// SetHealthy makes /health answer 200 (true) or 503 (false), as the real
// server does when its engine died.
func (s *Server) SetHealthy(ok bool) {
	s.mu.Lock()
	s.healthy = ok
	s.mu.Unlock()
}

// SetWaiting makes /metrics report n requests waiting on rank (a long
// queue the edge should steer new conversations away from).
func (s *Server) SetWaiting(rank, n int) {
	s.mu.Lock()
	s.waiting[rank] = n
	s.mu.Unlock()
}

// FlushCache empties every rank's prefix cache, as the engine's own cache
// reset does (vLLM POST /reset_prefix_cache, SGLang /flush_cache), or as
// evicting everything under memory pressure would: the next prompts report
// no cached tokens.
func (s *Server) FlushCache() {
	s.mu.Lock()
	for i := range s.blocks {
		clear(s.blocks[i])
	}
	s.mu.Unlock()
}

// Served lists the requests answered so far.
func (s *Server) Served() []Served {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Served(nil), s.served...)
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	ok := s.healthy
	s.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	card := map[string]any{"id": s.opts.Model, "object": "model", "created": time.Now().Unix(),
		"owned_by": string(s.opts.Engine), "root": s.opts.Model, "max_model_len": 32768}
	if s.opts.Engine == VLLM {
		card["parent"] = nil
		card["permission"] = []any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{card}})
}

// errorBody is the engine's error JSON: vLLM nests it under "error",
// SGLang answers the flat OpenAI error object.
func (s *Server) errorBody(status int, typ, msg string) any {
	e := map[string]any{"message": msg, "type": typ, "param": nil, "code": status}
	if s.opts.Engine == VLLM {
		return map[string]any{"error": e}
	}
	e["object"] = "error"
	return e
}

type request struct {
	Model         string          `json:"model"`
	Messages      []message       `json:"messages"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	MaxCompletion *int            `json:"max_completion_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// text is a message content: a string or a list of {type: text} parts.
func (m message) text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(m.Content, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// rankFor resolves the request's rank as the engine does: the header when
// it names one (vLLM ignores a non-integer and balances itself; SGLang
// refuses it), else the engine's own balancer. ok=false: the error is
// written.
func (s *Server) rankFor(w http.ResponseWriter, r *http.Request) (int, string, bool) {
	raw, present := "", false
	if v := r.Header.Values("X-Data-Parallel-Rank"); len(v) > 0 {
		raw, present = v[0], true
	}
	n := s.opts.DataParallelSize
	if present {
		rank, err := strconv.Atoi(strings.TrimSpace(raw))
		switch {
		case err != nil && s.opts.Engine == SGLang:
			writeJSON(w, http.StatusBadRequest, map[string]any{
				"detail": fmt.Sprintf("Invalid X-Data-Parallel-Rank header: must be an integer, got '%s'", raw)})
			return 0, raw, false
		case err != nil:
			// vLLM: not an integer, as if absent.
		case rank < 0 || rank >= n:
			msg := fmt.Sprintf("data_parallel_rank %d is out of range [0, %d).", rank, n)
			if s.opts.Engine == SGLang {
				msg = fmt.Sprintf("routed_dp_rank %d is out of range [0, %d)", rank, n)
			}
			writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "BadRequestError", msg))
			return 0, raw, false
		default:
			return rank, raw, true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.Engine == SGLang {
		// SGLang's default load_balance_method: round robin.
		rank := s.rr % n
		s.rr++
		return rank, raw, true
	}
	// vLLM's internal balancer: the least loaded engine core.
	best := 0
	for i := 1; i < n; i++ {
		if 4*s.waiting[i]+s.running[i] < 4*s.waiting[best]+s.running[best] {
			best = i
		}
	}
	return best, raw, true
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "BadRequestError", err.Error()))
		return
	}
	var req request
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "BadRequestError", "invalid JSON: "+err.Error()))
		return
	}
	fields := make([]string, 0, len(top))
	for k := range top {
		fields = append(fields, k)
	}
	sort.Strings(fields)
	if err := json.Unmarshal(body, &req); err != nil {
		writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "BadRequestError", "invalid JSON: "+err.Error()))
		return
	}
	if s.opts.Engine == VLLM && req.Model != "" && req.Model != s.opts.Model {
		writeJSON(w, http.StatusNotFound, s.errorBody(http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", req.Model)))
		return
	}
	var prompt, last string
	if chat {
		if len(req.Messages) == 0 {
			writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "BadRequestError", "messages must not be empty"))
			return
		}
		var b strings.Builder
		for _, m := range req.Messages {
			t := m.text()
			fmt.Fprintf(&b, "<%s> %s ", m.Role, t)
			if m.Role == "user" {
				last = t
			}
		}
		b.WriteString("<assistant>")
		prompt = b.String()
	} else {
		if err := json.Unmarshal(req.Prompt, &prompt); err != nil {
			writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "BadRequestError", "prompt must be a string"))
			return
		}
		last = prompt
	}
	rank, header, ok := s.rankFor(w, r)
	if !ok {
		return
	}
	maxTokens := 16
	switch {
	case req.MaxCompletion != nil:
		maxTokens = *req.MaxCompletion
	case req.MaxTokens != nil:
		maxTokens = *req.MaxTokens
	}
	maxTokens = min(max(maxTokens, 1), 4096)

	tokens := strings.Fields(prompt)
	s.mu.Lock()
	s.running[rank]++
	cached := s.cacheLocked(rank, tokens)
	s.prompted[rank] += int64(len(tokens))
	s.served = append(s.served, Served{Path: r.URL.Path, Rank: rank, Header: header, LastUser: last,
		PromptTokens: len(tokens), CachedTokens: cached, Stream: req.Stream, Fields: fields})
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running[rank]--
		s.mu.Unlock()
	}()

	words := make([]string, maxTokens)
	for i := range words {
		words[i] = fmt.Sprintf("w%d", i)
	}
	usage := map[string]any{"prompt_tokens": len(tokens), "completion_tokens": maxTokens, "total_tokens": len(tokens) + maxTokens,
		"prompt_tokens_details": nil}
	if s.opts.ReportCachedTokens {
		usage["prompt_tokens_details"] = map[string]any{"cached_tokens": cached}
	}
	id := s.requestID(chat)
	created := time.Now().Unix()
	if !req.Stream {
		choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": "length"}
		if chat {
			choice["message"] = map[string]any{"role": "assistant", "content": strings.Join(words, " "), "tool_calls": []any{}, "reasoning_content": nil}
		} else {
			choice["text"] = strings.Join(words, " ")
		}
		if s.opts.Engine == VLLM {
			choice["stop_reason"] = nil
		} else {
			choice["matched_stop"] = nil
		}
		object := "text_completion"
		if chat {
			object = "chat.completion"
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": object, "created": created, "model": s.opts.Model,
			"choices": []any{choice}, "usage": usage})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	object := "text_completion"
	if chat {
		object = "chat.completion.chunk"
	}
	emit := func(choices []any, u any) {
		m := map[string]any{"id": id, "object": object, "created": created, "model": s.opts.Model, "choices": choices}
		if u != nil {
			m["usage"] = u
		}
		b, _ := json.Marshal(m)
		fmt.Fprintf(bw, "data: %s\n\n", b)
	}
	if chat {
		emit([]any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}}, nil)
	}
	for i, word := range words {
		text := word
		if i > 0 {
			text = " " + word
		}
		var finish any
		if i == len(words)-1 {
			finish = "length"
		}
		if chat {
			emit([]any{map[string]any{"index": 0, "delta": map[string]any{"content": text}, "logprobs": nil, "finish_reason": finish}}, nil)
		} else {
			emit([]any{map[string]any{"index": 0, "text": text, "logprobs": nil, "finish_reason": finish}}, nil)
		}
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		emit([]any{}, usage)
	}
	fmt.Fprint(bw, "data: [DONE]\n\n")
	_ = bw.Flush()
}

// cacheLocked returns the prompt tokens rank already held in whole blocks
// and stores the prompt's blocks (a prefix cache with chained hashes).
func (s *Server) cacheLocked(rank int, tokens []string) int {
	bs := s.opts.BlockSize
	h := fnv.New64a()
	cached, hit := 0, true
	for end := bs; end <= len(tokens); end += bs {
		for _, t := range tokens[end-bs : end] {
			_, _ = h.Write([]byte(t))
			_, _ = h.Write([]byte{0})
		}
		key := h.Sum64()
		if hit && s.blocks[rank][key] {
			cached = end
		} else {
			hit = false
		}
		if len(s.blocks[rank]) < s.opts.GPUBlocks {
			s.blocks[rank][key] = true
		}
	}
	if cached >= len(tokens) {
		// The last token is always recomputed (both engines need its
		// logits), so a fully cached prompt reports one block less.
		cached = max(cached-bs, 0)
	}
	return cached
}

func (s *Server) requestID(chat bool) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	switch {
	case s.opts.Engine == SGLang:
		return hex.EncodeToString(b[:])
	case chat:
		return "chatcmpl-" + hex.EncodeToString(b[:])
	}
	return "cmpl-" + hex.EncodeToString(b[:])
}

// metrics serves the engine's Prometheus exposition: vLLM labels each
// engine core engine="<rank>" (always) with model_name; SGLang labels each
// scheduler with model_name, engine_type, tp_rank, pp_rank, moe_ep_rank
// and, with data parallelism, dp_rank.
func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	n := s.opts.DataParallelSize
	type fig struct {
		running, waiting int
		used             int
		prompted         int64
	}
	figs := make([]fig, n)
	for i := range figs {
		figs[i] = fig{s.running[i], s.waiting[i], len(s.blocks[i]), s.prompted[i]}
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	var b strings.Builder
	gauge := func(name, help string, val func(rank int) string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
		for r := range n {
			fmt.Fprintf(&b, "%s{%s} %s\n", name, s.labels(r), val(r))
		}
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	if s.opts.Engine == VLLM {
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.", func(r int) string { return f(float64(figs[r].running)) })
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", func(r int) string { return f(float64(figs[r].waiting)) })
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func(r int) string {
			return f(float64(figs[r].used) / float64(s.opts.GPUBlocks))
		})
		fmt.Fprintf(&b, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n")
		fmt.Fprintf(&b, "vllm:cache_config_info{block_size=\"%d\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"%d\"} 1.0\n",
			s.opts.BlockSize, s.opts.GPUBlocks)
		fmt.Fprintf(&b, "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n# TYPE vllm:prompt_tokens_total counter\n")
		for r := range n {
			fmt.Fprintf(&b, "vllm:prompt_tokens_total{%s} %s\n", s.labels(r), f(float64(figs[r].prompted)))
		}
	} else {
		gauge("sglang:num_running_reqs", "The number of running requests.", func(r int) string { return f(float64(figs[r].running)) })
		gauge("sglang:num_used_tokens", "The number of used tokens.", func(r int) string { return f(float64(figs[r].used * s.opts.BlockSize)) })
		gauge("sglang:token_usage", "The token usage.", func(r int) string { return f(float64(figs[r].used) / float64(s.opts.GPUBlocks)) })
		gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", func(r int) string { return f(float64(figs[r].waiting)) })
		gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", func(int) string {
			return f(float64(s.opts.GPUBlocks * s.opts.BlockSize))
		})
	}
	_, _ = io.WriteString(w, b.String())
}

func (s *Server) labels(rank int) string {
	var kv map[string]string
	if s.opts.Engine == VLLM {
		kv = map[string]string{"engine": strconv.Itoa(rank), "model_name": s.opts.Model}
	} else {
		kv = map[string]string{"model_name": s.opts.Model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
		if s.opts.DataParallelSize > 1 {
			kv["dp_rank"] = strconv.Itoa(rank)
		}
	}
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, kv[k])
	}
	return strings.Join(parts, ",")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
