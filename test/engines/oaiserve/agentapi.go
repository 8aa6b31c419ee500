package oaiserve

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"time"
)

// The agents' APIs as the engines serve them:
//   - POST /v1/messages and /v1/messages/count_tokens: vLLM converts the
//     Anthropic request to chat completions, runs it and converts the answer
//     back (vllm/entrypoints/anthropic/serving.py: messages_full_converter,
//     message_stream_converter — message_start from the first chunk, one
//     content block per kind, message_delta with the stop reason and usage
//     {input_tokens, output_tokens}, message_stop; no ping, no cache fields;
//     count_tokens answers input_tokens and context_management); SGLang's
//     python/sglang/srt/entrypoints/anthropic/serving.py is a port of it.
//   - POST /v1/responses, GET /v1/responses/{id} and POST
//     /v1/responses/{id}/cancel (vllm/entrypoints/openai/responses/
//     api_router.py, serving.py; SGLang's openai/serving_responses.py is a
//     port): the store is off unless enabled (VLLM_ENABLE_RESPONSES_API_STORE,
//     Options.ResponsesStore), when store is silently false and background
//     refused; an id the store does not hold is 404 "Response with id '…'
//     not found."; events are named (`event: <type>`) and numbered by
//     sequence_number from 0. No DELETE, no input_items.
//
// The prompt is the request's texts, each engine's own rendering: only
// what is cached and where matters to tests. On a split server both APIs
// take part in the handoff as the engine lets them (pd_agentapi.go).

func (s *Server) agentRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/messages", s.messages)
	mux.HandleFunc("POST /v1/messages/count_tokens", s.countTokens)
	mux.HandleFunc("POST /v1/responses", s.responses)
	mux.HandleFunc("GET /v1/responses/{id}", s.getResponse)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", s.cancelResponse)
}

// storedResp is one stored response.
type storedResp struct {
	object  map[string]any
	history []string // the conversation's texts, this response's output last
}

type anthropicMsg struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// texts collects the text of a content: a string, or blocks with text
// (or a tool result's content).
func texts(raw json.RawMessage) []string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}
	}
	var blocks []struct {
		Text    *string         `json:"text"`
		Content json.RawMessage `json:"content"`
		Output  json.RawMessage `json:"output"`
	}
	_ = json.Unmarshal(raw, &blocks)
	var out []string
	for _, b := range blocks {
		switch {
		case b.Text != nil:
			out = append(out, *b.Text)
		case len(b.Content) > 0:
			out = append(out, texts(b.Content)...)
		case len(b.Output) > 0:
			out = append(out, texts(b.Output)...)
		}
	}
	return out
}

// readAgentBody decodes the body into v and returns its top-level fields.
func (s *Server) readAgentBody(w http.ResponseWriter, r *http.Request, v any) (map[string]json.RawMessage, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	var top map[string]json.RawMessage
	if err == nil {
		err = json.Unmarshal(body, &top)
	}
	if err == nil {
		err = json.Unmarshal(body, v)
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "BadRequestError", "invalid JSON: "+fmt.Sprint(err)))
		return nil, false
	}
	return top, true
}

func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model     string          `json:"model"`
		System    json.RawMessage `json:"system"`
		Messages  []anthropicMsg  `json:"messages"`
		MaxTokens *int            `json:"max_tokens"`
		Stream    bool            `json:"stream"`
	}
	top, ok := s.readAgentBody(w, r, &req)
	if !ok {
		return
	}
	if req.MaxTokens == nil || len(req.Messages) == 0 {
		writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "BadRequestError", "max_tokens and messages are required"))
		return
	}
	var b strings.Builder
	b.WriteString("<system> " + strings.Join(texts(req.System), "") + " ")
	last := ""
	for _, m := range req.Messages {
		t := strings.Join(texts(m.Content), " ")
		fmt.Fprintf(&b, "<%s> %s ", m.Role, t)
		if m.Role == "user" {
			last = t
		}
	}
	t, ok := s.runAgent(w, r, top, agentMessages, b.String(), last, *req.MaxTokens, req.Stream)
	if !ok {
		return
	}
	defer t.done()
	words, prompt := t.words, t.prompt
	id := "chatcmpl-" + randHex()
	usage := map[string]int{"input_tokens": prompt, "output_tokens": len(words)}
	text := strings.Join(words, " ")
	if !req.Stream {
		answer := map[string]any{"id": id, "type": "message", "role": "assistant", "model": s.opts.Model,
			"content": []any{map[string]any{"type": "text", "text": text}}, "stop_reason": stopReason(t.finish), "stop_sequence": nil, "usage": usage}
		t.h.answerFields(answer) // kv_transfer_params (dumped with exclude_none: only when set)
		if answer["kv_transfer_params"] == nil {
			delete(answer, "kv_transfer_params")
		}
		writeJSON(w, http.StatusOK, answer)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	ev := func(name string, v map[string]any) {
		v["type"] = name
		data, _ := json.Marshal(v)
		fmt.Fprintf(bw, "event: %s\ndata: %s\n\n", name, data)
	}
	ev("message_start", map[string]any{"message": map[string]any{"id": id, "type": "message", "role": "assistant", "content": []any{},
		"model": s.opts.Model, "stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": prompt, "output_tokens": 0}}})
	ev("content_block_start", map[string]any{"index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
	for i, word := range words {
		if i > 0 {
			word = " " + word
		}
		ev("content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "text_delta", "text": word}})
	}
	ev("content_block_stop", map[string]any{"index": 0})
	ev("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stopReason(t.finish)}, "usage": usage})
	ev("message_stop", map[string]any{})
	_ = bw.Flush()
}

func (s *Server) countTokens(w http.ResponseWriter, r *http.Request) {
	var req struct {
		System   json.RawMessage `json:"system"`
		Messages []anthropicMsg  `json:"messages"`
	}
	if _, ok := s.readAgentBody(w, r, &req); !ok {
		return
	}
	n := len(strings.Fields(strings.Join(texts(req.System), "")))
	for _, m := range req.Messages {
		n += 1 + len(strings.Fields(strings.Join(texts(m.Content), " ")))
	}
	writeJSON(w, http.StatusOK, map[string]any{"input_tokens": n, "context_management": map[string]int{"original_input_tokens": n}})
}

func (s *Server) notFound(w http.ResponseWriter, id string) {
	e := s.errorBody(http.StatusNotFound, "invalid_request_error", fmt.Sprintf("Response with id '%s' not found.", id))
	writeJSON(w, http.StatusNotFound, e)
}

func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model        string          `json:"model"`
		Input        json.RawMessage `json:"input"`
		Instructions string          `json:"instructions"`
		MaxOutput    *int            `json:"max_output_tokens"`
		Stream       bool            `json:"stream"`
		Store        *bool           `json:"store"`
		Background   bool            `json:"background"`
		Previous     string          `json:"previous_response_id"`
	}
	top, ok := s.readAgentBody(w, r, &req)
	if !ok {
		return
	}
	store := req.Store == nil || *req.Store
	if store && !s.opts.ResponsesStore {
		if req.Background {
			writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "invalid_request_error",
				"This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."))
			return
		}
		store = false
	}
	var history []string
	if req.Previous != "" {
		s.mu.Lock()
		prev, ok := s.stored[req.Previous]
		s.mu.Unlock()
		if !ok {
			s.notFound(w, req.Previous)
			return
		}
		history = prev.history
	}
	input := inputTexts(req.Input)
	conv := append(append([]string{req.Instructions}, history...), input...)
	maxTokens, last := 16, ""
	if req.MaxOutput != nil {
		maxTokens = *req.MaxOutput
	}
	if len(input) > 0 {
		last = input[len(input)-1]
	}
	t, ok := s.runAgent(w, r, top, agentResponses, strings.Join(conv, " "), last, maxTokens, req.Stream)
	if !ok {
		return
	}
	defer t.done()
	prompt, cached, words := t.prompt, t.cached, t.words
	id, msgID, text := "resp_"+randHex(), "msg_"+randHex(), strings.Join(words, " ")
	obj := func(status string, output []any, usage any) map[string]any {
		var prev any
		if req.Previous != "" {
			prev = req.Previous
		}
		return map[string]any{"id": id, "object": "response", "created_at": time.Now().Unix(), "model": s.opts.Model,
			"status": status, "output": output, "usage": usage, "previous_response_id": prev, "store": store, "background": req.Background}
	}
	item := map[string]any{"id": msgID, "type": "message", "role": "assistant", "status": "completed",
		"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}
	usage := map[string]any{"input_tokens": prompt, "input_tokens_details": map[string]int{"cached_tokens": cached},
		"output_tokens": len(words), "output_tokens_details": map[string]int{"reasoning_tokens": 0}, "total_tokens": prompt + len(words)}
	final := obj(responseStatus(t.finish), []any{item}, usage)
	if store {
		s.mu.Lock()
		s.stored[id] = &storedResp{object: final, history: append(conv[1:len(conv):len(conv)], text)}
		s.mu.Unlock()
	}
	if !req.Stream {
		answer := maps.Clone(final) // (the stored object has no handoff)
		t.h.answerFields(answer)    // kv_transfer_params
		writeJSON(w, http.StatusOK, answer)
		return
	}
	streamResponse(w, obj("in_progress", []any{}, nil), final, item, words)
}

// inputTexts are the texts of a Responses input: a string, or the content
// of its items.
func inputTexts(raw json.RawMessage) []string {
	if input := texts(raw); len(input) > 0 {
		return input
	}
	var items []struct {
		Content json.RawMessage `json:"content"`
	}
	_ = json.Unmarshal(raw, &items)
	var input []string
	for _, it := range items {
		input = append(input, texts(it.Content)...)
	}
	return input
}

// streamResponse writes a response's events as vLLM streams them: created,
// in_progress, one message item's events with a delta per word, completed.
func streamResponse(w http.ResponseWriter, started, final, item map[string]any, words []string) {
	msgID, text := item["id"], strings.Join(words, " ")
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	seq := 0
	ev := func(name string, v map[string]any) {
		v["type"], v["sequence_number"] = name, seq
		seq++
		data, _ := json.Marshal(v)
		fmt.Fprintf(bw, "event: %s\ndata: %s\n\n", name, data)
	}
	ev("response.created", map[string]any{"response": started})
	ev("response.in_progress", map[string]any{"response": started})
	ev("response.output_item.added", map[string]any{"output_index": 0, "item": map[string]any{"id": msgID, "type": "message", "role": "assistant", "status": "in_progress", "content": []any{}}})
	ev("response.content_part.added", map[string]any{"output_index": 0, "item_id": msgID, "content_index": 0, "part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
	for i, word := range words {
		if i > 0 {
			word = " " + word
		}
		ev("response.output_text.delta", map[string]any{"output_index": 0, "item_id": msgID, "content_index": 0, "delta": word, "logprobs": []any{}})
	}
	ev("response.output_text.done", map[string]any{"output_index": 0, "item_id": msgID, "content_index": 0, "text": text, "logprobs": []any{}})
	ev("response.content_part.done", map[string]any{"output_index": 0, "item_id": msgID, "content_index": 0, "part": map[string]any{"type": "output_text", "text": text, "annotations": []any{}}})
	ev("response.output_item.done", map[string]any{"output_index": 0, "item": item})
	ev("response.completed", map[string]any{"response": final})
	_ = bw.Flush()
}

// storedOr404 returns the stored response the path names, or answers 404.
func (s *Server) storedOr404(w http.ResponseWriter, r *http.Request) (*storedResp, bool) {
	id := r.PathValue("id")
	s.mu.Lock()
	st, ok := s.stored[id]
	s.mu.Unlock()
	if !ok {
		s.notFound(w, id)
	}
	return st, ok
}

func (s *Server) getResponse(w http.ResponseWriter, r *http.Request) {
	if st, ok := s.storedOr404(w, r); ok {
		writeJSON(w, http.StatusOK, st.object)
	}
}

func (s *Server) cancelResponse(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.storedOr404(w, r); ok {
		// Every response here ran in the foreground.
		writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "invalid_request_error", "Cannot cancel a synchronous response."))
	}
}

func randHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
