package chaos

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/respid"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/routecheck"
)

// answer is one HTTP exchange as a client saw it: the status and headers,
// the body read to its end, and how reading it ended (nil: a clean end).
type answer struct {
	status  int
	header  http.Header
	body    []byte
	readErr error
	sendErr error
	took    time.Duration
}

// call sends one request to base+path and reads the whole answer.
func (v *env) call(timeout time.Duration, method, url string, body any, hdr map[string]string) answer {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		if raw, ok := body.(json.RawMessage); ok {
			b = raw
		}
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	for k, val := range hdr {
		req.Header.Set(k, val)
	}
	c := &http.Client{Transport: v.client.Transport, Timeout: timeout}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return answer{sendErr: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, readErr: err, took: time.Since(start)}
}

// openAIErrorNaming checks an OpenAI error answer whose message names id,
// and returns "" or what is wrong.
func (a answer) openAIErrorNaming(status int, id string) string {
	switch {
	case a.sendErr != nil:
		return fmt.Sprintf("no answer after %s: %v", a.took.Round(time.Millisecond), a.sendErr)
	case a.readErr != nil:
		return fmt.Sprintf("the answer broke off: %v", a.readErr)
	case status != 0 && a.status != status:
		return fmt.Sprintf("status %d, want %d: %.300s", a.status, status, a.body)
	case a.status < 400:
		return fmt.Sprintf("status %d, want an error: %.300s", a.status, a.body)
	}
	var e struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(a.body, &e) != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		return fmt.Sprintf("status %d without an OpenAI error body: %.300s", a.status, a.body)
	}
	if !strings.Contains(e.Error.Message, id) {
		return fmt.Sprintf("status %d: the message does not name %s: %q", a.status, id, e.Error.Message)
	}
	if (a.status == http.StatusServiceUnavailable || a.status == http.StatusTooManyRequests) && a.header.Get("Retry-After") == "" {
		return fmt.Sprintf("status %d without Retry-After: %.300s", a.status, a.body)
	}
	return ""
}

// worker is the worker process of instance id.
func (v *env) worker(id string) *workerProc {
	for _, w := range v.workers {
		if w.id == id {
			return w
		}
	}
	v.t.Fatalf("no worker %s", id)
	return nil
}

// TestChaosAgentSurfaces puts the agents' new surfaces under faults, on
// the deployment as deploy/ ships it (workers at real engine time): the
// worker holding a stored response, or a conversation, killed and then
// restarted (while it is down every request naming it gets the API's
// error naming the client's id, 503 with Retry-After, through every edge;
// once it restarted, not found naming the id; a new chain starts
// cleanly); an edge killed in the middle of a Messages
// and of a Responses stream (the client's stream never ends cleanly); a
// burst of twenty Claude Code Task sub-agents through three edges while
// the leader is killed (every sub-agent answered with a complete stream,
// every answer judged by what its edge knew).
func TestChaosAgentSurfaces(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process chaos: not in -short")
	}
	v := newEnvWith(t, envOptions{worker: map[string]any{"engine": map[string]any{"type": "sim", "time_scale": 1}}})
	for _, sub := range []struct {
		name string
		run  func(t *testing.T, v *env)
	}{
		{"stored-response-worker-killed", storedResponseWorkerKilled},
		{"conversation-worker-killed", conversationWorkerKilled},
		{"edge-killed-mid-stream", edgeKilledMidStream},
		{"task-burst-leader-kill", taskBurstLeaderKill},
	} {
		t.Run(sub.name, func(t *testing.T) {
			v.t = t
			defer func() { v.t = t }()
			sub.run(t, v)
			v.waitReady(60 * time.Second)
		})
	}
}

// byIDRequest is a request naming a stored response or conversation, and
// the status it must get once its holder restarted (0: any error naming
// the id while the holder is down).
type byIDRequest struct {
	name      string
	method    string
	path      string
	body      any
	restarted int
}

// holderFaults kills the worker holding id, checks every request of reqs
// through every edge while it is down and once it restarted, and returns
// the answers seen while it was down (status → count). While it is down
// every request gets an answer within 10 s, in OpenAI's error shape,
// naming id: a 503 with Retry-After (the holder may come back; no other
// instance holds the object).
func holderFaults(t *testing.T, v *env, holder, id string, reqs []byIDRequest) map[string]int {
	t.Helper()
	w := v.worker(holder)
	_ = w.stop(syscall.SIGKILL, time.Second)
	down := map[string]int{}
	for _, e := range v.edges {
		for _, r := range reqs {
			a := v.call(10*time.Second, r.method, e.url()+r.path, r.body, nil)
			why := a.openAIErrorNaming(http.StatusServiceUnavailable, id)
			down[fmt.Sprintf("%s: %d naming the id %v", r.name, a.status, why == "")]++
			if why != "" {
				t.Errorf("%s via %s while %s is down: %s", r.name, e.id, holder, why)
			}
		}
	}
	w.start(t)
	// The restarted process announces a new boot: once every edge has
	// heard it, the id is known gone.
	for _, e := range v.edges {
		for _, r := range reqs {
			var last answer
			waitFor(t, 60*time.Second, fmt.Sprintf("%s via %s answered %d after %s restarted", r.name, e.id, r.restarted, holder), func() bool {
				last = v.call(10*time.Second, r.method, e.url()+r.path, r.body, nil)
				return last.status == r.restarted
			})
			if why := last.openAIErrorNaming(r.restarted, id); why != "" {
				t.Errorf("%s via %s after %s restarted: %s", r.name, e.id, holder, why)
			}
		}
	}
	return down
}

// storedResponseWorkerKilled: the generation worker holding a stored
// response is killed, then restarted.
func storedResponseWorkerKilled(t *testing.T, v *env) {
	base := v.edges[0].url()
	a := v.call(30*time.Second, "POST", base+"/v1/responses", map[string]any{"model": model, "input": "remember the number 42", "max_output_tokens": 4}, nil)
	var o struct {
		ID string `json:"id"`
	}
	if a.status != 200 || json.Unmarshal(a.body, &o) != nil || o.ID == "" {
		t.Fatalf("create a stored response: %d %s %v", a.status, a.body, a.sendErr)
	}
	id, err := respid.Decode(o.ID)
	if err != nil {
		t.Fatal(err)
	}
	next := map[string]any{"model": model, "input": "which number?", "previous_response_id": o.ID, "max_output_tokens": 4}
	down := holderFaults(t, v, id.Instance, o.ID, []byIDRequest{
		{name: "GET /v1/responses/{id}", method: "GET", path: "/v1/responses/" + o.ID, restarted: 404},
		{name: "previous_response_id", method: "POST", path: "/v1/responses", body: next, restarted: 400},
		{name: "GET input_items", method: "GET", path: "/v1/responses/" + o.ID + "/input_items", restarted: 404},
	})
	fresh := newChain(t, v)
	t.Logf("FIGURES surfaces stored-response holder=%s answers_while_down=%v new_chain=%s", id.Instance, down, fresh)
}

// newChain starts a new chain of stored responses through one edge and
// continues it through another: both 200.
func newChain(t *testing.T, v *env) string {
	t.Helper()
	a := v.call(30*time.Second, "POST", v.edges[1].url()+"/v1/responses", map[string]any{"model": model, "input": "a new chain", "max_output_tokens": 4}, nil)
	var o struct {
		ID string `json:"id"`
	}
	if a.status != 200 || json.Unmarshal(a.body, &o) != nil || o.ID == "" {
		t.Fatalf("a new chain: %d %s %v", a.status, a.body, a.sendErr)
	}
	b := v.call(30*time.Second, "POST", v.edges[2].url()+"/v1/responses", map[string]any{"model": model, "input": "and on", "previous_response_id": o.ID, "max_output_tokens": 4}, nil)
	if b.status != 200 {
		t.Fatalf("continuing the new chain: %d %s %v", b.status, b.body, b.sendErr)
	}
	return "200,200"
}

// conversationWorkerKilled: the worker holding a conversation is killed,
// then restarted.
func conversationWorkerKilled(t *testing.T, v *env) {
	base := v.edges[0].url()
	a := v.call(30*time.Second, "POST", base+"/v1/conversations", map[string]any{"model": model, "metadata": map[string]string{"topic": "chaos"}}, nil)
	var c struct {
		ID string `json:"id"`
	}
	if a.status != 200 || json.Unmarshal(a.body, &c) != nil || c.ID == "" {
		t.Fatalf("create a conversation: %d %s %v", a.status, a.body, a.sendErr)
	}
	turn := map[string]any{"model": model, "input": "hello", "conversation": c.ID, "max_output_tokens": 4}
	if a := v.call(30*time.Second, "POST", v.edges[1].url()+"/v1/responses", turn, nil); a.status != 200 {
		t.Fatalf("a turn of the conversation: %d %s %v", a.status, a.body, a.sendErr)
	}
	id, err := respid.DecodeConversation(c.ID)
	if err != nil {
		t.Fatal(err)
	}
	down := holderFaults(t, v, id.Instance, c.ID, []byIDRequest{
		{name: "GET /v1/conversations/{id}", method: "GET", path: "/v1/conversations/" + c.ID, restarted: 404},
		{name: "GET items", method: "GET", path: "/v1/conversations/" + c.ID + "/items", restarted: 404},
		{name: "a Responses turn naming it", method: "POST", path: "/v1/responses", body: turn, restarted: 404},
	})
	// A new conversation starts cleanly.
	a = v.call(30*time.Second, "POST", v.edges[2].url()+"/v1/conversations", map[string]any{"model": model}, nil)
	if a.status != 200 || json.Unmarshal(a.body, &c) != nil || c.ID == "" {
		t.Fatalf("a new conversation: %d %s %v", a.status, a.body, a.sendErr)
	}
	turn["conversation"] = c.ID
	if a := v.call(30*time.Second, "POST", v.edges[0].url()+"/v1/responses", turn, nil); a.status != 200 {
		t.Fatalf("a turn of the new conversation: %d %s %v", a.status, a.body, a.sendErr)
	}
	t.Logf("FIGURES surfaces conversation holder=%s answers_while_down=%v new_conversation=200,200", id.Instance, down)
}

// edgeKilledMidStream: a Messages and a Responses stream whose edge is
// killed once the first events arrived: the client's read ends with an
// error event of the API or an error (the connection cut without a
// chunked end), never with a clean end missing its last event.
func edgeKilledMidStream(t *testing.T, v *env) {
	cases := []struct {
		name, path string
		body       map[string]any
		hdr        map[string]string
		last       string // the API's last event of a complete stream
	}{
		{"messages", "/v1/messages", map[string]any{"model": model, "max_tokens": 400, "stream": true,
			"messages": []map[string]string{{"role": "user", "content": "write a long story"}}},
			map[string]string{"anthropic-version": "2023-06-01", "x-claude-code-session-id": "midstream-messages"}, "message_stop"},
		{"responses", "/v1/responses", map[string]any{"model": model, "max_output_tokens": 400, "stream": true, "input": "write a long story",
			"prompt_cache_key": "midstream-responses"}, nil, "response.completed"},
	}
	for i, c := range cases {
		e := v.edges[i%len(v.edges)]
		got := streamThenKill(t, v, e, c.path, c.body, c.hdr)
		t.Logf("FIGURES surfaces mid-stream api=%s edge=%s events_before_kill=%d events=%d last_event=%q read_end=%v", c.name, e.id, got.before, got.events, got.last, got.readErr)
		switch {
		case got.last == c.last:
			t.Errorf("%s: the stream completed (%d events) before the kill took effect: the engine is too fast for this test", c.name, got.events)
		case got.readErr == nil && !strings.Contains(got.last, "error") && got.last != "response.failed":
			t.Errorf("%s: the stream ended cleanly after %q with the edge killed (no error event, no broken read)", c.name, got.last)
		}
		e.start(t)
		v.waitReady(60 * time.Second)
	}
}

// streamRead is how a stream ended.
type streamRead struct {
	before, events int
	last           string
	readErr        error
}

// streamThenKill opens a stream through e, SIGKILLs e after its first
// events and reads on until the stream ends.
func streamThenKill(t *testing.T, v *env, e *edgeProc, path string, body map[string]any, hdr map[string]string) streamRead {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", e.url()+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for k, val := range hdr {
		req.Header.Set(k, val)
	}
	c := &http.Client{Transport: v.transport(1), Timeout: 60 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("stream via %s: %v", e.id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream via %s: %d %s", e.id, resp.StatusCode, b)
	}
	var out streamRead
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	killed := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		out.events++
		var ev struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev)
		out.last = ev.Type
		if !killed && out.events >= 3 {
			out.before = out.events
			_ = e.stop(syscall.SIGKILL, time.Second)
			killed = true
		}
	}
	out.readErr = sc.Err()
	if !killed {
		_ = e.stop(syscall.SIGKILL, time.Second)
	}
	return out
}

// taskBurstLeaderKill: a Claude Code session's first turn, then twenty
// Task sub-agents of it at once (its captured sub-agent request, each with
// an agent id of its own) through the three edges, the leader killed once
// the burst is under way; every sub-agent retried on another edge as the
// client's SDK retries a broken stream or a refusal.
func taskBurstLeaderKill(t *testing.T, v *env) {
	root := readClientCapture(t, "claude-code-2.1.328/0002.json")
	agent := readClientCapture(t, "claude-code-2.1.328/0006.json")
	session := fmt.Sprintf("%s-%d", root.header("X-Claude-Code-Session-Id"), time.Now().UnixNano()%1e6)
	var amu sync.Mutex
	retriedOn := map[string]int{} // what a retried attempt got
	send := func(c clientCapture, agentID string, first int) sample {
		hdr := c.headers()
		hdr["X-Claude-Code-Session-Id"] = session
		conv := session
		if agentID != "" {
			hdr["X-Claude-Code-Agent-Id"] = agentID
			conv = routing.ClaudeCodeAgentConversation(session, agentID)
		}
		s := sample{root: session, conv: conv, start: time.Now()}
		for attempt := 0; attempt < 8 && !s.ok; attempt++ {
			e := v.edges[(first+attempt)%len(v.edges)]
			a := v.call(60*time.Second, "POST", e.url()+c.Path, c.body(), hdr)
			last := lastEventType(a.body)
			switch {
			case a.sendErr != nil:
				s.lastErr = "transport: " + errClass(a.sendErr)
			case a.status != 200:
				s.lastErr = fmt.Sprintf("HTTP %d", a.status)
			case a.readErr != nil || last != "message_stop":
				s.lastErr = fmt.Sprintf("stream ended after %q (%v)", last, a.readErr)
			default:
				s.ok, s.edge = true, e.id
				s.route = routecheck.ParseRoute(a.header.Get("x-tether-route"))
				s.prompt = messagesStreamPrompt(a.body)
				continue
			}
			amu.Lock()
			retriedOn[s.lastErr]++
			amu.Unlock()
			pause := time.NewTimer(200 * time.Millisecond)
			<-pause.C // client back-off between attempts
		}
		s.end = time.Now()
		return s
	}
	first := send(root, "", 0)
	if !first.ok {
		t.Fatalf("the session's first turn: %s", first.lastErr)
	}
	restarts := map[string][]time.Time{}
	l := v.waitLeader(20 * time.Second)
	const agents = 20
	samples := []sample{first}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := send(agent, fmt.Sprintf("a%016d", i+1), i)
			mu.Lock()
			samples = append(samples, s)
			mu.Unlock()
		}()
	}
	lead := time.NewTimer(300 * time.Millisecond)
	<-lead.C // the burst under way (schedule)
	restarts["*"] = append(restarts["*"], time.Now())
	restarts[l.id] = append(restarts[l.id], time.Now())
	_ = l.stop(syscall.SIGKILL, time.Second)
	wg.Wait()
	waitFor(t, 30*time.Second, "a new leader", func() bool { n := v.leader(); return n != nil && n != l })
	l.start(t)
	v.waitReady(60 * time.Second)
	v.converge(60 * time.Second)
	vd := v.checkRoutes(samples, restarts)
	failed := failureReasons(samples)
	okCount := 0
	for _, s := range samples {
		if s.ok {
			okCount++
		}
	}
	t.Logf("FIGURES surfaces task-burst agents=%d answered=%d failed=%v retried_after=%v killed_leader=%s %s lost_bindings=%d", agents, okCount-1, failed, retriedOn, l.id, vd.Verdict, vd.lost)
	if okCount != agents+1 {
		t.Errorf("%d of %d sub-agents answered with a complete stream (last errors %v)", okCount-1, agents, failed)
	}
	if vd.Wrong != 0 {
		t.Errorf("%d wrong answers", vd.Wrong)
	}
	// Every answered sub-agent has its own generation placement in the log.
	reader := v.waitLeader(20 * time.Second)
	for _, s := range samples[1:] {
		if !s.ok {
			continue
		}
		if routecheck.AckedPlacement(v.history(reader, "generation", s.conv), false) == routecheck.Lost {
			t.Errorf("sub-agent %s was answered but its generation key has no placement in the log", s.conv)
		}
	}
}

// clientCapture is one request a real CLI sent (test/agentapi/testdata/clients).
type clientCapture struct {
	Path    string              `json:"path"`
	Headers map[string][]string `json:"headers"`
	Body    json.RawMessage     `json:"body"`
}

func readClientCapture(t *testing.T, file string) clientCapture {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "agentapi", "testdata", "clients", file))
	if err != nil {
		t.Fatal(err)
	}
	var c clientCapture
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return c
}

func (c clientCapture) header(name string) string {
	for k, v := range c.Headers {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// headers are the capture's headers as sent (its placeholder credential
// left out).
func (c clientCapture) headers() map[string]string {
	out := map[string]string{}
	for k, v := range c.Headers {
		if !strings.EqualFold(k, "Authorization") && len(v) > 0 {
			out[k] = v[0]
		}
	}
	return out
}

// body is the capture's body for this deployment: its model, and a
// completion budget the simulated engine answers in a moment (the shape
// is the client's).
func (c clientCapture) body() json.RawMessage {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(c.Body, &m)
	m["model"], _ = json.Marshal(model)
	m["max_tokens"] = json.RawMessage("16")
	delete(m, "thinking")
	b, _ := json.Marshal(m)
	return b
}

// lastEventType is the type of an SSE body's last event ("" none).
func lastEventType(body []byte) string {
	last := ""
	for _, line := range strings.Split(string(body), "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			var ev struct {
				Type string `json:"type"`
			}
			if json.Unmarshal([]byte(d), &ev) == nil {
				last = ev.Type
			}
		}
	}
	return last
}

// messagesStreamPrompt is a Messages stream's prompt as its message_start
// counts it (input_tokens with the cache reads and writes).
func messagesStreamPrompt(body []byte) int {
	for _, line := range strings.Split(string(body), "\n") {
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type    string          `json:"type"`
			Message json.RawMessage `json:"message"`
		}
		if json.Unmarshal([]byte(d), &ev) == nil && ev.Type == "message_start" {
			return promptTokens(ev.Message)
		}
	}
	return 0
}
