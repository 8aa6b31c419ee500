// Package proxy is the engine that forwards each ADP rank's requests to an
// upstream OpenAI-compatible server (vLLM, trtllm-serve, SGLang, or another
// tether worker), so a tether worker can front real inference servers with
// its scheduling, hint verification and telemetry.
//
// Each request's (already sanitized) body is POSTed to the rank's upstream
// at the same API path, always as a stream with usage included, so chunks
// flow back as they are produced and the upstream's
// usage.prompt_tokens_details.cached_tokens, when reported, becomes the
// completion's CachedTokens. Stats come from the proxy's own accounting
// (requests in flight, prompt tokens, rolling cache lookups/hits) plus,
// when a metrics URL is configured for the rank, the upstream's Prometheus
// gauges (KV usage, waiting requests), scraped in the background.
//
// With Config.KVEvents the proxy also reads the upstreams' KV cache events
// (vLLM/SGLang ZeroMQ, trtllm-serve /kv_cache_events: worker/kvevents) and
// reports them as tether block keys to the KV event sink, so edges learn
// what each rank's cache holds as they do for the simulated engine.
//
// Disaggregation through a proxy is emulated, and only with
// Config.EmulateDisaggregation (engine.emulate_disaggregation): a
// context-only run asks the upstream for one token and returns that token
// as the opaque context state; a generation-only run is an ordinary
// upstream request, so a generation upstream other than the context's
// computes the whole prompt again (no KV cache moves between them).
// Without it a proxy worker serves whole requests only and refuses the
// phases (ErrNoDisaggregation): put real engines behind the edges directly
// (docs/engines.md) for their own disaggregation.
package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/httpjson"
	"github.com/tether-project/tether/worker/engine"
)

// Config configures the proxy engine.
type Config struct {
	// Upstreams is one base URL per rank (scheme://host:port[/prefix]);
	// the request path (/v1/chat/completions, /v1/completions) is appended.
	Upstreams []string
	// MetricsURLs optionally gives one Prometheus endpoint per rank.
	MetricsURLs []string
	// Timeout bounds one upstream request (default 10 minutes).
	Timeout time.Duration
	// BlockSize converts the upstream's KV token usage to blocks (default 64).
	BlockSize int
	// StatsWindow is the rolling window of cache lookups/hits (default 60 s).
	StatsWindow time.Duration
	// ScrapeInterval is how often upstream metrics are read (default 2 s).
	ScrapeInterval time.Duration
	// Client is the HTTP client (default: a pooled client with dial and
	// header timeouts).
	Client *http.Client
	// EmulateDisaggregation lets context-only and generation-only requests
	// through, emulated (the package comment says how: the prompt is
	// prefilled on both sides).
	EmulateDisaggregation bool
	// KVEvents, when set, reads the upstreams' KV cache events
	// (worker/kvevents) and reports them, keyed as tether block keys,
	// to the KV event sink.
	KVEvents *enginekv.Config
}

// UpstreamError is an upstream's non-2xx answer (or an error event in its
// stream).
type UpstreamError struct {
	Rank    int
	URL     string
	Status  int    // HTTP status; 0 for an error event inside a stream
	Message string // the upstream's error message, if it sent OpenAI error JSON
}

func (e *UpstreamError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("proxy: rank %d upstream %s: error in stream: %s", e.Rank, e.URL, e.Message)
	}
	return fmt.Sprintf("proxy: rank %d upstream %s: HTTP %d: %s", e.Rank, e.URL, e.Status, e.Message)
}

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("proxy: engine closed")

// ErrNoDisaggregation refuses a context-only or generation-only request to
// a proxy without engine.emulate_disaggregation.
var ErrNoDisaggregation = errors.New("proxy: this worker serves whole requests only: disaggregated phases through a proxy are emulated " +
	"(the generation upstream prefills the prompt again) and off unless engine.emulate_disaggregation is true")

// Engine is the proxy engine.
type Engine struct {
	cfg    Config
	client *http.Client
	ranks  []*rankState
	closed chan struct{}
	life   context.Context // cancelled by Close
	stop   context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	kvMu     sync.Mutex
	kvSource *enginekv.Source // started by SetKVEventSink
}

type rankState struct {
	upstream string
	metrics  string
	active   atomic.Int64
	tokens   atomic.Int64
	// prefill is the prompt tokens of requests awaiting their first token
	// (queued in the engine or in prefill).
	prefill   atomic.Int64
	window    *hitWindow
	upstreamM atomic.Pointer[upstreamMetrics]
}

var _ engine.Engine = (*Engine)(nil)

// New validates cfg and starts the metrics scrapers (if any).
func New(cfg Config) (*Engine, error) {
	if len(cfg.Upstreams) == 0 {
		return nil, errors.New("proxy: no upstreams")
	}
	if len(cfg.MetricsURLs) != 0 && len(cfg.MetricsURLs) != len(cfg.Upstreams) {
		return nil, fmt.Errorf("proxy: %d metrics URLs for %d upstreams (want one per rank, or none)", len(cfg.MetricsURLs), len(cfg.Upstreams))
	}
	if cfg.KVEvents != nil {
		k := *cfg.KVEvents
		k.Ranks = len(cfg.Upstreams)
		if k.BlockSize <= 0 {
			k.BlockSize = max(cfg.BlockSize, 0)
			if k.BlockSize == 0 {
				k.BlockSize = 64
			}
		}
		if err := k.Validate(); err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		cfg.KVEvents = &k
	}
	for i, u := range append(append([]string(nil), cfg.Upstreams...), cfg.MetricsURLs...) {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return nil, fmt.Errorf("proxy: URL %d %q is not an absolute http(s) URL", i, u)
		}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Minute
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = 64
	}
	if cfg.StatsWindow <= 0 {
		cfg.StatsWindow = 60 * time.Second
	}
	if cfg.ScrapeInterval <= 0 {
		cfg.ScrapeInterval = 2 * time.Second
	}
	e := &Engine{cfg: cfg, client: cfg.Client, closed: make(chan struct{})}
	if e.client == nil {
		e.client = &http.Client{Transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: cfg.Timeout,
			ForceAttemptHTTP2:     true,
		}}
	}
	for i, u := range cfg.Upstreams {
		rs := &rankState{upstream: strings.TrimRight(u, "/"), window: newHitWindow(cfg.StatsWindow, 60)}
		if len(cfg.MetricsURLs) > 0 {
			rs.metrics = cfg.MetricsURLs[i]
		}
		e.ranks = append(e.ranks, rs)
	}
	e.life, e.stop = context.WithCancel(context.Background())
	for _, rs := range e.ranks {
		if rs.metrics != "" {
			e.wg.Add(1)
			go e.scrapeLoop(e.life, rs)
		}
	}
	return e, nil
}

// SetKVEventSink starts reading the upstreams' KV cache events when
// Config.KVEvents is set (the first non-nil sink wins; later calls change
// nothing). Without it the proxy cannot see the upstreams' caches and
// reports no KV events.
func (e *Engine) SetKVEventSink(fn func(engine.KVEvent)) {
	if fn == nil || e.cfg.KVEvents == nil {
		return
	}
	e.kvMu.Lock()
	defer e.kvMu.Unlock()
	if e.kvSource != nil || e.isClosed() {
		return
	}
	src, err := enginekv.Start(*e.cfg.KVEvents, func(k enginekv.RankKeys) {
		// The workers' KV batches carry the GPU tier only.
		if len(k.Stored)+len(k.Removed) == 0 {
			return
		}
		fn(engine.KVEvent{Rank: k.Rank, Stored: k.Stored, Removed: k.Removed})
	})
	if err != nil { // validated in New: cannot happen
		return
	}
	e.kvSource = src
}

// KVEventStatus reports, per rank, what the KV event source knows (nil
// without one).
func (e *Engine) KVEventStatus() []enginekv.RankStatus {
	e.kvMu.Lock()
	defer e.kvMu.Unlock()
	if e.kvSource == nil {
		return nil
	}
	return e.kvSource.Status()
}

// Close stops the scrapers; running requests are cancelled and later Runs
// fail with ErrClosed.
func (e *Engine) Close() error {
	e.once.Do(func() {
		close(e.closed)
		e.stop()
		e.wg.Wait()
		e.kvMu.Lock()
		if e.kvSource != nil {
			e.kvSource.Close()
		}
		e.kvMu.Unlock()
		if t, ok := e.client.Transport.(*http.Transport); ok && e.cfg.Client == nil {
			t.CloseIdleConnections()
		}
	})
	return nil
}

// Stats reports the proxy's own accounting plus scraped upstream gauges.
func (e *Engine) Stats() []engine.RankStats {
	now := time.Now()
	out := make([]engine.RankStats, len(e.ranks))
	for i, rs := range e.ranks {
		lookup, hit := rs.window.sum(now)
		st := engine.RankStats{
			Rank:               i,
			ActivePromptTokens: int(rs.tokens.Load()),
			ActiveRequests:     int(rs.active.Load()),
			PrefillTokens:      prefillEstimate(rs.prefill.Load(), lookup, hit),
			WindowLookupTokens: lookup,
			WindowHitTokens:    hit,
		}
		if m := rs.upstreamM.Load(); m != nil {
			st.QueuedRequests = m.waiting
			st.KVBlocksTotal = m.blocksTotal
			st.KVBlocksUsed = m.blocksUsed
		}
		out[i] = st
	}
	return out
}

// Run forwards req to its rank's upstream.
func (e *Engine) Run(ctx context.Context, req engine.Request, emit func(engine.Chunk) error) (engine.Completion, error) {
	select {
	case <-e.closed:
		return engine.Completion{}, ErrClosed
	default:
	}
	if req.Rank < 0 || req.Rank >= len(e.ranks) {
		return engine.Completion{}, fmt.Errorf("proxy: request %s: rank %d, the proxy has ranks 0..%d", req.ID, req.Rank, len(e.ranks)-1)
	}
	if req.Path != "/v1/chat/completions" && req.Path != "/v1/completions" {
		return engine.Completion{}, fmt.Errorf("proxy: request %s: unsupported path %q", req.ID, req.Path)
	}
	if req.Phase != engine.PhaseAggregated && !e.cfg.EmulateDisaggregation {
		return engine.Completion{}, fmt.Errorf("proxy: request %s (%s): %w", req.ID, req.Phase, ErrNoDisaggregation)
	}
	rs := e.ranks[req.Rank]
	body, err := upstreamBody(req)
	if err != nil {
		return engine.Completion{}, fmt.Errorf("proxy: request %s: %w", req.ID, err)
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	// Close cancels running requests.
	defer context.AfterFunc(e.life, cancel)()

	rs.active.Add(1)
	rs.tokens.Add(int64(len(req.Prompt)))
	defer func() {
		rs.active.Add(-1)
		rs.tokens.Add(-int64(len(req.Prompt)))
	}()
	emit, firstToken := rs.awaitFirstToken(len(req.Prompt), emit)
	defer firstToken()

	target := rs.upstream + req.Path
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return engine.Completion{}, fmt.Errorf("proxy: request %s: %w", req.ID, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	hreq.Header.Set("X-Request-Id", req.ID)
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(hreq.Header))
	start := time.Now()
	resp, err := e.client.Do(hreq)
	if err != nil {
		if e.isClosed() {
			return engine.Completion{}, ErrClosed
		}
		return engine.Completion{}, fmt.Errorf("proxy: request %s: rank %d upstream %s: %w", req.ID, req.Rank, target, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return engine.Completion{}, &UpstreamError{Rank: req.Rank, URL: target, Status: resp.StatusCode, Message: errorMessage(resp.Body)}
	}
	comp, err := readStream(resp.Body, req, emit, target)
	if err != nil {
		if e.isClosed() {
			return engine.Completion{}, ErrClosed
		}
		if ctx.Err() != nil && !errors.As(err, new(*UpstreamError)) {
			return engine.Completion{}, fmt.Errorf("proxy: request %s: %w", req.ID, context.Cause(ctx))
		}
		return engine.Completion{}, err
	}
	comp.Decode = time.Since(start)
	if comp.PromptTokens == 0 {
		comp.PromptTokens = len(req.Prompt)
	}
	rs.window.add(time.Now(), int64(comp.PromptTokens), int64(comp.CachedTokens))
	if req.Phase == engine.PhaseContextOnly {
		comp.ContextState, _ = json.Marshal(contextState{V: 1, PromptTokens: comp.PromptTokens, First: comp.Text})
	}
	return comp, nil
}

// awaitFirstToken counts a request's prompt as prefill ahead on the rank
// until its first chunk reaches emit, or until release (the request's
// end, whichever comes first). The engine does not say how far a prefill
// got, so the whole prompt counts until its first token.
func (rs *rankState) awaitFirstToken(promptTokens int, emit func(engine.Chunk) error) (_ func(engine.Chunk) error, release func()) {
	n := int64(promptTokens)
	rs.prefill.Add(n)
	var once sync.Once
	release = func() { once.Do(func() { rs.prefill.Add(-n) }) }
	return func(c engine.Chunk) error {
		release()
		if emit == nil {
			return nil
		}
		return emit(c)
	}, release
}

// prefillEstimate is the prefill ahead of prompts awaiting their first
// token: their tokens less the share the rank's window says its cache
// serves.
func prefillEstimate(awaiting, lookup, hit int64) int {
	if lookup > 0 && hit > 0 {
		return int(float64(awaiting) * (1 - min(float64(hit)/float64(lookup), 1)))
	}
	return int(awaiting)
}

// Upstream is rank's upstream base URL ("" for a rank the proxy does not
// have): the worker relays the APIs the engine serves itself (Messages,
// Responses) there untouched.
func (e *Engine) Upstream(rank int) string {
	if rank < 0 || rank >= len(e.ranks) {
		return ""
	}
	return e.ranks[rank].upstream
}

// Ranks is the number of upstreams (one per rank).
func (e *Engine) Ranks() int { return len(e.ranks) }

// Client is the HTTP client the proxy reaches its upstreams with.
func (e *Engine) Client() *http.Client { return e.client }

func (e *Engine) isClosed() bool {
	select {
	case <-e.closed:
		return true
	default:
		return false
	}
}

// contextState is the proxy's opaque context-phase result.
type contextState struct {
	V            int    `json:"v"`
	PromptTokens int    `json:"prompt_tokens"`
	First        string `json:"first"`
}

// upstreamBody rewrites the request body for the upstream: always streamed
// with usage (to learn cached tokens), max_tokens set to what the worker
// decided (1 for a context-only run; left to the engine, its context
// length minus the prompt, when the worker decided none).
func upstreamBody(req engine.Request) ([]byte, error) {
	var m map[string]json.RawMessage
	if len(req.Raw) == 0 {
		return nil, errors.New("empty request body")
	}
	if err := json.Unmarshal(req.Raw, &m); err != nil {
		return nil, fmt.Errorf("request body: %w", err)
	}
	if m == nil {
		return nil, errors.New("request body is not a JSON object")
	}
	maxTokens := req.MaxTokens
	if req.Phase == engine.PhaseContextOnly {
		maxTokens = 1
	}
	if maxTokens > 0 {
		delete(m, "max_completion_tokens")
		m["max_tokens"] = json.RawMessage(fmt.Sprint(maxTokens))
	}
	m["stream"] = json.RawMessage("true")
	m["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	return json.Marshal(m)
}

// errorMessage extracts an OpenAI error message from an error body.
func errorMessage(r io.Reader) string {
	body, _ := io.ReadAll(io.LimitReader(r, 64<<10))
	var e struct {
		Error json.RawMessage `json:"error"`
		// Some servers (FastAPI) answer {"detail": ...} or {"message": ...}.
		Detail  json.RawMessage `json:"detail"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil {
		var obj struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case json.Unmarshal(e.Error, &obj) == nil && obj.Message != "":
			return obj.Message
		case json.Unmarshal(e.Error, &s) == nil && s != "":
			return s
		case e.Message != "":
			return e.Message
		case len(e.Detail) > 0:
			return string(e.Detail)
		}
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	if s == "" {
		s = "(empty body)"
	}
	return s
}

// streamChunk is the union of chat and completion chunk fields we read.
type streamChunk struct {
	Choices []struct {
		Delta *struct {
			Content   *string `json:"content"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// readStream consumes the upstream's SSE stream.
func readStream(r io.Reader, req engine.Request, emit func(engine.Chunk) error, target string) (engine.Completion, error) {
	sr := &streamReader{req: req, emit: emit, target: target}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	done := false
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue // comments, event:, id:, blank separators
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			done = true
			break
		}
		var ch streamChunk
		if err := json.Unmarshal(data, &ch); err != nil {
			return sr.comp, fmt.Errorf("proxy: rank %d upstream %s: bad stream chunk %q: %w", req.Rank, target, truncate(string(data), 120), err)
		}
		if len(ch.Error) > 0 && string(ch.Error) != "null" {
			return sr.comp, &UpstreamError{Rank: req.Rank, URL: target, Message: errorMessage(bytes.NewReader(data))}
		}
		if err := sr.chunk(&ch); err != nil {
			return sr.comp, err
		}
	}
	comp := sr.comp
	if err := sc.Err(); err != nil {
		return comp, fmt.Errorf("proxy: rank %d upstream %s: reading stream: %w", req.Rank, target, err)
	}
	if !done {
		return comp, fmt.Errorf("proxy: rank %d upstream %s: stream ended without [DONE]", req.Rank, target)
	}
	comp.Text = sr.text.String()
	if comp.FinishReason == "" {
		comp.FinishReason = "stop"
	}
	comp.CachedTokens = min(max(comp.CachedTokens, 0), max(comp.PromptTokens, len(req.Prompt)))
	return comp, nil
}

// streamReader builds a completion from the upstream's stream chunks and
// emits their pieces as they come.
type streamReader struct {
	req    engine.Request
	emit   func(engine.Chunk) error
	target string
	comp   engine.Completion
	text   strings.Builder
}

// chunk takes one stream chunk: its text, tool call pieces, finish reason
// and usage.
func (sr *streamReader) chunk(ch *streamChunk) error {
	for _, c := range ch.Choices {
		if c.Delta != nil {
			// Tool calls pass through: the upstream model decided them.
			for _, tc := range c.Delta.ToolCalls {
				if err := sr.toolCall(tc.Index, tc.ID, tc.Function.Name, tc.Function.Arguments); err != nil {
					return err
				}
			}
		}
		var piece string
		if c.Delta != nil && c.Delta.Content != nil {
			piece = *c.Delta.Content
		} else if c.Text != nil {
			piece = *c.Text
		}
		if piece != "" {
			sr.text.WriteString(piece)
			sr.comp.CompletionTokens++ // refined by usage when reported
			if sr.emit != nil {
				if err := sr.emit(engine.Chunk{Text: piece}); err != nil {
					return fmt.Errorf("proxy: emit: %w", err)
				}
			}
		}
		if c.FinishReason != nil && *c.FinishReason != "" {
			sr.comp.FinishReason = *c.FinishReason
		}
	}
	if u := ch.Usage; u != nil {
		sr.comp.PromptTokens = u.PromptTokens
		sr.comp.CompletionTokens = u.CompletionTokens
		if u.PromptTokensDetails != nil {
			sr.comp.CachedTokens = u.PromptTokensDetails.CachedTokens
		}
	}
	return nil
}

// toolCall adds one piece of tool call index to the completion and emits
// it.
func (sr *streamReader) toolCall(index int, id, name, args string) error {
	if index < 0 || index > 1024 {
		return fmt.Errorf("proxy: rank %d upstream %s: tool call index %d out of range", sr.req.Rank, sr.target, index)
	}
	for len(sr.comp.ToolCalls) <= index {
		sr.comp.ToolCalls = append(sr.comp.ToolCalls, engine.ToolCall{})
	}
	call := &sr.comp.ToolCalls[index]
	if id != "" {
		call.ID = id
	}
	call.Name += name
	call.Arguments += args
	if sr.emit != nil {
		piece := engine.ToolCall{ID: id, Name: name, Arguments: args}
		if err := sr.emit(engine.Chunk{ToolCall: &piece, ToolIndex: index}); err != nil {
			return fmt.Errorf("proxy: emit: %w", err)
		}
	}
	return nil
}

var truncate = httpjson.Clip // the shared message quoting
