package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/test/waitfor"
)

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// The official OpenAI Go client talks to an edge of `tether dev`, streaming
// and not, with x-session-id (and the parent header) set through its
// request options; the conversation sticks to one context instance and the
// second call reports the first call's prompt as cached.
func TestOpenAIClientThroughTetherDev(t *testing.T) {
	p := startDev(t)
	hc := p.client(t)
	client := openai.NewClient(option.WithBaseURL(p.edge(0)+"/v1/"), option.WithAPIKey("unused"),
		option.WithHTTPClient(hc), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	params := openai.ChatCompletionNewParams{
		Model:     devstack.DefaultModel,
		MaxTokens: openai.Int(6),
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("You are an Explore sub-agent. " + words("sdk-tools", 300)),
			openai.UserMessage("list the files in the repository root"),
		},
	}
	session := []option.RequestOption{
		option.WithHeader("x-session-id", "sdk-child"),
		option.WithHeader(devstack.ParentHeader, "sdk-parent"),
	}

	var first *http.Response
	comp, err := client.Chat.Completions.New(ctx, params, append(session, option.WithResponseInto(&first))...)
	if err != nil {
		t.Fatalf("non-streaming: %v", err)
	}
	if len(comp.Choices) != 1 || comp.Choices[0].Message.Content == "" || comp.Usage.CompletionTokens != 6 || comp.Usage.PromptTokens < 300 {
		t.Fatalf("non-streaming completion: %+v", comp)
	}
	var tr1 turn
	if err := parseRoute(first.Header.Get(edge.HeaderRoute), &tr1); err != nil {
		t.Fatal(err)
	}
	// Another edge serves the binding from its own replica (the admin read
	// is local, not linearizable): it shows once that edge applied the Bind.
	waitfor.Reason(t, 10*time.Second, "edge 2 to show the parent's binding", func() string {
		b, ok := adminBinding(t, hc, p.edge(1), p.token, "context", "sdk-parent")
		if !ok || b.Instance != tr1.ctxInst {
			return fmt.Sprintf("context binding of the parent key = %+v (found %v), want %s", b, ok, tr1.ctxInst)
		}
		return ""
	})

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	var second *http.Response
	stream := client.Chat.Completions.NewStreaming(ctx, params, append(session, option.WithResponseInto(&second))...)
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
	if chunks < 6 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" || acc.Usage.CompletionTokens != 6 {
		t.Fatalf("streamed %d chunks: %+v", chunks, acc.ChatCompletion)
	}
	var tr2 turn
	if second == nil {
		t.Fatal("no HTTP response recorded for the stream")
	}
	if err := parseRoute(second.Header.Get(edge.HeaderRoute), &tr2); err != nil {
		t.Fatal(err)
	}
	if tr2.ctxInst != tr1.ctxInst {
		t.Fatalf("the stream went to %s, the first call to %s", tr2.ctxInst, tr1.ctxInst)
	}
	want := comp.Usage.PromptTokens / blockSize * blockSize
	if got := acc.Usage.PromptTokensDetails.CachedTokens; got < want || got%blockSize != 0 {
		t.Fatalf("streamed call: cached_tokens %d, want whole blocks >= %d (the same %d-token prompt ran before)", got, want, comp.Usage.PromptTokens)
	}

	// An API error surfaces as the client's typed error (a 404 is never
	// retried). Under load this call used to meet a closed connection or
	// "connection refused": a write inside tether dev to a connection its
	// peer had closed (EPIPE) raised SIGPIPE, which stopped tether dev
	// (cmd/tether TestSocketBrokenPipeDoesNotStop).
	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "no-such-model", Messages: params.Messages}, session...)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Fatalf("unknown model: %v\ntether dev stdout:\n%s\nstderr:\n%s", err, tail(p.output(), 10), tail(p.stderr.String(), 40))
	}
	p.stop(t)
}
