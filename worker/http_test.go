package worker

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-project/tether/test/workertest"
)

// longPrompt is a prompt of n distinct words (n/4 full blocks at block size 4).
func longPrompt(tag string, n int) string {
	words := make([]string, n)
	for i := range words {
		words[i] = fmt.Sprintf("%s%d", tag, i)
	}
	return strings.Join(words, " ")
}

func chatBody(prompt string, extra string) string {
	b := `{"model":"test-model","messages":[{"role":"system","content":"you are terse"},{"role":"user","content":` + strconv.Quote(prompt) + `}]`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

func num(t *testing.T, v any) int {
	t.Helper()
	f, ok := v.(float64)
	if !ok {
		t.Fatalf("not a number: %#v", v)
	}
	return int(f)
}

func usageOf(t *testing.T, m map[string]any) (prompt, completion, cached int) {
	t.Helper()
	u, ok := m["usage"].(map[string]any)
	if !ok {
		t.Fatalf("no usage in %v", m)
	}
	d := u["prompt_tokens_details"].(map[string]any)
	return num(t, u["prompt_tokens"]), num(t, u["completion_tokens"]), num(t, d["cached_tokens"])
}

func TestChatNonStreamingAndCachedTokens(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	body := chatBody(longPrompt("a", 40), `"max_tokens":5`)
	hdr := map[string]string{"x-session-id": "conv-1"}
	first := post(t, c, s.URL()+"/v1/chat/completions", body, hdr)
	if first.status != 200 {
		t.Fatalf("status %d: %s", first.status, first.body)
	}
	m := first.json(t)
	if m["object"] != "chat.completion" || !strings.HasPrefix(m["id"].(string), "chatcmpl-") {
		t.Fatalf("bad envelope: %v", m)
	}
	choice := m["choices"].([]any)[0].(map[string]any)
	msg := choice["message"].(map[string]any)
	if msg["role"] != "assistant" || msg["content"] == "" || choice["finish_reason"] == nil {
		t.Fatalf("bad choice: %v", choice)
	}
	prompt, completion, cached := usageOf(t, m)
	if prompt < 40 || completion != 5 || cached != 0 {
		t.Fatalf("first usage prompt=%d completion=%d cached=%d", prompt, completion, cached)
	}
	if first.header.Get(HeaderInstance) != "w0" {
		t.Fatalf("instance header %q", first.header.Get(HeaderInstance))
	}
	rank := first.header.Get(HeaderADPRank)
	if rank != "0" && rank != "1" {
		t.Fatalf("rank header %q", rank)
	}
	// The same conversation again: same rank, and every full block of the
	// prompt is served from that rank's cache.
	second := post(t, c, s.URL()+"/v1/chat/completions", body, hdr)
	if second.status != 200 || second.header.Get(HeaderADPRank) != rank {
		t.Fatalf("repeat: status %d rank %q (first %q)", second.status, second.header.Get(HeaderADPRank), rank)
	}
	p2, _, cached2 := usageOf(t, second.json(t))
	if want := p2 / 4 * 4; cached2 != want || cached2 == 0 {
		t.Fatalf("repeat cached_tokens = %d, want %d (full blocks of %d)", cached2, want, p2)
	}
}

func TestStreamingChatAndCompletions(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	for _, tc := range []struct {
		name, path, body, object string
	}{
		{"chat", "/v1/chat/completions", chatBody("stream this please", `"stream":true,"stream_options":{"include_usage":true},"max_tokens":4`), "chat.completion.chunk"},
		{"completions", "/v1/completions", `{"model":"test-model","prompt":"stream this please","stream":true,"stream_options":{"include_usage":true},"max_tokens":4}`, "text_completion"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, c, s.URL()+tc.path, tc.body, nil)
			if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d type %q: %s", r.status, r.header.Get("Content-Type"), r.body)
			}
			events := sseEvents(t, r.body)
			if events[len(events)-1] != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", events[len(events)-1])
			}
			var text strings.Builder
			var finish string
			var usage map[string]any
			for _, ev := range events[:len(events)-1] {
				var m map[string]any
				if err := json.Unmarshal([]byte(ev), &m); err != nil {
					t.Fatalf("event %q: %v", ev, err)
				}
				if m["object"] != tc.object {
					t.Fatalf("object %v, want %s", m["object"], tc.object)
				}
				for _, ch := range m["choices"].([]any) {
					ch := ch.(map[string]any)
					if d, ok := ch["delta"].(map[string]any); ok {
						if s, ok := d["content"].(string); ok {
							text.WriteString(s)
						}
					}
					if s, ok := ch["text"].(string); ok {
						text.WriteString(s)
					}
					if f, ok := ch["finish_reason"].(string); ok {
						finish = f
					}
				}
				if u, ok := m["usage"].(map[string]any); ok {
					usage = u
				}
			}
			if len(strings.Fields(text.String())) != 4 || finish == "" {
				t.Fatalf("streamed text %q (want 4 words), finish %q", text.String(), finish)
			}
			if usage == nil || num(t, usage["completion_tokens"]) != 4 {
				t.Fatalf("usage chunk %v", usage)
			}
			// Without include_usage there is no usage chunk.
			r = post(t, c, s.URL()+tc.path, strings.Replace(tc.body, `"stream_options":{"include_usage":true},`, "", 1), nil)
			if strings.Contains(string(r.body), `"usage"`) {
				t.Fatalf("usage sent without include_usage: %s", r.body)
			}
		})
	}
}

func TestCompletionsPromptForms(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	for _, prompt := range []string{`"one two three four five"`, `["one two three four five"]`, `[11, 12, 13, 14, 15]`} {
		r := post(t, c, s.URL()+"/v1/completions", `{"model":"test-model","max_tokens":2,"prompt":`+prompt+`}`, nil)
		if r.status != 200 {
			t.Fatalf("prompt %s: status %d: %s", prompt, r.status, r.body)
		}
		m := r.json(t)
		if m["object"] != "text_completion" {
			t.Fatalf("object %v", m["object"])
		}
		if p, _, _ := usageOf(t, m); p != 5 {
			t.Fatalf("prompt %s: prompt_tokens %d, want 5", prompt, p)
		}
		if _, ok := m["choices"].([]any)[0].(map[string]any)["text"].(string); !ok {
			t.Fatalf("no text choice: %s", r.body)
		}
	}
}

func TestContentParts(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	asString := post(t, c, s.URL()+"/v1/chat/completions",
		`{"model":"test-model","max_tokens":1,"messages":[{"role":"user","content":"alpha beta\ngamma"}]}`, nil)
	asParts := post(t, c, s.URL()+"/v1/chat/completions",
		`{"model":"test-model","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"alpha beta"},{"type":"text","text":"gamma"}]}]}`, nil)
	if asString.status != 200 || asParts.status != 200 {
		t.Fatalf("status %d / %d: %s %s", asString.status, asParts.status, asString.body, asParts.body)
	}
	p1, _, _ := usageOf(t, asString.json(t))
	p2, _, _ := usageOf(t, asParts.json(t))
	if p1 != p2 {
		t.Fatalf("parts flatten to %d tokens, string to %d", p2, p1)
	}
}

func TestModelsHealthReadyMetrics(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	r := do(t, c, http.MethodGet, s.URL()+"/v1/models", "", nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"id":"test-model"`) {
		t.Fatalf("models: %d %s", r.status, r.body)
	}
	if r := do(t, c, http.MethodGet, s.URL()+"/healthz", "", nil); r.status != 200 {
		t.Fatalf("healthz %d", r.status)
	}
	if r := do(t, c, http.MethodGet, s.URL()+"/readyz", "", nil); r.status != 200 {
		t.Fatalf("readyz %d: %s", r.status, r.body)
	}
	// The engines' probe path (trtllm-serve, vLLM, SGLang), which edges use.
	if r := do(t, c, http.MethodGet, s.URL()+"/health", "", nil); r.status != 200 {
		t.Fatalf("health %d: %s", r.status, r.body)
	}
	post(t, c, s.URL()+"/v1/chat/completions", chatBody("metric me", `"max_tokens":1`), nil)
	post(t, c, s.URL()+"/v1/chat/completions", `{`, nil)
	r = do(t, c, http.MethodGet, s.URL()+"/metrics", "", nil)
	for _, want := range []string{
		`tether_worker_requests_total{endpoint="chat",status="200"} 1`,
		`tether_worker_requests_total{endpoint="chat",status="400"} 1`,
		`tether_worker_rank_queued_requests{rank="1"} 0`,
		`tether_worker_rank_active_prompt_tokens{rank="0"} 0`,
		`tether_worker_rank_kv_blocks_total{rank="0"} 4096`,
		`tether_worker_hint_verification_failures_total{reason="invalid"} 0`,
		`tether_worker_cached_tokens_total{rank="0"}`,
		`tether_worker_prompt_tokens_total{rank="0"}`,
		`tether_worker_rank_overflows_total{rank="0"} 0`,
		`tether_worker_rank_conversation_evictions_total{rank="1"} 0`,
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestBadInput(t *testing.T) {
	cfg := testConfig("w0")
	cfg.MaxBodyBytes = 4096
	s := workertest.Start(t, New, cfg)
	c := testClient(t)
	chat, cmpl := s.URL()+"/v1/chat/completions", s.URL()+"/v1/completions"
	cases := []struct {
		name, method, url, body string
		status                  int
		code, param             string
		msg                     string
	}{
		{"malformed json", "POST", chat, `{"model":`, 400, "invalid_json", "", "not valid JSON"},
		{"not an object", "POST", chat, `[1,2]`, 400, "invalid_value", "", "must be a JSON object"},
		{"null body", "POST", chat, `null`, 400, "invalid_value", "", "must be a JSON object"},
		{"empty body", "POST", chat, ``, 400, "invalid_json", "", "not valid JSON"},
		{"missing model", "POST", chat, `{"messages":[{"role":"user","content":"x"}]}`, 400, "missing_required_parameter", "model", "model is required"},
		{"model wrong type", "POST", chat, `{"model":7,"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_value", "model", "invalid type"},
		{"unknown model", "POST", chat, `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found", "model", `"gpt-9" does not exist`},
		{"missing messages", "POST", chat, `{"model":"test-model"}`, 400, "missing_required_parameter", "messages", "messages is required"},
		{"empty messages", "POST", chat, `{"model":"test-model","messages":[]}`, 400, "invalid_value", "messages", "at least one message"},
		{"messages wrong type", "POST", chat, `{"model":"test-model","messages":"hi"}`, 400, "invalid_value", "messages", "invalid type"},
		{"content wrong type", "POST", chat, `{"model":"test-model","messages":[{"role":"user","content":5}]}`, 400, "invalid_value", "messages[0].content", "string or an array of content parts"},
		{"image part", "POST", chat, `{"model":"test-model","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "invalid_value", "messages[0].content", `"image_url" is not supported`},
		{"missing role", "POST", chat, `{"model":"test-model","messages":[{"content":"x"}]}`, 400, "invalid_value", "messages[0].role", "role is required"},
		{"blank prompt", "POST", chat, `{"model":"test-model","messages":[{"role":"user","content":"   "}]}`, 200, "", "", ""},
		{"stream wrong type", "POST", chat, chatBody("x", `"stream":"yes"`), 400, "invalid_value", "stream", "invalid type"},
		{"max_tokens zero", "POST", chat, chatBody("x", `"max_tokens":0`), 400, "invalid_value", "max_tokens", "at least 1"},
		{"max_tokens fractional", "POST", chat, chatBody("x", `"max_tokens":1.5`), 400, "invalid_value", "max_tokens", "invalid type"},
		{"n=2", "POST", chat, chatBody("x", `"n":2`), 400, "invalid_value", "n", "n must be 1"},
		{"stream_options without stream", "POST", chat, chatBody("x", `"stream_options":{"include_usage":true}`), 400, "invalid_value", "stream_options", "only allowed when stream is true"},
		{"prompt on chat", "POST", chat, chatBody("x", `"prompt":"y"`), 400, "invalid_value", "prompt", "not a chat completions parameter"},
		{"messages on completions", "POST", cmpl, `{"model":"test-model","prompt":"x","messages":[]}`, 400, "invalid_value", "messages", "not a completions parameter"},
		{"missing prompt", "POST", cmpl, `{"model":"test-model"}`, 400, "missing_required_parameter", "prompt", "prompt is required"},
		{"empty prompt", "POST", cmpl, `{"model":"test-model","prompt":""}`, 400, "invalid_value", "prompt", "prompt is empty"},
		{"prompt object", "POST", cmpl, `{"model":"test-model","prompt":{"a":1}}`, 400, "invalid_value", "prompt", "must be a string"},
		{"batched prompts", "POST", cmpl, `{"model":"test-model","prompt":["a","b"]}`, 400, "invalid_value", "prompt", "batched prompts"},
		{"negative token", "POST", cmpl, `{"model":"test-model","prompt":[1,-2]}`, 400, "invalid_value", "prompt", "prompt[1]: want a token id (an integer 0..2147483647), got -2"},
		{"mixed token array", "POST", cmpl, `{"model":"test-model","prompt":[1,"x"]}`, 400, "invalid_value", "prompt", "prompt[1]: want a token id"},
		{"unknown request type", "POST", chat, chatBody("x", `"disaggregated_params":{"request_type":"prefill"}`), 400, "invalid_value", "disaggregated_params.request_type", `unknown disaggregated_params.request_type "prefill"`},
		{"generation without state", "POST", chat, chatBody("x", `"disaggregated_params":{"request_type":"generation_only","disagg_request_id":1}`), 400, "invalid_value", "disaggregated_params.encoded_opaque_state", "need disaggregated_params.encoded_opaque_state"},
		{"bad encoded state", "POST", chat, chatBody("x", `"disaggregated_params":{"request_type":"generation_only","disagg_request_id":1,"encoded_opaque_state":"!!"}`), 400, "invalid_value", "disaggregated_params.encoded_opaque_state", "not valid base64"},
		{"bad opaque state", "POST", chat, chatBody("x", `"disaggregated_params":{"request_type":"generation_only","disagg_request_id":1,"opaque_state":"!!"}`), 400, "invalid_value", "disaggregated_params.opaque_state", "not valid base64"},
		{"foreign opaque state", "POST", chat, chatBody("x", `"disaggregated_params":{"request_type":"generation_only","disagg_request_id":1,"opaque_state":"aGVsbG8="}`), 400, "invalid_value", "", "sim"},
		{"context without request id", "POST", chat, chatBody("x", `"disaggregated_params":{"request_type":"context_only"}`), 400, "missing_required_parameter", "disaggregated_params.disagg_request_id", "need disaggregated_params.disagg_request_id"},
		{"request id wrong type", "POST", chat, chatBody("x", `"disaggregated_params":{"request_type":"context_only","disagg_request_id":[1]}`), 400, "invalid_value", "disaggregated_params", "string or an integer"},
		{"too large", "POST", chat, chatBody(strings.Repeat("word ", 2000), ""), 413, "request_too_large", "", "exceeds the limit of 4096 bytes"},
		{"unknown path", "POST", s.URL() + "/v1/embeddings", `{}`, 404, "unknown_url", "", "unknown path POST /v1/embeddings"},
		{"root", "GET", s.URL() + "/", ``, 404, "unknown_url", "", "unknown path"},
		{"get on chat", "GET", chat, ``, 405, "method_not_allowed", "", "method GET is not allowed on /v1/chat/completions (allowed: POST)"},
		{"post on models", "POST", s.URL() + "/v1/models", `{}`, 405, "method_not_allowed", "", "allowed: GET, HEAD"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, c, tc.method, tc.url, tc.body, nil)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if tc.status == 200 {
				return
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("content type %q", ct)
			}
			var e struct {
				Error *struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(r.body, &e); err != nil || e.Error == nil {
				t.Fatalf("not OpenAI error JSON: %s", r.body)
			}
			if e.Error.Type == "" || e.Error.Code == nil || *e.Error.Code != tc.code {
				t.Fatalf("type %q code %v, want code %q: %s", e.Error.Type, e.Error.Code, tc.code, r.body)
			}
			param := ""
			if e.Error.Param != nil {
				param = *e.Error.Param
			}
			if param != tc.param {
				t.Fatalf("param %q, want %q: %s", param, tc.param, r.body)
			}
			if !strings.Contains(e.Error.Message, tc.msg) {
				t.Fatalf("message %q lacks %q", e.Error.Message, tc.msg)
			}
		})
	}
	if r := do(t, c, "GET", chat, "", nil); r.header.Get("Allow") != "POST" {
		t.Fatalf("405 without Allow header: %v", r.header)
	}
	// The worker still serves after all that.
	if r := post(t, c, chat, chatBody("still alive", `"max_tokens":1`), nil); r.status != 200 {
		t.Fatalf("after bad input: %d %s", r.status, r.body)
	}
}

// Spec: /v1/completions has instance affinity only; ADP-rank affinity is a
// chat feature. The same session id sticks to a rank on chat, and follows
// the placement policy (round robin here) on completions.
func TestRankAffinityIsForChatOnly(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	hdr := map[string]string{"x-session-id": "conv-x"}
	var chatRanks, cmplRanks []string
	for i := 0; i < 3; i++ {
		chatRanks = append(chatRanks, post(t, c, s.URL()+"/v1/chat/completions", chatBody("same words", `"max_tokens":1`), hdr).header.Get(HeaderADPRank))
		cmplRanks = append(cmplRanks, post(t, c, s.URL()+"/v1/completions", `{"model":"test-model","prompt":"same words","max_tokens":1}`, hdr).header.Get(HeaderADPRank))
	}
	if chatRanks[0] != chatRanks[1] || chatRanks[1] != chatRanks[2] {
		t.Fatalf("chat turns of one conversation on ranks %v", chatRanks)
	}
	if cmplRanks[0] == cmplRanks[1] && cmplRanks[1] == cmplRanks[2] {
		t.Fatalf("completions pinned to rank %s; docs/subagent-routing.md gives them instance affinity only", cmplRanks[0])
	}
}

func TestPromptLargerThanRankIsAClientError(t *testing.T) {
	cfg := testConfig("w0")
	cfg.Engine.CapacityBlocks = 4 // 16 tokens at block size 4
	s := workertest.Start(t, New, cfg)
	r := post(t, testClient(t), s.URL()+"/v1/completions", `{"model":"test-model","prompt":"`+longPrompt("w", 40)+`"}`, nil)
	if r.status != 400 || !strings.Contains(string(r.body), `"code":"context_length_exceeded"`) || !strings.Contains(string(r.body), `"param":"prompt"`) {
		t.Fatalf("%d %s", r.status, r.body)
	}
}
