package edge

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/config"
)

// The adaptive limit falls while the process is saturated (scheduling
// latency beyond the bound) and recovers after; requests beyond it are
// refused, never below the floor.
func TestShedderLimitFollowsSaturation(t *testing.T) {
	cfg := config.DefaultAdmissionConfig()
	cfg.MaxSchedulingLatency = 100 * time.Millisecond
	s, err := newShedder(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var releases []func()
	for range 100 {
		rel, why := s.admit()
		if rel == nil {
			t.Fatalf("refused below the limit: %s", why)
		}
		releases = append(releases, rel)
	}
	// Saturated: cut to 3/4 of what is in flight, at most every
	// shedCutEvery ticks.
	s.update(200*time.Millisecond, 10*shedMinSamples)
	if got := s.limit; got != 75 {
		t.Fatalf("limit after a saturated tick %v, want 75", got)
	}
	if rel, why := s.admit(); rel != nil || !strings.Contains(why, "goroutines wait") {
		t.Fatalf("admitted beyond the limit (why %q)", why)
	}
	s.update(200*time.Millisecond, 10*shedMinSamples)
	if s.limit != 75 {
		t.Fatalf("cut again within %d ticks: %v", shedCutEvery, s.limit)
	}
	// Few wake-ups say nothing, nor does a wait within the bound.
	for range shedCutEvery {
		s.update(200*time.Millisecond, shedMinSamples-1)
	}
	if s.limit != 75+7.5+8.25+9.075 {
		t.Fatalf("limit %v after unsaturated ticks", s.limit)
	}
	s.update(cfg.MaxSchedulingLatency, 10*shedMinSamples)
	if s.limit <= 75+7.5+8.25+9.075 {
		t.Fatalf("a wait at the bound cut the limit: %v", s.limit)
	}
	// The floor.
	for range 100 {
		s.update(time.Second, 10*shedMinSamples)
	}
	if s.limit != float64(cfg.MinInflight) {
		t.Fatalf("limit %v, want the floor %d", s.limit, cfg.MinInflight)
	}
	for _, r := range releases {
		r()
		r() // idempotent
	}
	if s.inflight != 0 {
		t.Fatalf("in flight %d after every release", s.inflight)
	}
	// Recovery to max_inflight.
	for range 200 {
		s.update(time.Millisecond, 10*shedMinSamples)
	}
	if s.limit != float64(cfg.MaxInflight) {
		t.Fatalf("limit %v after recovery, want %d", s.limit, cfg.MaxInflight)
	}
	if d := s.retryAfter(); d < cfg.RetryAfter/2 || d >= cfg.RetryAfter*3/2 {
		t.Errorf("Retry-After %s outside ±50 %% of %s", d, cfg.RetryAfter)
	}
}

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
		s.te.e.shed.mu.Lock()
		defer s.te.e.shed.mu.Unlock()
		return s.te.e.shed.inflight == 1
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
