package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"

	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/test/workertest"
	"github.com/tether-project/tether/worker"
	"github.com/tether-project/tether/worker/engine"
	"github.com/tether-project/tether/worker/proxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// simWorker starts a real tether worker (simulated engine, no waiting) to
// act as the upstream OpenAI-compatible server.
func simWorker(t *testing.T) *worker.Server {
	t.Helper()
	cfg := worker.DefaultConfig()
	cfg.InstanceID, cfg.Model = "upstream", "m"
	cfg.Engine.TimeScale = 0
	cfg.Engine.BlockSize = 4
	cfg.Logger = slog.New(slog.DiscardHandler)
	return workertest.Start(t, worker.New, cfg)
}

func newProxy(t *testing.T, cfg proxy.Config) *proxy.Engine {
	t.Helper()
	e, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func chatRequest(id, prompt string, maxTokens int) engine.Request {
	body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":%d}`, prompt, maxTokens)
	return engine.Request{
		ID: id, Rank: 0, Model: "m", MaxTokens: maxTokens, Path: "/v1/chat/completions", Raw: []byte(body),
		Prompt: prefix.Tokenize(prefix.RenderChat([]prefix.Message{{Role: "user", Content: prompt}})),
	}
}

func TestProxyAgainstSimWorker(t *testing.T) {
	up := simWorker(t)
	e := newProxy(t, proxy.Config{Upstreams: []string{up.URL()}})
	ctx := context.Background()
	prompt := "one two three four five six seven eight nine ten eleven twelve"

	first, err := e.Run(ctx, chatRequest("r1", prompt, 4), nil)
	if err != nil {
		t.Fatal(err)
	}
	if first.CompletionTokens != 4 || len(strings.Fields(first.Text)) != 4 || first.PromptTokens == 0 || first.CachedTokens != 0 || first.FinishReason == "" {
		t.Fatalf("first completion %+v", first)
	}
	// Streaming, same prompt: chunks arrive one by one and add up to the
	// text; the upstream's cached_tokens comes through.
	var chunks []string
	second, err := e.Run(ctx, chatRequest("r2", prompt, 4), func(c engine.Chunk) error {
		chunks = append(chunks, c.Text)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(chunks) != 4 || strings.Join(chunks, "") != second.Text || second.Text != first.Text {
		t.Fatalf("chunks %q, text %q, first %q", chunks, second.Text, first.Text)
	}
	if second.CachedTokens != second.PromptTokens/4*4 || second.CachedTokens == 0 {
		t.Fatalf("cached tokens %d of %d", second.CachedTokens, second.PromptTokens)
	}
	st := e.Stats()
	if len(st) != 1 || st[0].WindowLookupTokens != int64(first.PromptTokens+second.PromptTokens) || st[0].WindowHitTokens != int64(second.CachedTokens) || st[0].ActiveRequests != 0 {
		t.Fatalf("stats %+v", st)
	}

	// Completions endpoint, and a context-only run (one token + state).
	cmpl := engine.Request{ID: "r3", MaxTokens: 3, Path: "/v1/completions", Raw: []byte(`{"model":"m","prompt":"alpha beta gamma"}`), Prompt: prefix.Tokenize("alpha beta gamma")}
	c, err := e.Run(ctx, cmpl, nil)
	if err != nil || c.CompletionTokens != 3 || c.PromptTokens != 3 {
		t.Fatalf("completions: %+v %v", c, err)
	}
	// A context-only run is refused unless the emulation is asked for
	// (the generation upstream would prefill the prompt again).
	cmpl.Phase = engine.PhaseContextOnly
	if _, err := e.Run(ctx, cmpl, nil); !errors.Is(err, proxy.ErrNoDisaggregation) {
		t.Fatalf("context only without emulate_disaggregation: %v", err)
	}
	emu := newProxy(t, proxy.Config{Upstreams: []string{up.URL()}, EmulateDisaggregation: true})
	c, err = emu.Run(ctx, cmpl, nil)
	if err != nil || c.CompletionTokens != 1 || len(c.ContextState) == 0 {
		t.Fatalf("context only: %+v %v", c, err)
	}
}

func TestProxyUpstreamErrors(t *testing.T) {
	up := simWorker(t)
	ctx := context.Background()
	// 4xx from a real worker: its OpenAI error message comes through.
	e := newProxy(t, proxy.Config{Upstreams: []string{up.URL()}})
	req := chatRequest("r1", "hello", 2)
	req.Raw = []byte(`{"model":"unknown","messages":[{"role":"user","content":"hello"}]}`)
	_, err := e.Run(ctx, req, nil)
	var ue *proxy.UpstreamError
	if !errors.As(err, &ue) || ue.Status != 404 || !strings.Contains(ue.Message, `"unknown" does not exist`) {
		t.Fatalf("unknown model via proxy: %v", err)
	}

	cases := []struct {
		name    string
		handler http.HandlerFunc
		check   func(error) bool
	}{
		{"5xx", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(503)
			io.WriteString(w, `{"error":{"message":"overloaded"}}`)
		}, func(err error) bool { return errors.As(err, &ue) && ue.Status == 503 && ue.Message == "overloaded" }},
		{"non-JSON error", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(502)
			io.WriteString(w, "bad gateway")
		}, func(err error) bool { return errors.As(err, &ue) && ue.Status == 502 && ue.Message == "bad gateway" }},
		{"error event in stream", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"engine died\"}}\n\n")
		}, func(err error) bool { return errors.As(err, &ue) && ue.Status == 0 && ue.Message == "engine died" }},
		{"stream cut without DONE", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		}, func(err error) bool { return err != nil && strings.Contains(err.Error(), "without [DONE]") }},
		{"garbage chunk", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "data: {not json\n\n")
		}, func(err error) bool { return err != nil && strings.Contains(err.Error(), "bad stream chunk") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			e := newProxy(t, proxy.Config{Upstreams: []string{srv.URL}})
			_, err := e.Run(ctx, chatRequest("r", "hello", 2), nil)
			if !tc.check(err) {
				t.Fatalf("error %v", err)
			}
		})
	}
}

// blockingUpstream answers after release is closed (or the request ends),
// recording each request it saw.
type blockingUpstream struct {
	srv     *httptest.Server
	release chan struct{}
	mu      sync.Mutex
	bodies  []map[string]any
	headers []http.Header
	entered chan struct{}
}

func newBlockingUpstream(t *testing.T) *blockingUpstream {
	u := &blockingUpstream{release: make(chan struct{}), entered: make(chan struct{}, 16)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		u.mu.Lock()
		u.bodies = append(u.bodies, body)
		u.headers = append(u.headers, r.Header.Clone())
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		w.(http.Flusher).Flush()
		u.entered <- struct{}{}
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"done\"},\"finish_reason\":\"stop\"}]}\n\n")
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n")
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func TestProxyAccountingAndClose(t *testing.T) {
	up := newBlockingUpstream(t)
	e, err := proxy.New(proxy.Config{Upstreams: []string{up.srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	req := chatRequest("r1", "count my tokens please", 1)
	type result struct {
		c   engine.Completion
		err error
	}
	done := make(chan result, 2)
	go func() { c, err := e.Run(context.Background(), req, nil); done <- result{c, err} }()
	<-up.entered
	st := e.Stats()[0]
	// No token yet (the role chunk carries none): the whole prompt is
	// prefill ahead.
	if st.ActiveRequests != 1 || st.ActivePromptTokens != len(req.Prompt) || st.PrefillTokens != len(req.Prompt) {
		t.Fatalf("stats while running %+v (prompt %d tokens)", st, len(req.Prompt))
	}
	close(up.release)
	r := <-done
	if r.err != nil || r.c.CachedTokens != 8 || r.c.PromptTokens != 9 || r.c.Text != "done" || r.c.FinishReason != "stop" {
		t.Fatalf("completion %+v %v", r.c, r.err)
	}
	if st := e.Stats()[0]; st.ActiveRequests != 0 || st.ActivePromptTokens != 0 || st.PrefillTokens != 0 || st.WindowHitTokens != 8 {
		t.Fatalf("stats after %+v", st)
	}
	// Upstream body: streamed with usage, max_tokens set by the worker.
	body := up.bodies[0]
	if body["stream"] != true || body["max_tokens"] != float64(1) || body["stream_options"].(map[string]any)["include_usage"] != true {
		t.Fatalf("upstream body %v", body)
	}

	// Close cancels a running request.
	up2 := newBlockingUpstream(t)
	e2, err := proxy.New(proxy.Config{Upstreams: []string{up2.srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	go func() { c, err := e2.Run(context.Background(), req, nil); done <- result{c, err} }()
	<-up2.entered
	e2.Close()
	if r := <-done; !errors.Is(r.err, proxy.ErrClosed) {
		t.Fatalf("Run after Close = %v, want ErrClosed", r.err)
	}
	if _, err := e2.Run(context.Background(), req, nil); !errors.Is(err, proxy.ErrClosed) {
		t.Fatalf("Run on a closed engine = %v", err)
	}
	e.Close()
}

func TestProxyScrapesUpstreamMetrics(t *testing.T) {
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m",engine="0"} 3
vllm:num_requests_running{model_name="m",engine="0"} 2
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25
vllm:cache_config_info{block_size="16",num_gpu_blocks="1000",model_name="m"} 1
`)
	}))
	defer metrics.Close()
	e := newProxy(t, proxy.Config{Upstreams: []string{"http://127.0.0.1:1"}, MetricsURLs: []string{metrics.URL}, ScrapeInterval: 10 * time.Millisecond})
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := e.Stats()[0]
		if st.KVBlocksTotal == 1000 {
			if st.KVBlocksUsed != 250 || st.QueuedRequests != 3 {
				t.Fatalf("scraped stats %+v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics never scraped: %+v", st)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}

// A worker whose engine is the proxy: the upstream never sees the hint
// headers or internal body fields, and the trace continues upstream.
func TestWorkerWithProxyEngineSanitizesAndPropagates(t *testing.T) {
	up := newBlockingUpstream(t)
	close(up.release)
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	cfg := worker.DefaultConfig()
	cfg.InstanceID, cfg.Model = "front", "m"
	cfg.ServerRole = hintauth.RoleContext
	cfg.InternalRequestAuthKey = "front-key-0123456789abcdef"
	cfg.Engine.Type = "proxy"
	cfg.Engine.Upstreams = []string{up.srv.URL}
	cfg.TracerProvider = tp
	cfg.Logger = slog.New(slog.DiscardHandler)
	front, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := front.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer front.Close(context.Background())

	f := hintauth.Fields{Role: hintauth.RoleContext, Model: "m", ConversationID: "child-a", AffinityID: "parent-1", RequestType: hintauth.RequestAggregated}
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.2,
	  "conversation_params":{"conversation_id":"child-a"},"scheduling_params":{"subagent_affinity_id":"victim"},"subagent_affinity_id":"victim"}`
	req, _ := http.NewRequest(http.MethodPost, front.URL()+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set(hintauth.HeaderAffinityID, "parent-1")
	req.Header.Set(hintauth.HeaderAffinityAuth, hintauth.Sign([]byte(cfg.InternalRequestAuthKey), f))
	spanCtx, span := tp.Tracer("edge").Start(context.Background(), "edge")
	propagation.TraceContext{}.Inject(spanCtx, propagation.HeaderCarrier(req.Header))
	span.End()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(out), `"cached_tokens":8`) {
		t.Fatalf("front worker: %d %s", resp.StatusCode, out)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	got, hdr := up.bodies[0], up.headers[0]
	for _, k := range []string{"conversation_params", "scheduling_params", "subagent_affinity_id", "disaggregated_params"} {
		if _, ok := got[k]; ok {
			t.Errorf("upstream body carries internal field %q: %v", k, got)
		}
	}
	if got["temperature"] != 0.2 {
		t.Errorf("ordinary field lost: %v", got)
	}
	for k := range hdr {
		if strings.HasPrefix(strings.ToLower(k), "x-trtllm-") {
			t.Errorf("upstream saw header %s", k)
		}
	}
	tp2 := hdr.Get("traceparent")
	if !strings.Contains(tp2, span.SpanContext().TraceID().String()) {
		t.Errorf("upstream traceparent %q does not continue trace %s", tp2, span.SpanContext().TraceID())
	}
}

// An upstream's tool calls pass through the proxy, streamed piece by piece
// and whole in the completion; without max tokens from the worker the
// upstream bounds them by its own default (its context), so they come
// whole.
func TestProxyRelaysToolCalls(t *testing.T) {
	up := simWorker(t)
	e := newProxy(t, proxy.Config{Upstreams: []string{up.URL()}})
	body := `{"model":"m","messages":[{"role":"user","content":"call lookup"}],
	 "tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer","minimum":5}},"required":["query","limit"]}}}]}`
	req := engine.Request{ID: "t1", Path: "/v1/chat/completions", Raw: []byte(body),
		Prompt: prefix.Tokenize(prefix.RenderChat([]prefix.Message{{Role: "user", Content: "call lookup"}})),
		Output: &engine.OutputOptions{Tools: []engine.Tool{{Name: "lookup"}}}}
	var args strings.Builder
	var name string
	c, err := e.Run(context.Background(), req, func(ch engine.Chunk) error {
		if ch.ToolCall != nil {
			name += ch.ToolCall.Name
			args.WriteString(ch.ToolCall.Arguments)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.FinishReason != "tool_calls" || len(c.ToolCalls) != 1 || c.ToolCalls[0].Name != "lookup" || c.ToolCalls[0].ID == "" {
		t.Fatalf("completion %+v", c)
	}
	if name != "lookup" || args.String() != c.ToolCalls[0].Arguments || c.ToolCalls[0].Arguments != `{"query":"`+strings.Split(c.ToolCalls[0].Arguments, `"`)[3]+`","limit":5}` {
		t.Fatalf("streamed %s(%s), completion %+v", name, args.String(), c.ToolCalls)
	}
}
