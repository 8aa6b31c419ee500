package worker

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func slowConfig(id string) Config {
	cfg := testConfig(id)
	cfg.Engine.TimeScale = 1
	cfg.Engine.DecodeTokenTime = 20 * time.Millisecond
	cfg.Engine.PrefillOverhead = time.Millisecond
	return cfg
}

// startStream starts a streaming request and returns once its first chunk arrived.
func startStream(t *testing.T, c *http.Client, url string, maxTokens string) (*bufio.Reader, *http.Response) {
	t.Helper()
	resp, err := c.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(chatBody("keep talking", `"stream":true,"max_tokens":`+maxTokens)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	return br, resp
}

func TestCloseLetsInFlightRequestsFinish(t *testing.T) {
	s, err := New(slowConfig("w-graceful"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := testClient(t)
	br, _ := startStream(t, c, s.URL(), "5")
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		closed <- s.Close(ctx)
	}()
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("stream cut during graceful close: %v", err)
	}
	if !strings.Contains(string(rest), "data: [DONE]") {
		t.Fatalf("stream did not finish: %q", rest)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if s.Ready() {
		t.Fatal("ready after Close")
	}
	if _, err := c.Get(s.URL() + "/healthz"); err == nil {
		t.Fatal("still accepting connections after Close")
	}
}

func TestCloseDeadlineCancelsInFlightRequests(t *testing.T) {
	s, err := New(slowConfig("w-deadline"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := testClient(t)
	br, _ := startStream(t, c, s.URL(), "4096") // would stream for over a minute
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// The stream was cut, and nothing the request started is left running
	// (goleak checks at the end of the package).
	rest, _ := io.ReadAll(br)
	if strings.Contains(string(rest), "[DONE]") {
		t.Fatal("a half-hour stream completed within the close deadline")
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestServeReturnsWhenContextEnds(t *testing.T) {
	s, err := New(testConfig("w-serve"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	c := testClient(t)
	url := "http://" + ln.Addr().String()
	waitReady(t, c, url, http.StatusOK)
	if s.URL() != url {
		t.Fatalf("URL %q, want %q", s.URL(), url)
	}
	if r := post(t, c, url+"/v1/completions", `{"model":"test-model","prompt":"hi there","max_tokens":1}`, nil); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if err := s.Start(context.Background()); err == nil {
		t.Fatal("Start after Close succeeded")
	}
}

func TestCloseWithoutStart(t *testing.T) {
	s, err := New(testConfig("w-idle"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != nil || s.URL() != "" {
		t.Fatal("address without Start")
	}
}

func TestStartFailsOnBusyPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := testConfig("w-busy")
	cfg.Port = ln.Addr().(*net.TCPAddr).Port
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if err := s.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("Start on a busy port = %v", err)
	}
}
