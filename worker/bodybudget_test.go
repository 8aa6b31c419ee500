package worker

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/test/workertest"
)

// max_inflight_body_bytes: while one large body holds the budget (its
// bytes reserved on arrival, the rest not sent yet), another is refused
// with 429, Retry-After and an OpenAI error before it is read; once the
// first is sent it is served. Without the budget, both were read whole.
func TestInflightBodyBudgetRefusesWith429(t *testing.T) {
	cfg := testConfig("ctx-bodies")
	cfg.MaxBodyBytes, cfg.MaxInflightBodyBytes = 64<<10, 100<<10
	s := workertest.Start(t, New, cfg)
	c := testClient(t)
	body := chatBody(strings.Repeat("word ", 12_000), `"max_tokens":1`)
	if len(body) <= 50<<10 || len(body) > 64<<10 {
		t.Fatalf("body of %d bytes", len(body))
	}

	pr, pw := io.Pipe()
	gate := make(chan struct{})
	go func() {
		_, _ = pw.Write([]byte(body[:512]))
		<-gate
		_, _ = pw.Write([]byte(body[512:]))
		pw.Close()
	}()
	held := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/chat/completions", pr)
		req.ContentLength = int64(len(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			held <- -1
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	deadline := time.Now().Add(10 * time.Second)
	for s.bodies.InUse() != int64(len(body)) {
		if time.Now().After(deadline) {
			close(gate)
			t.Fatalf("the first body never held the budget (%d held)", s.bodies.InUse())
		}
		time.Sleep(5 * time.Millisecond) // polling, not a wait-to-pass
	}
	r := post(t, c, s.URL()+"/v1/chat/completions", body, nil)
	close(gate)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" {
		t.Fatalf("second body: %d Retry-After %q: %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	var e struct {
		Error struct {
			Type, Code, Message string
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Type != "rate_limit_error" || e.Error.Code != "request_body_budget_exhausted" ||
		!strings.Contains(e.Error.Message, "max_inflight_body_bytes") {
		t.Fatalf("429 body %s (%v)", r.body, err)
	}
	if st := <-held; st != http.StatusOK {
		t.Fatalf("the body within the budget: %d", st)
	}
	if n := s.bodies.InUse(); n != 0 {
		t.Fatalf("%d body bytes held after every request ended", n)
	}
}
