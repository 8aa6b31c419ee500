package edge

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// The adaptive limit falls while the process is saturated (scheduling
// latency beyond the bound) and recovers after; requests beyond it are
// refused, never below the floor.
func TestShedderLimitFollowsSaturation(t *testing.T) {
	cfg := DefaultAdmissionConfig()
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

// The admission section's values are checked with the key named.
func TestAdmissionConfigErrorsNameTheKey(t *testing.T) {
	t.Setenv(EnvInternalRequestAuthKey, "")
	base := "model: m\ncontext_servers: {urls: [http://a:1]}\ngeneration_servers: {urls: [http://b:1]}\ncluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}\n"
	for _, c := range []struct{ yaml, key string }{
		{"admission: {max_inflight: -1}", "admission.max_inflight"},
		{"admission: {max_inflight: 4, min_inflight: 5}", "admission.min_inflight"},
		{"admission: {retry_after: -1s}", "admission.retry_after"},
	} {
		if _, err := ParseConfig([]byte(base + c.yaml + "\n")); err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%s: error %v, want one naming %s", c.yaml, err, c.key)
		}
	}
	cfg, err := ParseConfig([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultAdmissionConfig()
	want.MaxSchedulingLatency = cfg.Cluster.Raft.LeaderLeaseTimeout / SchedulingLatencyLeaseShare
	if cfg.Admission != want || want.MaxSchedulingLatency != 200*time.Millisecond {
		t.Errorf("defaults %+v, want %+v (a fifth of the shipped 1 s lease)", cfg.Admission, want)
	}
	// The bound follows a lease the file sets; a bound the file sets stays.
	for _, c := range []struct {
		yaml string
		want time.Duration
	}{
		{"cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789, raft: {heartbeat_timeout: 500ms, leader_lease_timeout: 250ms}}\n", 50 * time.Millisecond},
		{"cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}\nadmission: {max_scheduling_latency: 30ms}\n", 30 * time.Millisecond},
	} {
		y := strings.Replace(base, "cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}\n", c.yaml, 1)
		cfg, err := ParseConfig([]byte(y))
		if err != nil {
			t.Fatalf("%s: %v", c.yaml, err)
		}
		if cfg.Admission.MaxSchedulingLatency != c.want {
			t.Errorf("%s: max_scheduling_latency %s, want %s", c.yaml, cfg.Admission.MaxSchedulingLatency, c.want)
		}
	}
}
