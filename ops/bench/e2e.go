package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/engine/sim"
)

// E2EOptions configure a replay over HTTP against running edges.
type E2EOptions struct {
	EdgeURLs []string // base URLs, e.g. http://127.0.0.1:8000
	Model    string
	// ParentHeader is sent with a sub-agent's parent session id ("": not
	// sent).
	ParentHeader string
	// TimeScale multiplies the workload's offsets (as in sim mode).
	TimeScale float64
	// Seed drives the choice of edge per request.
	Seed   uint64
	Client *http.Client
	// Label names the run (the policy the deployment is configured with).
	Label    Policy
	Progress func(done, total int)
	// RouteHeader is the edge's debug header naming the instances used
	// (x-tether-route); records get Instance -1 without it.
	RouteHeader string
	// EdgeFor, when set, picks the edge of each request (agent id, call
	// number) instead of the seeded random choice, as SimConfig.EdgeFor.
	EdgeFor func(agent string, call int) int
	// MaxShedRetries bounds 429 retries per request (default 20).
	MaxShedRetries int
	// API is the dialect the requests are sent in: "chat" (default,
	// /v1/chat/completions with x-session-id), "messages" (as Claude Code:
	// /v1/messages with x-claude-code-session-id) or "responses" (as
	// Codex: /v1/responses with prompt_cache_key).
	API string
}

// APIs are the dialects the e2e replay sends.
var APIs = []string{"chat", "messages", "responses"}

// chatBody is the /v1/chat/completions request the replay sends.
type chatBody struct {
	Model         string        `json:"model"`
	Messages      []chatMessage `json:"messages"`
	MaxTokens     int           `json:"max_tokens"`
	IgnoreEOS     bool          `json:"ignore_eos"`
	Stream        bool          `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options,omitempty"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// PromptMessages returns the chat messages a request is sent as: its own
// messages (synthetic workloads), or one user message synthesised from its
// block keys — 64 whitespace words per block (internal/prefix: one word, one
// token), each word derived from the block's namespaced key, so equal keys
// give equal token blocks and prompts share exactly their key prefix. The
// last block gets the words that bring the prompt to PromptTokens.
func PromptMessages(r *Request, blockSize int) []prefix.Message {
	if r.Messages != nil {
		return r.Messages
	}
	var sb strings.Builder
	sb.Grow(r.PromptTokens * 5)
	for i, k := range r.Keys {
		n := blockSize
		if i == len(r.Keys)-1 {
			if rest := r.PromptTokens - blockSize*(len(r.Keys)-1); rest >= 1 && rest <= blockSize {
				n = rest
			}
		}
		for j := 0; j < n; j++ {
			if sb.Len() > 0 {
				sb.WriteByte(' ')
			}
			x := mix64(k + uint64(j)*0x9e3779b97f4a7c15)
			for c := 0; c < 4; c++ {
				sb.WriteByte("abcdefghijklmnopqrstuvwxyz234567"[x&31])
				x >>= 5
			}
		}
	}
	return []prefix.Message{{Role: "user", Content: sb.String()}}
}

// ReplayE2E replays w in real time (offsets × TimeScale) against the edges,
// spreading requests over them like a non-sticky load balancer. Cache hits
// come from usage.prompt_tokens_details.cached_tokens.
func ReplayE2E(ctx context.Context, w *Workload, o E2EOptions) (*RunResult, error) {
	if len(o.EdgeURLs) == 0 {
		return nil, errors.New("bench: e2e: no edge URLs")
	}
	if !(o.TimeScale > 0) {
		return nil, fmt.Errorf("bench: e2e: time scale must be > 0, got %v", o.TimeScale)
	}
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}}
	}
	if o.MaxShedRetries == 0 {
		o.MaxShedRetries = 20
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	for _, a := range w.Agents {
		if a.Chained || a.Next != nil {
			return nil, fmt.Errorf("bench: e2e: workload %s chains conversations (a closed loop), which only sim mode replays", w.Name)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &e2eRun{o: o, w: w, start: time.Now(), rng: rand.New(rand.NewPCG(o.Seed, 0x6532)), instances: map[string]int64{}}
	w.WalkRequests(func(*Agent, *Request) { r.total++ })
	r.allDone, r.cancel = make(chan struct{}), cancel
	if r.total == 0 {
		close(r.allDone)
	}
	var wg sync.WaitGroup
	for _, a := range w.Agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.runAgent(ctx, cancel, a, a.Start)
		}()
	}
	wg.Wait()
	if r.err != nil {
		return nil, r.err
	}
	select {
	case <-r.allDone:
		// Every request completed: the replay is over, whatever timers
		// were left (they could send nothing).
	default:
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("bench: e2e: %d of %d requests completed: %w", r.done, r.total, err)
		}
	}
	res := &RunResult{Policy: o.Label, Edges: len(o.EdgeURLs), Records: r.records, Shed: r.shed, Wall: time.Since(r.start)}
	ids := make([]string, 0, len(r.instances))
	for id := range r.instances {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for i := range res.Records {
		if id := r.instanceOf[i]; id != "" {
			res.Records[i].Instance = slices.Index(ids, id)
			res.Records[i].InstanceID = id
		}
	}
	for _, id := range ids {
		res.InstancePrefillTokens = append(res.InstancePrefillTokens, r.instances[id])
	}
	return res, nil
}

type e2eRun struct {
	o     E2EOptions
	w     *Workload
	start time.Time
	total int

	mu         sync.Mutex
	rng        *rand.Rand
	records    []RequestRecord
	instanceOf []string
	instances  map[string]int64 // context instance → prompt tokens computed
	shed       int
	done       int
	err        error
	// allDone closes when the last request completed; cancel then ends
	// every wait left.
	allDone chan struct{}
	cancel  context.CancelFunc
}

func (r *e2eRun) fail(cancel context.CancelFunc, err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
	cancel()
}

func (r *e2eRun) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * r.o.TimeScale)
}

func (r *e2eRun) unscaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) / r.o.TimeScale)
}

// prefillModel is the simulated engine's prefill time for uncached tokens
// (worker/engine/sim defaults).
func prefillModel(uncached int) time.Duration {
	return sim.DefaultPrefillOverhead + time.Duration(float64(max(uncached, 0))/sim.DefaultPrefillTokensPerSec*float64(time.Second))
}

// runAgent runs an agent's groups in order, as the simulator does.
func (r *e2eRun) runAgent(ctx context.Context, cancel context.CancelFunc, a *Agent, startOffset time.Duration) {
	start := r.start.Add(r.scaled(startOffset))
	calls := 0
	for i := 0; i < len(a.Steps); {
		end := i + 1
		for end < len(a.Steps) && a.Steps[end].WithPrevious {
			end++
		}
		groupStart := time.Now()
		var wg sync.WaitGroup
		for k := i; k < end; k++ {
			st := a.Steps[k]
			if !st.sends() {
				continue // nothing to wait for
			}
			at := start.Add(r.scaled(st.At))
			if at.Before(groupStart) {
				at = groupStart
			}
			call := -1
			if st.Request != nil {
				call = calls
				calls++
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !sleepUntil(ctx, at) {
					return
				}
				if st.SubAgent != nil {
					r.runAgent(ctx, cancel, st.SubAgent, time.Since(r.start))
					return
				}
				if err := r.send(ctx, a, st.Request, call); err != nil {
					r.fail(cancel, err)
				}
			}()
		}
		wg.Wait()
		if ctx.Err() != nil {
			return
		}
		i = end
	}
}

// sends reports whether the step sends a request: a request, or a
// sub-agent with one somewhere in its script.
func (st Step) sends() bool {
	if st.Request != nil {
		return true
	}
	if st.SubAgent == nil {
		return false
	}
	for _, s := range st.SubAgent.Steps {
		if s.sends() {
			return true
		}
	}
	return false
}

func sleepUntil(ctx context.Context, at time.Time) bool {
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// send posts one request (retrying 429s after Retry-After) and records it.
func (r *e2eRun) send(ctx context.Context, a *Agent, req *Request, call int) error {
	msgs := PromptMessages(req, r.w.BlockSize)
	payload, err := requestBody(r.o.API, r.o.Model, a.ID, msgs, min(req.OutputTokens, e2eMaxOutputTokens))
	if err != nil {
		return fmt.Errorf("bench: e2e: %s call %d: encode: %w", a.ID, call, err)
	}
	arrival := time.Now()
	for attempt := 0; ; attempt++ {
		r.mu.Lock()
		edge := r.rng.IntN(len(r.o.EdgeURLs))
		r.mu.Unlock()
		if r.o.EdgeFor != nil {
			edge = r.o.EdgeFor(a.ID, call) % len(r.o.EdgeURLs)
		}
		out, retry, err := r.post(ctx, edge, a, payload)
		if errors.Is(err, errContextLength) {
			// The worker refuses a prompt larger than a rank's KV
			// capacity; sim mode computes it without the cache. Count
			// it the same way: a full miss, modelled prefill.
			out = e2eResponse{prompt: req.PromptTokens, oversized: true}
			out.firstToken = arrival.Add(r.scaled(prefillModel(req.PromptTokens)))
			err = nil
		}
		if err != nil {
			return fmt.Errorf("bench: e2e: %s call %d via %s: %w", a.ID, call, r.o.EdgeURLs[edge], err)
		}
		if retry >= 0 {
			r.mu.Lock()
			r.shed++
			r.mu.Unlock()
			if attempt >= r.o.MaxShedRetries {
				return fmt.Errorf("bench: e2e: %s call %d: shed %d times", a.ID, call, attempt+1)
			}
			if !sleepUntil(ctx, time.Now().Add(retry)) {
				return ctx.Err()
			}
			continue
		}
		// Times in engine units (wall ÷ time scale), comparable with sim
		// mode; prefill is the simulated workers' model applied to the
		// tokens the deployment reports as computed.
		rec := RequestRecord{
			Agent: a.ID, Root: a.Root().ID, SubAgent: a.SubAgent(), Call: call, Edge: edge, Instance: -1, Rank: -1,
			Arrival: r.unscaled(arrival.Sub(r.start)), TTFT: r.unscaled(out.firstToken.Sub(arrival)),
			Prefill: prefillModel(out.prompt - out.cached), Prompt: out.prompt, Cached: out.cached, Oversized: out.oversized,
		}
		inst := ""
		if out.route != "" {
			inst, rec.Rank = parseContextHop(out.route)
		}
		r.mu.Lock()
		r.records = append(r.records, rec)
		r.instanceOf = append(r.instanceOf, inst)
		if inst != "" {
			r.instances[inst] += int64(out.prompt - out.cached)
		}
		r.done++
		done := r.done
		if done == r.total {
			close(r.allDone)
			r.cancel()
		}
		r.mu.Unlock()
		if r.o.Progress != nil {
			r.o.Progress(done, r.total)
		}
		return nil
	}
}

type e2eResponse struct {
	firstToken     time.Time
	prompt, cached int
	route          string
	oversized      bool
}

// errContextLength: the deployment refused the prompt as larger than a
// rank's KV capacity (OpenAI code context_length_exceeded).
var errContextLength = errors.New("context_length_exceeded")

// post sends the request to one edge. retry >= 0 means it was refused for
// now (429 shed, 503 no healthy instance) and should be retried after retry.
func (r *e2eRun) post(ctx context.Context, edge int, a *Agent, payload []byte) (e2eResponse, time.Duration, error) {
	var out e2eResponse
	hr, err := r.request(ctx, edge, a, payload)
	if err != nil {
		return out, -1, err
	}
	resp, err := r.o.Client.Do(hr)
	if err != nil {
		return out, -1, err
	}
	defer resp.Body.Close()
	if retry, err := refusal(resp); retry >= 0 || err != nil {
		return out, retry, err
	}
	if r.o.RouteHeader != "" {
		out.route = resp.Header.Get(r.o.RouteHeader)
	}
	return out, -1, r.readStream(resp.Body, &out)
}

// request is the HTTP request of payload to edge for agent a, with the
// headers its API's clients send.
func (r *e2eRun) request(ctx context.Context, edge int, a *Agent, payload []byte) (*http.Request, error) {
	url := strings.TrimRight(r.o.EdgeURLs[edge], "/") + apiPath(r.o.API)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	switch r.o.API {
	case "messages":
		hr.Header.Set("x-claude-code-session-id", a.ID)
		hr.Header.Set("anthropic-version", "2023-06-01")
	case "responses":
		// The conversation is the body's prompt_cache_key, as Codex sends it.
	default:
		hr.Header.Set("x-session-id", a.ID)
	}
	if a.Parent != nil && r.o.ParentHeader != "" {
		hr.Header.Set(r.o.ParentHeader, a.Parent.ID)
	}
	return hr, nil
}

// refusal reads an answer other than 200: a retry delay for a refusal for
// now (429 with its Retry-After; 503, no healthy instance), else an error
// (errContextLength for a prompt over a rank's capacity). -1 and nil for
// a 200.
func refusal(resp *http.Response) (time.Duration, error) {
	switch resp.StatusCode {
	case http.StatusOK:
		return -1, nil
	case http.StatusTooManyRequests:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return time.Duration(max(secs, 0)) * time.Second, nil
	case http.StatusServiceUnavailable:
		// No healthy instance for now (stale telemetry on a loaded
		// machine): a client backs off and retries.
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return 100 * time.Millisecond, nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if resp.StatusCode == http.StatusBadRequest && json.Unmarshal(b, &e) == nil && e.Error.Code == "context_length_exceeded" {
		return -1, errContextLength
	}
	return -1, fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
}

// readStream reads a streamed answer into out: when its first text came,
// and its usage (prompt and cached tokens), which it must carry.
func (r *e2eRun) readStream(body io.Reader, out *e2eResponse) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	gotUsage := false
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if bytes.Equal(bytes.TrimSpace(data), []byte("[DONE]")) {
			break
		}
		ev, err := readEvent(r.o.API, data)
		if err != nil {
			return err
		}
		if out.firstToken.IsZero() && ev.text {
			out.firstToken = time.Now()
		}
		if ev.usage {
			out.prompt, out.cached = ev.prompt, ev.cached
			gotUsage = true
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read stream: %w", err)
	}
	if !gotUsage {
		return errors.New("stream ended without usage")
	}
	if out.firstToken.IsZero() {
		out.firstToken = time.Now()
	}
	return nil
}

func apiPath(api string) string {
	switch api {
	case "messages":
		return "/v1/messages"
	case "responses":
		return "/v1/responses"
	}
	return "/v1/chat/completions"
}

// requestBody is one streamed request in the dialect api: the same
// conversation (system messages become Messages' system and Responses'
// instructions) with the same completion budget.
func requestBody(api, model, conv string, msgs []prefix.Message, maxTokens int) ([]byte, error) {
	if api == "" {
		api = "chat"
	}
	var system []string
	var rest []chatMessage
	for _, m := range msgs {
		if m.Role == "system" && api != "chat" {
			system = append(system, m.Content)
			continue
		}
		rest = append(rest, chatMessage{Role: m.Role, Content: m.Content})
	}
	// ignore_eos (vLLM's sampling extension, which tether's simulated
	// model honours in every dialect): the answer has the trace's output
	// length instead of stopping on its own.
	switch api {
	case "messages":
		return json.Marshal(map[string]any{"model": model, "max_tokens": maxTokens, "stream": true, "ignore_eos": true,
			"system": strings.Join(system, ""), "messages": rest})
	case "responses":
		return json.Marshal(map[string]any{"model": model, "max_output_tokens": maxTokens, "stream": true, "store": false, "ignore_eos": true,
			"instructions": strings.Join(system, ""), "input": rest, "prompt_cache_key": conv})
	}
	body := chatBody{Model: model, MaxTokens: maxTokens, IgnoreEOS: true, Stream: true, Messages: rest}
	body.StreamOptions = &struct {
		IncludeUsage bool `json:"include_usage"`
	}{true}
	return json.Marshal(body)
}

// e2eMaxOutputTokens caps a trace's output tokens in e2e mode: the
// published e2e figures were measured with this cap (workers refused
// more before they took a context length, max_model_len), and keeping it
// keeps new runs comparable with them.
const e2eMaxOutputTokens = 4096

// streamEvent is what the replay reads of one streamed event.
type streamEvent struct {
	text           bool // it carries output text
	usage          bool
	prompt, cached int
}

// readEvent reads one SSE data line of dialect api: chat's chunks,
// Messages' text_delta and message_delta usage (input_tokens +
// cache_read_input_tokens), Responses' output_text.delta and the usage of
// response.completed (or response.incomplete, a cut-off answer's end).
func readEvent(api string, data []byte) (streamEvent, error) {
	var ev streamEvent
	var v struct {
		Type    string `json:"type"`
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
		Delta json.RawMessage `json:"delta"`
		Usage *struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
			InputTokens int `json:"input_tokens"`
			CacheRead   int `json:"cache_read_input_tokens"`
		} `json:"usage"`
		Response *struct {
			Usage *struct {
				InputTokens  int `json:"input_tokens"`
				InputDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"input_tokens_details"`
			} `json:"usage"`
		} `json:"response"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return ev, fmt.Errorf("malformed stream event %q: %w", truncateBytes(data, 200), err)
	}
	if len(v.Error) > 0 && string(v.Error) != "null" || v.Type == "error" || v.Type == "response.failed" {
		return ev, fmt.Errorf("stream error: %s", truncateBytes(data, 300))
	}
	switch api {
	case "messages":
		var d struct{ Type, Text string }
		_ = json.Unmarshal(v.Delta, &d)
		ev.text = v.Type == "content_block_delta" && d.Text != ""
		if v.Type == "message_delta" && v.Usage != nil {
			ev.usage, ev.prompt, ev.cached = true, v.Usage.InputTokens+v.Usage.CacheRead, v.Usage.CacheRead
		}
	case "responses":
		var d string
		_ = json.Unmarshal(v.Delta, &d)
		ev.text = v.Type == "response.output_text.delta" && d != ""
		if (v.Type == "response.completed" || v.Type == "response.incomplete") && v.Response != nil && v.Response.Usage != nil {
			u := v.Response.Usage
			ev.usage, ev.prompt, ev.cached = true, u.InputTokens, u.InputDetails.CachedTokens
		}
	default:
		ev.text = len(v.Choices) > 0 && v.Choices[0].Delta.Content != ""
		if v.Usage != nil {
			ev.usage, ev.prompt, ev.cached = true, v.Usage.PromptTokens, v.Usage.PromptTokensDetails.CachedTokens
		}
	}
	return ev, nil
}

// parseContextHop reads "context=<instance>/<rank>; generation=…".
func parseContextHop(h string) (instance string, rank int) {
	rank = -1
	for _, part := range strings.Split(h, ";") {
		v, ok := strings.CutPrefix(strings.TrimSpace(part), "context=")
		if !ok || v == "-" {
			continue
		}
		inst, rk, _ := strings.Cut(v, "/")
		if n, err := strconv.Atoi(rk); err == nil {
			rank = n
		}
		return inst, rank
	}
	return "", -1
}

func truncateBytes(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
