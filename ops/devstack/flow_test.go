package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/worker"
)

// loadTenant is one tenant of a multi-tenant load: its clients, each
// sending through edges[i % len(edges)] (indexes into the stack's edges).
type loadTenant struct {
	name    string
	clients int
	edges   []int
}

// tenantLoad is a closed-loop load: each client sends a request, waits
// for the answer, then sends the next; a refused one (429, 529) it sends
// again after the answer's Retry-After, as the agents' SDKs do. Every
// prompt is new (no cache hit shortens a prefill).
type tenantLoad struct {
	tenants     []loadTenant
	promptWords int
	maxTokens   int
	// served: the load stops once this many requests were answered 200.
	served int
}

// attempt is one request a client sent.
type attempt struct {
	tenant     string
	sent, done time.Time
	status     int
	waited     time.Duration // x-tether-queue-wait-ms (answered)
	retryAfter time.Duration // Retry-After-Ms (refused)
	flowShed   bool          // refused by flow control (not the edge's own saturation)
	header     http.Header
}

// run drives the load at st until l.served requests were answered or ctx
// ends, and returns every attempt.
func (l tenantLoad) run(ctx context.Context, c *http.Client, st *Stack) ([]attempt, error) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var mu sync.Mutex
	var all []attempt
	served := 0
	var wg sync.WaitGroup
	edges := st.Edges()
	for _, tn := range l.tenants {
		for i := range tn.clients {
			url := edges[tn.edges[i%len(tn.edges)]].URL() + "/v1/chat/completions"
			wg.Add(1)
			go func() {
				defer wg.Done()
				h := fnv.New64a()
				h.Write([]byte(tn.name))
				rng := rand.New(rand.NewPCG(h.Sum64(), uint64(i))) // every tenant's and client's prompts its own
				for ctx.Err() == nil {
					a, err := l.send(ctx, c, url, tn.name, rng)
					if err != nil {
						return // the load stopped (or the stack is gone)
					}
					mu.Lock()
					all = append(all, a)
					if a.status == http.StatusOK {
						if served++; served >= l.served {
							stop()
						}
					}
					mu.Unlock()
					if a.retryAfter > 0 {
						select {
						case <-ctx.Done():
						case <-time.After(a.retryAfter):
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if served < l.served {
		return all, fmt.Errorf("%d requests answered before the deadline, want %d", served, l.served)
	}
	return all, nil
}

// send sends one request of tenant and reads its answer.
func (l tenantLoad) send(ctx context.Context, c *http.Client, url, tenant string, rng *rand.Rand) (attempt, error) {
	words := make([]string, l.promptWords)
	for i := range words {
		words[i] = strconv.FormatUint(rng.Uint64()%100000, 36)
	}
	body, _ := json.Marshal(map[string]any{"model": DefaultModel, "max_tokens": l.maxTokens,
		"messages": []map[string]string{{"role": "user", "content": strings.Join(words, " ")}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return attempt{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-tether-tenant", tenant)
	a := attempt{tenant: tenant, sent: time.Now()}
	resp, err := c.Do(req)
	if err != nil {
		return attempt{}, err
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	a.done, a.status, a.header = time.Now(), resp.StatusCode, resp.Header
	a.flowShed = bytes.Contains(msg, []byte(`"code":"fleet_saturated"`))
	if ms, err := strconv.Atoi(resp.Header.Get(edge.HeaderQueueWait)); err == nil {
		a.waited = time.Duration(ms) * time.Millisecond
	}
	if ms, err := strconv.Atoi(resp.Header.Get("Retry-After-Ms")); err == nil {
		a.retryAfter = time.Duration(ms) * time.Millisecond
	} else if a.status == http.StatusTooManyRequests || a.status == 529 {
		a.retryAfter = time.Second // counted as missing below
	}
	return a, ctx.Err()
}

// loadReport is what a run of the load measured.
type loadReport struct {
	served, shed map[string]int // after the warm-up; shed: by flow control
	// refused are the other 429s and 529s after the warm-up: the
	// placement's shed (every instance over a placement.shed limit)
	// and the edge's own (admission).
	refused      map[string]int
	total        int
	noRetryAfter int
	maxWait      time.Duration // the longest an answered request waited at an edge
	waitP99      map[string]time.Duration
	// ratios are each shed's Retry-After over the measured time until the
	// requests of its tenant queued ahead of it had left the queue.
	ratios []float64
	other  map[int]int // statuses other than 200, 429, 529
}

// measure judges the attempts from the warm-up's end (the first 20 % of
// answers) on. A shed's Retry-After is judged when the load ran on for
// twice its Retry-After (the requests ahead of it were not cut short).
func measure(all []attempt) loadReport {
	sort.Slice(all, func(i, j int) bool { return all[i].done.Before(all[j].done) })
	r := loadReport{served: map[string]int{}, shed: map[string]int{}, refused: map[string]int{}, waitP99: map[string]time.Duration{}, other: map[int]int{}}
	answered := 0
	for _, a := range all {
		if a.status == http.StatusOK {
			answered++
		}
	}
	ok := 0
	var warm, end time.Time
	for _, a := range all {
		if a.done.After(end) {
			end = a.done
		}
		if a.status == http.StatusOK {
			if ok++; ok == max(answered/5, 1) {
				warm = a.done
			}
		}
	}
	waits := map[string][]time.Duration{}
	for _, a := range all {
		switch {
		case a.status == http.StatusOK:
			r.maxWait = max(r.maxWait, a.waited)
			if !a.done.Before(warm) {
				r.served[a.tenant]++
				r.total++
				waits[a.tenant] = append(waits[a.tenant], a.waited)
			}
		case a.status == http.StatusTooManyRequests || a.status == 529:
			if a.header.Get("Retry-After") == "" || a.header.Get("Retry-After-Ms") == "" {
				r.noRetryAfter++
			}
			if !a.done.Before(warm) && !a.flowShed {
				r.refused[a.tenant]++
			}
			if !a.done.Before(warm) && a.flowShed {
				r.shed[a.tenant]++
				if a.done.Add(2 * a.retryAfter).After(end) {
					continue
				}
				if d := drainAhead(all, a); d > 0 {
					r.ratios = append(r.ratios, a.retryAfter.Seconds()/d.Seconds())
				}
			}
		default:
			r.other[a.status]++
		}
	}
	for tenant, ws := range waits {
		slices.Sort(ws)
		r.waitP99[tenant] = ws[len(ws)*99/100]
	}
	return r
}

// drainAhead is how long after shed its tenant's requests then queued
// (sent before it, not yet dispatched nor answered) took to leave the
// queue: dispatched (sent + x-tether-queue-wait-ms) or refused at their
// bound. That is what its Retry-After estimated. 0: none was queued.
func drainAhead(all []attempt, shed attempt) time.Duration {
	var last time.Time
	for _, a := range all {
		if a.tenant != shed.tenant || !a.sent.Before(shed.done) {
			continue
		}
		left := a.done // refused
		if a.status == http.StatusOK {
			left = a.sent.Add(a.waited)
		} else if !a.flowShed {
			continue
		}
		if left.After(shed.done) && left.After(last) {
			last = left
		}
	}
	if last.IsZero() {
		return 0
	}
	return last.Sub(shed.done)
}

func (r loadReport) String() string {
	var b strings.Builder
	names := make([]string, 0, len(r.served))
	for n := range r.served {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "%s: served %d (%.1f %%), shed %d (other 429/529 %d), wait p99 %s; ", n, r.served[n], 100*float64(r.served[n])/float64(max(r.total, 1)), r.shed[n], r.refused[n], r.waitP99[n])
	}
	rs := slices.Clone(r.ratios)
	slices.Sort(rs)
	if len(rs) > 0 {
		within := 0
		for _, x := range rs {
			if x >= 0.5 && x <= 2 {
				within++
			}
		}
		fmt.Fprintf(&b, "Retry-After/drain over %d sheds: min %.2f, median %.2f, max %.2f, %d within 2×; ", len(rs), rs[0], rs[len(rs)/2], rs[len(rs)-1], within)
	}
	fmt.Fprintf(&b, "longest wait %s, without Retry-After %d, other statuses %v", r.maxWait, r.noRetryAfter, r.other)
	return b.String()
}

// flowStack is a stack whose edges run flow control with interactive
// max_wait bound.
func flowStack(o Options, bound time.Duration) Options {
	o.EdgeConfig = func(_ int, c *edge.Config) {
		c.FlowControl.Enabled = true
		c.FlowControl.Interactive.MaxWait = bound
	}
	return o
}

// One tenant with ten times the others' clients, through three edges: its
// clients on every edge, each other tenant's on one edge only, so only
// the fleet-wide order (not each edge's own) can make the shares even.
// Every tenant is served within ±10 % of its fair share (a quarter); every
// refusal carries Retry-After, each within 2× of the time the requests
// queued ahead of it took to drain; no request waited at an edge beyond
// its band's bound.
func TestFlowControlSharesTheFleetFairly(t *testing.T) {
	const bound = 8 * time.Second
	// The engines at real time, prefilling 2,000 tokens a second: a
	// request's 500 tokens hold a rank 260 ms, so the engines are the
	// bottleneck (about 7.7 requests a second), not the edges' CPU, even
	// under the race detector on a shared machine (flow control orders
	// what waits for the engines, not for the edges' own CPU).
	o := flowStack(Options{Aggregated: true, ContextWorkers: 2, Ranks: 1, TimeScale: 1}, bound)
	o.WorkerConfig = func(_ string, c *worker.Config) { c.Engine.PrefillTokensPerSecond = 2000 }
	flowOn := o.EdgeConfig
	o.EdgeConfig = func(i int, c *edge.Config) {
		flowOn(i, c)
		// This test is about flow control: the edges' own shedding on a
		// starved host (RELIABILITY.md) stays out of the shares.
		c.Admission.MaxSchedulingLatency = -1
	}
	st := startStack(t, o)
	load := tenantLoad{promptWords: 500, maxTokens: 4, served: 300, tenants: []loadTenant{
		{name: "noisy", clients: 60, edges: []int{0, 1, 2}},
		{name: "a", clients: 6, edges: []int{0}}, {name: "b", clients: 6, edges: []int{1}}, {name: "c", clients: 6, edges: []int{2}},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	all, err := load.run(ctx, stackClient(t, st), st)
	r := measure(all)
	t.Log(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range load.tenants {
		share := float64(r.served[tn.name]) / float64(r.total)
		if share < 0.25*0.9 || share > 0.25*1.1 {
			t.Errorf("tenant %s served %.1f %% of the requests, want 25 %% ± 10 %%", tn.name, 100*share)
		}
	}
	if r.noRetryAfter > 0 || len(r.other) > 0 {
		t.Errorf("%d refusals without Retry-After; other statuses %v", r.noRetryAfter, r.other)
	}
	if r.maxWait > bound {
		t.Errorf("a request waited %s at an edge, beyond the interactive bound %s", r.maxWait, bound)
	}
	if r.shed["noisy"] == 0 || len(r.ratios) == 0 {
		t.Fatalf("the noisy tenant was never shed with requests queued ahead: %v", r.shed)
	}
	// How close Retry-After came to the drain time measured after it is a
	// timing figure (the host's load moves the drain): logged here, judged
	// in the measured run (TestFlowControlIssueRun, RELIABILITY.md).
	within := 0
	for _, x := range r.ratios {
		if x >= 0.5 && x <= 2 {
			within++
		}
	}
	t.Logf("FIGURES %d of %d Retry-Afters within 2× of the measured drain time", within, len(r.ratios))
}

// TestFlowControlIssueRun is the run of docs/operations.md "Fair
// admission" (RELIABILITY.md has its figures): tether dev's default
// stack (three edges, two context and two generation workers of four
// ranks) at engine time scale 1, one tenant with 120 clients and three
// with 12 each, long prompts, every client on every edge; with flow
// control off (TETHER_FLOW_RUN=off) and on (=on). It only runs when asked:
//
//	TETHER_FLOW_RUN=on go test ./ops/devstack -run TestFlowControlIssueRun -v -timeout 30m
func TestFlowControlIssueRun(t *testing.T) {
	mode := os.Getenv("TETHER_FLOW_RUN")
	if mode != "on" && mode != "off" {
		t.Skip("set TETHER_FLOW_RUN=on or off to measure")
	}
	o := Options{TimeScale: 1}
	if mode == "on" {
		o = flowStack(o, edge.DefaultConfig().FlowControl.Interactive.MaxWait)
	}
	st := startStack(t, o)
	all3 := []int{0, 1, 2}
	served, _ := strconv.Atoi(os.Getenv("TETHER_FLOW_SERVED"))
	load := tenantLoad{promptWords: 8000, maxTokens: 64, served: max(served, 600), tenants: []loadTenant{
		{name: "noisy", clients: 120, edges: all3},
		{name: "a", clients: 12, edges: all3}, {name: "b", clients: 12, edges: all3}, {name: "c", clients: 12, edges: all3},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	t0 := time.Now()
	all, err := load.run(ctx, stackClient(t, st), st)
	r := measure(all)
	t.Logf("flow control %s, %s: %s", mode, time.Since(t0).Round(time.Second), r)
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range load.tenants {
		if share := float64(r.served[tn.name]) / float64(r.total); mode == "on" && share < 0.18 {
			t.Errorf("tenant %s served %.1f %%, want at least 18 %%", tn.name, 100*share)
		}
	}
}
