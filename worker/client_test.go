package worker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/workertest"
)

// The official OpenAI Go client talks to the worker, streaming and not.
func TestOpenAIClient(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	hc := testClient(t)
	client := openai.NewClient(option.WithBaseURL(s.URL()+"/v1/"), option.WithAPIKey("unused"), option.WithHTTPClient(hc), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	params := openai.ChatCompletionNewParams{
		Model:     "test-model",
		MaxTokens: openai.Int(6),
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("you are a sub-agent"),
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
	if chunks < 6 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content != comp.Choices[0].Message.Content {
		t.Fatalf("streamed %d chunks, content %q; non-streaming gave %q", chunks, acc.Choices[0].Message.Content, comp.Choices[0].Message.Content)
	}
	// Same conversation, same prompt: the second run hit the cache.
	if acc.Usage.PromptTokensDetails.CachedTokens == 0 || acc.Usage.CompletionTokens != 6 {
		t.Fatalf("streamed usage %+v", acc.Usage)
	}

	// An API error surfaces as the client's typed error.
	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "nope", Messages: params.Messages})
	var apiErr *openai.Error
	if !errorsAs(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("unknown model error = %v", err)
	}
}

// The context phase on one worker, the generation phase on another, each
// with a verified sub-agent hint for its own role.
func TestContextThenGenerationOnTwoWorkers(t *testing.T) {
	ctxCfg := testConfig("ctx-0")
	ctxCfg.ServerRole = hintauth.RoleContext
	genCfg := testConfig("gen-0")
	genCfg.Fleet, genCfg.ServerRole = telemetry.FleetGeneration, hintauth.RoleGeneration
	ctxW, genW := workertest.Start(t, New, ctxCfg), workertest.Start(t, New, genCfg)
	c := testClient(t)
	prompt := longPrompt("ctx", 30)

	r := post(t, c, ctxW.URL()+"/v1/chat/completions",
		chatBody(prompt, `"stream":true,"max_tokens":50,"disaggregated_params":{"request_type":"context_only","disagg_request_id":4242}`),
		signedChild("child-a", "parent-1", hintauth.RoleContext, hintauth.RequestContextOnly, "4242"))
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
		t.Fatalf("context phase: %d %s %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	// TensorRT-LLM's shape: the handoff is choices[0].disaggregated_params,
	// and the prompt's tokens are prompt_token_ids.
	var ctxResp struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
			DP      struct {
				RequestType        string          `json:"request_type"`
				CtxRequestID       json.RawMessage `json:"ctx_request_id"`
				DisaggRequestID    json.RawMessage `json:"disagg_request_id"`
				EncodedOpaqueState string          `json:"encoded_opaque_state"`
				FirstGenTokens     []int64         `json:"first_gen_tokens"`
			} `json:"disaggregated_params"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		PromptTokenIDs []int64         `json:"prompt_token_ids"`
		TopDP          json.RawMessage `json:"disaggregated_params"`
	}
	if err := json.Unmarshal(r.body, &ctxResp); err != nil || len(ctxResp.Choices) != 1 {
		t.Fatalf("%v: %s", err, r.body)
	}
	dp := ctxResp.Choices[0].DP
	if dp.RequestType != "context_only" || string(dp.DisaggRequestID) != "4242" || len(dp.CtxRequestID) == 0 ||
		dp.EncodedOpaqueState == "" || len(dp.FirstGenTokens) != 1 || ctxResp.Usage.CompletionTokens != 1 ||
		len(ctxResp.PromptTokenIDs) == 0 || ctxResp.TopDP != nil {
		t.Fatalf("context response: %s", r.body)
	}
	if _, err := base64.StdEncoding.DecodeString(dp.EncodedOpaqueState); err != nil {
		t.Fatalf("opaque state not base64: %v", err)
	}
	first := ctxResp.Choices[0].Message.Content

	state := strconv.Quote(dp.EncodedOpaqueState)
	genBody := chatBody(prompt, `"stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"disaggregated_params":{"request_type":"generation_only","disagg_request_id":4242,"ctx_request_id":`+string(dp.CtxRequestID)+`,"encoded_opaque_state":`+state+`,"schedule_style":"context_first","ctx_usage":{"prompt_tokens":3}}`)
	genHdr := signedChild("child-a", "parent-1", hintauth.RoleGeneration, hintauth.RequestGenerationOnly, "4242")
	// The KV-transfer fields are signed (x-trtllm-disagg-auth): unsigned
	// or tampered, the generation worker refuses them.
	if g := post(t, c, genW.URL()+"/v1/chat/completions", genBody, genHdr); g.status != 403 || !strings.Contains(string(g.body), "invalid_disagg_auth") {
		t.Fatalf("unsigned handoff: %d %s", g.status, g.body)
	}
	genHdr[hintauth.HeaderDisaggAuth], _ = hintauth.SignDisagg([]byte(testKey), nil, json.RawMessage(`"tampered"`))
	if g := post(t, c, genW.URL()+"/v1/chat/completions", genBody, genHdr); g.status != 403 {
		t.Fatalf("handoff signed for another state: %d %s", g.status, g.body)
	}
	genHdr[hintauth.HeaderDisaggAuth], _ = hintauth.SignDisagg([]byte(testKey), nil, json.RawMessage(state))
	g := post(t, c, genW.URL()+"/v1/chat/completions", genBody, genHdr)
	if g.status != 200 {
		t.Fatalf("generation phase: %d %s", g.status, g.body)
	}
	var text strings.Builder
	var usage map[string]any
	for _, ev := range sseEvents(t, g.body) {
		if ev == "[DONE]" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(ev), &m); err != nil {
			t.Fatal(err)
		}
		for _, ch := range m["choices"].([]any) {
			if d, ok := ch.(map[string]any)["delta"].(map[string]any); ok {
				if s, ok := d["content"].(string); ok {
					text.WriteString(s)
				}
			}
		}
		if u, ok := m["usage"].(map[string]any); ok {
			usage = u
		}
	}
	words := strings.Fields(text.String())
	if len(words) != 5 || words[0] != first {
		t.Fatalf("generation output %q does not continue from the context token %q", text.String(), first)
	}
	if usage == nil || num(t, usage["completion_tokens"]) != 5 {
		t.Fatalf("generation usage %v", usage)
	}
	// The context worker's signature does not verify on the generation worker.
	bad := post(t, c, genW.URL()+"/v1/chat/completions", genBody,
		signedChild("child-a", "parent-1", hintauth.RoleContext, hintauth.RequestGenerationOnly, "4242"))
	if bad.status != 403 {
		t.Fatalf("context-role signature on the generation worker: %d %s", bad.status, bad.body)
	}
}

// The worker continues the edge's trace: its server span is a child of the
// incoming traceparent and carries rank, phase and cached tokens.
func TestServerSpanContinuesIncomingTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg := testConfig("w-trace")
	cfg.TracerProvider = tp
	s := workertest.Start(t, New, cfg)

	edgeCtx, edgeSpan := tp.Tracer("edge").Start(context.Background(), "edge request")
	hdr := map[string]string{"x-session-id": "traced-conv"}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(edgeCtx, carrier)
	for k, v := range carrier {
		hdr[k] = v
	}
	body := chatBody(longPrompt("trace", 20), `"max_tokens":2`)
	post(t, testClient(t), s.URL()+"/v1/chat/completions", body, hdr)
	r := post(t, testClient(t), s.URL()+"/v1/chat/completions", body, hdr)
	edgeSpan.End()
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var server []sdktrace.ReadOnlySpan
	for _, sp := range rec.Ended() {
		if sp.SpanKind() == trace.SpanKindServer {
			server = append(server, sp)
		}
	}
	if len(server) != 2 {
		t.Fatalf("%d server spans, want 2", len(server))
	}
	sp := server[1]
	if sp.SpanContext().TraceID() != edgeSpan.SpanContext().TraceID() || sp.Parent().SpanID() != edgeSpan.SpanContext().SpanID() {
		t.Fatalf("worker span trace %s parent %s; edge trace %s span %s", sp.SpanContext().TraceID(), sp.Parent().SpanID(),
			edgeSpan.SpanContext().TraceID(), edgeSpan.SpanContext().SpanID())
	}
	attrs := map[string]string{}
	for _, kv := range sp.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if attrs["tether.rank"] != r.header.Get(HeaderADPRank) || attrs["tether.phase"] != "aggregated" ||
		attrs["tether.cached_tokens"] == "" || attrs["tether.cached_tokens"] == "0" || attrs["tether.instance"] != "w-trace" {
		t.Fatalf("span attributes %v", attrs)
	}
}
