package worker

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/test/workertest"
)

// A request is refused only when it does not fit the model's context
// (max_model_len), with vLLM's status and messages
// (vllm/renderers/params.py TokenizeParams); without max tokens it may run
// to max_model_len − prompt, or default_max_tokens when set. Before, any
// max_tokens above max_tokens_limit (4096) was refused, Claude Code's
// 32000 among them.
func TestMaxTokensBeyondContextRefused(t *testing.T) {
	cfg := testConfig("w0")
	cfg.MaxModelLen = 64
	s := workertest.Start(t, New, cfg)
	c := testClient(t)
	chat := s.URL() + "/v1/chat/completions"
	prompt := len(promptOf(t, chatBody("too long", "")))
	for _, name := range []string{"max_tokens", "max_completion_tokens"} {
		r := post(t, c, chat, chatBody("too long", `"`+name+`":100000`), nil)
		e := errorOf(t, r, 400)
		if want := name + "=100000 cannot be greater than max_model_len=64. Please request fewer output tokens."; e["param"] != name || e["message"] != want {
			t.Fatalf("%s 100000: error %v, want param %s and %q", name, e, name, want)
		}
	}
	// The output fits alone, not with the prompt.
	over := 64 - prompt + 1
	e := errorOf(t, post(t, c, chat, chatBody("too long", fmt.Sprintf(`"max_tokens":%d`, over)), nil), 400)
	want := fmt.Sprintf("This model's maximum context length is 64 tokens. However, you requested %d output tokens and your prompt contains %d input tokens, for a total of 65 tokens. Please reduce the length of the input prompt or the number of requested output tokens.", over, prompt)
	if e["message"] != want || e["param"] != "input_tokens" || e["code"] != "context_length_exceeded" {
		t.Fatalf("prompt + max_tokens over the context: %v\nwant %q", e, want)
	}
	// Exactly the context is served; so is no max_tokens, up to the
	// context (ignore_eos runs free text to its bound).
	for _, extra := range []string{fmt.Sprintf(`"max_tokens":%d,"ignore_eos":true`, over-1), `"ignore_eos":true`} {
		r := post(t, c, chat, chatBody("too long", extra), nil)
		if r.status != 200 {
			t.Fatalf("%s: %d %s", extra, r.status, r.body)
		}
		if _, completion, _ := usageOf(t, r.json(t)); completion != 64-prompt {
			t.Fatalf("%s: %d completion tokens, want max_model_len − prompt = %d", extra, completion, 64-prompt)
		}
	}
	// Responses names its own parameter.
	e = errorOf(t, post(t, c, s.URL()+"/v1/responses", `{"model":"test-model","input":"hi","max_output_tokens":65}`, nil), 400)
	if e["param"] != "max_output_tokens" || !strings.HasPrefix(e["message"].(string), "max_output_tokens=65 cannot be greater than max_model_len=64") {
		t.Fatalf("responses: %v", e)
	}
	// A prompt longer than the context with no max tokens.
	e = errorOf(t, post(t, c, chat, chatBody(longPrompt("w", 80), ""), nil), 400)
	if e["code"] != "context_length_exceeded" || !strings.Contains(e["message"].(string), "you requested 0 output tokens") {
		t.Fatalf("long prompt: %v", e)
	}
}

// default_max_tokens bounds an answer whose request sets none, as a
// model's generation config gives vLLM a default.
func TestDefaultMaxTokensBoundsAnswersWithoutMaxTokens(t *testing.T) {
	cfg := testConfig("w0")
	cfg.DefaultMaxTokens = 3
	s := workertest.Start(t, New, cfg)
	r := post(t, testClient(t), s.URL()+"/v1/chat/completions", chatBody("default", `"ignore_eos":true`), nil)
	if _, completion, _ := usageOf(t, r.json(t)); completion != 3 {
		t.Fatalf("completion tokens %d, want default_max_tokens 3", completion)
	}
}

// Claude Code asks for max_tokens 32000, and 128000 after "Output token
// limit hit": both fit the default context and are served.
func TestClaudeCodeMaxTokensServed(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	for _, n := range []int{32000, 128000} {
		body := fmt.Sprintf(`{"model":"test-model","max_tokens":%d,"messages":[{"role":"user","content":"hello"}]}`, n)
		if r := post(t, testClient(t), s.URL()+"/v1/messages", body, nil); r.status != 200 {
			t.Fatalf("max_tokens %d: %d %s", n, r.status, r.body)
		}
	}
}

// vLLM's min_tokens and ignore_eos are checked as its SamplingParams
// checks them.
func TestSamplingExtensionsChecked(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	chat := s.URL() + "/v1/chat/completions"
	for _, tc := range []struct{ extra, param, msg string }{
		{`"ignore_eos":"yes"`, "ignore_eos", "ignore_eos must be a boolean"},
		{`"min_tokens":-1`, "min_tokens", "min_tokens must be greater than or equal to 0, got -1."},
		{`"max_tokens":4,"min_tokens":5`, "min_tokens", "min_tokens must be less than or equal to max_tokens=4, got 5."},
	} {
		e := errorOf(t, post(t, testClient(t), chat, chatBody("x", tc.extra), nil), 400)
		if e["param"] != tc.param || !strings.Contains(e["message"].(string), tc.msg) {
			t.Fatalf("%s: %v", tc.extra, e)
		}
	}
}

// promptOf is the worker's prompt of a chat body.
func promptOf(t *testing.T, body string) []uint32 {
	t.Helper()
	p, aerr := parseRequest([]byte(body), apireq.Chat, requestRules{})
	if aerr != nil {
		t.Fatal(aerr)
	}
	return p.prompt
}

// errorOf is the OpenAI error object of an answer with status want.
func errorOf(t *testing.T, r response, want int) map[string]any {
	t.Helper()
	if r.status != want {
		t.Fatalf("status %d, want %d: %s", r.status, want, r.body)
	}
	e, ok := r.json(t)["error"].(map[string]any)
	if !ok {
		t.Fatalf("no error object: %s", r.body)
	}
	return e
}
