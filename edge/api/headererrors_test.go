package api

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/edge/config"
)

// rawExchange writes req on a new connection from dial and returns the
// response the server sends before closing.
func rawExchange(t *testing.T, dial func() (net.Conn, error), req string) *http.Response {
	t.Helper()
	c, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() { _, _ = io.WriteString(c, req) }()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	return resp
}

// checkAPIError asserts resp is status in the API's JSON error shape.
func checkAPIError(t *testing.T, resp *http.Response, status int, code string) string {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json: %s", ct, b)
	}
	var e struct {
		Error struct {
			Message, Type string
			Code          string
		}
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" || e.Error.Type != "invalid_request_error" || e.Error.Code != code {
		t.Fatalf("not the API's error shape with code %s (%v): %s", code, err, b)
	}
	return e.Error.Message
}

// Requests net/http rejects before any handler runs are answered in the
// API's JSON error shape, with net/http's status; the edge keeps serving.
func TestHeaderLevelErrorsAreAPIErrors(t *testing.T) {
	addr, chat := startServer(t, nil)
	dial := func() (net.Conn, error) { return net.Dial("tcp", addr) }
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n"
	for _, c := range []struct {
		name, req string
		status    int
		code      string
	}{
		{"NUL in a header value", head + "X-Junk: a\x00b\r\nContent-Length: 0\r\n\r\n", 400, "malformed_request"},
		{"bare CR in a header value", head + "X-Junk: a\rb\r\nContent-Length: 0\r\n\r\n", 400, "malformed_request"},
		{"invalid header name", head + "X Junk: b\r\nContent-Length: 0\r\n\r\n", 400, "malformed_request"},
		{"2 MiB header", head + "X-Junk: " + strings.Repeat("a", 2<<20) + "\r\nContent-Length: 0\r\n\r\n", 431, "request_header_too_large"},
		{"repeated Content-Length", head + "Content-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, "malformed_request"},
		{"unsupported transfer encoding", head + "Transfer-Encoding: gzip\r\n\r\n", 501, "transfer_encoding_not_supported"},
		{"HTTP/9", "POST /v1/chat/completions HTTP/9.1\r\nHost: edge\r\n\r\n", 505, "http_version_not_supported"},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkAPIError(t, rawExchange(t, dial, c.req), c.status, c.code)
		})
	}
	if status := chat(); status != 200 {
		t.Fatalf("after the bad requests: %d", status)
	}
}

// startServer serves a handler answering 200 on the API's server and
// listener (NewServer, Listener), with the edge's default timeouts; tlsCfg
// nil serves plain HTTP. chat sends a well-formed request and returns its
// status.
func startServer(t *testing.T, tlsCfg *tls.Config) (addr string, chat func() int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.DefaultConfig()
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }), &cfg, nil)
	go func() { _ = srv.Serve(Listener{Listener: ln, TLS: tlsCfg}) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), func() int {
		resp, err := http.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
}

// Behind TLS the same holds; a plain-HTTP request to the TLS port gets a
// JSON 400 saying so; handlers still see r.TLS.
func TestHeaderLevelErrorsOverTLS(t *testing.T) {
	ca, err := pki.NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue("edge-1", pki.IssueOptions{Role: pki.RoleEdge, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srvTLS := &tls.Config{Certificates: []tls.Certificate{leaf.TLS}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		RestoreTLS(r)
		if r.TLS == nil || !r.TLS.HandshakeComplete {
			w.WriteHeader(500)
			return
		}
		w.WriteHeader(204)
	}), ConnContext: ConnContext, MaxHeaderBytes: 1 << 20, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(Listener{Listener: ln, TLS: srvTLS}) }()
	defer srv.Close()
	clientTLS := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	dialTLS := func() (net.Conn, error) { return tls.Dial("tcp", ln.Addr().String(), clientTLS) }

	checkAPIError(t, rawExchange(t, dialTLS, "POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nX-Junk: a\x00b\r\nContent-Length: 0\r\n\r\n"), 400, "malformed_request")
	anthropicError(t, rawExchange(t, dialTLS, "POST /v1/messages HTTP/1.1\r\nHost: edge\r\nX-Junk: a\x00b\r\nContent-Length: 0\r\n\r\n"), 400)
	anthropicError(t, rawExchange(t, func() (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) },
		"POST /v1/messages HTTP/1.1\r\nHost: edge\r\nContent-Length: 0\r\n\r\n"), 400)
	msg := checkAPIError(t, rawExchange(t, func() (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) },
		"POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nContent-Length: 0\r\n\r\n"), 400, "https_required")
	if !strings.Contains(msg, "HTTPS") {
		t.Errorf("a plain-HTTP request to the TLS port: %q does not say the port serves HTTPS", msg)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}}
	defer c.CloseIdleConnections()
	resp, err := c.Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 {
		t.Errorf("a handler behind apiErrorConn saw no r.TLS (status %d)", resp.StatusCode)
	}
}

// anthropicError asserts body is Anthropic's error shape
// ({"type":"error","error":{"type","message"}}) with type invalid_request_error.
func anthropicError(t *testing.T, resp *http.Response, status int) {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, b)
	}
	var e struct {
		Type  string `json:"type"`
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Type != "error" || e.Error == nil || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
		t.Fatalf("not Anthropic's error shape (%v): %s", err, b)
	}
}

// A header-level refusal takes the shape of the refused request's path:
// Anthropic's on the Messages paths (with a query, in absolute form, after
// another API's request on the same connection), OpenAI's elsewhere (also
// after a Messages request on the same connection); a plain-HTTP request to
// the TLS port as well.
func TestHeaderLevelErrorsInThePathsShape(t *testing.T) {
	addr, _ := startServer(t, nil)
	dial := func() (net.Conn, error) { return net.Dial("tcp", addr) }
	bad := "Host: edge\r\nX-Junk: a\x00b\r\nContent-Length: 0\r\n\r\n"
	good := func(path string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: edge\r\nContent-Length: 2\r\n\r\n{}"
	}
	for _, c := range []struct {
		name, req string
		messages  bool
		status    int
	}{
		{"messages", "POST /v1/messages HTTP/1.1\r\n" + bad, true, 400},
		{"messages with a query", "POST /v1/messages?beta=true HTTP/1.1\r\n" + bad, true, 400},
		{"count_tokens", "POST /v1/messages/count_tokens HTTP/1.1\r\n" + bad, true, 400},
		{"absolute form", "POST http://edge/v1/messages HTTP/1.1\r\n" + bad, true, 400},
		{"messages, an unknown transfer coding", "POST /v1/messages HTTP/1.1\r\nHost: edge\r\nTransfer-Encoding: gzip\r\n\r\n", true, 501},
		{"messages after chat on the connection", good("/v1/chat/completions") + "POST /v1/messages HTTP/1.1\r\n" + bad, true, 400},
		{"responses", "POST /v1/responses HTTP/1.1\r\n" + bad, false, 400},
		{"chat after messages on the connection", good("/v1/messages") + "POST /v1/chat/completions HTTP/1.1\r\n" + bad, false, 400},
		{"a path below messages' that is none of its", "POST /v1/messagesx HTTP/1.1\r\n" + bad, false, 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			c0, err := dial()
			if err != nil {
				t.Fatal(err)
			}
			defer c0.Close()
			_ = c0.SetDeadline(time.Now().Add(10 * time.Second))
			go func() { _, _ = io.WriteString(c0, c.req) }()
			br := bufio.NewReader(c0)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Count(c.req, "POST ") == 2 { // the good request's answer first
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("the well-formed request: %d", resp.StatusCode)
				}
				if resp, err = http.ReadResponse(br, nil); err != nil {
					t.Fatal(err)
				}
			}
			if c.messages {
				anthropicError(t, resp, c.status)
			} else {
				checkAPIError(t, resp, c.status, "malformed_request")
			}
		})
	}
}

// requestLines finds the last request line's path however the bytes are
// cut into reads, and never takes a body's line or a header for one.
func TestRequestLinesAcrossReads(t *testing.T) {
	stream := "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5009\r\n\r\n" + strings.Repeat("z", 5000) +
		"{\"a\":1}POST /v1/messages?beta=true HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n" +
		"{\"a\":\"GET /v1/chat/completions\"}\nPUT /x\n" + strings.Repeat("z", 5000) + "\n"
	for _, size := range []int{1, 2, 3, 7, 64, 4096, len(stream)} {
		var s requestLines
		for i := 0; i < len(stream); i += size {
			s.feed([]byte(stream[i:min(i+size, len(stream))]))
		}
		if s.path != "/v1/messages" || s.dialect().String() != "messages" {
			t.Errorf("reads of %d bytes: path %q, dialect %s", size, s.path, s.dialect())
		}
	}
	for line, want := range map[string]string{
		"GET /v1/responses/resp_1 HTTP/1.1":                            "/v1/responses/resp_1",
		"POST https://edge:8000/v1/messages/count_tokens?x=1 HTTP/1.1": "/v1/messages/count_tokens",
		`{"model":"m"}POST /v1/messages HTTP/1.1`:                      "/v1/messages",
		"POST /v1/messages HTTP/9.1":                                   "/v1/messages",
		"POST /v1/messages/" + strings.Repeat("a", 400) + " HTTP/1.1":  "",
		"post /v1/messages HTTP/1.1":                                   "-",
		"POST /v1/messages":                                            "-",
		"POST /v1/messages SPDY/3":                                     "-",
		"X-Junk: /v1/messages HTTP/1.1":                                "-",
		"HTTP/1.1 200 OK":                                              "-",
	} {
		if want == "" { // a request line whose target is longer than the kept tail
			var s requestLines
			s.path = "/v1/messages"
			s.feed([]byte(line + "\r\n"))
			if s.path != "" {
				t.Errorf("%.60q: path %q, want none", line, s.path)
			}
			continue
		}
		if want == "-" {
			want = ""
		}
		got, ok := parseRequestLine([]byte(line), false)
		if got != want || ok != (want != "") {
			t.Errorf("%.60q: %q %v, want %q", line, got, ok, want)
		}
	}
}
