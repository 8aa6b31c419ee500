// Package trtllm is a stand-in for trtllm-serve (TensorRT-LLM's OpenAI
// server) in tests: it serves what trtllm-serve serves, with its paths,
// status codes and response shapes, and nothing more, over a toy model
// (whitespace tokens, deterministic words).
//
// What it follows, from TensorRT-LLM's public source:
//   - routes: GET /health (200 empty; 503 while starting, with
//     x-trtllm-server-state: starting: tensorrt_llm/serve/readiness.py),
//     GET /version, GET /v1/models, GET /metrics (a JSON list of
//     iteration stats), POST /v1/completions, POST /v1/chat/completions;
//     FastAPI's {"detail": ...} for unknown paths (404) and methods (405);
//     no /readyz;
//   - errors: {"object":"error","message","type","param","code"}, a
//     ValueError being 400 BadRequestError;
//   - disaggregation (openai_protocol.py DisaggregatedParams,
//     openai_disagg_service.py): a context_only request answers one token
//     with the handoff in choices[0].disaggregated_params and the prompt's
//     prompt_token_ids; a generation_only request continues from
//     encoded_opaque_state;
//   - conversation ids (conversation_id.py): body
//     conversation_params.conversation_id, else the first non-empty of
//     CONVERSATION_ID_HEADERS;
//   - signatures (disagg_auth.py): x-trtllm-subagent-affinity-auth and
//     x-trtllm-disagg-auth are checked by verify.py, a python3-stdlib
//     implementation independent of tether's internal/hintauth. Without
//     python3 the checks are skipped and counted (Unverified), so a test
//     can say so.
package trtllm

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-project/tether/internal/prefix"
)

// ConversationIDHeaders is TensorRT-LLM's CONVERSATION_ID_HEADERS.
var ConversationIDHeaders = []string{
	"x-claude-code-session-id", "x-claude-session-id", "x-session-id",
	"x-correlation-id", "x-session-affinity", "x-multi-turn-session-id",
}

// Header names of TensorRT-LLM's internal signatures.
const (
	HeaderAffinityID   = "x-trtllm-subagent-affinity-id"
	HeaderAffinityAuth = "x-trtllm-subagent-affinity-auth"
	HeaderDisaggAuth   = "x-trtllm-disagg-auth"
	HeaderServerState  = "x-trtllm-server-state"
)

// The x-trtllm-disagg-auth payloads of TensorRT-LLM's releases.
const (
	DisaggAuthFields = "trtllm"
	DisaggAuthParams = "trtllm-params"
)

// legacyParamsFields are the fields of openai_protocol.py's
// DisaggregatedParams in the releases that signed its whole model_dump.
var legacyParamsFields = []string{"request_type", "first_gen_tokens", "ctx_request_id", "encoded_opaque_state", "draft_tokens",
	"disagg_request_id", "ctx_dp_rank", "ctx_info_endpoint", "schedule_style"}

// Config configures a stand-in.
type Config struct {
	Name  string // used in ids and ctx_info_endpoint
	Model string
	// Role is --server_role: "context", "generation" or "" (inferred per
	// request from disaggregated_params.request_type).
	Role string
	// Key is internal_request_auth_key ("" none).
	Key string
	// TokensPerBlock is kv_cache_config tokens_per_block (default 32);
	// MaxBlocks the KV cache's blocks (default 4096), evicted least
	// recently used.
	TokensPerBlock, MaxBlocks int
	// EventBufferMaxSize is kv_cache_config.event_buffer_max_size: above
	// 0, KV cache events are kept (at most that many, the oldest dropped)
	// and POST /kv_cache_events drains them; 0 serves an empty list.
	EventBufferMaxSize int
	// DisaggAuth is the release's x-trtllm-disagg-auth payload:
	// DisaggAuthFields (the default, current disagg_auth.py: ctx_info_endpoint
	// and encoded_opaque_state) or DisaggAuthParams (its first version: the
	// whole DisaggregatedParams model_dump).
	DisaggAuth string
	// EOSAt makes the toy model end its answer with the end-of-sequence
	// token as its EOSAt-th generated token (finish_reason "stop"; 0:
	// never, every answer runs to max_tokens, "length"). With 1 the
	// context phase itself finishes: trtllm-serve then answers it with
	// ctx_request_id and encoded_opaque_state null (no KV to hand off).
	EOSAt int
}

// Seen is one inference request as the stand-in resolved it.
type Seen struct {
	Path           string
	RequestType    string // "" without disaggregated_params
	ConversationID string
	Affinity       string // verified x-trtllm-subagent-affinity-id ("" none)
	DisaggAuth     bool   // x-trtllm-disagg-auth was required and checked
	CachedTokens   int
}

// Server is one stand-in trtllm-serve.
type Server struct {
	cfg      Config
	starting atomic.Bool
	verifier *verifier // nil: python3 absent
	seq      atomic.Int64

	mu         sync.Mutex
	seen       []Seen
	blocks     map[uint64]uint64 // cached prompt blocks → last use
	clock      uint64
	events     *kvEvents
	unverified int
}

// New builds a stand-in. It starts verify.py under python3 when python3
// is installed.
func New(cfg Config) (*Server, error) {
	if cfg.Model == "" {
		return nil, errors.New("trtllm stand-in: model is required")
	}
	if cfg.TokensPerBlock <= 0 {
		cfg.TokensPerBlock = 32
	}
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = 4096
	}
	s := &Server{cfg: cfg, blocks: map[uint64]uint64{}, events: newKVEvents(cfg.EventBufferMaxSize, 32768, cfg.MaxBlocks)}
	v, err := startVerifier()
	if err != nil && !errors.Is(err, exec.ErrNotFound) {
		return nil, err
	}
	s.verifier = v
	return s, nil
}

// PythonVerifies reports whether signatures are checked by python3.
func (s *Server) PythonVerifies() bool { return s.verifier != nil }

// Unverified counts signatures accepted unchecked (python3 absent).
func (s *Server) Unverified() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unverified
}

// SetStarting makes every request answer 503 as a starting trtllm-serve.
func (s *Server) SetStarting(v bool) { s.starting.Store(v) }

// Seen returns the inference requests served so far.
func (s *Server) Seen() []Seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Seen(nil), s.seen...)
}

// Close stops the verifier.
func (s *Server) Close() {
	if s.verifier != nil {
		s.verifier.close()
	}
}

// Handler is the HTTP API, the routes of tensorrt_llm/serve/openai_server.py
// OpenAIServer.register_routes: a starting server answers every path 503
// with x-trtllm-server-state: starting (readiness.py); GET /health is 200
// with an empty body (health), /version, /v1/models (get_model), /metrics
// (get_iteration_stats: a JSON list); POST /v1/completions and
// /v1/chat/completions (openai_completion, openai_chat_completion);
// FastAPI's {"detail": ...} for other paths (404) and methods (405).
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.starting.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "1")
			w.Header().Set(HeaderServerState, "starting")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error": {"message": "The server is still initializing the model and cannot serve requests yet. It is listening, so this is not a crash; retry until /health returns 200.", "type": "ServiceUnavailableError", "code": "starting"}}`)
			return
		}
		get := map[string]http.HandlerFunc{
			"/health": func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) },
			"/version": func(w http.ResponseWriter, _ *http.Request) {
				writeJSON(w, 200, map[string]string{"version": "stand-in"})
			},
			"/v1/models": s.models,
			"/metrics":   func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, []any{}) },
		}
		post := map[string]bool{"/v1/completions": true, "/v1/chat/completions": true, "/kv_cache_events": true}
		switch {
		case get[r.URL.Path] != nil && r.Method == http.MethodGet:
			get[r.URL.Path](w, r)
		case r.URL.Path == "/kv_cache_events" && r.Method == http.MethodPost:
			s.drainKVEvents(w)
		case post[r.URL.Path] && r.Method == http.MethodPost:
			s.inference(w, r, r.URL.Path == "/v1/chat/completions")
		case get[r.URL.Path] != nil || post[r.URL.Path]:
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
		default:
			writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		}
	})
}

// models follows openai_server.py get_model: ModelList of one ModelCard
// owned by tensorrt_llm.
func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, 200, map[string]any{"object": "list", "data": []any{
		map[string]any{"id": s.cfg.Model, "object": "model", "created": 1700000000, "owned_by": "tensorrt_llm"},
	}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// apiError writes TensorRT-LLM's ErrorResponse (openai_protocol.py; the
// server's create_error_response, a ValueError being 400 BadRequestError).
func apiError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"object": "error", "message": msg, "type": typ, "param": nil, "code": status})
}

func badRequest(w http.ResponseWriter, msg string) {
	apiError(w, http.StatusBadRequest, "BadRequestError", msg)
}

type disaggParams map[string]json.RawMessage

func (d disaggParams) str(k string) (string, bool) {
	var s *string
	if raw, ok := d[k]; !ok || json.Unmarshal(raw, &s) != nil || s == nil {
		return "", false
	}
	return *s, true
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// state is the stand-in's encoded_opaque_state (base64 JSON).
type state struct {
	Server    string `json:"server"`
	CtxID     int64  `json:"ctx_request_id"`
	Prompt    uint64 `json:"prompt"` // hash of the prompt tokens
	FirstWord string `json:"first"`
}

// inference follows openai_server.py openai_chat_completion and
// openai_completion: the request validated as ChatCompletionRequest /
// CompletionRequest (disaggregated_params as DisaggregatedParams,
// conversation_params as ConversationParams), the conversation id resolved
// (conversation_id.py), the sub-agent hint and the KV-transfer signature
// checked (disagg_auth.py), then one generation: a context_only request
// computes the prompt and its first token and answers the handoff, a
// generation_only request continues from encoded_opaque_state.
func (s *Server) inference(w http.ResponseWriter, r *http.Request, chat bool) {
	q, ok := parseInference(w, r, chat)
	if !ok || !s.checkRouting(w, r, q) {
		return
	}
	q.n = s.seq.Add(1)
	q.id = fmt.Sprintf("%s-%s-%d", map[bool]string{true: "chatcmpl", false: "cmpl"}[chat], s.cfg.Name, q.n)
	if !s.parseGeneration(w, q) {
		return
	}
	out := make([]string, 0, q.limit)
	switch q.reqType {
	case "context_only":
		s.contextPhase(w, q)
		return
	case "generation_only":
		first, ok := generationPhase(w, q)
		if !ok {
			return
		}
		out = append(out, first)
	default:
		q.seen.CachedTokens = s.cache(q.tokens)
	}
	s.record(q.seen)
	s.answer(w, q, out)
}

// inferenceRequest is one inference request as its steps parse, check and
// serve it.
type inferenceRequest struct {
	body    map[string]json.RawMessage
	chat    bool
	model   string
	tokens  []uint32
	dp      disaggParams
	reqType string
	seen    Seen

	// Set once the request passed its checks.
	n            int64  // the request's sequence number
	id           string // the response id
	stream       bool
	includeUsage bool
	ph           uint64 // hash of the prompt tokens
	limit        int    // words to answer
	finish       string // the finish reason after limit words
}

// parseInference reads and validates the request body: a JSON object with
// a model, a prompt and, when present, disaggregated_params with a
// request_type. It answers the error itself and returns false on bad input.
func parseInference(w http.ResponseWriter, r *http.Request, chat bool) (*inferenceRequest, bool) {
	b, err := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	if err != nil {
		badRequest(w, err.Error())
		return nil, false
	}
	q := &inferenceRequest{chat: chat}
	if err := json.Unmarshal(b, &q.body); err != nil || q.body == nil {
		apiError(w, http.StatusUnprocessableEntity, "BadRequestError", "request body is not a JSON object")
		return nil, false
	}
	if json.Unmarshal(q.body["model"], &q.model) != nil || q.model == "" {
		badRequest(w, "model is required")
		return nil, false
	}
	q.tokens, _, err = promptTokens(q.body, chat)
	if err != nil {
		badRequest(w, err.Error())
		return nil, false
	}
	if !isNull(q.body["disaggregated_params"]) {
		if err := json.Unmarshal(q.body["disaggregated_params"], &q.dp); err != nil {
			badRequest(w, "disaggregated_params: "+err.Error())
			return nil, false
		}
		if _, ok := q.dp.str("request_type"); !ok {
			apiError(w, http.StatusUnprocessableEntity, "BadRequestError", "disaggregated_params.request_type: field required")
			return nil, false
		}
	}
	q.reqType, _ = q.dp.str("request_type")
	return q, true
}

// checkRouting resolves the conversation id and checks the sub-agent hint
// and, for a generation_only request, the KV-transfer signature, noting
// each in q.seen. It answers the error itself and returns false when one
// fails.
func (s *Server) checkRouting(w http.ResponseWriter, r *http.Request, q *inferenceRequest) bool {
	conv, convNull, msg := resolveConversation(q.body, r.Header)
	if msg != "" {
		badRequest(w, msg)
		return false
	}
	q.seen = Seen{Path: r.URL.Path, RequestType: q.reqType, ConversationID: conv}

	affinity, msg := s.checkHint(r.Header, q.model, conv, convNull, q.dp)
	if msg != "" {
		badRequest(w, msg)
		return false
	}
	q.seen.Affinity = affinity
	if q.reqType == "generation_only" {
		need, msg := s.checkDisaggAuth(r.Header, q.dp)
		if msg != "" {
			badRequest(w, msg)
			return false
		}
		q.seen.DisaggAuth = need
	}
	return true
}

// parseGeneration reads the sampling and streaming parameters (max_tokens,
// stream, stream_options) and sets how many words the answer has and why it
// ends. It answers the error itself and returns false on bad input.
func (s *Server) parseGeneration(w http.ResponseWriter, q *inferenceRequest) bool {
	maxTokens := 16
	if raw, ok := q.body["max_tokens"]; ok && !isNull(raw) {
		if json.Unmarshal(raw, &maxTokens) != nil || maxTokens < 1 {
			badRequest(w, "max_tokens must be a positive integer")
			return false
		}
	}
	_ = json.Unmarshal(q.body["stream"], &q.stream)
	if !isNull(q.body["stream_options"]) {
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		_ = json.Unmarshal(q.body["stream_options"], &so)
		q.includeUsage = so.IncludeUsage
	}
	q.ph = hashTokens(q.tokens)
	// The answer: maxTokens words, or fewer when the toy model emits EOS.
	q.limit, q.finish = maxTokens, "length"
	if s.cfg.EOSAt > 0 && s.cfg.EOSAt <= maxTokens {
		q.limit, q.finish = s.cfg.EOSAt-1, "stop"
	}
	return true
}

// contextPhase serves a context_only request.
func (s *Server) contextPhase(w http.ResponseWriter, q *inferenceRequest) {
	// The context phase computes the prompt and its first token
	// (openai_server.py with a context_only request; the response's
	// disaggregated_params come from to_disaggregated_params of the
	// result's context phase params).
	q.seen.CachedTokens = s.cache(q.tokens)
	s.record(q.seen)
	if q.limit == 0 {
		// The first token ended the request: the executor returns no
		// context phase params, so ctx_request_id and the opaque state
		// are null and nothing is left for a generation server.
		handoff := map[string]any{
			"request_type": "context_only", "first_gen_tokens": []uint32{eosID}, "ctx_request_id": nil,
			"encoded_opaque_state": nil, "draft_tokens": nil,
			"disagg_request_id": json.RawMessage(orNull(q.dp["disagg_request_id"])), "ctx_dp_rank": 0, "ctx_info_endpoint": nil,
			"schedule_style": nil,
		}
		s.respond(w, q.id, q.model, q.chat, nil, "stop", len(q.tokens), q.seen.CachedTokens, handoff, q.tokens)
		return
	}
	first := word(q.ph, 0)
	st, _ := json.Marshal(state{Server: s.cfg.Name, CtxID: q.n, Prompt: q.ph, FirstWord: first})
	handoff := map[string]any{
		"request_type":         "context_only",
		"first_gen_tokens":     []uint32{tokenID(first)},
		"ctx_request_id":       q.n,
		"encoded_opaque_state": base64.StdEncoding.EncodeToString(st),
		"draft_tokens":         nil,
		"disagg_request_id":    json.RawMessage(orNull(q.dp["disagg_request_id"])),
		"ctx_dp_rank":          0,
		"ctx_info_endpoint":    "tcp://" + s.cfg.Name + ":5555",
		"schedule_style":       nil,
	}
	ctxFinish := "length"
	if q.limit == 1 && q.finish == "stop" {
		ctxFinish = "stop"
	}
	s.respond(w, q.id, q.model, q.chat, []string{first}, ctxFinish, len(q.tokens), q.seen.CachedTokens, handoff, q.tokens)
}

// generationPhase opens a generation_only request's encoded_opaque_state
// and returns the first word the context phase generated. It answers the
// error itself and returns false when the state is not this prompt's
// context state.
func generationPhase(w http.ResponseWriter, q *inferenceRequest) (string, bool) {
	raw, _ := q.dp.str("encoded_opaque_state")
	sb, err := base64.StdEncoding.DecodeString(raw)
	var st state
	if err != nil || json.Unmarshal(sb, &st) != nil || st.Server == "" {
		badRequest(w, "disaggregated_params.encoded_opaque_state is not a context state")
		return "", false
	}
	if st.Prompt != q.ph {
		badRequest(w, "the prompt differs from the context phase's")
		return "", false
	}
	return st.FirstWord, true
}

// answer completes out to the request's word limit and writes the
// completion, streamed or whole.
func (s *Server) answer(w http.ResponseWriter, q *inferenceRequest, out []string) {
	for i := len(out); i < q.limit; i++ {
		out = append(out, word(q.ph, i))
	}
	if q.stream {
		s.stream(w, q.id, q.model, q.chat, out, q.finish, len(q.tokens), q.seen.CachedTokens, q.includeUsage)
		return
	}
	s.respond(w, q.id, q.model, q.chat, out, q.finish, len(q.tokens), q.seen.CachedTokens, nil, nil)
}

// eosID is the toy model's end-of-sequence token.
const eosID = 2

func orNull(raw json.RawMessage) json.RawMessage {
	if isNull(raw) {
		return json.RawMessage("null")
	}
	return raw
}

func (s *Server) record(seen Seen) {
	s.mu.Lock()
	s.seen = append(s.seen, seen)
	s.mu.Unlock()
}

// cache counts the prompt's cached leading blocks of tokens_per_block
// tokens and stores the others (the KV cache manager's block reuse), and
// records the stored blocks (and those evicted for them) as KV cache events.
func (s *Server) cache(tokens []uint32) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	bs := s.cfg.TokensPerBlock
	cached, hit := 0, true
	var parent uint64
	hasParent := false
	var run []storedBlock
	runParent, runHasParent := uint64(0), false
	flush := func() {
		if len(run) > 0 {
			s.events.stored(runParent, runHasParent, run)
			run = nil
		}
	}
	for i := 0; i+bs <= len(tokens); i += bs {
		k := blockKey(parent, hasParent, tokens[i:i+bs])
		if _, ok := s.blocks[k]; ok && hit {
			cached += bs
			s.touch(k)
		} else if ok {
			s.touch(k)
			flush()
		} else {
			hit = false
			if len(run) == 0 {
				runParent, runHasParent = parent, hasParent
			}
			s.evictFor()
			s.blocks[k] = s.clock
			s.clock++
			run = append(run, storedBlock{hash: k, tokens: tokens[i : i+bs]})
		}
		parent, hasParent = k, true
	}
	flush()
	return cached
}

// touch marks a block recently used.
func (s *Server) touch(k uint64) {
	s.blocks[k] = s.clock
	s.clock++
}

// evictFor makes room for one block: the least recently used goes (a
// "removed" event) when the pool holds MaxBlocks.
func (s *Server) evictFor() {
	if len(s.blocks) < s.cfg.MaxBlocks {
		return
	}
	var oldest uint64
	first := true
	for k, at := range s.blocks {
		if first || at < s.blocks[oldest] {
			oldest, first = k, false
		}
	}
	delete(s.blocks, oldest)
	s.events.removed([]uint64{oldest})
}

// blockKey is the block's hash as the KV cache manager computes it: over
// its tokens, chained to its parent's (an opaque 64-bit value, not tether's
// key).
func blockKey(parent uint64, hasParent bool, tokens []uint32) uint64 {
	h := fnv.New64a()
	if hasParent {
		var b [8]byte
		for i := range b {
			b[i] = byte(parent >> (8 * i))
		}
		_, _ = h.Write(b[:])
	}
	for _, t := range tokens {
		_, _ = h.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(t >> 24)})
	}
	return h.Sum64() | 1<<63 // above 2^63: JSON readers must not round it
}

// respond writes ChatCompletionResponse / CompletionResponse
// (postprocess_handlers.py chat_response_post_processor and
// completion_response_post_processor): the handoff in
// choices[0].disaggregated_params (to_disaggregated_params), the prompt's
// prompt_token_ids for a context answer, usage with prompt_tokens_details.
func (s *Server) respond(w http.ResponseWriter, id, model string, chat bool, words []string, finish string, prompt, cached int, handoff map[string]any, promptIDs []uint32) {
	text := strings.Join(words, " ")
	choice := map[string]any{"index": 0, "finish_reason": finish, "logprobs": nil}
	obj := "text_completion"
	if chat {
		obj = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": text}
	} else {
		choice["text"] = text
	}
	if handoff != nil {
		choice["disaggregated_params"] = handoff
	}
	resp := map[string]any{
		"id": id, "object": obj, "created": time.Now().Unix(), "model": model,
		"choices": []any{choice},
		"usage": map[string]any{"prompt_tokens": prompt, "completion_tokens": len(words), "total_tokens": prompt + len(words),
			"prompt_tokens_details": map[string]any{"cached_tokens": cached}},
	}
	if promptIDs != nil {
		resp["prompt_token_ids"] = promptIDs
	}
	writeJSON(w, http.StatusOK, resp)
}

// stream writes the SSE chunks of postprocess_handlers.py
// chat_stream_post_processor / completion_stream_post_processor: one chunk
// per token (the role in the first chat delta), the usage chunk with
// stream_options.include_usage, then [DONE].
func (s *Server) stream(w http.ResponseWriter, id, model string, chat bool, words []string, finishReason string, prompt, cached int, includeUsage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	obj := "text_completion"
	if chat {
		obj = "chat.completion.chunk"
	}
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		_ = http.NewResponseController(w).Flush()
	}
	chunk := func(choice map[string]any) map[string]any {
		return map[string]any{"id": id, "object": obj, "created": time.Now().Unix(), "model": model, "choices": []any{choice}}
	}
	completion := len(words)
	if len(words) == 0 {
		words = []string{""} // one chunk carries the finish reason
	}
	for i, wd := range words {
		var finish any
		if i == len(words)-1 {
			finish = finishReason
		}
		if i > 0 {
			wd = " " + wd
		}
		c := map[string]any{"index": 0, "finish_reason": finish}
		if chat {
			d := map[string]any{"content": wd}
			if i == 0 {
				d["role"] = "assistant"
			}
			c["delta"] = d
		} else {
			c["text"] = wd
		}
		send(chunk(c))
	}
	if includeUsage {
		send(map[string]any{"id": id, "object": obj, "created": time.Now().Unix(), "model": model, "choices": []any{},
			"usage": map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
				"prompt_tokens_details": map[string]any{"cached_tokens": cached}}})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	_ = http.NewResponseController(w).Flush()
}

// resolveConversation follows conversation_id.py
// resolve_request_conversation_id: the body's
// conversation_params.conversation_id when the body has conversation_params
// (validated as openai_protocol.py ConversationParams: extra fields
// forbidden, conversation_id required, str()-ed and stripped, not empty:
// else a 400), otherwise the first non-empty of CONVERSATION_ID_HEADERS,
// stripped. null: no conversation id.
func resolveConversation(body map[string]json.RawMessage, h http.Header) (id string, null bool, msg string) {
	if !isNull(body["conversation_params"]) {
		var cp map[string]json.RawMessage
		if err := json.Unmarshal(body["conversation_params"], &cp); err != nil {
			return "", false, "conversation_params: Input should be a valid dictionary"
		}
		for k := range cp {
			if k != "conversation_id" {
				return "", false, "conversation_params." + k + ": Extra inputs are not permitted"
			}
		}
		raw := bytes.TrimSpace(cp["conversation_id"])
		if len(raw) == 0 {
			return "", false, "conversation_params.conversation_id: Field required"
		}
		var v any
		_ = json.Unmarshal(raw, &v)
		var str string
		switch x := v.(type) {
		case nil:
			return "", false, "conversation_params.conversation_id: Value error, conversation_id must be non-empty"
		case string:
			str = x
		default:
			str = string(raw) // str() of a number or bool
		}
		if str = strings.TrimSpace(str); str == "" {
			return "", false, "conversation_params.conversation_id: Value error, conversation_id must be non-empty"
		}
		return str, false, ""
	}
	for _, name := range ConversationIDHeaders {
		// Starlette's headers keep the last value of a repeated name in a dict.
		vs := h.Values(name)
		if len(vs) == 0 {
			continue
		}
		if v := strings.TrimSpace(vs[len(vs)-1]); v != "" {
			return v, false, ""
		}
	}
	return "", true, ""
}

// checkHint is validate_subagent_affinity: the role is configured or
// inferred; a hint needs a key and a valid signature (else a ValueError,
// 400).
func (s *Server) checkHint(h http.Header, model, conv string, convNull bool, dp disaggParams) (affinity, msg string) {
	role := strings.ToUpper(s.cfg.Role)
	if role == "" && dp != nil {
		rt, _ := dp.str("request_type")
		role = map[string]string{"context_only": "CONTEXT", "generation_only": "GENERATION"}[rt]
	}
	if role != "CONTEXT" && role != "GENERATION" {
		return "", ""
	}
	hdr := h.Get(HeaderAffinityID)
	if strings.TrimSpace(hdr) == "" {
		return "", ""
	}
	if s.cfg.Key == "" {
		return "", "Subagent affinity requires internal_request_auth_key"
	}
	req := map[string]any{
		"kind": "hint", "key": s.cfg.Key, "role": role, "model": model,
		"affinity_header_hex": hex.EncodeToString([]byte(hdr)),
		"request_type":        nil, "disagg_request_id": nil, "conversation_id": nil,
	}
	if !convNull {
		req["conversation_id"] = conv
	}
	if dp != nil {
		req["request_type"] = json.RawMessage(orNull(dp["request_type"]))
		req["disagg_request_id"] = json.RawMessage(orNull(dp["disagg_request_id"]))
	}
	if sig := h.Get(HeaderAffinityAuth); sig != "" {
		req["signature"] = sig
	}
	if msg := s.verify(req); msg != "" {
		return "", msg
	}
	return strings.TrimSpace(hdr), ""
}

// checkDisaggAuth is disagg_auth.py validate_internal_disagg_request of
// the configured release. Current releases protect ctx_info_endpoint and
// encoded_opaque_state (either set: the header is required, and a worker
// without internal_request_auth_key refuses the request); the first ones
// signed the whole model_dump and required the header for
// encoded_opaque_state only.
func (s *Server) checkDisaggAuth(h http.Header, dp disaggParams) (need bool, msg string) {
	legacy := s.cfg.DisaggAuth == DisaggAuthParams
	if isNull(dp["encoded_opaque_state"]) && (legacy || isNull(dp["ctx_info_endpoint"])) {
		return false, ""
	}
	if s.cfg.Key == "" {
		if legacy {
			return false, "encoded_opaque_state requires authenticated disaggregated request forwarding"
		}
		return false, "Protected disaggregated request fields require authenticated disaggregated request forwarding"
	}
	req := map[string]any{"kind": "disagg", "key": s.cfg.Key,
		"ctx_info_endpoint":    json.RawMessage(orNull(dp["ctx_info_endpoint"])),
		"encoded_opaque_state": json.RawMessage(orNull(dp["encoded_opaque_state"]))}
	if legacy {
		req = map[string]any{"kind": "disagg-params", "key": s.cfg.Key, "params": map[string]json.RawMessage(dp), "fields": legacyParamsFields}
	}
	if sig := h.Get(HeaderDisaggAuth); sig != "" {
		req["signature"] = sig
	}
	return true, s.verify(req)
}

// verify asks verify.py; without python3 the check is skipped and counted.
func (s *Server) verify(req map[string]any) string {
	if s.verifier == nil {
		s.mu.Lock()
		s.unverified++
		s.mu.Unlock()
		return ""
	}
	ok, msg, err := s.verifier.check(req)
	if err != nil {
		return "verifier failed: " + err.Error()
	}
	if !ok {
		return msg
	}
	return ""
}

// promptTokens renders and tokenizes the prompt: chat messages as
// "role: content" lines, or the completion prompt (text or token ids). A
// generation request's prompt_token_ids (set by a disaggregated server
// from the context response) win for chat.
func promptTokens(body map[string]json.RawMessage, chat bool) ([]uint32, []string, error) {
	if chat && !isNull(body["prompt_token_ids"]) {
		var ids []uint32
		if err := json.Unmarshal(body["prompt_token_ids"], &ids); err != nil {
			return nil, nil, fmt.Errorf("prompt_token_ids: %v", err)
		}
		return ids, nil, nil
	}
	var text string
	if chat {
		var msgs []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(body["messages"], &msgs); err != nil || len(msgs) == 0 {
			return nil, nil, errors.New("messages: a non-empty list is required")
		}
		pm := make([]prefix.Message, 0, len(msgs))
		for _, m := range msgs {
			var c string
			if json.Unmarshal(m.Content, &c) != nil {
				var parts []struct {
					Text string `json:"text"`
				}
				_ = json.Unmarshal(m.Content, &parts)
				texts := make([]string, 0, len(parts))
				for _, p := range parts {
					texts = append(texts, p.Text)
				}
				c = strings.Join(texts, "\n")
			}
			pm = append(pm, prefix.Message{Role: m.Role, Content: c})
		}
		text = prefix.RenderChat(pm)
	} else {
		raw := bytes.TrimSpace(body["prompt"])
		if len(raw) > 0 && raw[0] == '[' {
			var ids []uint32
			if err := json.Unmarshal(raw, &ids); err == nil {
				return ids, nil, nil
			}
			var one []string
			if err := json.Unmarshal(raw, &one); err != nil || len(one) != 1 {
				return nil, nil, errors.New("prompt: a string, one string in a list, or token ids")
			}
			text = one[0]
		} else if err := json.Unmarshal(raw, &text); err != nil {
			return nil, nil, errors.New("prompt is required")
		}
	}
	words := strings.Fields(text)
	if len(words) == 0 {
		return nil, nil, errors.New("the prompt is empty")
	}
	return prefix.Tokenize(text), words, nil
}

// tokenID is the toy model's token of one word (tether's words tokenizer:
// internal/prefix, so an edge with `tokenizer: words` cuts the same blocks).
func tokenID(w string) uint32 { return prefix.Tokenize(w)[0] }

func hashTokens(ids []uint32) uint64 {
	h := fnv.New64a()
	for _, t := range ids {
		_, _ = h.Write([]byte(strconv.FormatUint(uint64(t), 10) + ","))
	}
	return h.Sum64()
}

var vocabulary = strings.Fields("the model answers in plain words so tests can read them back and check the order of tokens")

func word(seed uint64, i int) string {
	return vocabulary[(seed+uint64(i)*7)%uint64(len(vocabulary))]
}

// verifier is a long-running python3 verify.py.
type verifier struct {
	mu  sync.Mutex
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startVerifier() (*verifier, error) {
	py, err := exec.LookPath("python3")
	if err != nil {
		return nil, err
	}
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command(py, filepath.Join(filepath.Dir(file), "verify.py"))
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting verify.py: %w", err)
	}
	return &verifier{cmd: cmd, in: in, out: bufio.NewReader(out)}, nil
}

func (v *verifier) check(req map[string]any) (bool, string, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return false, "", err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, err := v.in.Write(append(b, '\n')); err != nil {
		return false, "", err
	}
	line, err := v.out.ReadBytes('\n')
	if err != nil {
		return false, "", err
	}
	var ans struct {
		OK      bool   `json:"ok"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(line, &ans); err != nil {
		return false, "", err
	}
	return ans.OK, ans.Message, nil
}

func (v *verifier) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	_ = v.in.Close()
	_ = v.cmd.Wait()
}
