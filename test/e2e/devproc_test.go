package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/test/testhttp"
	"github.com/tether-project/tether/test/waitfor"
)

// Deadlines: generous because the machine running the suite may be loaded.
const (
	readyTimeout = 90 * time.Second
	exitTimeout  = 45 * time.Second
)

// devProc is a `tether dev` child process and what it printed.
type devProc struct {
	cmd    *exec.Cmd
	stderr *lockedBuffer
	lines  chan string // stdout lines not yet consumed
	exited chan struct{}
	err    error // cmd.Wait's result, after exited

	mu      sync.Mutex
	stdout  []string
	edges   []string          // edge URLs, edge-1 first
	workers map[string]string // instance id → URL
	token   string
	dataDir string
	caFile  string // "ca cert:" (mutual TLS, the default)
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startDev runs `tether dev --port 0 args...` and waits for its ready line.
// The process is stopped (SIGINT, then SIGKILL) at cleanup if the test did
// not stop it.
func startDev(t *testing.T, args ...string) *devProc {
	t.Helper()
	all := append([]string{"dev", "--port", "0", "--ready-timeout", readyTimeout.String()}, args...)
	cmd := exec.Command(tetherBin(t), all...)
	p := &devProc{cmd: cmd, stderr: &lockedBuffer{}, lines: make(chan string, 256), exited: make(chan struct{}), workers: map[string]string{}}
	cmd.Stderr = p.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start tether dev: %v", err)
	}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.record(sc.Text())
		}
		close(p.lines)
	}()
	go func() {
		<-readerDone // Wait closes the pipe: read everything first
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-p.exited:
		case <-time.After(exitTimeout):
			_ = cmd.Process.Kill()
			<-p.exited
			t.Errorf("tether dev ignored SIGINT for %s; killed. stderr:\n%s", exitTimeout, tail(p.stderr.String(), 40))
		}
	})

	deadline := time.NewTimer(readyTimeout + 10*time.Second)
	defer deadline.Stop()
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				<-p.exited
				t.Fatalf("tether dev exited before ready (%v).\nstdout:\n%s\nstderr:\n%s", p.err, p.output(), tail(p.stderr.String(), 40))
			}
			if strings.HasPrefix(line, "tether dev: ready") {
				p.mu.Lock()
				n, tok := len(p.edges), p.token
				p.mu.Unlock()
				if n == 0 || tok == "" {
					t.Fatalf("ready, but no edge URLs or admin token were printed:\n%s", p.output())
				}
				return p
			}
		case <-deadline.C:
			t.Fatalf("tether dev not ready within %s.\nstdout:\n%s\nstderr:\n%s", readyTimeout, p.output(), tail(p.stderr.String(), 40))
		}
	}
}

// record parses one stdout line: "edge-1:      https://…  raft …",
// "ctx-1:       https://…  context worker", "admin token: …", "data dir:    …",
// "ca cert:     …".
func (p *devProc) record(line string) {
	p.mu.Lock()
	p.stdout = append(p.stdout, line)
	name, rest, ok := strings.Cut(line, ":")
	if ok && !strings.HasPrefix(line, " ") {
		fields := strings.Fields(rest)
		switch {
		case strings.HasPrefix(name, "edge-") && len(fields) > 0:
			p.edges = append(p.edges, fields[0])
		case (strings.Contains(name, "ctx-") || strings.Contains(name, "gen-")) && len(fields) > 0:
			p.workers[name] = fields[0]
		case name == "admin token" && len(fields) > 0:
			p.token = fields[0]
		case name == "data dir" && len(fields) > 0:
			p.dataDir = fields[0]
		case name == "ca cert" && len(fields) > 0:
			p.caFile = fields[0]
		}
	}
	p.mu.Unlock()
	select {
	case p.lines <- line:
	default: // nobody is reading: the transcript keeps it
	}
}

func (p *devProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.stdout, "\n")
}

func (p *devProc) edge(i int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.edges[i]
}

func (p *devProc) worker(id string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.workers[id]
}

// stop sends SIGINT and asserts a clean exit: status 0 and the "stopped"
// line.
func (p *devProc) stop(t *testing.T) { t.Helper(); p.stopWith(t, syscall.SIGINT) }

// stopWith is stop with another signal (SIGTERM).
func (p *devProc) stopWith(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%v: %v", sig, err)
	}
	select {
	case <-p.exited:
	case <-time.After(exitTimeout):
		t.Fatalf("tether dev still running %s after %v.\nstderr:\n%s", exitTimeout, sig, tail(p.stderr.String(), 40))
	}
	if p.err != nil {
		t.Fatalf("tether dev exited with %v after %v.\nstdout:\n%s\nstderr:\n%s", p.err, sig, p.output(), tail(p.stderr.String(), 40))
	}
	if out := p.output(); !strings.Contains(out, "tether dev: stopped") {
		t.Fatalf("no clean-stop line after %v:\n%s", sig, out)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func httpClient(t *testing.T) *http.Client { return testhttp.Client(t, nil) }

func tlsClient(t *testing.T, tc *tls.Config) *http.Client { return testhttp.Client(t, tc) }

// client trusts the CA `tether dev` printed (its edges serve HTTPS with
// certificates from it); a plain client for a --plaintext stack.
func (p *devProc) client(t *testing.T) *http.Client {
	t.Helper()
	p.mu.Lock()
	ca := p.caFile
	p.mu.Unlock()
	if ca == "" {
		return httpClient(t)
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatalf("tether dev's CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("tether dev's CA %s holds no certificate", ca)
	}
	return tlsClient(t, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
}

// agent is one conversation: its session, optional parent, system prompt
// and the messages so far. aggregated: its answers come from one hop to
// the aggregated fleet (tether dev --generation-workers 0).
type agent struct {
	session, parent string
	system          string
	turns           []string
	aggregated      bool
}

// turn is what one request returned.
type turn struct {
	ctxInst, ctxRank string
	genInst, genRank string
	prompt, cached   int
	via              string // the edge URL that answered
	route            string // its x-tether-route
}

// errTransport marks a request that never got an HTTP answer (the edge
// is down).
var errTransport = errors.New("no HTTP answer")

// send posts the next turn to baseURL and appends the reply to the
// conversation. A non-200 answer is an error naming the body.
func (a *agent) send(ctx context.Context, c *http.Client, baseURL, model, user string) (turn, error) {
	msgs := []map[string]string{{"role": "system", "content": a.system}}
	pending := append(append([]string(nil), a.turns...), user)
	for i, m := range pending {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": m})
	}
	body, err := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": 6})
	if err != nil {
		return turn{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return turn{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-id", a.session)
	if a.parent != "" {
		req.Header.Set(devstack.ParentHeader, a.parent)
	}
	resp, err := c.Do(req)
	if err != nil {
		return turn{}, fmt.Errorf("%s: %w: %v", a.session, errTransport, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return turn{}, fmt.Errorf("%s: %w: read: %v", a.session, errTransport, err)
	}
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("%s via %s: HTTP %d: %s", a.session, baseURL, resp.StatusCode, b)
		if after := retryAfter(resp); resp.StatusCode == http.StatusServiceUnavailable && after > 0 {
			return turn{}, &retryLaterError{after: after, err: err}
		}
		return turn{}, err
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			Prompt  int `json:"prompt_tokens"`
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) != 1 {
		return turn{}, fmt.Errorf("%s: bad completion (%v): %s", a.session, err, b)
	}
	tr := turn{prompt: out.Usage.Prompt, cached: out.Usage.Details.Cached, via: baseURL}
	if err := readRoute(resp.Header.Get(edge.HeaderRoute), &tr, a.aggregated); err != nil {
		return turn{}, fmt.Errorf("%s: %w", a.session, err)
	}
	a.turns = append(pending, out.Choices[0].Message.Content)
	return tr, nil
}

// retryLaterError is a 503 answer with Retry-After: the edge cannot place
// the key right now (the affinity log did not commit or apply its Bind
// within propose_timeout, as on a loaded machine, or is electing) and asks
// the client to come back.
type retryLaterError struct {
	after time.Duration
	err   error
}

func (r *retryLaterError) Error() string { return r.err.Error() }

// retryAfter is the pause an answer asks for (Retry-After-Ms, else
// Retry-After), 0 if none.
func retryAfter(resp *http.Response) time.Duration {
	if ms, err := strconv.Atoi(resp.Header.Get("Retry-After-Ms")); err == nil && ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	if sec, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && sec > 0 {
		return time.Duration(sec) * time.Second
	}
	return 0
}

// sendHonoringRetryAfter is send, retried on the same edge after each
// answer asking to retry later (the pause capped at 1 s), as an OpenAI SDK
// client does, until ctx ends.
func (a *agent) sendHonoringRetryAfter(ctx context.Context, c *http.Client, baseURL, model, user string) (turn, error) {
	for {
		tr, err := a.send(ctx, c, baseURL, model, user)
		var rl *retryLaterError
		if !errors.As(err, &rl) {
			return tr, err
		}
		t := time.NewTimer(min(rl.after, time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return tr, fmt.Errorf("%w (retrying until %v)", err, ctx.Err())
		case <-t.C:
		}
	}
}

// parseRoute reads "context=ctx-1/2; generation=gen-2/0" (edge.ParseRoute).
func parseRoute(h string, tr *turn) error { return readRoute(h, tr, false) }

// readRoute is parseRoute; aggregated, it wants the one hop of an
// aggregated fleet: "context=ctx-1/2; generation=-".
func readRoute(h string, tr *turn, aggregated bool) error {
	r, err := edge.ParseRoute(h)
	if err != nil {
		return err
	}
	tr.ctxInst, tr.ctxRank, tr.genInst, tr.genRank = r.ContextInstance, r.ContextRank, r.GenerationInstance, r.GenerationRank
	tr.route = h
	switch {
	case aggregated && (tr.ctxInst == "" || tr.genInst != ""):
		return fmt.Errorf("%s header %q is not one hop to the aggregated fleet", edge.HeaderRoute, h)
	case !aggregated && (tr.ctxInst == "" || tr.genInst == ""):
		return fmt.Errorf("%s header %q does not name both hops", edge.HeaderRoute, h)
	}
	return nil
}

// mustSend is sendHonoringRetryAfter for the main goroutine.
func (a *agent) mustSend(t *testing.T, c *http.Client, baseURL, model, user string) turn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tr, err := a.sendHonoringRetryAfter(ctx, c, baseURL, model, user)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// adminBinding calls GET /admin/v1/bindings/{fleet}/{key}; found is false
// on 404.
// awaitBinding waits until every edge of p has key bound on fleet to inst:
// a new key is dispatched beside its Bind, and a later request follows the
// committed binding once its edge has applied it.
func awaitBinding(t *testing.T, c *http.Client, p *devProc, fleet, key, inst string) {
	t.Helper()
	waitfor.Reason(t, 15*time.Second, fleet+" binding of "+key+" on every edge", func() string {
		for i := range 3 {
			if b, ok := adminBinding(t, c, p.edge(i), p.token, fleet, key); !ok || b.Instance != inst {
				return fmt.Sprintf("edge-%d: %+v (found %v), want %s", i+1, b, ok, inst)
			}
		}
		return ""
	})
}

func adminBinding(t *testing.T, c *http.Client, baseURL, token, fleet, key string) (admin.BindingInfo, bool) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, baseURL+"/admin/v1/bindings/"+fleet+"/"+key, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("admin binding %s/%s: %v", fleet, key, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusNotFound {
		return admin.BindingInfo{}, false
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("admin binding %s/%s on %s: %d %s", fleet, key, baseURL, resp.StatusCode, b)
	}
	var bi admin.BindingInfo
	if err := json.Unmarshal(b, &bi); err != nil {
		t.Fatalf("admin binding: %v: %s", err, b)
	}
	return bi, true
}

// metricSum scrapes url's Prometheus text and sums the samples of name
// whose labels contain every want pair.
func metricSum(t *testing.T, c *http.Client, url, name string, want map[string]string) float64 {
	t.Helper()
	resp, err := c.Get(url + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	total := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		rest := line[len(name):]
		labels := ""
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			labels, rest = rest[1:end], rest[end+1:]
		} else if !strings.HasPrefix(rest, " ") {
			continue // another metric sharing the prefix
		}
		match := true
		for k, v := range want {
			if !strings.Contains(labels, k+"="+strconv.Quote(v)) {
				match = false
			}
		}
		if !match {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		total += f
	}
	return total
}
