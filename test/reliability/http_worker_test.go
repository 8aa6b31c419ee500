package reliability

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/test/testhttp"
	"github.com/tether-project/tether/test/workertest"
	"github.com/tether-project/tether/worker"
)

const workerKey = "reliability-worker-key-0123456789"

func standaloneWorker(t *testing.T, mut func(*worker.Config)) *worker.Server {
	t.Helper()
	cfg := worker.DefaultConfig()
	cfg.InstanceID = "w-http"
	cfg.Model = "test-model"
	cfg.InternalRequestAuthKey = workerKey
	cfg.ServerRole = hintauth.RoleContext
	cfg.Engine.TimeScale = 0
	cfg.MaxBodyBytes = 64 << 10
	cfg.Logger = slog.New(slog.DiscardHandler)
	if mut != nil {
		mut(&cfg)
	}
	return workertest.Start(t, worker.New, cfg)
}

func httpClient(t *testing.T) *http.Client { return testhttp.Client(t, nil) }

type openAIError struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// expectAPIError checks an OpenAI error body with the given status and a
// message containing want.
func expectAPIError(t *testing.T, resp *http.Response, status int, want string) {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, body)
	}
	var e openAIError
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error JSON (%v): %s", err, body)
	}
	if !strings.Contains(e.Error.Message, want) {
		t.Fatalf("message %q lacks %q", e.Error.Message, want)
	}
}

// expectAPIErrorCode is expectAPIError that also wants the error's code:
// a refusal must say why, not only refuse.
func expectAPIErrorCode(t *testing.T, resp *http.Response, status int, code, want string) {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e openAIError
	if resp.StatusCode != status || json.Unmarshal(body, &e) != nil || e.Error == nil || e.Error.Code == nil || *e.Error.Code != code ||
		!strings.Contains(e.Error.Message, want) {
		t.Fatalf("status %d %s; want %d with code %q and a message naming %q", resp.StatusCode, body, status, code, want)
	}
}

func chat(content string) string {
	b, _ := json.Marshal(map[string]any{"model": "test-model", "max_tokens": 2, "messages": []map[string]string{{"role": "user", "content": content}}})
	return string(b)
}

// The worker's bad-input catalogue beyond its own package tests: header
// abuse, invalid UTF-8, slow clients, floods and unsigned hints — each with
// a clear error, and the worker still serving afterwards.
func TestWorkerHTTPBadInput(t *testing.T) {
	s := standaloneWorker(t, nil)
	c := httpClient(t)
	url := s.URL() + "/v1/chat/completions"
	post := func(body string, hdr map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("POST: %v", err)
		}
		return resp
	}

	t.Run("huge header value", func(t *testing.T) {
		resp := post(chat("hi"), map[string]string{"X-Junk": strings.Repeat("a", 2<<20)})
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("status %d, want 431", resp.StatusCode)
		}
	})
	t.Run("invalid UTF-8 in a message", func(t *testing.T) {
		body := strings.Replace(chat("hello XX"), "XX", "\xff\xfe", 1)
		resp := post(body, nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// Either a clear 400, or accepted with the bytes replaced (JSON
		// decoding maps invalid UTF-8 to U+FFFD): never a 5xx or a hang.
		if resp.StatusCode != 200 && resp.StatusCode != 400 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		t.Logf("invalid UTF-8: status %d", resp.StatusCode)
	})
	t.Run("unsigned sub-agent hint sent directly to a worker", func(t *testing.T) {
		expectAPIErrorCode(t, post(chat("hi"), map[string]string{hintauth.HeaderAffinityID: "parent-1"}), 401,
			"missing_subagent_affinity_signature", hintauth.HeaderAffinityAuth+" is missing")
	})
	t.Run("forged sub-agent signature", func(t *testing.T) {
		f := hintauth.Fields{Role: hintauth.RoleContext, Model: "test-model", ConversationID: "c", AffinityID: "parent-1", RequestType: hintauth.RequestAggregated}
		sig := hintauth.Sign([]byte("an-attacker-key-0123456789"), f)
		expectAPIErrorCode(t, post(chat("hi"), map[string]string{hintauth.HeaderAffinityID: "parent-1", hintauth.HeaderAffinityAuth: sig}), 403,
			"invalid_subagent_affinity_signature", "not signed with this worker's internal_request_auth_key")
	})
	t.Run("unknown endpoint", func(t *testing.T) {
		resp, err := c.Post(s.URL()+"/v1/unknown", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		expectAPIError(t, resp, 404, "unknown")
	})
	t.Run("wrong method", func(t *testing.T) {
		req, _ := http.NewRequest("DELETE", url, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		expectAPIError(t, resp, 405, "not allowed")
	})
	t.Run("oversized body without content length", func(t *testing.T) {
		pr, pw := io.Pipe()
		go func() {
			_, _ = pw.Write([]byte(`{"model":"test-model","messages":[{"role":"user","content":"`))
			_, _ = pw.Write(bytes.Repeat([]byte("x"), 128<<10))
			pw.Close()
		}()
		req, _ := http.NewRequest("POST", url, pr)
		req.ContentLength = -1 // chunked: the limit is enforced while reading
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		expectAPIError(t, resp, 413, "exceeds the limit")
	})
	t.Run("slow client does not block others", func(t *testing.T) {
		// A client that sends half a request line and stalls holds one
		// connection, not the server.
		conn, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")); err != nil {
			t.Fatal(err)
		}
		resp := post(chat("still served"), nil)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d while a slow client stalls", resp.StatusCode)
		}
	})
	t.Run("slow body is cut off, not waited for forever", func(t *testing.T) {
		// read_header_timeout is configurable: a short one here, the
		// 10 s default with -long.
		slow := s
		if !longMode() {
			slow = standaloneWorker(t, func(c *worker.Config) { c.InstanceID, c.ReadHeaderTimeout = "w-slow", 300*time.Millisecond })
		}
		conn, err := net.Dial("tcp", slow.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, _ = conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"))
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err = bufio.NewReader(conn).ReadString('\n')
		if err == nil {
			return // the server answered (408) and closed
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("the server kept a stalled header open for 30s")
		}
	})
	t.Run("request flood", func(t *testing.T) {
		const n = 300
		var wg sync.WaitGroup
		statuses := make(chan int, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := c.Post(url, "application/json", strings.NewReader(chat(fmt.Sprintf("flood %d", i))))
				if err != nil {
					statuses <- -1
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				statuses <- resp.StatusCode
			}()
		}
		wg.Wait()
		close(statuses)
		count := map[int]int{}
		for st := range statuses {
			count[st]++
		}
		// Every request gets an answer: served, or refused with a clear
		// 429/503 if the worker limits concurrency. No resets, no 5xx.
		for st, k := range count {
			if st != 200 && st != 429 && st != 503 {
				t.Fatalf("flood: %d requests ended with %d (all: %v)", k, st, count)
			}
		}
		t.Logf("flood of %d: %v", n, count)
	})
	t.Run("flood beyond max_concurrent_requests", func(t *testing.T) {
		// A worker reached directly sheds what exceeds its limit with
		// 429, Retry-After and an OpenAI error, and serves the rest.
		lim := standaloneWorker(t, func(c *worker.Config) {
			c.InstanceID, c.MaxConcurrentRequests = "w-limited", 4
			c.Engine.TimeScale, c.Engine.DecodeTokenTime = 1, 20*time.Millisecond // each request takes a while
		})
		const n = 100
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			count    = map[int]int{}
			refusals []string
		)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := c.Post(lim.URL()+"/v1/chat/completions", "application/json", strings.NewReader(chat(fmt.Sprintf("flood %d", i))))
				if err != nil {
					mu.Lock()
					count[-1]++
					mu.Unlock()
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				mu.Lock()
				defer mu.Unlock()
				count[resp.StatusCode]++
				if resp.StatusCode == http.StatusTooManyRequests {
					var e openAIError
					if json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Type != "rate_limit_error" || resp.Header.Get("Retry-After") == "" {
						refusals = append(refusals, fmt.Sprintf("%v %s", resp.Header, b))
					}
				}
			}()
		}
		wg.Wait()
		if count[200]+count[429] != n || count[429] == 0 || count[200] < 4 {
			t.Fatalf("flood of %d against a limit of 4: %v (want only 200s and 429s, both)", n, count)
		}
		if len(refusals) > 0 {
			t.Fatalf("429 without Retry-After or an OpenAI rate_limit_error: %v", refusals[0])
		}
		t.Logf("flood of %d against max_concurrent_requests 4: %v", n, count)
		if r, err := c.Post(lim.URL()+"/v1/chat/completions", "application/json", strings.NewReader(chat("after the flood"))); err != nil || r.StatusCode != 200 {
			t.Fatalf("after the flood: %v %v", r, err)
		} else {
			r.Body.Close()
		}
	})
	// Nothing lost: the worker serves normally after all of the above.
	resp := post(chat("after the catalogue"), nil)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("worker unhealthy after the catalogue: %d", resp.StatusCode)
	}
}
