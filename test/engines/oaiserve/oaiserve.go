// Package oaiserve is the shared core of the vLLM and SGLang stand-ins
// (test/engines/vllm, test/engines/sglang): an HTTP server that serves what
// those OpenAI-compatible servers serve — /health, /v1/models,
// /v1/chat/completions and /v1/completions (JSON and SSE), /metrics in the
// engine's Prometheus names and labels — honours X-Data-Parallel-Rank as the
// engine does, and, when configured, publishes the engine's KV cache events
// on ZeroMQ (kvevents.go), one publisher per data-parallel rank on
// consecutive ports as both engines offset them.
//
// Each behaviour that differs between the engines lives in the engine's
// file (vllm.go, sglang.go) beside a comment naming the upstream file and
// function it follows; what both share is here. The model is a toy: the
// prompt is rendered as tether's words template (internal/prefix RenderChat,
// content parts joined with "\n" as vLLM joins text parts) and tokenized by
// words, so an edge with `tokenizer: words` computes the same block keys;
// the answer is max_tokens words "w0 w1 ...". Each rank keeps a paged
// prefix cache (cache.go) with LRU eviction, so usage reports cached tokens
// as the engine would and the KV events say what the cache holds.
//
// Nothing else is served: a path the real server does not serve is a 404, a
// header it does not read is ignored. With Options.PD the server is one side
// of a prefill/decode split (pd.go): vLLM's NixlConnector handoff
// (kv_transfer_params, pd_vllm.go) or SGLang's bootstrap rendezvous
// (bootstrap_host/port/room, pd_sglang.go); the rest is shared.
package oaiserve

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/kvevents"
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
	// LoRA (lora.go): LoRAModules is vLLM's --lora-modules or SGLang's
	// --lora-paths (name=path or name), MaxLoRAs vLLM's --max-loras
	// (default 1) or SGLang's --max-loras-per-batch, RuntimeLoRA vLLM's
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (POST /v1/load_lora_adapter).
	LoRAModules []string
	MaxLoRAs    int
	RuntimeLoRA bool
	// KVEvents publishes the cache's events (vLLM --kv-events-config,
	// SGLang --kv-events-config); nil: none.
	KVEvents *KVEventsOptions
	// VLLMZeroCachedDetails is the one vLLM release (0.25.1) that writes
	// prompt_tokens_details with cached_tokens 0; every other release
	// (serving_chat.py: `if self.enable_prompt_tokens_details and
	// num_cached_tokens`) and SGLang (usage_processor.py _details_if_cached)
	// leave it null when nothing was cached.
	VLLMZeroCachedDetails bool
	// SGLangFastHealth (SGLang only) is SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false,
	// which releases since late 2025 accept: GET /health answers at once
	// while /health_generate still generates. Default (and every older
	// release): /health generates a token and answers after a second.
	SGLangFastHealth bool
	// SGLangTPSize is the tensor-parallel ranks of each data-parallel
	// group (--tp-size / --dp-size with --enable-dp-attention; default 1).
	// SGLangAllSchedulers is --enable-metrics-for-all-schedulers: every TP
	// rank's scheduler exports the group's figures, not only the one with
	// attn_tp_rank 0.
	SGLangTPSize        int
	SGLangAllSchedulers bool
	// SGLangHealthTimeout is SGLANG_HEALTH_CHECK_TIMEOUT: how long a
	// generating health check waits for a dead scheduler before 503
	// (default 20 s, as upstream).
	SGLangHealthTimeout time.Duration
	// PD makes the server one side of a prefill/decode split (pd.go);
	// nil: aggregated.
	PD *PDOptions
	// StreamGate, when set, runs before each generated token of a streamed
	// answer is written (tests: stop a server in the middle of a stream).
	StreamGate func(token int)
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
	// Computed is the prompt tokens this server computed (prefill work);
	// Transferred those it received from a prefill server instead.
	Computed, Transferred int
	// Handoff is the request's part in a prefill/decode split ("" none;
	// pd.go names the others).
	Handoff string
	// KVMismatch: a decode received KV computed for other tokens than its
	// prompt (the engines do not check; the answer would be garbage).
	KVMismatch bool
}

// Server is a running stand-in.
type Server struct {
	opts Options
	ts   *httptest.Server
	eng  engine
	pubs []*kvevents.Publisher // per rank; nil without KV events

	mu       sync.Mutex
	healthy  bool
	starting bool
	served   []Served
	rr       int
	running  []int
	waiting  []int // reported on /metrics on top of what is running
	caches   []*rankCache
	prompted []int64
	lora     *loraState             // nil without LoRA (lora.go)
	stored   map[string]*storedResp // Responses API store (agentapi.go)
	sources  [][numSources]int64    // per rank: prompt tokens by source (pd.go)

	pd *pdState // nil: aggregated
}

// engine is what differs between vLLM and SGLang (vllm.go, sglang.go).
type engine interface {
	register(mux *http.ServeMux, s *Server)
	errorBody(status int, typ, msg string) any
	// rank resolves the X-Data-Parallel-Rank header (present: the raw
	// value); -1: the engine's own balancer picks. A non-nil error body
	// is the engine's answer.
	rank(raw string, present bool, size int) (int, int, any)
	balance(s *Server) int
	usage(o Options, prompt, completion, cached int) map[string]any
	choiceExtras(choice map[string]any, chat bool)
	message(text string) map[string]any
	requestID(chat bool) string
	modelCard(model string) map[string]any
	metrics(b *strings.Builder, s *Server, figs []rankFigures)
	eventLayout() Layout
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
	if opts.SGLangTPSize <= 0 {
		opts.SGLangTPSize = 1
	}
	if opts.SGLangHealthTimeout <= 0 {
		opts.SGLangHealthTimeout = 20 * time.Second
	}
	if opts.KVEvents != nil {
		k := *opts.KVEvents
		opts.KVEvents = &k
	}
	n := opts.DataParallelSize
	s := &Server{opts: opts, healthy: true, running: make([]int, n), waiting: make([]int, n), prompted: make([]int64, n),
		sources: make([][numSources]int64, n), stored: map[string]*storedResp{}}
	if opts.Engine == SGLang {
		s.eng = sglangEngine{}
	} else {
		s.eng = vllmEngine{}
	}
	for range n {
		s.caches = append(s.caches, newRankCache(opts.GPUBlocks))
	}
	if opts.KVEvents != nil {
		if err := s.startPublishers(*opts.KVEvents); err != nil {
			panic("oaiserve: " + err.Error())
		}
	}
	s.initLoRA()
	mux := http.NewServeMux()
	if opts.RuntimeLoRA {
		mux.HandleFunc("POST /v1/load_lora_adapter", s.loadAdapter)
	}
	s.eng.register(mux, s)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, false) })
	mux.HandleFunc("GET /metrics", s.metrics)
	s.agentRoutes(mux)
	s.ts = httptest.NewServer(mux)
	if opts.PD != nil {
		s.startPD(*opts.PD)
	}
	return s
}

// URL is the server's base URL.
func (s *Server) URL() string { return s.ts.URL }

// Close stops the server and its publishers.
func (s *Server) Close() {
	s.ts.Close()
	s.closePD()
	for _, p := range s.pubs {
		_ = p.Close()
	}
}

// SetHealthy makes /health answer 200 (true) or 503 (false), as the real
// server does when its engine died.
func (s *Server) SetHealthy(ok bool) {
	s.mu.Lock()
	s.healthy = ok
	s.mu.Unlock()
}

// SetStarting makes SGLang's /health answer 503 as while its server is
// still starting (ServerStatus.Starting: the HTTP server listens before
// the model is warmed up). vLLM does not listen before it is ready.
func (s *Server) SetStarting(v bool) {
	s.mu.Lock()
	s.starting = v
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
// no cached tokens, and the KV events say AllBlocksCleared.
func (s *Server) FlushCache() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for r, c := range s.caches {
		c.clear()
		s.publishLocked(r, nil, nil, true)
	}
}

// Served lists the requests answered so far.
func (s *Server) Served() []Served {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Served(nil), s.served...)
}

// models serves GET /v1/models with the engine's model card.
func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	card := s.eng.modelCard(s.opts.Model)
	data := append([]any{card}, s.loraCards(time.Now().Unix())...)
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// errorBody is the engine's error JSON (vllm.go, sglang.go).
func (s *Server) errorBody(status int, typ, msg string) any { return s.eng.errorBody(status, typ, msg) }

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

// text is a message content: a string or a list of {type: text} parts,
// joined with "\n" (vLLM chat_utils _parse_chat_message_content_parts with
// the string content format).
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
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		texts = append(texts, p.Text)
	}
	return strings.Join(texts, "\n")
}

// rankFor resolves the request's rank as the engine does: the header when
// it names one, else the engine's own balancer. ok=false: the error is
// written.
func (s *Server) rankFor(w http.ResponseWriter, r *http.Request) (int, string, bool) {
	raw, present := "", false
	if v := r.Header.Values("X-Data-Parallel-Rank"); len(v) > 0 {
		raw, present = v[0], true
	}
	rank, status, body := s.eng.rank(raw, present, s.opts.DataParallelSize)
	if body != nil {
		writeJSON(w, status, body)
		return 0, raw, false
	}
	if rank >= 0 {
		return rank, raw, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eng.balance(s), raw, true
}

// promptOf renders and tokenizes the prompt: chat messages with the toy
// template (internal/prefix RenderChat), a completions prompt as text or
// token ids. last is what tests name the request by.
func promptOf(req request, chat bool) (tokens []uint32, last string, errMsg string) {
	if chat {
		if len(req.Messages) == 0 {
			return nil, "", "messages must not be empty"
		}
		msgs := make([]prefix.Message, 0, len(req.Messages))
		for _, m := range req.Messages {
			t := m.text()
			msgs = append(msgs, prefix.Message{Role: m.Role, Content: t})
			if m.Role == "user" {
				last = t
			}
		}
		return prefix.Tokenize(prefix.RenderChat(msgs)), last, ""
	}
	var text string
	if err := json.Unmarshal(req.Prompt, &text); err == nil {
		return prefix.Tokenize(text), text, ""
	}
	var ids []uint32
	if err := json.Unmarshal(req.Prompt, &ids); err == nil && len(ids) > 0 {
		return ids, "", ""
	}
	return nil, "", "prompt must be a string or a list of token ids"
}

func (s *Server) badRequest(w http.ResponseWriter, msg string) {
	writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "BadRequestError", msg))
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	req, top, fields, adapter, ok := s.decode(w, r)
	if !ok {
		return
	}
	tokens, last, msg := promptOf(req, chat)
	if msg != "" {
		s.badRequest(w, msg)
		return
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
	// One side of a prefill/decode split (pd.go): a decode reads the
	// prompt's KV from its prefill server instead of computing it, or
	// fails as the engine does; a prefill keeps it for its decode.
	h, ok := s.handoff(w, r, top, req, chat, tokens, last, &rank, header != "")
	if !ok {
		return
	}
	cached := s.admit(r, req, rank, header, adapter, last, tokens, fields, h)
	defer func() {
		s.mu.Lock()
		s.running[rank]--
		s.endAdapterLocked(rank, adapter)
		s.mu.Unlock()
	}()
	if !h.awaitDecode(w, s) {
		return
	}
	served := s.opts.Model
	switch {
	case s.opts.Engine == SGLang && req.Model != "":
		served = req.Model // SGLang answers with the request's model as given
	case adapter != "":
		served = adapter // vLLM answers with the adapter's name as the model
	}
	s.respond(w, req, chat, served, len(tokens), cached, maxTokens, h)
}

// decode reads a completions or chat request: its body, its top-level
// fields (sorted names), and the adapter its model names; ok is false when
// it answered an error (a bad body, an unknown model).
func (s *Server) decode(w http.ResponseWriter, r *http.Request) (req request, top map[string]json.RawMessage, fields []string, adapter string, ok bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	if err != nil {
		s.badRequest(w, err.Error())
		return req, nil, nil, "", false
	}
	if err := json.Unmarshal(body, &top); err != nil {
		s.badRequest(w, "invalid JSON: "+err.Error())
		return req, nil, nil, "", false
	}
	fields = make([]string, 0, len(top))
	for k := range top {
		fields = append(fields, k)
	}
	sort.Strings(fields)
	if err := json.Unmarshal(body, &req); err != nil {
		s.badRequest(w, "invalid JSON: "+err.Error())
		return req, nil, nil, "", false
	}
	adapter, known := s.adapterOf(req.Model)
	if s.opts.Engine == SGLang {
		var msg string
		if adapter, msg = s.sglangAdapter(req.Model, top); msg != "" {
			s.badRequest(w, msg)
			return req, nil, nil, "", false
		}
	} else if !known {
		// vllm/entrypoints/openai/serving_engine.py _check_model.
		writeJSON(w, http.StatusNotFound, s.errorBody(http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", req.Model)))
		return req, nil, nil, "", false
	}
	return req, top, fields, adapter, true
}

// admit runs the request on rank: counts it running (the caller ends it),
// takes its prompt's cached tokens (or those its prefill server handed
// over), records what it computed and how it was served, and returns the
// cached tokens.
func (s *Server) admit(r *http.Request, req request, rank int, header, adapter, last string, tokens []uint32, fields []string, h *handoff) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running[rank]++
	s.startAdapterLocked(rank, adapter)
	var cached int
	var src sources
	if h.received() {
		cached, src = s.receivedLocked(rank, adapter, tokens, h)
	} else {
		cached = s.cacheLocked(rank, adapter, tokens)
		src = sources{cacheHit: cached, compute: len(tokens) - cached}
	}
	s.prompted[rank] += int64(len(tokens))
	s.addSourcesLocked(rank, src)
	s.served = append(s.served, Served{Path: r.URL.Path, Rank: rank, Header: header, LastUser: last,
		PromptTokens: len(tokens), CachedTokens: cached, Stream: req.Stream, Fields: fields,
		Computed: src.compute, Transferred: src.external, Handoff: h.name(), KVMismatch: h.mismatch()})
	h.prefilledLocked(s, rank, tokens)
	return cached
}

// respond writes the answer: one JSON object, or the SSE stream (a role
// chunk first for chat, one chunk per word, the usage chunk when
// stream_options.include_usage, then [DONE]).
func (s *Server) respond(w http.ResponseWriter, req request, chat bool, served string, promptTokens, cached, maxTokens int, h *handoff) {
	finish := h.finishReason()
	maxTokens = h.outputTokens(maxTokens)
	if finish == "stop" {
		maxTokens = 1 // the first token was EOS
	}
	words := make([]string, maxTokens)
	for i := range words {
		words[i] = fmt.Sprintf("w%d", i)
	}
	usage := s.eng.usage(s.opts, promptTokens, maxTokens, cached)
	id := s.eng.requestID(chat)
	created := time.Now().Unix()
	object := "text_completion"
	if !req.Stream {
		choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish}
		if chat {
			choice["message"] = s.eng.message(strings.Join(words, " "))
			object = "chat.completion"
		} else {
			choice["text"] = strings.Join(words, " ")
		}
		s.eng.choiceExtras(choice, chat)
		answer := map[string]any{"id": id, "object": object, "created": created, "model": served,
			"choices": []any{choice}, "usage": usage}
		h.answerFields(answer)
		writeJSON(w, http.StatusOK, answer)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	if chat {
		object = "chat.completion.chunk"
	}
	emit := func(choices []any, u any) {
		m := map[string]any{"id": id, "object": object, "created": created, "model": served, "choices": choices}
		if u != nil {
			m["usage"] = u
		}
		b, _ := json.Marshal(m)
		fmt.Fprintf(bw, "data: %s\n\n", b)
	}
	if chat {
		emit([]any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}}, nil)
	}
	rc := http.NewResponseController(w)
	for i, word := range words {
		if gate := s.opts.StreamGate; gate != nil {
			// Each chunk reaches the client before the gate, as the
			// engines' streaming responses send each as it is made.
			if bw.Flush() != nil || rc.Flush() != nil {
				return
			}
			gate(i)
		}
		text := word
		if i > 0 {
			text = " " + word
		}
		var fr any
		if i == len(words)-1 {
			fr = finish
		}
		if chat {
			emit([]any{map[string]any{"index": 0, "delta": map[string]any{"content": text}, "logprobs": nil, "finish_reason": fr}}, nil)
		} else {
			emit([]any{map[string]any{"index": 0, "text": text, "logprobs": nil, "finish_reason": fr}}, nil)
		}
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		emit([]any{}, usage)
	}
	fmt.Fprint(bw, "data: [DONE]\n\n")
	_ = bw.Flush()
}

// cacheLocked looks the prompt up in rank's prefix cache, stores its
// blocks, publishes what changed and returns the tokens found cached in
// whole blocks. The last token is always recomputed (both engines need its
// logits), so a fully cached prompt reports one block less.
func (s *Server) cacheLocked(rank int, adapter string, tokens []uint32) int {
	bs := s.opts.BlockSize
	hit, stored, removed := s.caches[rank].lookup(tokens, bs, adapter)
	s.publishLocked(rank, stored, removed, false)
	cached := hit * bs
	if cached >= len(tokens) {
		cached = max(cached-bs, 0)
	}
	return cached
}

func hexID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// rankFigures are one rank's figures for /metrics.
type rankFigures struct {
	running, waiting int
	usedBlocks       int
	prompted         int64
	sources          [numSources]int64
}

// metrics serves the engine's Prometheus exposition (vllm.go, sglang.go).
func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	figs := make([]rankFigures, s.opts.DataParallelSize)
	for i := range figs {
		figs[i] = rankFigures{s.running[i], s.waiting[i], s.caches[i].len(), s.prompted[i], s.sources[i]}
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	var b strings.Builder
	s.eng.metrics(&b, s, figs)
	_, _ = io.WriteString(w, b.String())
}

// promLabels renders a label set sorted by name.
func promLabels(kv map[string]string) string {
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
