package edge

import (
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestInflightBodyBudgetRefusesConcurrentLargeBodies holds two large
// request bodies half-sent (their bytes reserved on arrival) and sends six
// more: those are refused with 429, Retry-After and a clear error before a
// byte of theirs is read, and the two complete once sent. Before
// max_inflight_body_bytes, every body under max_body_bytes was read at once
// (eight 31 MB bodies took an edge to 2.5 GB RSS).
func TestInflightBodyBudgetRefusesConcurrentLargeBodies(t *testing.T) {
	const maxBody, budget = 256 << 10, 512 << 10
	s := startStatic(t, 1, 1, func(c *Config) {
		c.MaxBodyBytes, c.MaxInflightBodyBytes = maxBody, budget
	})
	body := chatBody(t, "", []string{longText("budget", 16_000)}, map[string]any{"max_tokens": 1})
	if n := len(body); n <= budget/3 || n > maxBody {
		t.Fatalf("body of %d bytes: want (%d, %d]", n, budget/3, maxBody)
	}
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	gate := make(chan struct{})
	type result struct {
		status int
		retry  string
		code   string
	}
	results := make(chan result, 8)
	var wg sync.WaitGroup
	send := func(hold bool) {
		defer wg.Done()
		pr, pw := io.Pipe()
		go func() {
			_, _ = pw.Write(body[:1024])
			if hold {
				<-gate
			}
			_, _ = pw.Write(body[1024:])
			pw.Close()
		}()
		req, _ := http.NewRequest(http.MethodPost, s.te.url()+"/v1/chat/completions", pr)
		req.ContentLength = int64(len(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := s.c.Do(req)
		if err != nil {
			results <- result{status: -1, code: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		results <- result{status: resp.StatusCode, retry: resp.Header.Get("Retry-After"), code: e.Error.Code}
	}
	// Two bodies hold the budget (reserved when their headers arrive).
	wg.Add(2)
	go send(true)
	go send(true)
	waitFor(t, "two bodies holding the budget", 15*time.Second, func() bool {
		return s.te.e.bodies.InUse() == int64(2*len(body))
	})
	wg.Add(6)
	for range 6 {
		go send(false)
	}
	refused := 0
	for range 6 {
		var r result
		select {
		case r = <-results:
		case <-time.After(30 * time.Second):
			close(gate)
			t.Fatal("no answer to a body beyond the budget within 30 s")
		}
		if r.status != http.StatusTooManyRequests || r.retry != "1" || r.code != "request_body_budget_exhausted" {
			t.Errorf("a body beyond the budget: %+v, want 429, Retry-After 1, request_body_budget_exhausted", r)
			continue
		}
		refused++
	}
	close(gate)
	wg.Wait()
	close(results)
	for r := range results {
		if r.status != http.StatusOK {
			t.Errorf("a body within the budget: %+v, want 200", r)
		}
	}
	if n := s.te.e.bodies.InUse(); n != 0 {
		t.Errorf("%d body bytes still held after every request ended", n)
	}
	if got := counter(t, s.te.registry, "tether_edge_body_budget_refused_total", nil); got != float64(refused) {
		t.Errorf("tether_edge_body_budget_refused_total = %v, want %d", got, refused)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	t.Logf("8 concurrent bodies of %d bytes, budget %d: %d refused; heap in use %d → %d KiB (total allocated %d KiB)",
		len(body), budget, refused, before.HeapInuse>>10, after.HeapInuse>>10, (after.TotalAlloc-before.TotalAlloc)>>10)
}
