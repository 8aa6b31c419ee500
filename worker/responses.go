package worker

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/worker/engine"
	"github.com/tether-project/tether/worker/proxy"
)

// The Responses API as vLLM serves it (vllm/entrypoints/openai/responses/
// serving.py, api_router.py; event shapes as simple_streaming_events.py
// and openai-node's ResponseStreamEvent): POST /v1/responses answers a
// response object, or streams response.created, response.in_progress,
// each output item's events (output_item.added; a message's
// content_part.added, output_text.delta..., output_text.done,
// content_part.done; a function call's function_call_arguments.delta...,
// function_call_arguments.done; a reasoning item's reasoning_text events;
// output_item.done) and response.completed, every event numbered by
// sequence_number. store (default true here, as OpenAI; vLLM needs
// VLLM_ENABLE_RESPONSES_API_STORE) keeps the response in this process:
// previous_response_id continues from it, GET /v1/responses/{id} returns it
// (?stream=true&starting_after=N replays a background response's events and
// follows them), POST .../cancel cancels a background response, DELETE
// removes it, GET .../input_items lists its input. background runs the
// response after the request returns its queued object.

// responsesAnswer writes one Responses answer, to the client's stream or,
// for a background response, to its stored event log.
type responsesAnswer struct {
	x      *exchange
	s      *Server
	prevID string
	// stored is the store's record of a background response (nil
	// otherwise: a foreground response is stored when complete).
	stored *storedResponse
	// send writes one event (nil until the answer streams).
	send func(name string, ev map[string]any) error

	seq      int
	started  bool
	cur      *respItem
	items    []any
	outIndex int
	// input are the request's input items as stored (inputs).
	input []json.RawMessage
}

// inputs are the request's input items with their ids, the same for the
// stored response and its conversation.
func (a *responsesAnswer) inputs() []json.RawMessage {
	if a.input == nil {
		a.input = inputItems(a.x.p.req.Responses.Input)
	}
	return a.input
}

// respItem is an output item being streamed.
type respItem struct {
	kind   string // message, function_call
	id     string
	callID string
	name   apireq.ToolName
	text   strings.Builder
}

func (s *Server) newResponsesAnswer(x *exchange, prev *storedResponse) *responsesAnswer {
	a := &responsesAnswer{x: x, s: s}
	if prev != nil {
		a.prevID = prev.id
	}
	a.send = func(name string, ev map[string]any) error {
		ev["sequence_number"] = a.seq
		a.seq++
		return a.x.sendNamed(name, ev)
	}
	return a
}

func rawOr(top map[string]json.RawMessage, k string, def any) any {
	if raw, ok := top[k]; ok && !apireq.IsNull(raw) {
		return raw
	}
	return def
}

// echoed are the request fields a response object repeats as the request
// sent them, with the value it shows when the request did not (OpenAI's
// Response, openai-python types/responses/response.py).
var echoed = []struct {
	name string
	def  any
}{
	{"tools", []any{}}, {"tool_choice", "auto"}, {"parallel_tool_calls", true},
	{"temperature", 1.0}, {"top_p", 1.0}, {"max_output_tokens", nil}, {"max_tool_calls", nil},
	{"text", map[string]any{"format": map[string]string{"type": "text"}}},
	{"reasoning", map[string]any{"effort": nil, "summary": nil}},
	{"truncation", "disabled"}, {"metadata", map[string]any{}}, {"user", nil}, {"safety_identifier", nil},
	{"prompt_cache_key", nil}, {"prompt_cache_retention", nil}, {"service_tier", "default"}, {"top_logprobs", 0},
	{"prompt", nil},
}

// object is the response object in a status.
func (a *responsesAnswer) object(status string, output []any, usage any) map[string]any {
	p := a.x.p
	rf, top := p.req.Responses, p.req.Top
	var prev, instr, incomplete, conv, completed any
	if a.prevID != "" {
		prev = a.prevID
	}
	if rf.Instructions != "" {
		instr = rf.Instructions
	}
	if status == "incomplete" {
		incomplete = map[string]string{"reason": "max_output_tokens"}
	}
	if status == "completed" {
		completed = time.Now().Unix()
	}
	if rf.Conversation != "" {
		conv = map[string]string{"id": rf.Conversation}
	}
	if output == nil {
		output = []any{}
	}
	obj := map[string]any{
		"id": a.x.id, "object": "response", "created_at": a.x.created, "model": p.model, "status": status,
		"output": output, "usage": usage, "error": nil, "incomplete_details": incomplete,
		"instructions": instr, "previous_response_id": prev, "conversation": conv, "completed_at": completed,
		"store": rf.Store, "background": rf.Background,
	}
	for _, f := range echoed {
		obj[f.name] = rawOr(top, f.name, f.def)
	}
	return obj
}

func (a *responsesAnswer) usage(c engine.Completion) map[string]any {
	prompt := c.PromptTokens
	if prompt == 0 {
		prompt = len(a.x.p.prompt)
	}
	return map[string]any{"input_tokens": prompt, "input_tokens_details": map[string]int{"cached_tokens": c.CachedTokens},
		"output_tokens": c.CompletionTokens, "output_tokens_details": map[string]int{"reasoning_tokens": 0},
		"total_tokens": prompt + c.CompletionTokens}
}

// status is the finished response's status: incomplete when the output
// was cut at its bound (the client's max_output_tokens, else what is left
// of the context or default_max_tokens), completed when the model
// stopped on its own or called tools.
func (a *responsesAnswer) status(c engine.Completion) string {
	if c.FinishReason == "length" {
		return "incomplete"
	}
	return "completed"
}

func (a *responsesAnswer) start() error {
	if a.started {
		return a.x.writeErr
	}
	a.started = true
	obj := a.object("in_progress", nil, nil)
	if err := a.send("response.created", map[string]any{"type": "response.created", "response": obj}); err != nil {
		return err
	}
	if err := a.send("response.in_progress", map[string]any{"type": "response.in_progress", "response": obj}); err != nil {
		return err
	}
	if !a.x.p.req.Thinking {
		return nil
	}
	text := reasoningText(a.x.p.output)
	item := a.reasoningItem(text)
	id := item["id"]
	i := a.outIndex
	a.outIndex++
	added := map[string]any{"type": "reasoning", "id": id, "summary": []any{}, "content": []any{}, "status": "in_progress"}
	type event struct {
		name string
		v    map[string]any
	}
	evs := []event{
		{"response.output_item.added", map[string]any{"output_index": i, "item": added}},
		{"response.reasoning_text.delta", map[string]any{"output_index": i, "item_id": id, "content_index": 0, "delta": text}},
		{"response.reasoning_text.done", map[string]any{"output_index": i, "item_id": id, "content_index": 0, "text": text}},
	}
	for j, sum := range item["summary"].([]any) {
		st := sum.(map[string]string)["text"]
		// Each summary part's events name the item and the part.
		at := func(k string, v any) map[string]any {
			return map[string]any{"output_index": i, "item_id": id, "summary_index": j, k: v}
		}
		evs = append(evs,
			event{"response.reasoning_summary_part.added", at("part", map[string]string{"type": "summary_text", "text": ""})},
			event{"response.reasoning_summary_text.delta", at("delta", st)},
			event{"response.reasoning_summary_text.done", at("text", st)},
			event{"response.reasoning_summary_part.done", at("part", map[string]string{"type": "summary_text", "text": st})})
	}
	evs = append(evs, event{"response.output_item.done", map[string]any{"output_index": i, "item": item}})
	for _, ev := range evs {
		ev.v["type"] = ev.name
		if err := a.send(ev.name, ev.v); err != nil {
			return err
		}
	}
	a.items = append(a.items, item)
	return nil
}

// reasoningItem is the reasoning output item of text: its summary when the
// request asked for one (reasoning.summary: detailed the whole text,
// concise and auto its first sentence), its encrypted_content when
// include asked for it (apireq.ReasoningBlob: the next turn reads it
// back).
func (a *responsesAnswer) reasoningItem(text string) map[string]any {
	rf := a.x.p.req.Responses
	summary := []any{}
	if rf.ReasoningSummary != "" {
		st := text
		if rf.ReasoningSummary != "detailed" {
			if i := strings.Index(text, ". "); i >= 0 {
				st = text[:i+1]
			}
		}
		summary = append(summary, map[string]string{"type": "summary_text", "text": st})
	}
	item := map[string]any{"type": "reasoning", "id": "rs_" + randomID(), "summary": summary,
		"content": []any{map[string]string{"type": "reasoning_text", "text": text}}, "status": "completed"}
	if rf.EncryptedReasoning {
		item["encrypted_content"] = apireq.ReasoningBlob(text)
	}
	return item
}

func messageItem(id, text, status string) map[string]any {
	content := []any{}
	if status == "completed" {
		content = append(content, map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}})
	}
	return map[string]any{"type": "message", "id": id, "role": "assistant", "status": status, "content": content}
}

// callItem is a function_call output item. A namespace tool's function is
// named by its own name with its namespace (OpenAI's
// ResponseFunctionToolCall.namespace; vLLM's build_response_output_items),
// as Codex reads the call back (codex-rs/protocol/src/tool_name.rs).
func callItem(id, callID string, name apireq.ToolName, args, status string) map[string]any {
	item := map[string]any{"type": "function_call", "id": id, "call_id": callID, "name": name.Name, "arguments": args, "status": status}
	if name.Namespace != "" {
		item["namespace"] = name.Namespace
	}
	return item
}

func (a *responsesAnswer) ev(name string, fields map[string]any) error {
	fields["type"] = name
	return a.send(name, fields)
}

func (a *responsesAnswer) open(kind, callID string, name apireq.ToolName) error {
	if err := a.closeItem(); err != nil {
		return err
	}
	it := &respItem{kind: kind, callID: callID, name: name}
	a.cur = it
	i := a.outIndex
	if kind == "message" {
		it.id = "msg_" + randomID()
		if err := a.ev("response.output_item.added", map[string]any{"output_index": i, "item": messageItem(it.id, "", "in_progress")}); err != nil {
			return err
		}
		return a.ev("response.content_part.added", map[string]any{"output_index": i, "item_id": it.id, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}, "logprobs": []any{}}})
	}
	it.id = "fc_" + randomID()
	return a.ev("response.output_item.added", map[string]any{"output_index": i, "item": callItem(it.id, callID, name, "", "in_progress")})
}

func (a *responsesAnswer) closeItem() error {
	it := a.cur
	if it == nil {
		return nil
	}
	a.cur = nil
	i := a.outIndex
	a.outIndex++
	text := it.text.String()
	var item map[string]any
	if it.kind == "message" {
		item = messageItem(it.id, text, "completed")
		if err := a.ev("response.output_text.done", map[string]any{"output_index": i, "item_id": it.id, "content_index": 0, "text": text, "logprobs": []any{}}); err != nil {
			return err
		}
		if err := a.ev("response.content_part.done", map[string]any{"output_index": i, "item_id": it.id, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": []any{}}}); err != nil {
			return err
		}
	} else {
		item = callItem(it.id, it.callID, it.name, text, "completed")
		// OpenAI's ResponseFunctionCallArgumentsDoneEvent carries the name.
		if err := a.ev("response.function_call_arguments.done", map[string]any{"output_index": i, "item_id": it.id, "name": it.name.Name, "arguments": text}); err != nil {
			return err
		}
	}
	a.items = append(a.items, item)
	return a.ev("response.output_item.done", map[string]any{"output_index": i, "item": item})
}

func (a *responsesAnswer) emit(c engine.Chunk) error {
	if err := a.start(); err != nil {
		return err
	}
	if tc := c.ToolCall; tc != nil {
		if tc.ID != "" {
			if err := a.open("function_call", tc.ID, a.x.p.req.Responses.CallName(tc.Name)); err != nil {
				return err
			}
		}
		if tc.Arguments == "" || a.cur == nil {
			return nil
		}
		a.cur.text.WriteString(tc.Arguments)
		return a.ev("response.function_call_arguments.delta", map[string]any{"output_index": a.outIndex, "item_id": a.cur.id, "delta": tc.Arguments})
	}
	if c.Text == "" {
		return nil
	}
	if a.cur == nil || a.cur.kind != "message" {
		if err := a.open("message", "", apireq.ToolName{}); err != nil {
			return err
		}
	}
	a.cur.text.WriteString(c.Text)
	return a.ev("response.output_text.delta", map[string]any{"output_index": a.outIndex, "item_id": a.cur.id, "content_index": 0, "delta": c.Text, "logprobs": []any{}})
}

// store keeps a finished response (its object, the conversation to
// continue from, its input) when the request asked to store it.
func (a *responsesAnswer) store(c engine.Completion, status string, obj map[string]any) {
	p := a.x.p
	if conv := p.req.Responses.Conversation; conv != "" {
		a.s.appendTurn(conv, a.inputs(), obj["output"])
	}
	if !p.req.Responses.Store {
		return
	}
	reasoning := ""
	if p.req.Thinking {
		reasoning = reasoningText(p.output)
	}
	calls := make([]apireq.ToolCall, len(c.ToolCalls))
	for i, tc := range c.ToolCalls {
		calls[i] = apireq.ToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments}
	}
	history := append(p.req.History(), apireq.AssistantMessage(c.Text, reasoning, calls))
	raw, _ := json.Marshal(obj)
	if a.stored != nil {
		a.s.responses.update(a.stored, status, raw, history)
		return
	}
	a.s.responses.put(&storedResponse{id: a.x.id, status: status, object: raw, history: history,
		input: a.inputs(), chain: a.x.chainKey()})
}

func (a *responsesAnswer) finish(c engine.Completion) int {
	if a.start() != nil || a.closeItem() != nil {
		return statusClientClosed
	}
	status := a.status(c)
	obj := a.object(status, a.items, a.usage(c))
	a.store(c, status, obj) // before the last event: the id resolves once the client has it
	// OpenAI ends a cut-off answer with response.incomplete
	// (types/responses/response_incomplete_event.py); vLLM's serving.py
	// sends response.completed whatever the status.
	last := "response.completed"
	if status == "incomplete" {
		last = "response.incomplete"
	}
	if a.ev(last, map[string]any{"response": obj}) != nil {
		return statusClientClosed
	}
	return http.StatusOK
}

func (a *responsesAnswer) respond(c engine.Completion) int {
	p := a.x.p
	var out []any
	if p.req.Thinking {
		out = append(out, a.reasoningItem(reasoningText(p.output)))
	}
	if c.Text != "" {
		out = append(out, messageItem("msg_"+randomID(), c.Text, "completed"))
	}
	for _, tc := range c.ToolCalls {
		out = append(out, callItem("fc_"+randomID(), tc.ID, p.req.Responses.CallName(tc.Name), tc.Arguments, "completed"))
	}
	status := a.status(c)
	obj := a.object(status, out, a.usage(c))
	a.store(c, status, obj)
	a.x.extendDeadline()
	writeJSON(a.x.w, http.StatusOK, obj)
	return http.StatusOK
}

// streamError ends a stream with an error event and response.failed.
func (a *responsesAnswer) streamError(e *apiError) error {
	obj := a.object("failed", a.items, nil)
	obj["error"] = map[string]string{"code": "server_error", "message": e.Message}
	if a.stored != nil {
		raw, _ := json.Marshal(obj)
		a.s.responses.update(a.stored, "failed", raw, nil)
	}
	if err := a.ev("error", map[string]any{"code": "server_error", "message": e.Message, "param": nil}); err != nil {
		return err
	}
	return a.ev("response.failed", map[string]any{"response": obj})
}

// chainKey is the rank-placement key a response stores: its
// conversation, the chain it continues, or itself.
func (x *exchange) chainKey() string {
	if x.p.conversationID != "" {
		return x.p.conversationID
	}
	return x.chain
}

// inputItems are a request's input items as stored (a response's
// input_items, a conversation's items): each with an id and a type, a
// message's string content as its one text part and its status completed,
// as OpenAI lists them.
func inputItems(in []json.RawMessage) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(in))
	for _, raw := range in {
		var item map[string]json.RawMessage
		if json.Unmarshal(raw, &item) != nil {
			continue
		}
		var typ string
		_ = json.Unmarshal(item["type"], &typ)
		if typ == "" {
			typ = "message"
			item["type"] = json.RawMessage(`"message"`)
		}
		if _, ok := item["id"]; !ok {
			prefix := map[string]string{"function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}[typ]
			if prefix == "" {
				prefix = "msg_"
			}
			item["id"] = json.RawMessage(strconv.Quote(prefix + randomID()))
		}
		if typ == "message" {
			var text string
			if json.Unmarshal(item["content"], &text) == nil {
				var role string
				_ = json.Unmarshal(item["role"], &role)
				part := "input_text"
				if role == "assistant" {
					part = "output_text"
				}
				item["content"], _ = json.Marshal([]map[string]any{{"type": part, "text": text}})
			}
			if _, ok := item["status"]; !ok {
				item["status"] = json.RawMessage(`"completed"`)
			}
		}
		b, _ := json.Marshal(item)
		out = append(out, b)
	}
	return out
}

// expandResponses puts the stored conversation of previous_response_id
// before the request's input, and renders each item_reference as the
// stored item it names (an input or output item of a response this
// process stores).
func (s *Server) expandResponses(p *parsedRequest) (*storedResponse, *apiError) {
	var st *storedResponse
	if id := p.req.Responses.PreviousResponseID; id != "" {
		var ok bool
		if st, ok = s.responses.get(id); !ok {
			return nil, previousNotFound(id)
		}
		_, _, history, _ := s.responses.snapshot(st)
		if aerr := p.req.WithHistory(history); aerr != nil {
			return nil, aerr
		}
	}
	if len(p.req.Responses.ItemReferences()) > 0 {
		if aerr := p.req.ResolveItems(s.responses.item); aerr != nil {
			return nil, aerr
		}
	}
	return st, nil
}

// previousNotFound is OpenAI's answer to a previous_response_id it does
// not hold: 400, code previous_response_not_found (vLLM answers 404 as
// for an id in the path).
func previousNotFound(id string) *apiError {
	return apireq.BadRequest("previous_response_not_found", "previous_response_id", "Previous response with id '%s' not found.", truncate(id, 200))
}

// notFoundResponse is vLLM's answer to an id its store does not hold
// (serving.py _make_not_found_error), and OpenAI's to an id in the path.
func notFoundResponse(id, param string) *apiError {
	return newAPIError(http.StatusNotFound, "invalid_request_error", "", param, "Response with id '%s' not found.", truncate(id, 200))
}

// startBackground stores a queued response, runs it after the request
// returns, and answers the queued object (or, streamed, its events).
func (s *Server) startBackground(x *exchange, a *responsesAnswer) int {
	ctx, cancel := context.WithCancel(s.baseCtx)
	st := &storedResponse{id: x.id, status: "queued", background: true, cancel: cancel, changed: make(chan struct{}),
		input: a.inputs(), chain: x.chainKey()}
	queued := a.object("queued", nil, nil)
	st.object, _ = json.Marshal(queued)
	s.responses.put(st)
	a.stored = st

	bx := *x
	p := *x.p
	p.stream = true // a background response keeps its events for GET ?stream=true
	bx.p, bx.ctx, bx.r = &p, ctx, x.r.WithContext(ctx)
	bx.w = &discardWriter{h: http.Header{}}
	bx.headerSent, bx.writeErr = false, nil
	a.x = &bx
	a.send = func(name string, ev map[string]any) error {
		bx.headerSent = true
		ev["sequence_number"] = a.seq
		a.seq++
		data, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		last := name == "response.completed" || name == "response.incomplete" || name == "response.failed"
		if name == "response.in_progress" {
			raw, _ := json.Marshal(ev["response"])
			s.responses.update(st, "in_progress", raw, nil)
		}
		s.responses.appendEvent(st, name, data, last)
		return nil
	}
	s.handlers.Add(1)
	go func() {
		defer s.handlers.Done()
		defer cancel()
		status, _ := bx.run(ctx)
		s.endBackground(st, a, status)
	}()
	if x.p.stream {
		return s.streamStored(x.w, x.r, st, 0)
	}
	writeJSON(x.w, http.StatusOK, queued)
	return http.StatusOK
}

// endBackground closes a background response's event log when the run
// ended without its last event (cancelled, failed before streaming).
func (s *Server) endBackground(st *storedResponse, a *responsesAnswer, status int) {
	_, done, _ := s.responses.eventsAfter(st, 1<<30)
	if done {
		return
	}
	stat, _, _, _ := s.responses.snapshot(st)
	msg := "the response was cancelled"
	if stat != "cancelled" {
		stat, msg = "failed", "the response failed (status "+strconv.Itoa(status)+")"
	}
	obj := a.object(stat, a.items, nil)
	obj["error"] = map[string]string{"code": stat, "message": msg}
	raw, _ := json.Marshal(obj)
	s.responses.update(st, stat, raw, nil)
	a.seq++
	data, _ := json.Marshal(map[string]any{"type": "response.failed", "sequence_number": a.seq - 1, "response": obj})
	s.responses.appendEvent(st, "response.failed", data, true)
}

// streamStored streams a background response's events from index from,
// following them until the last.
func (s *Server) streamStored(w http.ResponseWriter, r *http.Request, st *storedResponse, from int) int {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for i := from; ; {
		events, done, changed := s.responses.eventsAfter(st, i)
		for _, ev := range events {
			_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
			if _, err := w.Write([]byte("event: " + ev.name + "\ndata: " + string(ev.data) + "\n\n")); err != nil {
				return statusClientClosed
			}
		}
		if rc.Flush() != nil {
			return statusClientClosed
		}
		i += len(events)
		if done {
			return http.StatusOK
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return statusClientClosed
		case <-s.baseCtx.Done():
			return statusClientClosed
		}
	}
}

// storedResponseRoute is the route of /v1/responses/{rest}.
func (s *Server) storedResponseRoute(rest string) (route, bool) {
	id, action, _ := strings.Cut(rest, "/")
	if id == "" {
		return route{}, false
	}
	if px, ok := s.eng.(*proxy.Engine); ok {
		methods := map[string][]string{"": {http.MethodGet, http.MethodDelete}, "cancel": {http.MethodPost}, "input_items": {http.MethodGet}}[action]
		if methods == nil {
			return route{}, false
		}
		return route{methods, func(w http.ResponseWriter, r *http.Request) { s.relayStored(w, r, px, id, action) }}, true
	}
	switch action {
	case "":
		return route{[]string{http.MethodGet, http.MethodDelete}, func(w http.ResponseWriter, r *http.Request) { s.handleStoredResponse(w, r, id) }}, true
	case "cancel":
		return route{[]string{http.MethodPost}, func(w http.ResponseWriter, r *http.Request) { s.handleCancelResponse(w, id) }}, true
	case "input_items":
		return route{[]string{http.MethodGet}, func(w http.ResponseWriter, r *http.Request) { s.handleInputItems(w, r, id) }}, true
	}
	return route{}, false
}

// handleStoredResponse is GET (retrieve; ?stream=true&starting_after=N)
// and DELETE /v1/responses/{id}.
func (s *Server) handleStoredResponse(w http.ResponseWriter, r *http.Request, id string) {
	st, ok := s.responses.get(id)
	if !ok {
		s.metrics.requests.WithLabelValues("responses_by_id", "404").Inc()
		writeAPIError(w, notFoundResponse(id, "response_id"))
		return
	}
	if r.Method == http.MethodDelete {
		s.responses.delete(id)
		s.metrics.requests.WithLabelValues("responses_by_id", "200").Inc()
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
		return
	}
	q := r.URL.Query()
	if stream, _ := strconv.ParseBool(q.Get("stream")); stream {
		from := 0
		if v := q.Get("starting_after"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < -1 {
				writeAPIError(w, badRequest("starting_after", "starting_after must be an integer sequence number, got %q", truncate(v, 40)))
				return
			}
			from = n + 1
		}
		if !st.background {
			// vLLM keeps the events of background responses only.
			writeAPIError(w, badRequest("response_id", "Unknown response_id: %s (only a background response can be streamed by id)", truncate(id, 200)))
			return
		}
		s.metrics.requests.WithLabelValues("responses_by_id", strconv.Itoa(s.streamStored(w, r, st, from))).Inc()
		return
	}
	_, obj, _, _ := s.responses.snapshot(st)
	s.metrics.requests.WithLabelValues("responses_by_id", "200").Inc()
	writeJSON(w, http.StatusOK, json.RawMessage(obj))
}

// handleCancelResponse is POST /v1/responses/{id}/cancel.
func (s *Server) handleCancelResponse(w http.ResponseWriter, id string) {
	st, ok := s.responses.get(id)
	if !ok {
		writeAPIError(w, notFoundResponse(id, "response_id"))
		return
	}
	obj, ok := s.responses.cancelRun(st, func(status string) json.RawMessage {
		var o map[string]json.RawMessage
		_ = json.Unmarshal(st.object, &o)
		o["status"] = json.RawMessage(strconv.Quote(status))
		b, _ := json.Marshal(o)
		return b
	})
	if !ok {
		// A response that did not run in the background (vLLM's words).
		writeAPIError(w, badRequest("response_id", "Cannot cancel a synchronous response."))
		return
	}
	writeJSON(w, http.StatusOK, json.RawMessage(obj))
}

// handleInputItems is GET /v1/responses/{id}/input_items (order asc or
// desc, default desc; limit 1..100, default 20; after an item id).
func (s *Server) handleInputItems(w http.ResponseWriter, r *http.Request, id string) {
	st, ok := s.responses.get(id)
	if !ok {
		writeAPIError(w, notFoundResponse(id, "response_id"))
		return
	}
	_, _, _, items := s.responses.snapshot(st)
	writeItemPage(w, r, items)
}

// discardWriter is where a background run's HTTP answer goes: its events
// go to the store.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}
