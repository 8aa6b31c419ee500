package edge

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// A request beyond admission.max_inflight is shed before its body is read:
// 429 edge_overloaded with Retry-After in the API's error shape.
func TestShedRequestsGet429WithRetryAfter(t *testing.T) {
	s := startStatic(t, 1, 1, func(c *Config) { c.Admission.MaxInflight, c.Admission.MinInflight = 1, 1 })
	gate := make(chan struct{})
	s.ctx[0].gate.Store(&gate)
	var wg sync.WaitGroup
	var first response
	wg.Add(1)
	go func() {
		defer wg.Done()
		first = s.chat(t, oneTurn(t, "held"), map[string]string{"x-session-id": "held"})
	}()
	waitFor(t, "the first request in flight", 10*time.Second, func() bool {
		return s.te.e.admission.InFlight() == 1
	})
	r := s.chat(t, oneTurn(t, "shed"), map[string]string{"x-session-id": "shed"})
	// A Messages client is refused in the Anthropic error shape.
	msgStatus, msgBody, err := postRaw(t, s.c, s.te.url()+"/v1/messages", map[string]any{"model": testModel, "max_tokens": 4,
		"messages": []any{map[string]any{"role": "user", "content": "shed"}}}, nil)
	close(gate)
	if err != nil {
		t.Fatal(err)
	}
	var anth struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(msgBody, &anth) != nil || msgStatus != http.StatusTooManyRequests || anth.Type != "error" ||
		anth.Error.Type != "rate_limit_error" || !strings.Contains(anth.Error.Message, "saturated") {
		t.Errorf("a Messages request beyond max_inflight: %d %s, want 429 in the Anthropic shape (rate_limit_error)", msgStatus, msgBody)
	}
	wg.Wait()
	if r.status != http.StatusTooManyRequests || !strings.Contains(string(r.body), "edge_overloaded") {
		t.Fatalf("beyond max_inflight: %d %s, want 429 edge_overloaded", r.status, r.body)
	}
	if r.header.Get("Retry-After") == "" || r.header.Get("Retry-After-Ms") == "" {
		t.Errorf("429 without Retry-After: %v", r.header)
	}
	if first.status != 200 {
		t.Fatalf("the admitted request: %d %s", first.status, first.body)
	}
	if r := s.chat(t, oneTurn(t, "after"), map[string]string{"x-session-id": "after"}); r.status != 200 {
		t.Fatalf("after the held request finished: %d %s", r.status, r.body)
	}
}
