package worker

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/test/engines/vllm"
	"github.com/tether-project/tether/test/waitfor"
	"github.com/tether-project/tether/test/workertest"
)

type sseEvent struct {
	name string
	data map[string]any
}

// namedEvents parses an SSE body into its named events.
func namedEvents(t testing.TB, body []byte) []sseEvent {
	t.Helper()
	var out []sseEvent
	for _, block := range bytes.Split(body, []byte("\n\n")) {
		var ev sseEvent
		for _, line := range strings.Split(string(bytes.TrimSpace(block)), "\n") {
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				ev.name = v
			} else if v, ok := strings.CutPrefix(line, "data: "); ok {
				if err := json.Unmarshal([]byte(v), &ev.data); err != nil {
					t.Fatalf("event data %q: %v", v, err)
				}
			}
		}
		if ev.name != "" {
			out = append(out, ev)
		}
	}
	return out
}

func eventNamesOf(evs []sseEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.name
	}
	return out
}

// A cut-off answer (max_output_tokens reached) ends its stream with
// response.incomplete, status incomplete and incomplete_details, as OpenAI
// streams it (types/responses/response_incomplete_event.py); streamed by
// id from a background run alike. A whole answer ends with
// response.completed.
func TestCutOffResponseStreamsResponseIncomplete(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	r := post(t, c, s.URL()+"/v1/responses", `{"model":"test-model","input":"write a long story","max_output_tokens":8,"stream":true}`, nil)
	evs := namedEvents(t, r.body)
	last := evs[len(evs)-1]
	resp, _ := last.data["response"].(map[string]any)
	if r.status != 200 || last.name != "response.incomplete" || last.data["type"] != "response.incomplete" || resp["status"] != "incomplete" ||
		resp["incomplete_details"].(map[string]any)["reason"] != "max_output_tokens" {
		t.Fatalf("cut-off stream ends with %s %v", last.name, last.data)
	}
	for _, ev := range evs {
		if ev.name == "response.completed" {
			t.Fatalf("a cut-off answer streamed response.completed: %v", eventNamesOf(evs))
		}
	}
	// Background, streamed by id: the same last event.
	r = post(t, c, s.URL()+"/v1/responses", `{"model":"test-model","input":"write a long story","max_output_tokens":8,"background":true}`, nil)
	id := r.json(t)["id"].(string)
	waitfor.Reason(t, 10*time.Second, "the background response to end", func() string {
		if st := do(t, c, "GET", s.URL()+"/v1/responses/"+id, "", nil).json(t)["status"]; st != "incomplete" {
			return "status " + st.(string)
		}
		return ""
	})
	evs = namedEvents(t, do(t, c, "GET", s.URL()+"/v1/responses/"+id+"?stream=true", "", nil).body)
	if last := evs[len(evs)-1]; last.name != "response.incomplete" {
		t.Fatalf("background stream: %v", eventNamesOf(evs))
	}
}

// An unknown previous_response_id is OpenAI's 400
// previous_response_not_found naming the id (vLLM answers 404).
func TestUnknownPreviousResponseIs400(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	r := post(t, testClient(t), s.URL()+"/v1/responses", `{"model":"test-model","input":"x","previous_response_id":"resp_nope"}`, nil)
	want := `{"error":{"message":"Previous response with id 'resp_nope' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`
	if r.status != 400 || strings.TrimSpace(string(r.body)) != want {
		t.Fatalf("%d %s\nwant 400 %s", r.status, r.body, want)
	}
}

// Cancelling a background response that already ended — cancelled before,
// or finished — answers the response as it is (200), as OpenAI answers a
// second cancel; a response that did not run in the background cannot be
// cancelled (400).
func TestCancelEndedBackgroundResponse(t *testing.T) {
	cfg := testConfig("w0")
	cfg.Engine.TimeScale = 1 // a long answer takes long
	s := workertest.Start(t, New, cfg)
	c := testClient(t)
	long := post(t, c, s.URL()+"/v1/responses", `{"model":"test-model","input":"a very long answer of 4000 words","background":true,"max_output_tokens":4000}`, nil).json(t)["id"].(string)
	for i := range 2 {
		r := post(t, c, s.URL()+"/v1/responses/"+long+"/cancel", "", nil)
		if r.status != 200 || r.json(t)["status"] != "cancelled" || r.json(t)["id"] != long {
			t.Fatalf("cancel %d: %d %s", i+1, r.status, r.body)
		}
	}
	cfg.Engine.TimeScale = 0
	fast := workertest.Start(t, New, cfg)
	done := post(t, c, fast.URL()+"/v1/responses", `{"model":"test-model","input":"short","background":true,"max_output_tokens":4}`, nil).json(t)["id"].(string)
	waitfor.Reason(t, 10*time.Second, "the background response to end", func() string {
		if st := do(t, c, "GET", fast.URL()+"/v1/responses/"+done, "", nil).json(t)["status"]; st == "queued" || st == "in_progress" {
			return "status " + st.(string)
		}
		return ""
	})
	r := post(t, c, fast.URL()+"/v1/responses/"+done+"/cancel", "", nil)
	if st := r.json(t)["status"]; r.status != 200 || (st != "completed" && st != "incomplete") {
		t.Fatalf("cancel of a finished background response: %d %s", r.status, r.body)
	}
	fg := post(t, c, fast.URL()+"/v1/responses", `{"model":"test-model","input":"short","max_output_tokens":4}`, nil).json(t)["id"].(string)
	if r := post(t, c, fast.URL()+"/v1/responses/"+fg+"/cancel", "", nil); r.status != 400 {
		t.Fatalf("cancel of a foreground response: %d %s", r.status, r.body)
	}
}

// The response object repeats the request's fields as sent (OpenAI's
// Response: truncation, user, safety_identifier, prompt_cache_key,
// prompt_cache_retention, service_tier, top_logprobs, max_tool_calls,
// metadata, ...), and their defaults when the request has none.
func TestResponseEchoesRequestFields(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	sent := map[string]any{"truncation": "auto", "user": "user-1234", "safety_identifier": "safety-1", "prompt_cache_key": "thread-9",
		"prompt_cache_retention": "24h", "service_tier": "flex", "top_logprobs": float64(3), "max_tool_calls": float64(2),
		"metadata": map[string]any{"k": "v"}, "max_output_tokens": float64(16), "temperature": 0.5}
	body := map[string]any{"model": "test-model", "input": "x"}
	for k, v := range sent {
		body[k] = v
	}
	for _, stream := range []bool{false, true} {
		body["stream"] = stream
		r := post(t, c, s.URL()+"/v1/responses", mustJSON(t, body), nil)
		obj := r.json
		var got map[string]any
		if stream {
			evs := namedEvents(t, r.body)
			got = evs[len(evs)-1].data["response"].(map[string]any)
			if created := evs[0].data["response"].(map[string]any); created["user"] != "user-1234" {
				t.Errorf("response.created lacks the echoed fields: %v", created)
			}
		} else {
			got = obj(t)
		}
		for k, v := range sent {
			if b1, b2 := mustJSON(t, got[k]), mustJSON(t, v); b1 != b2 {
				t.Errorf("stream %v: %s = %s, sent %s", stream, k, b1, b2)
			}
		}
	}
	got := post(t, c, s.URL()+"/v1/responses", `{"model":"test-model","input":"x"}`, nil).json(t)
	for k, want := range map[string]any{"truncation": "disabled", "user": nil, "safety_identifier": nil, "prompt_cache_key": nil, "service_tier": "default"} {
		if got[k] != want {
			t.Errorf("default %s = %v, want %v", k, got[k], want)
		}
	}
	if _, ok := got["completed_at"].(float64); !ok {
		t.Errorf("a completed response has no completed_at: %v", got["completed_at"])
	}
}

// With include ["reasoning.encrypted_content"] a reasoning item carries
// encrypted_content, and with reasoning.summary a summary (streamed as
// reasoning_summary events); a stateless client (store: false, Codex)
// handing the item back with only its summary and encrypted_content
// prompts as if it had sent the reasoning text.
func TestEncryptedReasoningRoundTrip(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	first := post(t, c, s.URL()+"/v1/responses", `{"model":"test-model","store":false,"input":"plan the trip to Paris",
		"reasoning":{"effort":"medium","summary":"auto"},"include":["reasoning.encrypted_content"],"max_output_tokens":8}`, nil).json(t)
	item := first["output"].([]any)[0].(map[string]any)
	blob, _ := item["encrypted_content"].(string)
	summary := item["summary"].([]any)
	text := item["content"].([]any)[0].(map[string]any)["text"].(string)
	if item["type"] != "reasoning" || blob == "" || len(summary) != 1 || summary[0].(map[string]any)["type"] != "summary_text" ||
		!strings.HasPrefix(text, summary[0].(map[string]any)["text"].(string)) {
		t.Fatalf("reasoning item: %v", item)
	}
	// The next call of an agent loop, stateless: the reasoning item handed
	// back with its summary and encrypted_content only, a tool call and
	// its output. (The prompt's reasoning is apireq's to check: the words
	// tokenizer does not count it.)
	call := map[string]any{"type": "function_call", "call_id": "call_1", "name": "book", "arguments": "{}"}
	output := map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "booked"}
	turn := func(reasoning map[string]any) response {
		in := []any{map[string]any{"role": "user", "content": "plan the trip to Paris"}, reasoning, call, output}
		return post(t, c, s.URL()+"/v1/responses", mustJSON(t, map[string]any{"model": "test-model", "store": false, "input": in, "max_output_tokens": 4}), nil)
	}
	if r := turn(map[string]any{"type": "reasoning", "id": item["id"], "summary": summary, "encrypted_content": blob}); r.status != 200 {
		t.Fatalf("the reasoning handed back: %d %s", r.status, r.body)
	}
	// Another provider's blob (a session begun there) is accepted; a
	// damaged one of tether's is OpenAI's invalid_encrypted_content.
	if r := turn(map[string]any{"type": "reasoning", "id": item["id"], "summary": summary, "encrypted_content": "gAAAAB-not-ours"}); r.status != 200 {
		t.Fatalf("a foreign encrypted_content: %d %s", r.status, r.body)
	}
	r := turn(map[string]any{"type": "reasoning", "id": item["id"], "summary": summary, "encrypted_content": blob[:len(blob)-3] + "!!!"})
	if r.status != 400 || !strings.Contains(string(r.body), `"code":"invalid_encrypted_content"`) {
		t.Fatalf("a damaged encrypted_content: %d %s", r.status, r.body)
	}
	// Streamed: the summary's events, in OpenAI's order.
	r = post(t, c, s.URL()+"/v1/responses", `{"model":"test-model","input":"x","stream":true,"reasoning":{"summary":"detailed"},"include":["reasoning.encrypted_content"],"max_output_tokens":4}`, nil)
	names := strings.Join(eventNamesOf(namedEvents(t, r.body)), " ")
	if !strings.Contains(names, "response.reasoning_text.done response.reasoning_summary_part.added response.reasoning_summary_text.delta response.reasoning_summary_text.done response.reasoning_summary_part.done response.output_item.done") {
		t.Fatalf("streamed summary events: %s", names)
	}
	if !strings.Contains(string(r.body), apireq.ReasoningBlob("")[:len("tether-rs1.")]) {
		t.Fatalf("streamed reasoning item without encrypted_content: %s", r.body)
	}
}

// A stored chain's follow-up prompts exactly as the same conversation sent
// whole: the first turn's role: system input item stays in the prompt
// (only instructions do not carry over).
func TestChainPromptsAsTheWholeConversation(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	sys := strings.Repeat("policy ", 300)
	first := post(t, c, s.URL()+"/v1/responses", mustJSON(t, map[string]any{"model": "test-model", "max_output_tokens": 4,
		"input": []any{map[string]any{"role": "system", "content": sys}, map[string]any{"role": "user", "content": "q one"}}}), nil).json(t)
	answer := first["output"].([]any)[0]
	chained := post(t, c, s.URL()+"/v1/responses", mustJSON(t, map[string]any{"model": "test-model", "max_output_tokens": 4,
		"previous_response_id": first["id"], "input": "q two"}), nil).json(t)
	whole := post(t, c, s.URL()+"/v1/responses", mustJSON(t, map[string]any{"model": "test-model", "max_output_tokens": 4, "store": false,
		"input": []any{map[string]any{"role": "system", "content": sys}, map[string]any{"role": "user", "content": "q one"}, answer,
			map[string]any{"role": "user", "content": "q two"}}}), nil).json(t)
	in := func(o map[string]any) float64 { return o["usage"].(map[string]any)["input_tokens"].(float64) }
	if in(chained) != in(whole) || in(chained) < 300 {
		t.Fatalf("input tokens: chained %v, whole %v", in(chained), in(whole))
	}
}

// convAPI is a worker's Conversations API for a test.
type convAPI struct {
	t    *testing.T
	c    *http.Client
	base string
}

func (a convAPI) call(method, path string, body any, wantStatus int) map[string]any {
	a.t.Helper()
	var b string
	if body != nil {
		b = mustJSON(a.t, body)
	}
	r := do(a.t, a.c, method, a.base+path, b, nil)
	if r.status != wantStatus {
		a.t.Fatalf("%s %s: %d %s, want %d", method, path, r.status, r.body, wantStatus)
	}
	return r.json(a.t)
}

// The Conversations API: create with items and metadata, read, update,
// add items, list them (order, after, limit), read and delete one, and
// a Responses request naming the conversation gets its items before its
// input and appends its input and output; unknown ids are OpenAI's 404s.
func TestConversationsAPI(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	a := convAPI{t, testClient(t), s.URL()}
	conv := a.call("POST", "/v1/conversations", map[string]any{"metadata": map[string]string{"topic": "trip"},
		"items": []any{map[string]any{"type": "message", "role": "system", "content": "You are a travel agent. " + strings.Repeat("rule ", 200)}}}, 200)
	id, _ := conv["id"].(string)
	if !strings.HasPrefix(id, "conv_") || conv["object"] != "conversation" || conv["metadata"].(map[string]any)["topic"] != "trip" || conv["created_at"] == nil {
		t.Fatalf("created: %v", conv)
	}
	if got := a.call("GET", "/v1/conversations/"+id, nil, 200); got["id"] != id {
		t.Fatalf("GET: %v", got)
	}
	if got := a.call("POST", "/v1/conversations/"+id, map[string]any{"metadata": map[string]string{"topic": "paris"}}, 200); got["metadata"].(map[string]any)["topic"] != "paris" {
		t.Fatalf("update: %v", got)
	}
	added := a.call("POST", "/v1/conversations/"+id+"/items", map[string]any{"items": []any{map[string]any{"role": "user", "content": "Where should I stay?"}}}, 200)
	data := added["data"].([]any)
	if added["object"] != "list" || len(data) != 1 || data[0].(map[string]any)["id"] == nil || data[0].(map[string]any)["status"] != "completed" {
		t.Fatalf("items added: %v", added)
	}

	// A response in the conversation: its prompt holds the items.
	r := post(t, a.c, s.URL()+"/v1/responses", mustJSON(t, map[string]any{"model": "test-model", "conversation": id, "input": "Near the Louvre?", "max_output_tokens": 4}), nil)
	resp := r.json(t)
	if r.status != 200 || resp["conversation"].(map[string]any)["id"] != id || resp["usage"].(map[string]any)["input_tokens"].(float64) < 200 {
		t.Fatalf("response in the conversation: %d %s", r.status, r.body)
	}
	// {"id": ...} names it too, streamed; the turn before is in its prompt.
	r = post(t, a.c, s.URL()+"/v1/responses", mustJSON(t, map[string]any{"model": "test-model", "conversation": map[string]string{"id": id}, "input": "Thanks", "stream": true, "max_output_tokens": 4}), nil)
	if evs := namedEvents(t, r.body); r.status != 200 || evs[len(evs)-1].data["response"].(map[string]any)["conversation"].(map[string]any)["id"] != id {
		t.Fatalf("streamed response in the conversation: %d %s", r.status, r.body)
	}
	// Items: system, user, then each turn's input and output.
	list := a.call("GET", "/v1/conversations/"+id+"/items?order=asc&limit=100", nil, 200)
	items := list["data"].([]any)
	var roles []string
	for _, it := range items {
		m := it.(map[string]any)
		roles = append(roles, m["type"].(string)+":"+func() string { s, _ := m["role"].(string); return s }())
	}
	if got := strings.Join(roles, " "); got != "message:system message:user message:user message:assistant message:user message:assistant" || list["has_more"] != false {
		t.Fatalf("items in order: %s (%v)", got, list)
	}
	// Pages: newest first by default, after an id, limit.
	page := a.call("GET", "/v1/conversations/"+id+"/items?limit=2", nil, 200)
	pd := page["data"].([]any)
	if len(pd) != 2 || page["has_more"] != true || pd[0].(map[string]any)["id"] != items[5].(map[string]any)["id"] || page["first_id"] != pd[0].(map[string]any)["id"] {
		t.Fatalf("first page: %v", page)
	}
	next := a.call("GET", "/v1/conversations/"+id+"/items?limit=2&after="+page["last_id"].(string), nil, 200)
	if nd := next["data"].([]any); len(nd) != 2 || nd[0].(map[string]any)["id"] != items[3].(map[string]any)["id"] {
		t.Fatalf("next page: %v", next)
	}
	// One item: read, delete (answers the conversation), then 404.
	itemID := items[1].(map[string]any)["id"].(string)
	if got := a.call("GET", "/v1/conversations/"+id+"/items/"+itemID, nil, 200); got["id"] != itemID {
		t.Fatalf("GET item: %v", got)
	}
	if got := a.call("DELETE", "/v1/conversations/"+id+"/items/"+itemID, nil, 200); got["object"] != "conversation" || got["id"] != id {
		t.Fatalf("DELETE item: %v", got)
	}
	if got := a.call("GET", "/v1/conversations/"+id+"/items/"+itemID, nil, 404); got["error"].(map[string]any)["message"] != "Item with id '"+itemID+"' not found." {
		t.Fatalf("deleted item: %v", got)
	}

	// Unknown conversations: OpenAI's 404, everywhere.
	want := map[string]any{"message": "Conversation with id 'conv_nope' not found.", "type": "invalid_request_error", "param": nil, "code": nil}
	for _, c := range []struct{ method, path string }{{"GET", "/v1/conversations/conv_nope"}, {"POST", "/v1/conversations/conv_nope/items"},
		{"GET", "/v1/conversations/conv_nope/items"}, {"DELETE", "/v1/conversations/conv_nope"}, {"GET", "/v1/conversations/conv_nope/items/msg_x"}} {
		var body any
		if c.method == "POST" {
			body = map[string]any{"items": []any{map[string]any{"role": "user", "content": "x"}}}
		}
		if got := a.call(c.method, c.path, body, 404); mustJSON(t, got["error"]) != mustJSON(t, want) {
			t.Errorf("%s %s: %v", c.method, c.path, got)
		}
	}
	r = post(t, a.c, s.URL()+"/v1/responses", `{"model":"test-model","conversation":"conv_nope","input":"x"}`, nil)
	if r.status != 404 || !strings.Contains(string(r.body), `"message":"Conversation with id 'conv_nope' not found."`) {
		t.Fatalf("responses with an unknown conversation: %d %s", r.status, r.body)
	}
	// Bad input: OpenAI's refusals.
	for body, param := range map[string]string{
		`{"items":"x"}`: "items", `{"metadata":"x"}`: "metadata", `{"items":[{"type":"bogus"}]}`: "items[0].type",
		`{"metadata":{"a":1}}`: "metadata.a", mustJSON(t, map[string]any{"items": make([]map[string]string, 21)}): "items",
	} {
		got := a.call("POST", "/v1/conversations", json.RawMessage(body), 400)
		if p := got["error"].(map[string]any)["param"]; p != param {
			t.Errorf("%s: param %v, want %s (%v)", body, p, param, got)
		}
	}
	if got := a.call("DELETE", "/v1/conversations/"+id, nil, 200); got["object"] != "conversation.deleted" || got["deleted"] != true || got["id"] != id {
		t.Fatalf("DELETE: %v", got)
	}
	a.call("GET", "/v1/conversations/"+id, nil, 404)
}

// The conversation store is bounded: beyond responses_store_entries the
// least recently used conversation is evicted, and counted.
func TestConversationStoreBounded(t *testing.T) {
	cfg := testConfig("w0")
	cfg.ResponsesStoreEntries = 2
	s := workertest.Start(t, New, cfg)
	a := convAPI{t, testClient(t), s.URL()}
	var ids []string
	for range 3 {
		ids = append(ids, a.call("POST", "/v1/conversations", nil, 200)["id"].(string))
	}
	a.call("GET", "/v1/conversations/"+ids[0], nil, 404)
	a.call("GET", "/v1/conversations/"+ids[2], nil, 200)
	if n := counterValue(t, s, "tether_worker_conversations_evicted_total"); n != 1 {
		t.Fatalf("tether_worker_conversations_evicted_total = %v, want 1", n)
	}
}

// counterValue reads an unlabelled counter from the server's registry.
func counterValue(t *testing.T, s *Server, name string) float64 {
	t.Helper()
	mfs, err := s.metrics.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// A proxy worker in front of vLLM (which serves no Conversations API)
// holds the conversation itself: its engine gets the conversation's items
// and the request's input as one input, the answer names the
// conversation, and the turn joins it (streamed and not).
func TestProxyWorkerHoldsConversations(t *testing.T) {
	up := vllm.Start(vllm.Options{Model: "test-model", ResponsesStore: true})
	t.Cleanup(up.Close)
	cfg := testConfig("px")
	cfg.Ranks = 1
	cfg.Engine = DefaultConfig().Engine
	cfg.Engine.Type = "proxy"
	cfg.Engine.Upstreams = []string{up.URL()}
	s := workertest.Start(t, New, cfg)
	a := convAPI{t, testClient(t), s.URL()}
	id := a.call("POST", "/v1/conversations", map[string]any{"items": []any{map[string]any{"role": "user", "content": words(120)}}}, 200)["id"].(string)
	in := func(o map[string]any) float64 { return o["usage"].(map[string]any)["input_tokens"].(float64) }
	first := a.call("POST", "/v1/responses", map[string]any{"model": "test-model", "conversation": id, "input": "go on", "max_output_tokens": 4}, 200)
	if first["conversation"].(map[string]any)["id"] != id || in(first) < 120 {
		t.Fatalf("first turn: the engine must get the conversation's items: %v", first)
	}
	r := post(t, a.c, s.URL()+"/v1/responses", mustJSON(t, map[string]any{"model": "test-model", "conversation": map[string]string{"id": id}, "input": "and then", "max_output_tokens": 4, "stream": true}), nil)
	evs := namedEvents(t, r.body)
	second := evs[len(evs)-1].data["response"].(map[string]any)
	if r.status != 200 || second["conversation"].(map[string]any)["id"] != id || in(second) <= in(first) {
		t.Fatalf("second turn (its prompt holds the first): %d %v", r.status, second)
	}
	items := a.call("GET", "/v1/conversations/"+id+"/items?order=asc", nil, 200)["data"].([]any)
	if len(items) != 5 || items[1].(map[string]any)["role"] != "user" || items[2].(map[string]any)["role"] != "assistant" {
		t.Fatalf("conversation items: %v", items)
	}
	a.call("POST", "/v1/responses", map[string]any{"model": "test-model", "conversation": "conv_nope", "input": "x"}, 404)
}

func words(n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = "w" + strconv.Itoa(i)
	}
	return strings.Join(w, " ")
}
