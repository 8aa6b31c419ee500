package worker

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/tether-project/tether/test/natstest"
	"github.com/tether-project/tether/test/workertest"
)

// max_concurrent_requests: requests beyond the limit get 429 with
// Retry-After and an OpenAI error at once (before the body is read), and
// the worker serves again as soon as in-flight requests finish.
func TestConcurrencyLimitRefusesWith429(t *testing.T) {
	cfg := testConfig("ctx-limit")
	cfg.MaxConcurrentRequests = 2
	// Real time, slow decode: a long completion stays in flight until its
	// client goes away.
	cfg.Engine.TimeScale = 1
	cfg.Engine.DecodeTokenTime = 50 * time.Millisecond
	s := workertest.Start(t, New, cfg)
	c := testClient(t)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := chatBody("long "+strings.Repeat("x ", i+1), `"max_tokens":4000,"stream":true`)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := c.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for s.inflight.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the two long requests never were in flight together (%d)", s.inflight.Load())
		}
		time.Sleep(5 * time.Millisecond) // polling, not a wait-to-pass
	}

	r := post(t, c, s.URL()+"/v1/chat/completions", chatBody("one too many", `"max_tokens":1`), nil)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" {
		t.Fatalf("third request: %d Retry-After %q: %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	var e struct {
		Error struct {
			Type, Code, Message string
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Type != "rate_limit_error" || e.Error.Code != "too_many_concurrent_requests" ||
		!strings.Contains(e.Error.Message, "max_concurrent_requests") {
		t.Fatalf("429 body %s (%v)", r.body, err)
	}
	// Health endpoints are not inference: never limited.
	if r := do(t, c, http.MethodGet, s.URL()+"/readyz", "", nil); r.status != http.StatusOK {
		t.Fatalf("/readyz under the limit: %d", r.status)
	}

	cancel()
	wg.Wait()
	deadline = time.Now().Add(10 * time.Second)
	for s.inflight.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("cancelled requests still counted in flight (%d)", s.inflight.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r := post(t, c, s.URL()+"/v1/chat/completions", chatBody("after the flood", `"max_tokens":1`), nil); r.status != http.StatusOK {
		t.Fatalf("after the in-flight requests ended: %d %s", r.status, r.body)
	}
}

// The HTTP server timeouts come from the configuration: a client that
// sends half its headers is cut after read_header_timeout.
func TestReadHeaderTimeoutIsConfigurable(t *testing.T) {
	cfg := testConfig("ctx-slow")
	cfg.ReadHeaderTimeout = 200 * time.Millisecond
	s := workertest.Start(t, New, cfg)
	if got := s.httpSrv.ReadHeaderTimeout; got != 200*time.Millisecond {
		t.Fatalf("http.Server.ReadHeaderTimeout = %v", got)
	}
	var d net.Dialer
	conn, err := d.DialContext(context.Background(), "tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")); err != nil {
		t.Fatal(err)
	}
	// The server closes the stalled connection (EOF or a 408) well before
	// this read deadline.
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(conn)
	if ne, ok := err.(interface{ Timeout() bool }); ok && ne.Timeout() {
		t.Fatalf("the stalled connection was not cut after read_header_timeout (read %q)", b)
	}
}

// A worker authenticates to NATS with a token taken from the environment.
func TestNATSTokenFromEnvironmentConnects(t *testing.T) {
	ns := natstest.Start(t, &natsserver.Options{Authorization: "nats-token-0123456789"})

	cfg := testConfig("ctx-token")
	cfg.NATS.URLs = []string{ns.ClientURL()}
	cfg.ApplyEnv(func(k string) string {
		if k == EnvNATSToken {
			return "nats-token-0123456789"
		}
		return ""
	})
	s := workertest.Start(t, New, cfg)
	waitReady(t, testClient(t), s.URL(), http.StatusOK) // /readyz needs the NATS connection

	// The same worker with a wrong token is refused by the server.
	bad := testConfig("ctx-badtoken")
	bad.NATS.URLs = []string{ns.ClientURL()}
	bad.NATS.Token = "wrong-token"
	b := workertest.Start(t, New, bad)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := b.pub.nc.LastError()
		if err != nil && strings.Contains(strings.ToLower(err.Error()), "authorization") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a wrong token was not refused (last error %v, connected %v)", err, b.pub.connected())
		}
		time.Sleep(10 * time.Millisecond) // polling, not a wait-to-pass
	}
	if b.pub.connected() {
		t.Fatal("connected with a wrong token")
	}
}
