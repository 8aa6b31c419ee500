package edge

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/test/engines/oaiserve"
)

// agentBody is a Messages or Responses request whose last user turn is
// msg, behind a long shared system prompt.
func agentBody(t *testing.T, path, msg string, stream bool, extra map[string]any) []byte {
	t.Helper()
	sys := longText("agent-sys", 60)
	m := map[string]any{"model": testModel, "stream": stream}
	if path == "/v1/messages" {
		m["max_tokens"], m["system"] = 4, sys
		m["messages"] = []any{map[string]any{"role": "user", "content": msg}}
	} else {
		m["max_output_tokens"], m["instructions"], m["input"] = 4, sys, msg
	}
	for k, v := range extra {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// agentResult is what an agent-API answer says: its cached tokens (-1:
// none reported) and, for Responses, the response's id.
type agentResult struct {
	cached int
	id     string
}

// agentAnswer checks an answer is a whole one in its API (a message, or a
// response; streamed, ending with message_stop or the response's last
// event, with no error event) and reads it.
func agentAnswer(t *testing.T, path string, stream bool, r response) agentResult {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("%s: %d %s", path, r.status, r.body)
	}
	res := agentResult{cached: -1}
	read := func(obj map[string]any) {
		if id, ok := obj["id"].(string); ok && obj["object"] == "response" {
			res.id = id
		}
		u, _ := obj["usage"].(map[string]any)
		if d, ok := u["input_tokens_details"].(map[string]any); ok {
			if c, ok := d["cached_tokens"].(float64); ok {
				res.cached = int(c)
			}
		}
	}
	if !stream {
		obj := r.json(t)
		if obj["type"] != "message" && obj["object"] != "response" {
			t.Fatalf("%s: not an answer of the API: %s", path, r.body)
		}
		if _, leaked := obj["kv_transfer_params"].(map[string]any); leaked {
			t.Fatalf("%s: the handoff leaked to the client: %s", path, r.body)
		}
		read(obj)
		return res
	}
	last := ""
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("%s event %q: %v", path, data, err)
		}
		last, _ = ev["type"].(string)
		if last == "error" || last == "response.failed" {
			t.Fatalf("%s: error event relayed: %s", path, data)
		}
		if resp, ok := ev["response"].(map[string]any); ok {
			read(resp)
		}
	}
	if last != "message_stop" && last != "response.completed" && last != "response.incomplete" {
		t.Fatalf("%s: stream ended with %q: %s", path, last, r.body)
	}
	return res
}

// Three edges in front of a vLLM split serve the Messages and Responses
// APIs split, streamed and not, from every edge: the prefill server gets
// the request in its API for one token with the handoff, the decode server
// reads its KV and answers in the API, the client sees the prefill's
// cached tokens and no handoff. A response the decode server stored is
// continued (previous_response_id) and read back (GET) from other edges on
// that server, whole. count_tokens is counted on a prefill server; bad
// input is answered in the path's own error shape.
func TestPDAgentAPIsThroughVLLMSplit(t *testing.T) {
	s := startPD(t, EngineVLLM, pdOptions{dp: 2, responsesStore: true})
	stored := map[string]string{} // a response id → the decode server that made it
	n := 0
	for _, path := range []string{"/v1/messages", "/v1/responses"} {
		for _, stream := range []bool{false, true} {
			msg := fmt.Sprintf("%s stream=%v", path, stream)
			i := n % 3
			n++
			r := do(t, s.c, http.MethodPost, s.ec.edge(i).url()+path, agentBody(t, path, msg, stream, nil),
				map[string]string{"x-session-id": "agent-" + msg})
			res := agentAnswer(t, path, stream, r)
			_, pre := served(t, s.prefill, msg, oaiserve.HandoffPrefill)
			dec, sv := served(t, s.decode, msg, oaiserve.HandoffDecode)
			if pre.Stream || sv.KVMismatch || sv.Stream != stream || sv.Computed != 1 {
				t.Fatalf("%s: prefill %+v, decode %+v", msg, pre, sv)
			}
			if path == "/v1/responses" && res.cached != pre.CachedTokens {
				t.Fatalf("%s: %d cached tokens answered, the prefill had %d", msg, res.cached, pre.CachedTokens)
			}
			if res.id != "" {
				stored[res.id] = dec
			}
			awaitPlacementsApplied(t, s.ec, i)
		}
	}
	if len(stored) != 2 {
		t.Fatalf("response ids %v", stored)
	}
	for id, dec := range stored {
		msg := "continues " + id
		body := agentBody(t, "/v1/responses", msg, false, map[string]any{"previous_response_id": id, "instructions": nil})
		res := agentAnswer(t, "/v1/responses", false, do(t, s.c, http.MethodPost, s.ec.edge(2).url()+"/v1/responses", body, nil))
		if res.id == "" || res.id == id {
			t.Fatalf("%s: answered id %q", msg, res.id)
		}
		if got, sv := served(t, s.decode, msg, ""); got != dec || sv.Computed != sv.PromptTokens {
			t.Fatalf("%s: served by %s (%+v), want %s whole", msg, got, sv, dec)
		}
		for name, srv := range s.prefill {
			for _, sv := range srv.Served() {
				if sv.LastUser == msg {
					t.Fatalf("%s: prefill server %s served it", msg, name)
				}
			}
		}
		if r := do(t, s.c, http.MethodGet, s.ec.edge(1).url()+"/v1/responses/"+id, nil, nil); r.status != http.StatusOK || r.json(t)["id"] != id {
			t.Fatalf("GET %s: %d %s", id, r.status, r.body)
		}
	}
	count := do(t, s.c, http.MethodPost, s.ec.edge(0).url()+"/v1/messages/count_tokens",
		[]byte(`{"model":"test-model","messages":[{"role":"user","content":"count these words"}]}`), nil)
	if count.status != http.StatusOK || count.json(t)["input_tokens"] == nil {
		t.Fatalf("count_tokens: %d %s", count.status, count.body)
	}
	if r := do(t, s.c, http.MethodPost, s.ec.edge(0).url()+"/v1/conversations", []byte(`{}`), nil); r.status != http.StatusNotImplemented {
		t.Fatalf("a conversation on a split (vLLM serves no Conversations API): %d %s", r.status, r.body)
	}
	for _, c := range []struct{ path, body, shape string }{
		{"/v1/messages", `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`, `"type":"error"`},
		{"/v1/responses", `{"model":"test-model","input":5}`, `"error":{`},
	} {
		r := do(t, s.c, http.MethodPost, s.ec.edge(1).url()+c.path, []byte(c.body), nil)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), c.shape) {
			t.Fatalf("%s %s: %d %s", c.path, c.body, r.status, r.body)
		}
	}
}

// A vLLM release whose Messages and Responses APIs predate
// kv_transfer_params answers a prefill with no handoff: the decode server
// computes the request whole, and the client gets its answer.
func TestPDAgentAPIsVLLMWithoutTheirHandoff(t *testing.T) {
	legacy := func(string) oaiserve.PDOptions { return oaiserve.PDOptions{AgentAPIsIgnoreKVTransfer: true} }
	s := startPD(t, EngineVLLM, pdOptions{dp: 1, prefill: legacy, decode: legacy})
	for i, path := range []string{"/v1/messages", "/v1/responses"} {
		msg := "legacy " + path
		r := do(t, s.c, http.MethodPost, s.ec.edge(i).url()+path, agentBody(t, path, msg, i == 1, nil), nil)
		agentAnswer(t, path, i == 1, r)
		served(t, s.prefill, msg, "")
		if _, sv := served(t, s.decode, msg, ""); sv.Computed != sv.PromptTokens || sv.Transferred != 0 {
			t.Fatalf("%s: decode %+v", msg, sv)
		}
	}
}

// An SGLang split cannot take either agent API (SGLang's request models
// carry no bootstrap fields): both are answered 501 in their own error
// shapes, naming why, and reach no server; count_tokens needs no handoff
// and is served.
func TestPDAgentAPIsSGLangSplit(t *testing.T) {
	s := startPD(t, EngineSGLang, pdOptions{dp: 1})
	for _, c := range []struct{ path, shape string }{{"/v1/messages", `"type":"error"`}, {"/v1/responses", `"error":{`}} {
		r := do(t, s.c, http.MethodPost, s.ec.edge(0).url()+c.path, agentBody(t, c.path, "sglang", false, nil), nil)
		if r.status != http.StatusNotImplemented || !strings.Contains(string(r.body), "bootstrap") || !strings.Contains(string(r.body), c.shape) {
			t.Fatalf("%s through an SGLang split: %d %s", c.path, r.status, r.body)
		}
	}
	for name, srv := range s.prefill {
		if n := len(srv.Served()); n != 0 {
			t.Fatalf("prefill server %s served %d requests", name, n)
		}
	}
	count := do(t, s.c, http.MethodPost, s.ec.edge(1).url()+"/v1/messages/count_tokens",
		[]byte(`{"model":"test-model","messages":[{"role":"user","content":"count these words"}]}`), nil)
	if count.status != http.StatusOK {
		t.Fatalf("count_tokens: %d %s", count.status, count.body)
	}
}

// A Messages or Responses stream whose handoff the decode server cannot
// read (the prefill server died between the hops) fails before any output
// (vLLM streams its error event after message_start or response.created):
// the edge prefills again on the other server and the client gets one
// whole stream.
func TestPDAgentAPIsPrefillKilledBetweenHops(t *testing.T) {
	for _, path := range []string{"/v1/messages", "/v1/responses"} {
		t.Run(strings.TrimPrefix(path, "/v1/"), func(t *testing.T) {
			var s *pdSetup
			var armed atomic.Bool
			conv := "killed-prefill" + strings.ReplaceAll(path, "/", "-")
			victim := ""
			s = startPD(t, EngineVLLM, pdOptions{dp: 1, decode: func(string) oaiserve.PDOptions {
				return oaiserve.PDOptions{BeforeHandoff: func() {
					if armed.CompareAndSwap(true, false) {
						b, _ := s.ec.edge(0).e.node.State().Lookup(fsm.FleetContext, conv)
						victim = b.Instance
						s.prefill[victim].Kill()
					}
				}}
			}})
			h := map[string]string{"x-session-id": conv}
			agentAnswer(t, path, false, do(t, s.c, http.MethodPost, s.ec.edge(0).url()+path, agentBody(t, path, conv+" turn 1", false, nil), h))
			waitFor(t, "the prefill binding on edge-1", 30*time.Second, func() bool {
				_, ok := s.ec.edge(0).e.node.State().Lookup(fsm.FleetContext, conv)
				return ok
			})
			awaitPlacementsApplied(t, s.ec, 0) // edge-2 routes turn 2 by the same binding
			armed.Store(true)
			msg := conv + " turn 2"
			agentAnswer(t, path, true, do(t, s.c, http.MethodPost, s.ec.edge(1).url()+path, agentBody(t, path, msg, true, nil), h))
			if victim == "" {
				t.Fatal("the decode server never got the handoff")
			}
			served(t, s.decode, msg, oaiserve.HandoffDecodeFailed)
			served(t, s.decode, msg, oaiserve.HandoffDecode)
			others := maps.Clone(s.prefill)
			delete(others, victim)
			served(t, others, msg, oaiserve.HandoffPrefill)
		})
	}
}
