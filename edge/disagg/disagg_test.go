package disagg

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-project/tether/internal/apireq"
)

// Bootstrap rooms lie in [0, 2^63) and are ≡ the prefill rank modulo the
// prefill fleet's ranks (any room without ranks).
func TestSGLangRoom(t *testing.T) {
	for _, tc := range []struct{ rank, size int }{
		{-1, 0}, {-1, 4}, {0, 1}, {0, 2}, {1, 2}, {2, 3}, {7, 8}, {1023, 1024}, {0, 1 << 20},
	} {
		for range 1000 {
			r := sglangRoom(tc.rank, tc.size)
			if r >= 1<<63 || (tc.rank >= 0 && tc.size > 1 && int(r%uint64(tc.size)) != tc.rank) {
				t.Fatalf("room %d for rank %d of %d", r, tc.rank, tc.size)
			}
		}
	}
}

// The bootstrap fields name the prefill URL's host and the given port;
// n > 1 and prompt batches get arrays, one room each, as SGLang's router
// injects them.
func TestSGLangBootstrap(t *testing.T) {
	for _, tc := range []struct {
		url, host string
		batch     int
	}{
		{"http://prefill-0.internal:30000", "prefill-0.internal", 0},
		{"http://10.0.0.7:30000", "10.0.0.7", 3},
		{"http://[fd00::1]:30000", "fd00::1", 0},
		{"prefill-0", "prefill-0", 2}, // no host in the URL: the URL as written
	} {
		boot := SGLangBootstrap(tc.url, 9001, 4, tc.batch, 3)
		var hosts []string
		var ports []int
		var rooms []uint64
		if tc.batch == 0 {
			var host string
			var port int
			var room uint64
			if json.Unmarshal(boot["bootstrap_host"], &host) != nil || json.Unmarshal(boot["bootstrap_port"], &port) != nil || json.Unmarshal(boot["bootstrap_room"], &room) != nil {
				t.Fatalf("%s: %v", tc.url, boot)
			}
			hosts, ports, rooms = []string{host}, []int{port}, []uint64{room}
		} else if json.Unmarshal(boot["bootstrap_host"], &hosts) != nil || json.Unmarshal(boot["bootstrap_port"], &ports) != nil || json.Unmarshal(boot["bootstrap_room"], &rooms) != nil ||
			len(hosts) != tc.batch || len(ports) != tc.batch || len(rooms) != tc.batch || rooms[0] == rooms[1] {
			t.Fatalf("%s: %v", tc.url, boot)
		}
		for i := range hosts {
			if hosts[i] != tc.host || ports[i] != 9001 || rooms[i]%4 != 3 {
				t.Fatalf("%s: host %q port %d room %d", tc.url, hosts[i], ports[i], rooms[i])
			}
		}
	}
}

// The prefill request carries its own rank and is not streamed; the
// decode's carries its rank and the prefill's; neither takes the client's
// rendezvous fields.
func TestSGLangHopFields(t *testing.T) {
	boot := map[string]json.RawMessage{"bootstrap_host": json.RawMessage(`"h"`), "bootstrap_port": json.RawMessage("1"), "bootstrap_room": json.RawMessage("5")}
	for _, tc := range []struct {
		pRank, dRank int
		prefill      map[string]string
		decode       map[string]string
	}{
		{-1, -1, map[string]string{"stream": "false"}, map[string]string{}},
		{2, -1, map[string]string{"stream": "false", "routed_dp_rank": "2"}, map[string]string{"disagg_prefill_dp_rank": "2"}},
		{2, 0, map[string]string{"stream": "false", "routed_dp_rank": "2"}, map[string]string{"disagg_prefill_dp_rank": "2", "routed_dp_rank": "0"}},
	} {
		p, d := SGLangHopFields(boot, tc.pRank, tc.dRank)
		for _, c := range []struct {
			got  Fields
			want map[string]string
		}{{p, tc.prefill}, {d, tc.decode}} {
			want := map[string]string{"bootstrap_host": `"h"`, "bootstrap_port": "1", "bootstrap_room": "5"}
			for k, v := range c.want {
				want[k] = v
			}
			got := map[string]string{}
			for k, v := range c.got.Set {
				got[k] = string(v)
			}
			if !maps.Equal(got, want) {
				t.Errorf("ranks %d/%d: %v, want %v", tc.pRank, tc.dRank, got, want)
			}
			if !slices.Contains(c.got.Del, "bootstrap_room") || !slices.Contains(c.got.Del, "data_parallel_rank") {
				t.Errorf("ranks %d/%d: removes %v", tc.pRank, tc.dRank, c.got.Del)
			}
		}
		if !slices.Contains(p.Del, "stream_options") || slices.Contains(d.Del, "stream_options") {
			t.Errorf("stream_options: prefill removes %v, decode %v", p.Del, d.Del)
		}
	}
}

func answer(body string) *http.Response {
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader(body))}
}

// A prefill answer is one choice; stopped for length it names the handoff
// (do_remote_prefill), any other finish is the client's answer.
func TestReadVLLMPrefill(t *testing.T) {
	const params = `{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"h","remote_port":5600}`
	for _, tc := range []struct {
		name, body string
		limit      int64
		err        string // "": good
		finished   bool
		text       string
		usage      Usage
	}{
		{name: "chat handoff", body: `{"choices":[{"message":{"content":"x"},"finish_reason":"length"}],"kv_transfer_params":` + params + `,"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}}`,
			text: "x", usage: Usage{OK: true, Prompt: 40, Cached: 32, HasCached: true}},
		{name: "completions handoff", body: `{"choices":[{"text":"y","finish_reason":"length"}],"kv_transfer_params":` + params + `,"usage":{"prompt_tokens":7}}`,
			text: "y", usage: Usage{OK: true, Prompt: 7}},
		{name: "stopped on the first token", body: `{"choices":[{"message":{"content":"."},"finish_reason":"stop"}],"kv_transfer_params":null}`,
			finished: true, text: "."},
		{name: "stopped, no params", body: `{"choices":[{"text":"","finish_reason":"stop"}]}`, finished: true},
		{name: "no handoff", body: `{"choices":[{"text":"y","finish_reason":"length"}]}`, err: "no kv_transfer_params with do_remote_prefill"},
		{name: "null handoff", body: `{"choices":[{"text":"y","finish_reason":"length"}],"kv_transfer_params":null}`, err: "no kv_transfer_params with do_remote_prefill"},
		{name: "handoff not asked", body: `{"choices":[{"text":"y","finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":false}}`, err: "no kv_transfer_params with do_remote_prefill"},
		{name: "handoff not an object", body: `{"choices":[{"text":"y","finish_reason":"length"}],"kv_transfer_params":"x"}`, err: "no kv_transfer_params with do_remote_prefill"},
		{name: "two choices", body: `{"choices":[{"text":"a","finish_reason":"length"},{"text":"b","finish_reason":"length"}],"kv_transfer_params":` + params + `}`, err: "2 choices, want 1"},
		{name: "no choices", body: `{"choices":[]}`, err: "0 choices, want 1"},
		{name: "not JSON", body: `<html>`, err: "not a JSON object"},
		{name: "an array", body: `[1]`, err: "not a JSON object"},
		{name: "choices not a list", body: `{"choices":{}}`, err: "unexpected shape"},
		{name: "cut by the limit", body: `{"choices":[]}`, limit: 5, err: "not a JSON object"},
	} {
		limit := tc.limit
		if limit == 0 {
			limit = 1 << 20
		}
		pre, err := ReadVLLMPrefill(answer(tc.body), limit, openAIDialect{})
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if pre.Finished != tc.finished || pre.Answer.Text != tc.text || pre.Answer.Usage != tc.usage {
			t.Errorf("%s: finished %v text %q usage %+v", tc.name, pre.Finished, pre.Answer.Text, pre.Answer.Usage)
		}
		if _, ok := pre.Answer.Raw["kv_transfer_params"]; ok {
			t.Errorf("%s: the handoff stays in the answer", tc.name)
		}
		if !tc.finished {
			if string(pre.Params) != params {
				t.Errorf("%s: params %s", tc.name, pre.Params)
			}
			if got := pre.DecodeFields(); string(got.Set["kv_transfer_params"]) != params || len(got.Del) != 0 {
				t.Errorf("%s: decode fields %v", tc.name, got)
			}
		}
	}
}

// The prefill request is one token, not streamed, and asks for the
// handoff; max_completion_tokens only when the client gave it.
func TestVLLMPrefillFields(t *testing.T) {
	for _, tc := range []struct {
		top  string
		want map[string]string
	}{
		{`{"max_tokens":50}`, map[string]string{"max_tokens": "1", "stream": "false", "kv_transfer_params": string(nixlPrefillParams)}},
		{`{"max_completion_tokens":50}`, map[string]string{"max_tokens": "1", "max_completion_tokens": "1", "stream": "false", "kv_transfer_params": string(nixlPrefillParams)}},
	} {
		var top map[string]json.RawMessage
		_ = json.Unmarshal([]byte(tc.top), &top)
		f := VLLMPrefillFields(openAIDialect{}, top)
		got := map[string]string{}
		for k, v := range f.Set {
			got[k] = string(v)
		}
		if !maps.Equal(got, tc.want) || !slices.Equal(f.Del, []string{"stream_options", "min_tokens", "min_completion_tokens"}) {
			t.Errorf("%s: sets %v, removes %v", tc.top, got, f.Del)
		}
	}
}

// Chat and completions are handed off unless one token is all prefill or
// several consumers would read one handoff.
func TestVLLMHandoff(t *testing.T) {
	for _, tc := range []struct {
		path      string
		maxTokens int
		top       string
		d         apireq.Dialect
		want      bool
	}{
		{"/v1/chat/completions", 0, `{}`, apireq.Chat, true},
		{"/v1/completions", 16, `{"prompt":"a"}`, apireq.Completions, true},
		{"/v1/chat/completions", 1, `{}`, apireq.Chat, false},
		{"/v1/chat/completions", 0, `{"n":2}`, apireq.Chat, false},
		{"/v1/completions", 0, `{"prompt":["a","b"]}`, apireq.Completions, false},
		{"/v1/messages", 0, `{}`, apireq.Messages, true},
		{"/v1/responses", 0, `{}`, apireq.Responses, true},
		{"/v1/messages", 1, `{}`, apireq.Messages, false},
		{"/v1/responses", 1, `{}`, apireq.Responses, false},
		{"/v1/messages/count_tokens", 0, `{}`, apireq.Messages, false},
	} {
		var top map[string]json.RawMessage
		_ = json.Unmarshal([]byte(tc.top), &top)
		if _, ok := VLLMHandoff(tc.path, tc.maxTokens, top, tc.d); ok != tc.want {
			t.Errorf("%s max_tokens %d %s: %v, want %v", tc.path, tc.maxTokens, tc.top, ok, tc.want)
		}
	}
}

func TestPatchUsageCached(t *testing.T) {
	for _, tc := range []struct {
		usage  string
		cached int
		want   string
	}{
		{`{"prompt_tokens":40,"completion_tokens":1}`, 32, `{"completion_tokens":1,"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}`},
		{`{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":2}}`, 16, `{"prompt_tokens":40,"prompt_tokens_details":{"audio_tokens":2,"cached_tokens":16}}`},
		{`{"prompt_tokens":40,"prompt_tokens_details":null}`, 0, `{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":0}}`},
		{`null`, 5, `null`},
		{``, 5, ``},
		{`[1]`, 5, `[1]`}, // not an object: unchanged
	} {
		if got := string(PatchUsageCached(json.RawMessage(tc.usage), tc.cached)); got != tc.want {
			t.Errorf("%s with %d cached: %s, want %s", tc.usage, tc.cached, got, tc.want)
		}
	}
}

func TestBatch(t *testing.T) {
	for _, tc := range []struct {
		body string
		d    apireq.Dialect
		n    int
	}{
		{`{"prompt":"a"}`, apireq.Completions, 0}, {`{"prompt":[1,2,3]}`, apireq.Completions, 0},
		{`{"prompt":["a","b"]}`, apireq.Completions, 2}, {`{"prompt":[[1],[2],[3]]}`, apireq.Completions, 3},
		{`{"prompt":"a","n":4}`, apireq.Completions, 4}, {`{"n":1}`, apireq.Completions, 0},
		{`{"prompt":["a","b"]}`, apireq.Chat, 0}, {`{"n":3}`, apireq.Chat, 3},
	} {
		var top map[string]json.RawMessage
		_ = json.Unmarshal([]byte(tc.body), &top)
		if got := Batch(top, tc.d); got != tc.n {
			t.Errorf("%s (%s): batch %d, want %d", tc.body, tc.d, got, tc.n)
		}
	}
}

func TestHeader(t *testing.T) {
	h := Header("req-1-0", 3)
	if h.Get("X-Request-Id") != "req-1-0" || h.Get(HeaderDataParallelRank) != "3" || h.Get("Content-Type") != "application/json" {
		t.Fatalf("%v", h)
	}
	if h := Header("req", -1); len(h.Values(HeaderDataParallelRank)) != 0 {
		t.Fatalf("no rank: %v", h)
	}
}

func TestStreamEvent(t *testing.T) {
	for _, tc := range []struct {
		data string
		want int
	}{
		{`{"choices":[{"delta":{"role":"assistant","content":""}}]}`, eventOther},
		{`{"choices":[{"delta":{"content":"hi"}}]}`, eventOutput},
		{`{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}`, eventOutput},
		{`{"choices":[{"delta":{"tool_calls":[]}}]}`, eventOther},
		{`{"choices":[{"text":"x"}]}`, eventOutput},
		{`{"choices":[{"text":"","finish_reason":"stop"}]}`, eventOutput},
		{`{"choices":[],"usage":{"prompt_tokens":3}}`, eventOutput},
		{`{"error":{"message":"KV transfer failed"}}`, eventError},
		{`{"object":"error","message":"x"}`, eventError},
		{`{"error":null,"choices":[{"delta":{"content":""}}]}`, eventOther},
		{`{"type":"message_start","message":{"usage":{"input_tokens":3}}}`, eventOther},
		{`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`, eventOther},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"w0"}}`, eventOutput},
		{`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}`, eventOutput},
		{`{"type":"error","error":{"type":"internal_error","message":"x"}}`, eventError},
		{`{"type":"response.created","sequence_number":0,"response":{"usage":null}}`, eventOther},
		{`{"type":"response.output_item.added","sequence_number":2,"item":{"type":"message"}}`, eventOther},
		{`{"type":"response.output_text.delta","sequence_number":4,"delta":"w0"}`, eventOutput},
		{`{"type":"response.function_call_arguments.delta","sequence_number":4,"delta":"{"}`, eventOutput},
		{`{"type":"response.completed","sequence_number":9,"response":{}}`, eventOutput},
		{`{"type":"error","sequence_number":1,"code":"InternalServerError","message":"x"}`, eventError},
		{`{"type":"response.failed","sequence_number":2,"response":{}}`, eventError},
		{`not json`, eventOther},
	} {
		if got := streamEvent([]byte(tc.data)); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.data, got, tc.want)
		}
	}
}

// PeekStream reads up to the first output and gives the relay everything;
// an error event or the end before any output is a failed decode.
func TestPeekStream(t *testing.T) {
	const role = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
	const tok = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
	for _, tc := range []struct {
		name, stream string
		failed       bool
	}{
		{"output", role + tok + "data: [DONE]\n\n", false},
		{"done before output", role + "data: [DONE]\n\n", false},
		{"error after the role chunk", role + "data: {\"error\":{\"message\":\"transfer failed\"}}\n\n", true},
		{"end before output", role, true},
	} {
		resp := answer(tc.stream)
		err := PeekStream(resp)
		if tc.failed {
			if !errors.Is(err, ErrStreamFailed) {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != tc.stream {
			t.Errorf("%s: the relay reads %q", tc.name, b)
		}
		if resp.Body.Close() != nil {
			t.Errorf("%s: close", tc.name)
		}
	}
}

// The bootstrap server is alive when its /health answers 200 on the
// bootstrap port of the prefill URL's host.
func TestSGLangBootstrapAlive(t *testing.T) {
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer healthy.Close()
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer failing.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	port := func(s *httptest.Server) int {
		u, _ := url.Parse(s.URL)
		p, _ := strconv.Atoi(u.Port())
		return p
	}
	for _, tc := range []struct {
		name string
		port int
		want bool
	}{{"healthy", port(healthy), true}, {"503", port(failing), false}, {"nothing listening", closed, false}} {
		// The prefill server's own port is not the bootstrap port.
		if got := SGLangBootstrapAlive(context.Background(), "http://127.0.0.1:30000", tc.port); got != tc.want {
			t.Errorf("%s: alive %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The agent APIs' prefill requests: one token in the API's own field, not
// streamed; a Responses prefill neither stored nor in the background.
func TestAgentPrefillFields(t *testing.T) {
	for _, tc := range []struct {
		d    Dialect
		want map[string]string
	}{
		{messagesDialect{}, map[string]string{"max_tokens": "1", "stream": "false", "kv_transfer_params": string(nixlPrefillParams)}},
		{responsesDialect{}, map[string]string{"max_output_tokens": "1", "stream": "false", "store": "false", "background": "false",
			"kv_transfer_params": string(nixlPrefillParams)}},
	} {
		f := VLLMPrefillFields(tc.d, map[string]json.RawMessage{"stream": json.RawMessage("true")})
		got := map[string]string{}
		for k, v := range f.Set {
			got[k] = string(v)
		}
		if !maps.Equal(got, tc.want) || len(f.Del) != 0 {
			t.Errorf("%T: sets %v, removes %v", tc.d, got, f.Del)
		}
	}
}

// A Messages or Responses prefill answer names its handoff as chat's does
// (at the top level); a pending one without it is a release whose API
// predates the field, whose decode computes the request whole; a stopped
// one is never relayed (the decode answers in the API).
func TestReadVLLMPrefillAgentAPIs(t *testing.T) {
	const params = `{"do_remote_prefill":true,"remote_block_ids":[[1]],"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":5600}`
	for _, tc := range []struct {
		name, body string
		d          Dialect
		err        string
		handoff    bool
		finished   bool
		text       string
		usage      Usage
	}{
		{name: "message handoff", d: messagesDialect{}, handoff: true, text: "w0",
			body: `{"id":"chatcmpl-1","type":"message","role":"assistant","content":[{"type":"text","text":"w0"}],"stop_reason":"max_tokens","usage":{"input_tokens":40,"output_tokens":1},"kv_transfer_params":` + params + `}`},
		{name: "message with cache fields", d: messagesDialect{}, handoff: true,
			body:  `{"type":"message","content":[],"stop_reason":"max_tokens","usage":{"input_tokens":8,"cache_read_input_tokens":32,"output_tokens":1},"kv_transfer_params":` + params + `}`,
			usage: Usage{OK: true, Prompt: 40, Cached: 32, HasCached: true}},
		{name: "message without the field", d: messagesDialect{}, text: "w0",
			body: `{"type":"message","content":[{"type":"text","text":"w0"}],"stop_reason":"max_tokens","usage":{"input_tokens":40,"output_tokens":1}}`},
		{name: "message stopped", d: messagesDialect{}, finished: true,
			body: `{"type":"message","content":[],"stop_reason":"end_turn"}`},
		{name: "not a message", d: messagesDialect{}, body: `{"type":"error","error":{"type":"x","message":"y"}}`, err: "want a message"},
		{name: "response handoff", d: responsesDialect{}, handoff: true, text: "w0",
			body:  `{"id":"resp_1","object":"response","status":"incomplete","output":[{"type":"message","content":[{"type":"output_text","text":"w0"}]}],"usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":16}},"kv_transfer_params":` + params + `}`,
			usage: Usage{OK: true, Prompt: 40, Cached: 16, HasCached: true}},
		{name: "response without the field", d: responsesDialect{},
			body: `{"object":"response","status":"incomplete","output":[],"kv_transfer_params":null}`},
		{name: "response completed", d: responsesDialect{}, finished: true, body: `{"object":"response","status":"completed","output":[]}`},
		{name: "not a response", d: responsesDialect{}, body: `{"error":{"message":"x"}}`, err: "want a response"},
		{name: "response not JSON", d: responsesDialect{}, body: `<html>`, err: "not a JSON object"},
	} {
		pre, err := ReadVLLMPrefill(answer(tc.body), 1<<20, tc.d)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if (pre.Params != nil) != tc.handoff || pre.Finished != tc.finished || pre.Answer.Text != tc.text || pre.Answer.Usage != tc.usage {
			t.Errorf("%s: params %s finished %v text %q usage %+v", tc.name, pre.Params, pre.Finished, pre.Answer.Text, pre.Answer.Usage)
		}
		if pre.Relayed(map[string]json.RawMessage{}) {
			t.Errorf("%s: an agent API's prefill answer relayed", tc.name)
		}
		f := pre.DecodeFields()
		if tc.handoff != (string(f.Set["kv_transfer_params"]) == params) || tc.handoff == slices.Contains(f.Del, "kv_transfer_params") {
			t.Errorf("%s: decode fields %v", tc.name, f)
		}
	}
}
