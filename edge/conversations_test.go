package edge

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/respid"
	"github.com/tether-project/tether/test/engines/vllm"
)

// The Conversations API through an edge in front of tether workers: a new
// conversation is held by a generation worker under an id the edge mints
// (conv_t1…, naming that instance); every request naming it — by path, or
// as the conversation of a Responses request — goes there with the
// worker's own id, and the answers carry the client's id only. Ids the
// cluster did not mint are OpenAI's 404 from the edge.
func TestConversationsThroughTheEdge(t *testing.T) {
	s := startStatic(t, 1, 2, nil)
	base := s.te.url()
	call := func(method, path string, body any, want int) map[string]any {
		t.Helper()
		var b []byte
		if body != nil {
			b, _ = json.Marshal(body)
		}
		r := do(t, s.c, method, base+path, b, nil)
		var out map[string]any
		if r.status != want || json.Unmarshal(r.body, &out) != nil {
			t.Fatalf("%s %s: %d %s, want %d", method, path, r.status, r.body, want)
		}
		return out
	}
	conv := call("POST", "/v1/conversations", map[string]any{"metadata": map[string]string{"k": "v"},
		"items": []any{map[string]any{"role": "system", "content": longText("sys", 80)}}}, 200)
	id, _ := conv["id"].(string)
	ref, err := s.te.e.respIDs.ParseConversation(id)
	if err != nil || !strings.HasPrefix(id, "conv_") || fsm.Fleet(ref.Fleet) != fsm.FleetGeneration || conv["object"] != "conversation" {
		t.Fatalf("created %v (%+v, %v)", conv, ref, err)
	}
	holder := s.worker(ref.Instance)
	if got := call("GET", "/v1/conversations/"+id, nil, 200); got["id"] != id {
		t.Fatalf("GET %v", got)
	}
	// A Responses request in the conversation: on the holder, whole, with
	// the worker's id in its body; the answer names the client's id.
	before := len(holder.requests())
	r := do(t, s.c, "POST", base+"/v1/responses", mustJSON(map[string]any{"model": testModel, "conversation": map[string]string{"id": id}, "input": "hello", "max_output_tokens": 4}), nil)
	var resp map[string]any
	if r.status != 200 || json.Unmarshal(r.body, &resp) != nil || resp["conversation"].(map[string]any)["id"] != id || strings.Contains(string(r.body), ref.Upstream) {
		t.Fatalf("response in the conversation: %d %s", r.status, r.body)
	}
	seen := holder.requests()
	if len(seen) != before+1 || seen[len(seen)-1].path != "/v1/responses" || seen[len(seen)-1].body["conversation"] != ref.Upstream {
		t.Fatalf("the holder saw %d requests, the last %+v", len(seen)-before, seen[len(seen)-1])
	}
	if u := resp["usage"].(map[string]any)["input_tokens"].(float64); u < 80 {
		t.Fatalf("the conversation's items are not in the prompt: %v input tokens", u)
	}
	// Read back by id, the response names the client's conversation id.
	if got := call("GET", "/v1/responses/"+resp["id"].(string), nil, 200); got["conversation"].(map[string]any)["id"] != id {
		t.Fatalf("GET the response: %v", got)
	}
	items := call("GET", "/v1/conversations/"+id+"/items?order=asc", nil, 200)
	if data := items["data"].([]any); len(data) != 3 {
		t.Fatalf("items %v", items)
	}
	// Deleted: every answer naming it names the client's id.
	if got := call("DELETE", "/v1/conversations/"+id, nil, 200); got["id"] != id || got["deleted"] != true {
		t.Fatalf("DELETE %v", got)
	}
	for _, c := range []struct{ method, path string }{{"GET", "/v1/conversations/" + id}, {"GET", "/v1/conversations/" + id + "/items"}} {
		got := call(c.method, c.path, nil, 404)
		if msg := got["error"].(map[string]any)["message"]; msg != "Conversation with id '"+id+"' not found." {
			t.Errorf("%s %s: %v", c.method, c.path, got)
		}
	}
	r = do(t, s.c, "POST", base+"/v1/responses", mustJSON(map[string]any{"model": testModel, "conversation": id, "input": "x", "stream": true}), nil)
	if r.status != 404 || !strings.Contains(string(r.body), "Conversation with id '"+id+"' not found.") || strings.Contains(string(r.body), ref.Upstream) {
		t.Fatalf("responses in a deleted conversation: %d %s", r.status, r.body)
	}
	// Ids the cluster did not mint: OpenAI's 404 (param and code null),
	// from the edge.
	forged := respid.NewCodec([]byte("another-key")).MintConversation(respid.ID{Fleet: 2, Instance: holder.id, Rank: -1, Upstream: "conv_x", Edge: "e", Minted: time.Now()})
	for bad, why := range map[string]string{"conv_68b1c0ffee": "not a conversation id issued by this tether cluster", forged: "does not authenticate",
		s.te.e.respIDs.Mint(respid.ID{Fleet: 2, Instance: holder.id, Rank: -1, Upstream: "resp_x", Edge: "e", Minted: time.Now()}): "not a conversation id"} {
		got := call("GET", "/v1/conversations/"+bad, nil, 404)
		e := got["error"].(map[string]any)
		if e["param"] != nil || e["code"] != nil || !strings.HasPrefix(e["message"].(string), "Conversation with id '"+bad+"' not found. ") || !strings.Contains(e["message"].(string), why) {
			t.Errorf("GET %s: %v", bad, got)
		}
		r := do(t, s.c, "POST", base+"/v1/responses", mustJSON(map[string]any{"model": testModel, "conversation": bad, "input": "x"}), nil)
		if r.status != 404 || !strings.Contains(string(r.body), "Conversation with id '"+bad+"' not found.") {
			t.Errorf("responses with conversation %s: %d %s", bad, r.status, r.body)
		}
	}
	if r := do(t, s.c, "PATCH", base+"/v1/conversations/"+id, nil, nil); r.status != 405 {
		t.Fatalf("PATCH: %d %s", r.status, r.body)
	}
}

// Fleets of engines the edge relays to directly serve no Conversations
// API: 501 naming the way (a proxy worker in front of them).
func TestConversationsOnEngineFleetsAre501(t *testing.T) {
	s := startEnginesWith(t, EngineVLLM, 1, 1, 1, vllm.Options{ResponsesStore: true})
	r := do(t, s.c, "POST", s.ec.edge(0).url()+"/v1/conversations", []byte(`{}`), nil)
	if r.status != http.StatusNotImplemented || !strings.Contains(string(r.body), "engine.type: proxy") {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

// A stored response the worker no longer holds (deleted): the worker's
// answer to the continuation names the id the client sent, never the
// worker's own, streamed or not.
func TestContinuationErrorsNameTheClientsID(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	base := s.te.url()
	r := do(t, s.c, "POST", base+"/v1/responses", mustJSON(map[string]any{"model": testModel, "input": "x", "max_output_tokens": 4}), nil)
	var first struct{ ID string }
	if r.status != 200 || json.Unmarshal(r.body, &first) != nil {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	inner, _ := respid.Decode(first.ID)
	if r := do(t, s.c, "DELETE", base+"/v1/responses/"+first.ID, nil, nil); r.status != 200 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	for _, stream := range []bool{false, true} {
		r := do(t, s.c, "POST", base+"/v1/responses", mustJSON(map[string]any{"model": testModel, "input": "y", "previous_response_id": first.ID, "stream": stream}), nil)
		if r.status != 400 || !strings.Contains(string(r.body), `"code":"previous_response_not_found"`) || !strings.Contains(string(r.body), first.ID) || strings.Contains(string(r.body), inner.Upstream) {
			t.Fatalf("stream %v: %d %s (the worker's id is %s)", stream, r.status, r.body, inner.Upstream)
		}
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// While the worker holding a stored response and a conversation cannot be
// reached, every request naming either is answered 503 with Retry-After in
// OpenAI's shape, naming the id the client sent: never the worker's URL
// or its own id for the object (a continuation and a turn of the
// conversation were 502 naming the worker's URL, the Conversations paths
// named the worker's conversation id).
func TestUnreachableHolderAnswersNameTheClientsID(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	base := s.te.url()
	r := do(t, s.c, "POST", base+"/v1/responses", mustJSON(map[string]any{"model": testModel, "input": "x", "max_output_tokens": 4}), nil)
	var first struct{ ID string }
	if r.status != 200 || json.Unmarshal(r.body, &first) != nil {
		t.Fatalf("a stored response: %d %s", r.status, r.body)
	}
	r = do(t, s.c, "POST", base+"/v1/conversations", []byte(`{}`), nil)
	var conv struct{ ID string }
	if r.status != 200 || json.Unmarshal(r.body, &conv) != nil {
		t.Fatalf("a conversation: %d %s", r.status, r.body)
	}
	respRef, _ := respid.Decode(first.ID)
	convRef, _ := respid.DecodeConversation(conv.ID)
	holder := s.worker(respRef.Instance)
	if holder == nil || convRef.Instance != holder.id {
		t.Fatalf("holders %s and %s: want the one generation worker", respRef.Instance, convRef.Instance)
	}
	holder.proxy.Close()
	for _, c := range []struct {
		name, method, path string
		body               any
		id, inner          string
	}{
		{"a continuation", "POST", "/v1/responses", map[string]any{"model": testModel, "input": "y", "previous_response_id": first.ID}, first.ID, respRef.Upstream},
		{"a streamed continuation", "POST", "/v1/responses", map[string]any{"model": testModel, "input": "y", "previous_response_id": first.ID, "stream": true}, first.ID, respRef.Upstream},
		{"GET the response", "GET", "/v1/responses/" + first.ID, nil, first.ID, respRef.Upstream},
		{"a turn of the conversation", "POST", "/v1/responses", map[string]any{"model": testModel, "input": "y", "conversation": conv.ID}, conv.ID, convRef.Upstream},
		{"GET the conversation", "GET", "/v1/conversations/" + conv.ID, nil, conv.ID, convRef.Upstream},
		{"GET its items", "GET", "/v1/conversations/" + conv.ID + "/items", nil, conv.ID, convRef.Upstream},
	} {
		var b []byte
		if c.body != nil {
			b = mustJSON(c.body)
		}
		r := do(t, s.c, c.method, base+c.path, b, nil)
		var e struct {
			Error *struct {
				Message, Type string
				Code          *string
			} `json:"error"`
		}
		switch {
		case r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "":
			t.Errorf("%s: %d (Retry-After %q) %s, want 503 with Retry-After", c.name, r.status, r.header.Get("Retry-After"), r.body)
		case json.Unmarshal(r.body, &e) != nil || e.Error == nil || e.Error.Type != "server_error":
			t.Errorf("%s: not OpenAI's error shape: %s", c.name, r.body)
		case !strings.Contains(e.Error.Message, c.id):
			t.Errorf("%s: the message does not name %s: %s", c.name, c.id, e.Error.Message)
		case strings.Contains(string(r.body), c.inner) || strings.Contains(string(r.body), strings.TrimPrefix(holder.proxy.URL, "http://")):
			t.Errorf("%s: the answer names the worker's own id %s or its address %s: %s", c.name, c.inner, holder.proxy.URL, r.body)
		}
	}
}
