package edge

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
)

// Prefill/decode disaggregation of vLLM and SGLang, driven by the edges: a
// deployment whose context_servers and generation_servers both name engine
// vllm (or both sglang) has prefill servers in the context fleet and decode
// servers in the generation fleet. Each fleet is routed with the decision
// every request takes (bindings in the log, sub-agents by their parent on
// the context fleet, KV-aware placement), each hop pinned to the key's
// data-parallel rank; what goes over the wire is the engine's own
// protocol: vLLM's KV connector handoff (pd_vllm.go) or SGLang's bootstrap
// rendezvous (pd_sglang.go).

// DefaultSGLangBootstrapPort is SGLang's --disaggregation-bootstrap-port
// default: a prefill server's bootstrap server, which decode servers dial.
const DefaultSGLangBootstrapPort = 8998

// pdEngine is the engine whose prefill/decode split the edge drives: vllm
// or sglang when both fleets name it, else "".
func (c *Config) pdEngine() EngineKind {
	k := c.ContextServers.Engine.Kind()
	if k.aggregatedOnly() && c.GenerationServers.Engine.Kind() == k {
		return k
	}
	return ""
}

// validatePDKeys checks the keys only a prefill/decode split takes:
// bootstrap_port names an SGLang prefill server's bootstrap port.
func (c *Config) validatePDKeys(key string, s *ServersConfig, bad complain) {
	sglangPrefill := s == &c.ContextServers && c.pdEngine() == EngineSGLang
	for i, si := range s.URLs {
		k := fmt.Sprintf("%s.urls[%d].bootstrap_port", key, i)
		switch {
		case si.BootstrapPort == 0:
		case !sglangPrefill:
			bad(k, "only for the prefill servers of an SGLang prefill/decode split (context_servers and generation_servers both engine: sglang)")
		case si.BootstrapPort < 0 || si.BootstrapPort > 65535:
			bad(k, "must be a port, 1..65535 (0: SGLang's default, %d), got %d", DefaultSGLangBootstrapPort, si.BootstrapPort)
		}
	}
}

// validatePD checks a prefill/decode split of engine kind: both fleets
// list their servers and conditional disaggregation (a trtllm-serve
// feature) is off.
func (c *Config) validatePD(key string, s *ServersConfig, kind EngineKind, bad complain) {
	if len(s.URLs) == 0 {
		what := "prefill"
		if s == &c.GenerationServers {
			what = "decode"
		}
		bad(key+".urls", "a %s prefill/decode split needs its %s servers' URLs (they do not register over NATS)", kind, what)
	}
	if s == &c.ContextServers && c.ConditionalDisagg.MaxLocalPrefillLength > 0 {
		bad("conditional_disagg_config", "does not apply to a %s prefill/decode split (every request is prefilled on the context fleet)", kind)
	}
}

// bootstrapPort is the bootstrap port of SGLang prefill instance id, in
// whichever model's context fleet lists it.
func (e *Edge) bootstrapPort(id string) int {
	for _, m := range e.models {
		for _, si := range m.cfg.ContextServers.URLs {
			if si.ID() == id && si.BootstrapPort > 0 {
				return si.BootstrapPort
			}
		}
	}
	return DefaultSGLangBootstrapPort
}

// dispatchPD serves a request through the engines' prefill/decode split.
func (e *Edge) dispatchPD(ctx context.Context, w http.ResponseWriter, rq *request, span trace.Span) int {
	kind := rq.m.cfg.pdEngine()
	span.SetAttributes(attribute.String("tether.engine", string(kind)))
	if kind == EngineSGLang {
		return e.dispatchSGLangPD(ctx, w, rq, span)
	}
	return e.dispatchVLLMPD(ctx, w, rq, span)
}

// pdDialect is what the split needs to know of one API (a request path):
// how to ask a prefill server for the prompt's prefill alone, and how to
// read a non-streamed answer. Chat and completions share openAIDialect;
// another API (the Responses or Messages API, where an engine serves it
// disaggregated) adds its own to pdDialects.
type pdDialect interface {
	// prefillFields are the fields set on, and removed from, the
	// client's body for a request that produces one token, not
	// streamed.
	prefillFields(rq *request) (set map[string]json.RawMessage, del []string)
	// readAnswer reads a non-streamed answer.
	readAnswer(b []byte) (*pdAnswer, error)
}

var pdDialects = map[string]pdDialect{
	"/v1/chat/completions": openAIDialect{},
	"/v1/completions":      openAIDialect{},
}

// pdAnswer is a non-streamed answer as the split reads it.
type pdAnswer struct {
	raw          map[string]json.RawMessage
	choices      int
	finish, text string
	usage        usageFigures
}

// openAIDialect is chat completions and completions.
type openAIDialect struct{}

// prefillFields: the request as the client sent it, for one token and not
// streamed (toy_proxy_server.py send_request_to_service: max_tokens 1,
// max_completion_tokens 1 when given, stream false, no stream_options;
// min_tokens and min_completion_tokens, which a one-token request cannot
// honour, left out).
func (openAIDialect) prefillFields(rq *request) (map[string]json.RawMessage, []string) {
	set := map[string]json.RawMessage{"max_tokens": json.RawMessage("1"), "stream": json.RawMessage("false")}
	if _, ok := rq.top["max_completion_tokens"]; ok {
		set["max_completion_tokens"] = json.RawMessage("1")
	}
	return set, []string{"stream_options", "min_tokens", "min_completion_tokens"}
}

func (openAIDialect) readAnswer(b []byte) (*pdAnswer, error) {
	a := &pdAnswer{}
	if err := json.Unmarshal(b, &a.raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	var body struct {
		Choices []struct {
			Message      *struct{ Content *string } `json:"message"`
			Text         *string                    `json:"text"`
			FinishReason *string                    `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, fmt.Errorf("unexpected shape: %w", err)
	}
	a.choices = len(body.Choices)
	if len(body.Choices) > 0 {
		c := body.Choices[0]
		if c.FinishReason != nil {
			a.finish = *c.FinishReason
		}
		switch {
		case c.Message != nil && c.Message.Content != nil:
			a.text = *c.Message.Content
		case c.Text != nil:
			a.text = *c.Text
		}
	}
	a.usage = readUsage(b)
	return a, nil
}

// pdAttempt is one attempt of a hop: the server's 200 response (body
// open; done ends the dispatch accounting), or why there is none.
type pdAttempt struct {
	resp *http.Response
	done func()
	fail *hopFailure
	// unreachable: no answer came (a connection error): the instance is
	// gone or not listening, and nothing it held can be used.
	unreachable bool
	// status is the server's answer when it was not 200.
	status int
}

// retryable: the attempt failed the instance's way (no answer, or a 5xx),
// not the client's (4xx) or by cancellation.
func (a *pdAttempt) retryable() bool { return a.unreachable || a.status >= 500 }

// pdSend sends one attempt of a hop to h.
func (e *Edge) pdSend(ctx context.Context, rq *request, h *hop, phase string, body []byte, hdr http.Header) pdAttempt {
	hctx, span := e.tracing.tracer.Start(ctx, "tether.edge "+phase+" hop", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrInstance.String(h.Instance), attrFleet.String(h.Fleet.String())))
	defer span.End()
	traceProp.Inject(hctx, propagation.HeaderCarrier(hdr))
	done := e.fleet.NoteDispatch(h.Instance, rq.promptTokens)
	resp, err := e.post(hctx, h.URL+rq.path, body, hdr)
	if err != nil {
		done()
		if ctx.Err() != nil {
			return pdAttempt{fail: &hopFailure{err: newAPIError(statusClientClosed, "server_error", "cancelled", "", "request cancelled: %v", ctx.Err())}}
		}
		span.SetStatus(codes.Error, "hop failed")
		e.metrics.upstreamErrors.WithLabelValues(h.Fleet.String(), "connect").Inc()
		return pdAttempt{unreachable: true, fail: &hopFailure{err: newAPIError(http.StatusBadGateway, "server_error", "upstream_unavailable", "",
			"%s instance %s (%s) failed: %v", h.Fleet, h.Instance, h.URL, err)}}
	}
	span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	if resp.StatusCode == http.StatusOK {
		return pdAttempt{resp: resp, done: done}
	}
	done()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode >= 500 {
		span.SetStatus(codes.Error, "hop failed")
		e.metrics.upstreamErrors.WithLabelValues(h.Fleet.String(), "status_5xx").Inc()
	}
	return pdAttempt{status: resp.StatusCode, fail: &hopFailure{pass: &upstreamAnswer{status: resp.StatusCode, header: resp.Header, body: b}}}
}

// pdHeader is a hop's headers: the id both hops of one handoff share
// (vLLM's X-Request-Id, which the toy proxy sends to both servers) and the
// data-parallel rank (-1: none).
func pdHeader(requestID string, rank int) http.Header {
	hdr := make(http.Header, 4)
	hdr.Set("Content-Type", "application/json")
	hdr.Set("X-Request-Id", requestID)
	if rank >= 0 {
		hdr.Set(HeaderDataParallelRank, strconv.Itoa(rank))
	}
	return hdr
}

// pdRetry moves a failed hop to another instance when retries are left
// (max_retries counts every retry of the request, on either fleet): a
// bound key overflows (recorded as unhealthy), an unbound request is
// placed again.
func (e *Edge) pdRetry(ctx context.Context, rq *request, h **hop, retries *int) bool {
	if *retries <= 0 {
		return false
	}
	next, aerr := e.reroute(ctx, rq, *h)
	if aerr != nil {
		return false
	}
	*retries--
	e.metrics.retries.WithLabelValues((*h).Fleet.String()).Inc()
	e.log.Info("retrying a failed hop on another instance", "fleet", (*h).Fleet, "from", (*h).Instance, "to", next.Instance)
	*h = next
	return true
}

// maxStreamPeek bounds what the edge reads of a decode stream before the
// first generated event (a role chunk is a few hundred bytes).
const maxStreamPeek = 64 << 10

// errStreamFailed is a decode stream that failed before its first token.
var errStreamFailed = errors.New("the decode stream failed before its first token")

// peekStream reads a decode's SSE stream up to its first generated event.
// An error event (both engines stream a failed request as 200 with
// {"error": ...}, vLLM after the role chunk) or the stream's end before
// any token means the decode failed before the client saw anything, so the
// handoff can still be retried; what was read is put back in front of the
// body for the relay.
func peekStream(resp *http.Response) error {
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	var buf bytes.Buffer
	for buf.Len() < maxStreamPeek {
		line, err := br.ReadBytes('\n')
		buf.Write(line)
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if bytes.Equal(data, []byte("[DONE]")) {
				break
			}
			switch streamEvent(data) {
			case eventError:
				return fmt.Errorf("%w: %s", errStreamFailed, truncate(string(data), 300))
			case eventOutput:
				resp.Body = readCloser{io.MultiReader(&buf, br), resp.Body}
				return nil
			}
		}
		if err != nil {
			return fmt.Errorf("%w: %v", errStreamFailed, err)
		}
	}
	resp.Body = readCloser{io.MultiReader(&buf, br), resp.Body}
	return nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

const (
	eventOther = iota
	eventOutput
	eventError
)

// streamEvent classifies one SSE data payload: an error, an event carrying
// output (content, text, tool calls, a finish reason or the usage), or
// another (a role chunk).
func streamEvent(data []byte) int {
	var ev struct {
		Error   json.RawMessage `json:"error"`
		Object  string          `json:"object"`
		Usage   json.RawMessage `json:"usage"`
		Choices []struct {
			Text         string          `json:"text"`
			FinishReason json.RawMessage `json:"finish_reason"`
			Delta        *struct {
				Content   *string         `json:"content"`
				ToolCalls json.RawMessage `json:"tool_calls"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return eventOther
	}
	if !isNullOrAbsent(ev.Error) || ev.Object == "error" {
		return eventError
	}
	if !isNullOrAbsent(ev.Usage) {
		return eventOutput
	}
	for _, c := range ev.Choices {
		if c.Text != "" || !isNullOrAbsent(c.FinishReason) {
			return eventOutput
		}
		if d := c.Delta; d != nil && ((d.Content != nil && *d.Content != "") || (!isNullOrAbsent(d.ToolCalls) && string(d.ToolCalls) != "[]")) {
			return eventOutput
		}
	}
	return eventOther
}

// prefilled records what a prefill hop taught the edge: its usage feeds
// the instance's cache breaker and the shadow of its cache, and the rank
// the edge chose joins the binding in the log. It returns the cached
// tokens to report to the client (-1: the prefill reported none).
func (e *Edge) prefilled(rq *request, h *hop, rank int, u usageFigures) int {
	u = e.engineUsage(h.Instance, u)
	e.shadowRoute(rq, h, rank)
	if rank >= 0 {
		e.recordEngineRank(h, rank)
	}
	if !u.ok || !u.hasCached {
		return -1
	}
	e.fleet.RecordUsage(h.Instance, int64(u.prompt), int64(u.cached), e.now())
	e.shadowCorrect(rq, h, u.cached)
	return u.cached
}

// relayDecode relays the decode's answer: the ranks the edge chose in the
// route headers, the prefill's cached tokens in the usage (the prompt was
// or was not recomputed there; -1: the prefill reported none, and the
// client gets none either).
func (e *Edge) relayDecode(w http.ResponseWriter, rq *request, resp *http.Response, ctxHop *hop, ctxRank, cached int, genHop *hop, genRank int, span trace.Span) int {
	resp.Header.Del(HeaderADPRank)
	if genRank >= 0 {
		// The engines do not name their rank: relay the one the edge chose.
		resp.Header.Set(HeaderADPRank, strconv.Itoa(genRank))
	}
	cres := &contextResult{cachedTokens: cached, nullCached: cached < 0}
	if ctxRank >= 0 {
		cres.rank = strconv.Itoa(ctxRank)
	}
	if genRank >= 0 {
		e.recordEngineRank(genHop, genRank)
	}
	return e.relay(w, rq, resp, ctxHop, cres, genHop, span)
}

// pdBatch is the number of prompts a request generates for (n > 1, or a
// completions prompt that is a list of prompts); 0 for one.
func pdBatch(rq *request) int {
	var n int
	if raw, ok := rq.top["n"]; ok && json.Unmarshal(raw, &n) == nil && n > 1 {
		return n
	}
	if rq.dialect != apireq.Completions {
		return 0
	}
	var prompts []json.RawMessage
	if raw, ok := rq.top["prompt"]; ok && json.Unmarshal(raw, &prompts) == nil && len(prompts) > 0 {
		// A list of token ids is one prompt; a list of strings or of
		// token-id lists is a batch.
		if b := bytes.TrimSpace(prompts[0]); len(b) > 0 && (b[0] == '"' || b[0] == '[') {
			return len(prompts)
		}
	}
	return 0
}

// hopRank is the data-parallel rank of h's key in fleet f of c (-1: none).
func hopRank(c *Config, h *hop, f fsm.Fleet) int { return engineRank(h, c.dataParallelSize(f)) }
