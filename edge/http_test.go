package edge

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/routing"
)

func oneTurn(t testing.TB, tag string) []byte {
	return chatBody(t, longText(tag, 24), []string{"go"}, nil)
}

// Client-supplied hint headers never reach a worker; a sub-agent's hint is
// the edge's own, signed.
func TestInternalHeadersAreStripped(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	forged := map[string]string{
		hintauth.HeaderAffinityID:   "someone-else",
		hintauth.HeaderAffinityAuth: "v1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
		"x-session-id":              "plain-conv",
	}
	if r := s.chat(t, oneTurn(t, "strip"), forged); r.status != http.StatusOK {
		t.Fatalf("plain request with forged hint: %d %s", r.status, r.body)
	}
	forged["x-session-id"] = "child-x"
	forged[parentHeader] = "root-x"
	if r := s.chat(t, oneTurn(t, "strip"), forged); r.status != http.StatusOK {
		t.Fatalf("sub-agent with forged hint: %d %s", r.status, r.body)
	}
	for _, w := range []*testWorker{s.ctx[0], s.gen[0]} {
		for _, seen := range w.requests() {
			aff, sig := seen.header.Get(hintauth.HeaderAffinityID), seen.header.Get(hintauth.HeaderAffinityAuth)
			if aff == "someone-else" || sig == forged[hintauth.HeaderAffinityAuth] {
				t.Fatalf("%s received a client-supplied hint header: %q %q", w.id, aff, sig)
			}
			switch seen.conversationID() {
			case "plain-conv":
				if aff != "" || sig != "" {
					t.Fatalf("%s: the plain conversation carried a hint %q %q", w.id, aff, sig)
				}
			case "child-x":
				if w == s.ctx[0] && (aff != "root-x" || sig == "") {
					t.Fatalf("%s: the sub-agent's hint %q %q, want root-x signed by the edge", w.id, aff, sig)
				}
			}
		}
	}
	if n := counter(t, s.te.registry, "tether_edge_stripped_headers_total", map[string]string{"header": hintauth.HeaderAffinityID}); n != 2 {
		t.Fatalf("stripped %s = %v, want 2", hintauth.HeaderAffinityID, n)
	}
}

// With the gateway trust boundary on, the parent header counts only from a
// trusted source (here: the gateway's token); otherwise it is stripped and
// the request routes by its own conversation.
func TestTrustedGatewayStripsUntrustedParentHeader(t *testing.T) {
	const token = "gateway-token-0123456789"
	s := startStatic(t, 1, 1, func(c *Config) {
		c.TrustedGateway = TrustedGatewayConfig{Enabled: true, CIDRs: []string{"10.99.0.0/16"}, TokenHeader: "X-Gateway-Token", Token: token}
	})
	h := map[string]string{"x-session-id": "untrusted-child", parentHeader: "victim-root"}
	if r := s.chat(t, oneTurn(t, "gw"), h); r.status != http.StatusOK {
		t.Fatalf("untrusted: %d %s", r.status, r.body)
	}
	if _, ok := binding(t, s.c, s.te, fsm.FleetContext, "untrusted-child"); !ok {
		t.Fatal("the untrusted request did not route by its own conversation id")
	}
	if _, ok := binding(t, s.c, s.te, fsm.FleetContext, "victim-root"); ok {
		t.Fatal("the untrusted parent header placed a binding for the victim's root")
	}
	h = map[string]string{"x-session-id": "trusted-child", parentHeader: "real-root", "X-Gateway-Token": token}
	if r := s.chat(t, oneTurn(t, "gw"), h); r.status != http.StatusOK {
		t.Fatalf("trusted: %d %s", r.status, r.body)
	}
	if _, ok := binding(t, s.c, s.te, fsm.FleetContext, "real-root"); !ok {
		t.Fatal("the trusted sub-agent did not route by its parent's root")
	}
	for _, seen := range s.ctx[0].requests() {
		if seen.header.Get("X-Gateway-Token") != "" {
			t.Fatal("the gateway token was forwarded to a worker")
		}
		aff := seen.header.Get(hintauth.HeaderAffinityID)
		switch seen.conversationID() {
		case "untrusted-child":
			if aff != "" {
				t.Fatalf("untrusted request carried hint %q", aff)
			}
		case "trusted-child":
			if aff != "real-root" {
				t.Fatalf("trusted request hint %q, want real-root", aff)
			}
		}
	}
}

// conversation_params.conversation_id in the body wins over x-session-id.
func TestBodyConversationIDWinsOverHeader(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	body := chatBody(t, longText("prec", 24), []string{"go"}, map[string]any{"conversation_params": map[string]any{"conversation_id": "body-conv"}})
	if r := s.chat(t, body, map[string]string{"x-session-id": "header-conv"}); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if _, ok := binding(t, s.c, s.te, fsm.FleetContext, "body-conv"); !ok {
		t.Fatal("no binding for the body's conversation id")
	}
	if _, ok := binding(t, s.c, s.te, fsm.FleetContext, "header-conv"); ok {
		t.Fatal("the header's conversation id was bound")
	}
	for _, seen := range s.ctx[0].requests() {
		if got := seen.conversationID(); got != "body-conv" {
			t.Fatalf("the worker saw conversation %q, want body-conv", got)
		}
	}
}

// /v1/completions gets instance affinity only: a sub-agent lands on its
// parent's instance but no hint is sent.
func TestCompletionsSendNoHint(t *testing.T) {
	s := startStatic(t, 2, 1, nil)
	if r := s.chat(t, oneTurn(t, "cmpl-parent"), map[string]string{"x-session-id": "cmpl-root"}); r.status != http.StatusOK {
		t.Fatalf("parent: %d %s", r.status, r.body)
	}
	parent, _ := binding(t, s.c, s.te, fsm.FleetContext, "cmpl-root")
	body, _ := json.Marshal(map[string]any{"model": testModel, "prompt": longText("cmpl", 30), "max_tokens": 3})
	r := do(t, s.c, http.MethodPost, s.te.url()+"/v1/completions", body, map[string]string{"x-session-id": "cmpl-child", parentHeader: "cmpl-root"})
	if r.status != http.StatusOK {
		t.Fatalf("completions: %d %s", r.status, r.body)
	}
	m := r.json(t)
	if m["object"] != "text_completion" {
		t.Fatalf("completions object %v", m["object"])
	}
	if ci, _ := routeOf(t, r); ci != parent.Instance {
		t.Fatalf("the sub-agent's completion ran on %s, its parent is on %s", ci, parent.Instance)
	}
	for _, w := range append(append([]*testWorker(nil), s.ctx...), s.gen...) {
		for _, seen := range w.requests() {
			if seen.path == "/v1/completions" && (seen.header.Get(hintauth.HeaderAffinityID) != "" || seen.header.Get(hintauth.HeaderAffinityAuth) != "") {
				t.Fatalf("%s: /v1/completions carried a hint", w.id)
			}
		}
	}
}

// Every context instance over its hard limit: 429 with Retry-After and an
// OpenAI error body.
func TestShedWhenEveryInstanceIsOverItsLimit(t *testing.T) {
	s := startStatic(t, 1, 1, func(c *Config) {
		c.Placement.Overflow.QueuedRequests = 0
		c.Placement.Shed.MaxQueuedRequests = 1
	})
	gate := make(chan struct{})
	s.ctx[0].gate.Store(&gate)
	first := make(chan response, 1)
	go func() {
		first <- do(t, s.c, http.MethodPost, s.te.url()+"/v1/chat/completions", oneTurn(t, "shed-1"), map[string]string{"x-session-id": "shed-1"})
	}()
	waitFor(t, "the first request to reach the worker", 10*time.Second, func() bool { return len(s.ctx[0].requests()) == 1 })
	r := s.chat(t, oneTurn(t, "shed-2"), map[string]string{"x-session-id": "shed-2"})
	close(gate)
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("second request: %d %s, want 429", r.status, r.body)
	}
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || ra < 1 {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
	e := r.json(t)["error"].(map[string]any)
	if e["type"] != "rate_limit_error" || e["code"] != "overloaded" || !strings.Contains(e["message"].(string), "retry after") {
		t.Fatalf("error body %v", e)
	}
	if f := <-first; f.status != http.StatusOK {
		t.Fatalf("first request: %d %s", f.status, f.body)
	}
	if n := counter(t, s.te.registry, "tether_edge_routing_decisions_total", map[string]string{"outcome": routing.OutcomeShed}); n != 1 {
		t.Fatalf("shed decisions %v", n)
	}
}

// No healthy instance in a fleet: 503.
func TestNoHealthyInstance(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	s := startStatic(t, 0, 1, func(c *Config) { c.ContextServers.URLs = []StaticInstance{{Name: "ctx-dead", URL: dead}} })
	s.ec.waitInstances(1)
	r := s.chat(t, oneTurn(t, "dead"), map[string]string{"x-session-id": "dead-conv"})
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("%d %s, want 503", r.status, r.body)
	}
	if e := r.json(t)["error"].(map[string]any); e["code"] != "no_healthy_instance" {
		t.Fatalf("error %v", e)
	}
}

// Bad input: 413 over max_body_bytes, 400 with an OpenAI error naming the
// parameter, 404 for an unknown model, 405 for a wrong method; nothing
// panics and nothing is bound.
func TestBadInput(t *testing.T) {
	s := startStatic(t, 1, 1, func(c *Config) { c.MaxBodyBytes = 4096; c.MaxSubagentDepth = 1 })
	chat := s.te.url() + "/v1/chat/completions"
	msgs := `"messages":[{"role":"user","content":"hi there"}]`
	cases := []struct {
		name    string
		method  string
		url     string
		body    string
		headers map[string]string
		status  int
		param   string
		msg     string
	}{
		{"not json", "POST", chat, `{"model":`, nil, 400, "", "not valid JSON"},
		{"not an object", "POST", chat, `[1,2]`, nil, 400, "", "JSON object"},
		{"two values", "POST", chat, `{"model":"test-model",` + msgs + `} {}`, nil, 400, "", "more than one JSON value"},
		{"no model", "POST", chat, `{` + msgs + `}`, nil, 400, "model", "model is required"},
		{"model not a string", "POST", chat, `{"model":7,` + msgs + `}`, nil, 400, "model", "want a string"},
		{"unknown model", "POST", chat, `{"model":"other",` + msgs + `}`, nil, 404, "model", "does not exist"},
		{"no messages", "POST", chat, `{"model":"test-model"}`, nil, 400, "messages", "messages is required"},
		{"empty messages", "POST", chat, `{"model":"test-model","messages":[]}`, nil, 400, "messages", "at least one message"},
		{"messages not an array", "POST", chat, `{"model":"test-model","messages":"hi"}`, nil, 400, "messages", "want an array"},
		{"message without role", "POST", chat, `{"model":"test-model","messages":[{"content":"x"}]}`, nil, 400, "messages[0].role", "role is required"},
		{"bad content part", "POST", chat, `{"model":"test-model","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, nil, 400, "messages[0].content", "not supported"},
		{"stream not bool", "POST", chat, `{"model":"test-model","stream":"yes",` + msgs + `}`, nil, 400, "stream", "want a boolean"},
		{"stream_options without stream", "POST", chat, `{"model":"test-model","stream_options":{"include_usage":true},` + msgs + `}`, nil, 400, "stream_options", "only allowed"},
		{"max_tokens zero", "POST", chat, `{"model":"test-model","max_tokens":0,` + msgs + `}`, nil, 400, "max_tokens", "at least 1"},
		{"max_tokens string", "POST", chat, `{"model":"test-model","max_tokens":"9",` + msgs + `}`, nil, 400, "max_tokens", "want an integer"},
		{"n=2", "POST", chat, `{"model":"test-model","n":2,` + msgs + `}`, nil, 400, "n", "n must be 1"},
		{"conversation id not a string", "POST", chat, `{"model":"test-model","conversation_params":{"conversation_id":5},` + msgs + `}`, nil, 400, "conversation_params.conversation_id", "want a string"},
		{"prompt on chat", "POST", chat, `{"model":"test-model","prompt":"x",` + msgs + `}`, nil, 400, "prompt", "not a chat completions parameter"},
		{"completions prompt missing", "POST", s.te.url() + "/v1/completions", `{"model":"test-model"}`, nil, 400, "prompt", "prompt is required"},
		{"completions bad token", "POST", s.te.url() + "/v1/completions", `{"model":"test-model","prompt":[1,-2]}`, nil, 400, "prompt", "token id"},
		{"unknown role", "POST", chat, `{"model":"test-model","messages":[{"role":"wizard","content":"hi"}]}`, nil, 400, "messages[0].role", `"wizard"`},
		{"long x-session-id", "POST", chat, `{"model":"test-model",` + msgs + `}`, map[string]string{"x-session-id": strings.Repeat("s", 1100)}, 400, "x-session-id", "header x-session-id"},
		{"self parent", "POST", chat, `{"model":"test-model",` + msgs + `}`, map[string]string{"x-session-id": "loop", parentHeader: "loop"}, 400, parentHeader, "cycle"},
		{"unknown priority", "POST", chat, `{"model":"test-model",` + msgs + `}`, map[string]string{routing.PriorityHeader: "urgent"}, 400, routing.PriorityHeader, "unknown priority"},
		{"too large", "POST", chat, `{"model":"test-model","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`, nil, 413, "", "exceeds the limit"},
		{"GET on chat", "GET", chat, "", nil, 405, "", "not allowed"},
		{"unknown path", "GET", s.te.url() + "/v2/nothing", "", nil, 404, "", "unknown path"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body []byte
			if tc.body != "" {
				body = []byte(tc.body)
			}
			r := do(t, s.c, tc.method, tc.url, body, tc.headers)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			e, ok := r.json(t)["error"].(map[string]any)
			if !ok {
				t.Fatalf("no OpenAI error object: %s", r.body)
			}
			for _, k := range []string{"message", "type", "param", "code"} {
				if _, ok := e[k]; !ok {
					t.Fatalf("error lacks %q: %s", k, r.body)
				}
			}
			if tc.param != "" && e["param"] != tc.param {
				t.Fatalf("param %v, want %s (%s)", e["param"], tc.param, r.body)
			}
			if !strings.Contains(e["message"].(string), tc.msg) {
				t.Fatalf("message %q lacks %q", e["message"], tc.msg)
			}
		})
	}
	// A nested sub-agent beyond max_subagent_depth (1): child-n's parent is
	// itself a recorded child. It is routed (as a child of the root), with
	// a header saying so; before, it was refused with 400.
	if r := s.chat(t, oneTurn(t, "nest"), map[string]string{"x-session-id": "nest-child", parentHeader: "nest-root"}); r.status != 200 {
		t.Fatalf("first-level child: %d %s", r.status, r.body)
	}
	waitFor(t, "the parent link recorded", 10*time.Second, func() bool {
		_, ok := s.te.e.Node().State().Link("nest-child")
		return ok
	})
	r := s.chat(t, oneTurn(t, "nest"), map[string]string{"x-session-id": "nest-grandchild", parentHeader: "nest-child"})
	if r.status != 200 || r.header.Get(HeaderDepthLimited) != `depth=2; limit=1; parent="nest-root"` {
		t.Fatalf("grandchild: %d %q %s", r.status, r.header.Get(HeaderDepthLimited), r.body)
	}
	waitFor(t, "the capped link recorded", 10*time.Second, func() bool {
		l, ok := s.te.e.Node().State().Link("nest-grandchild")
		return ok && l.Parent == "nest-root" && l.Depth == 1
	})
	if len(s.ctx[0].requests()) != 2 {
		t.Fatalf("bad requests reached the worker: %d requests", len(s.ctx[0].requests()))
	}
}

// The official openai-go client, streaming and not, with x-session-id set
// through its request options.
func TestOpenAIClient(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	client := openai.NewClient(option.WithBaseURL(s.te.url()+"/v1/"), option.WithAPIKey("unused"), option.WithHTTPClient(s.c), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	params := openai.ChatCompletionNewParams{
		Model:     testModel,
		MaxTokens: openai.Int(6),
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage(longText("sdk-system", 30)),
			openai.UserMessage("list the files in the repository root"),
		},
	}
	comp, err := client.Chat.Completions.New(ctx, params, option.WithHeader("x-session-id", "sdk-conv"))
	if err != nil {
		t.Fatalf("non-streaming: %v", err)
	}
	if len(comp.Choices) != 1 || comp.Choices[0].Message.Content == "" || comp.Usage.CompletionTokens != 6 || comp.Usage.PromptTokens == 0 {
		t.Fatalf("non-streaming completion: %+v", comp)
	}
	if _, ok := binding(t, s.c, s.te, fsm.FleetContext, "sdk-conv"); !ok {
		t.Fatal("x-session-id from the client's options did not bind the conversation")
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params, option.WithHeader("x-session-id", "sdk-conv"))
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("streaming: %v", err)
	}
	if err := stream.Close(); err != nil {
		t.Fatal(err)
	}
	if chunks < 6 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" {
		t.Fatalf("streamed %d chunks: %+v", chunks, acc.Choices)
	}
	// The same prompt again on the same conversation: the prefill hit.
	if acc.Usage.PromptTokensDetails.CachedTokens == 0 || acc.Usage.CompletionTokens != 6 {
		t.Fatalf("streamed usage %+v", acc.Usage)
	}
	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "nope", Messages: params.Messages})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("unknown model error = %v", err)
	}
	// models.retrieve: the served model, and 404 for another (was 404 for both).
	if m, err := client.Models.Get(ctx, testModel); err != nil || m.ID != testModel || m.Object != "model" {
		t.Fatalf("models.retrieve %s: %+v %v", testModel, m, err)
	}
	if _, err := client.Models.Get(ctx, "nope"); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("models.retrieve nope: %v", err)
	}
}

// A context hop that fails with 5xx is retried on another instance: the
// bound key overflows (recorded as unhealthy) and the retry carries a new
// disaggregated request id.
func TestContextRetryOnAnotherInstance(t *testing.T) {
	s := startStatic(t, 2, 1, func(c *Config) { c.MaxRetries = 1 })
	a := &agent{session: "retry-conv", system: longText("retry", 24)}
	r1 := a.send(t, s.c, s.te, "one", nil)
	bound := s.worker(r1.ctxInst)
	bound.failNext.Store(1)
	r2 := a.send(t, s.c, s.te, "two", nil)
	if r2.ctxInst == r1.ctxInst {
		t.Fatalf("the retry stayed on the failing instance %s", r1.ctxInst)
	}
	failed := bound.requests()
	other := s.worker(r2.ctxInst).requests()
	idOf := func(sr seenRequest) string {
		dp, _ := sr.body["disaggregated_params"].(map[string]any)
		return strconv.FormatFloat(dp["disagg_request_id"].(float64), 'f', -1, 64)
	}
	if idOf(failed[len(failed)-1]) == idOf(other[len(other)-1]) {
		t.Fatal("the context retry reused the failed attempt's disaggregated request id")
	}
	if n := counter(t, s.te.registry, "tether_edge_retries_total", map[string]string{"fleet": "context"}); n != 1 {
		t.Fatalf("context retries %v", n)
	}
	waitFor(t, "the overflow in the log", 30*time.Second, func() bool {
		return s.te.e.Node().State().Counters().Overflows[fsm.OverflowUnhealthy] >= 1
	})
}

// Conditional disaggregation: once the generation instance holds the
// conversation's prefix, the context hop is skipped.
func TestConditionalDisaggregationSkipsContextHop(t *testing.T) {
	s := startStatic(t, 1, 1, func(c *Config) {
		c.GenerationServers.Router.Type = routing.RouterKVCacheAware
		c.ConditionalDisagg.MaxLocalPrefillLength = 40
	})
	a := &agent{session: "cond-conv", system: longText("cond", 60)}
	r1 := a.send(t, s.c, s.te, "first", nil)
	if r1.ctxInst == "" {
		t.Fatalf("turn 1 skipped the context hop with nothing cached: %s", r1.resp.header.Get(HeaderRoute))
	}
	r2 := a.send(t, s.c, s.te, "second", nil)
	if r2.ctxInst != "" || r2.gen != "gen-0" {
		t.Fatalf("turn 2 route %q, want the context hop skipped", r2.resp.header.Get(HeaderRoute))
	}
	last := s.gen[0].requests()
	if rt := last[len(last)-1].requestType(); rt != "aggregated" {
		t.Fatalf("turn 2 reached the generation worker as %s", rt)
	}
}
