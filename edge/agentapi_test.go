package edge

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/respid"
	"github.com/tether-project/tether/test/engines/vllm"
)

// postRaw sends body and reads the answer to its end, returning the read
// error (an aborted stream's unexpected EOF) instead of failing.
func postRaw(t *testing.T, c *http.Client, u string, body any, h map[string]string) (int, []byte, error) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, u, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	return resp.StatusCode, got, err
}

// A generation worker that dies mid-stream must not look like a model that
// stopped: the client reads an error event in the API's own streaming
// shape, then the connection ends without a clean chunked end; the edge
// counts it. For chat, Messages and Responses.
func TestStreamCutEndsWithErrorEventAndAbort(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	gen := s.gen[0]
	sys := longText("cut", 80)
	cases := []struct {
		path, endpoint string
		body           map[string]any
		wantEvent      string // in the body, after the partial stream
		notAfter       string // a clean end the client must not read
	}{
		{"/v1/chat/completions", "chat", map[string]any{"model": testModel, "stream": true, "max_tokens": 40,
			"messages": []any{map[string]any{"role": "system", "content": sys}, map[string]any{"role": "user", "content": "go"}}},
			`data: {"error":{"message":"generation instance gen-0 did not finish the response`, "data: [DONE]"},
		{"/v1/messages", "messages", map[string]any{"model": testModel, "stream": true, "max_tokens": 40, "system": sys,
			"messages": []any{map[string]any{"role": "user", "content": "go"}}},
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"generation instance gen-0 did not finish", "event: message_stop"},
		{"/v1/responses", "responses", map[string]any{"model": testModel, "stream": true, "max_output_tokens": 40, "instructions": sys, "input": "go"},
			"event: response.failed\ndata: {", "event: response.completed"},
	}
	for _, c := range cases {
		gen.cutStream.Store(4)
		status, body, err := postRaw(t, s.c, s.te.url()+c.path, c.body, nil)
		if status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", c.path, status, body)
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: reading the stream ended with %v, want an aborted connection (unexpected EOF)\n%s", c.path, err, body)
		}
		if !strings.Contains(string(body), c.wantEvent) {
			t.Errorf("%s: no error event %q in\n%s", c.path, c.wantEvent, body)
		}
		if strings.Contains(string(body), c.notAfter) {
			t.Errorf("%s: the stream ended cleanly (%q)", c.path, c.notAfter)
		}
		if c.path == "/v1/responses" && !strings.Contains(string(body), `"status":"failed"`) {
			t.Errorf("responses: response.failed without status failed:\n%s", body)
		}
		if n := counter(t, s.te.registry, "tether_edge_streams_aborted_total", map[string]string{"endpoint": c.endpoint, "fleet": "generation"}); n != 1 {
			t.Errorf("%s: tether_edge_streams_aborted_total = %v, want 1", c.endpoint, n)
		}
	}
	// An uncut stream ends cleanly.
	status, body, err := postRaw(t, s.c, s.te.url()+"/v1/messages", cases[1].body, nil)
	if status != 200 || err != nil || !strings.Contains(string(body), "event: message_stop") {
		t.Fatalf("uncut stream: %d %v\n%s", status, err, body)
	}
}

// Sampling parameters of the wrong type are refused at the edge in the
// endpoint's error shape, before any routing.
func TestSamplingParameterTypesRefused(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	status, body, _ := postRaw(t, s.c, s.te.url()+"/v1/chat/completions", map[string]any{"model": testModel, "temperature": "hot",
		"messages": []any{map[string]any{"role": "user", "content": "x"}}}, nil)
	if status != 400 || !strings.Contains(string(body), `"param":"temperature"`) || !strings.Contains(string(body), "want a number") {
		t.Fatalf("chat: %d %s", status, body)
	}
	status, body, _ = postRaw(t, s.c, s.te.url()+"/v1/messages", map[string]any{"model": testModel, "max_tokens": 4, "top_k": "5",
		"messages": []any{map[string]any{"role": "user", "content": "x"}}}, nil)
	if status != 400 || !strings.HasPrefix(string(body), `{"type":"error","error":{"type":"invalid_request_error","message":"invalid type for \"top_k\"`) {
		t.Fatalf("messages: %d %s", status, body)
	}
	for _, w := range append(s.ctx, s.gen...) {
		if n := len(w.requests()); n != 0 {
			t.Fatalf("%s saw %d requests: refused bodies must not be routed", w.id, n)
		}
	}
}

// Ids the cluster did not mint, forged ones, expired ones and ids naming
// an instance the fleet does not have are answered in OpenAI's shape, from
// the edge, without reaching a worker: 404 by id, 400
// previous_response_not_found as previous_response_id.
func TestStoredResponseIDsNotFound(t *testing.T) {
	s := startStatic(t, 1, 1, func(c *Config) { c.StoredResponseRetention, c.Telemetry.StartupGrace = time.Hour, time.Millisecond })
	e := s.te.e
	now := e.now()
	mint := func(c *respid.Codec, inst string, at time.Time) string {
		return c.Mint(respid.ID{Fleet: 2, Instance: inst, Rank: -1, Upstream: "resp_x", Edge: "edge-x", Minted: at})
	}
	cases := map[string]string{
		"resp_0123456789abcdef": "not a response id issued by this tether cluster",
		mint(respid.NewCodec([]byte("another-key")), "gen-0", now): "does not authenticate",
		mint(e.respIDs, "gen-0", now.Add(-2*time.Hour)):            "beyond stored_response_retention",
		mint(e.respIDs, "gen-9", now):                              "instance gen-9 that stored it is not in this fleet",
	}
	for id, want := range cases {
		r := do(t, s.c, http.MethodGet, s.te.url()+"/v1/responses/"+id, nil, nil)
		if r.status != 404 || !strings.Contains(string(r.body), want) || !strings.Contains(string(r.body), `"param":"response_id"`) {
			t.Errorf("GET %s: %d %s, want 404 with %q", id, r.status, r.body, want)
		}
		if !strings.Contains(string(r.body), `"message":"Response with id '`+id+`' not found. `) {
			t.Errorf("GET %s: %s, want OpenAI's sentence first", id, r.body)
		}
		// OpenAI answers an unknown previous_response_id 400 (a by-id
		// path 404).
		status, body, _ := postRaw(t, s.c, s.te.url()+"/v1/responses", map[string]any{"model": testModel, "input": "x", "previous_response_id": id}, nil)
		if status != 400 || !strings.Contains(string(body), `"code":"previous_response_not_found"`) || !strings.Contains(string(body), `"param":"previous_response_id"`) ||
			!strings.Contains(string(body), `"message":"Previous response with id '`+id+`' not found. `) || !strings.Contains(string(body), want) {
			t.Errorf("previous_response_id %s: %d %s", id, status, body)
		}
	}
	for _, w := range append(s.ctx, s.gen...) {
		if n := len(w.requests()); n != 0 {
			t.Fatalf("%s saw %d requests", w.id, n)
		}
	}
}

// A trtllm-serve fleet (disaggregated) has no Messages or Responses
// endpoint: 501 naming the engine, never a translation.
func TestTRTLLMFleetAnswers501ForAgentAPIs(t *testing.T) {
	s := startStatic(t, 1, 1, func(c *Config) {
		c.ContextServers.Engine, c.GenerationServers.Engine = EngineTRTLLM, EngineTRTLLM
	})
	for path, body := range map[string]map[string]any{
		"/v1/messages":  {"model": testModel, "max_tokens": 4, "messages": []any{map[string]any{"role": "user", "content": "x"}}},
		"/v1/responses": {"model": testModel, "input": "x"},
	} {
		status, b, _ := postRaw(t, s.c, s.te.url()+path, body, nil)
		if status != http.StatusNotImplemented || !strings.Contains(string(b), "trtllm-serve in disaggregated mode") {
			t.Errorf("%s: %d %s", path, status, b)
		}
	}
}

// In front of vLLM: the Messages and Responses APIs pass through to the
// engine, a stored response is continued and retrieved through any edge
// on the instance and rank that made it, and the engine's answers carry
// the ids the edge minted.
func TestEngineAgentAPIsThroughAnyEdge(t *testing.T) {
	s := startEnginesWith(t, EngineVLLM, 2, 2, 2, vllm.Options{ResponsesStore: true})
	url := func(i int) string { return s.ec.edge(i).url() }
	// Messages: sticky by Claude Code's session header, shaped as vLLM's.
	msg := map[string]any{"model": testModel, "max_tokens": 4, "system": longText("cc", 40),
		"messages": []any{map[string]any{"role": "user", "content": "msg-turn-1"}}}
	h := map[string]string{"x-claude-code-session-id": "cc-sess", "anthropic-version": "2023-06-01"}
	status, body, _ := postRaw(t, s.c, url(0)+"/v1/messages", msg, h)
	if status != 200 || !strings.Contains(string(body), `"type":"message"`) {
		t.Fatalf("messages: %d %s", status, body)
	}
	inst1, rank1 := s.whereServed(t, "msg-turn-1")
	// Edges without NATS hear no placement of another edge: the next turn
	// through edge 2 follows the binding (and its rank) once edge 2 has
	// applied them.
	waitFor(t, "the session's binding and rank on edge 2", 20*time.Second, func() bool {
		b, ok := binding(t, s.c, s.ec.edge(1), fsm.FleetContext, "cc-sess")
		return ok && b.Instance == inst1 && b.Rank != nil && int(*b.Rank) == rank1
	})
	msg["messages"] = []any{map[string]any{"role": "user", "content": "msg-turn-1"}, map[string]any{"role": "assistant", "content": "ok"},
		map[string]any{"role": "user", "content": "msg-turn-2"}}
	msg["stream"] = true
	status, body, _ = postRaw(t, s.c, url(1)+"/v1/messages", msg, h)
	if status != 200 || !strings.Contains(string(body), "event: message_stop") {
		t.Fatalf("messages stream: %d %s", status, body)
	}
	if inst, rank := s.whereServed(t, "msg-turn-2"); inst != inst1 || rank != rank1 {
		t.Fatalf("turn 2 on %s/%d, turn 1 on %s/%d", inst, rank, inst1, rank1)
	}

	// Responses: no conversation at all, chained by previous_response_id.
	status, body, _ = postRaw(t, s.c, url(0)+"/v1/responses", map[string]any{"model": testModel, "input": "resp-turn-1 " + longText("r", 30)}, nil)
	var first struct{ ID string }
	if status != 200 || json.Unmarshal(body, &first) != nil || !respid.Minted(first.ID) {
		t.Fatalf("responses: %d %s", status, body)
	}
	instR, rankR := s.whereServed(t, "resp-turn-1 "+longText("r", 30))
	for turn := 2; turn <= 4; turn++ {
		in := "resp-turn-" + strconv.Itoa(turn)
		status, body, _ = postRaw(t, s.c, url(turn%2)+"/v1/responses", map[string]any{"model": testModel, "input": in, "previous_response_id": first.ID, "stream": turn == 3}, nil)
		if status != 200 {
			t.Fatalf("turn %d: %d %s", turn, status, body)
		}
		if inst, rank := s.whereServed(t, in); inst != instR || rank != rankR {
			t.Fatalf("turn %d on %s/%d, the stored response on %s/%d", turn, inst, rank, instR, rankR)
		}
		if !strings.Contains(string(body), `"previous_response_id":"`+first.ID+`"`) {
			t.Fatalf("turn %d does not echo the client's previous_response_id: %s", turn, body)
		}
	}
	for i := range 2 {
		r := do(t, s.c, http.MethodGet, url(i)+"/v1/responses/"+first.ID, nil, nil)
		if r.status != 200 || !strings.Contains(string(r.body), `"id":"`+first.ID+`"`) {
			t.Fatalf("GET through edge-%d: %d %s", i+1, r.status, r.body)
		}
	}
	// A previous_response_id the engine no longer holds: vLLM's 404
	// becomes OpenAI's 400 previous_response_not_found, naming the id the
	// client sent.
	gone := s.ec.edge(0).e.respIDs.Mint(respid.ID{Fleet: uint8(fsm.FleetContext), Instance: instR, Rank: rankR, Upstream: "resp_gone0123",
		Edge: "edge-x", Minted: s.ec.edge(0).e.now()})
	status, body, _ = postRaw(t, s.c, url(1)+"/v1/responses", map[string]any{"model": testModel, "input": "x", "previous_response_id": gone}, nil)
	if status != 400 || !strings.Contains(string(body), `"code":"previous_response_not_found"`) || !strings.Contains(string(body), gone) || strings.Contains(string(body), "resp_gone0123") {
		t.Fatalf("a response the engine lost: %d %s", status, body)
	}
	// The engine's own 404 names the id the client sent.
	r := do(t, s.c, http.MethodPost, url(1)+"/v1/responses/"+first.ID+"/cancel", nil, nil)
	if r.status != 400 || !strings.Contains(string(r.body), "Cannot cancel a synchronous response") {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
}

// An id naming an instance this edge has not heard yet, while it may
// still hear it (its startup gate is open), is a 503 to retry, not a 404:
// the response may well exist.
func TestStoredResponseOnUnheardInstanceIsRetried(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	id := s.te.e.respIDs.Mint(respid.ID{Fleet: 2, Instance: "gen-7", Rank: -1, Upstream: "resp_x", Edge: "edge-x", Minted: s.te.e.now()})
	r := do(t, s.c, http.MethodGet, s.te.url()+"/v1/responses/"+id, nil, nil)
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || !strings.Contains(string(r.body), `"code":"instance_not_heard"`) {
		t.Fatalf("GET: %d %v %s", r.status, r.header, r.body)
	}
}
