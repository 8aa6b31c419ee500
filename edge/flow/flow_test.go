package flow

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/natstest"
	"github.com/tether-project/tether/test/waitfor"
)

// fleet stands in for the engines behind an edge: capacity requests may be
// in flight; each admitted request holds one until the test finishes it.
type fleet struct {
	mu       sync.Mutex
	capacity int
	inflight int
	conn     *nats.Conn
	// dispatched, when set, counts the requests in flight instead of the
	// test's goroutines: the moment a controller releases one, not when
	// the goroutine that waited for it runs again.
	dispatched func() int
}

func (f *fleet) Headroom(string, time.Time) int {
	f.mu.Lock()
	capacity, inflight, dispatched := f.capacity, f.inflight, f.dispatched
	f.mu.Unlock()
	if dispatched != nil {
		inflight = dispatched()
	}
	return capacity - inflight
}
func (f *fleet) NATS() *nats.Conn { return f.conn }
func (f *fleet) Now() time.Time   { return time.Now() }

func (f *fleet) set(capacity int) {
	f.mu.Lock()
	f.capacity = capacity
	f.mu.Unlock()
}

func (f *fleet) admitted() {
	f.mu.Lock()
	f.inflight++
	f.mu.Unlock()
}

func (f *fleet) finish() {
	f.mu.Lock()
	f.inflight--
	f.mu.Unlock()
}

func flowConfig() config.FlowConfig {
	c := config.DefaultFlowConfig()
	c.Enabled = true
	c.Fairness = config.FairnessRequests
	return c
}

func start(t *testing.T, cfg config.FlowConfig, node string, f Edge) *Controller {
	t.Helper()
	return startWith(t, cfg, node, f, nil)
}

// startWith is start with set applied to the controller before it runs.
func startWith(t *testing.T, cfg config.FlowConfig, node string, f Edge, set func(*Controller)) *Controller {
	t.Helper()
	m, err := observe.New(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := New(cfg, node, []byte("internal-key-0123456789"), f, &m.Flow, slog.New(slog.DiscardHandler))
	if set != nil {
		set(c)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.Run(done) }()
	t.Cleanup(func() { close(done); c.Close(); wg.Wait() })
	return c
}

// result is one Admit's outcome.
type result struct {
	tenant string
	waited time.Duration
	err    error
	status int
}

// admitAll sends one request per tenant in tenants, each in its own
// goroutine, and waits until all are queued; results arrive on the
// returned channel (the fleet's in-flight count taken for each admitted).
func admitAll(t *testing.T, c *Controller, f *fleet, band Band, tenants ...string) <-chan result {
	t.Helper()
	out := make(chan result, len(tenants))
	before := c.queuedTotal()
	for _, tenant := range tenants {
		go func() {
			waited, aerr := c.Admit(context.Background(), Request{Model: "m", Tenant: tenant, Band: band, Dialect: apireq.Chat})
			r := result{tenant: tenant, waited: waited}
			if aerr != nil {
				r.err, r.status = aerr, aerr.Status
			} else {
				f.admitted()
			}
			out <- r
		}()
	}
	waitfor.True(t, 10*time.Second, "requests queued", func() bool { return c.queuedTotal() == before+len(tenants) })
	return out
}

// dispatches is the requests this controller let through (queued and
// released, or admitted at once), and the charges a test made.
func (c *Controller) dispatches() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, q := range c.models {
		n += int(q.picks)
	}
	return n
}

func (c *Controller) queuedTotal() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, q := range c.models {
		n += q.total()
	}
	return n
}

// Below the fleet's room a request passes at once; beyond it requests wait
// and leave in fair order as room frees (one at a time here): the three
// tenants take turns although the noisy one queued first and most.
func TestControllerQueuesAndServesInFairOrder(t *testing.T) {
	f := &fleet{capacity: 1}
	c := start(t, flowConfig(), "e1", f)
	if waited, aerr := c.Admit(context.Background(), Request{Model: "m", Tenant: "a", Dialect: apireq.Chat}); aerr != nil || waited != 0 {
		t.Fatalf("with room: waited %v, %v", waited, aerr)
	}
	f.admitted() // the fleet is full now
	res := admitAll(t, c, f, Interactive, "noisy", "noisy", "noisy", "noisy")
	res2 := admitAll(t, c, f, Interactive, "b", "b", "c", "c")
	var order []string
	for i := 0; i < 8; i++ {
		f.finish() // one request ends: room for one
		var r result
		select {
		case r = <-res:
		case r = <-res2:
		case <-time.After(30 * time.Second):
			t.Fatalf("no release after %v", order)
		}
		if r.err != nil || r.waited <= 0 {
			t.Fatalf("%s: waited %v, %v", r.tenant, r.waited, r.err)
		}
		order = append(order, r.tenant)
	}
	// noisy was served once before b and c queued (the first release can
	// go to it); from then on each turn serves all three.
	n := map[string]int{}
	for i, tenant := range order {
		n[tenant]++
		if i >= 1 && i < 7 && n["noisy"] > n["b"]+1 {
			t.Fatalf("order %v: noisy ahead of its turn", order)
		}
	}
	if n["b"] != 2 || n["c"] != 2 || n["noisy"] != 4 {
		t.Fatalf("order %v", order)
	}
}

// A full band's queue sheds at once; a request that waited its band's
// bound is shed: 429 rate_limit_error with Retry-After on OpenAI's APIs,
// 529 overloaded_error on the Messages API; each counted by reason.
func TestControllerShedsBeyondTheBounds(t *testing.T) {
	cfg := flowConfig()
	cfg.Interactive = config.BandConfig{MaxWait: 40 * time.Millisecond, MaxQueued: 2}
	f := &fleet{capacity: 0}
	c := start(t, cfg, "e1", f)
	res := admitAll(t, c, f, Interactive, "a", "b")
	_, aerr := c.Admit(context.Background(), Request{Model: "m", Tenant: "c", Dialect: apireq.Chat})
	if aerr == nil || aerr.Status != http.StatusTooManyRequests || aerr.Type != "rate_limit_error" || aerr.RetryAfter < minRetryAfter {
		t.Fatalf("a third request beyond max_queued 2: %+v", aerr)
	}
	if v := count(c.m.Shed.WithLabelValues("interactive", "c", "queue_full")); v != 1 {
		t.Fatalf("queue_full sheds of c: %v", v)
	}
	for i := 0; i < 2; i++ {
		r := <-res
		if r.status != http.StatusTooManyRequests {
			t.Fatalf("%s after its band's max_wait: %d %v", r.tenant, r.status, r.err)
		}
	}
	if v := count(c.m.Shed.WithLabelValues("interactive", "a", "wait_bound")); v != 1 {
		t.Fatalf("wait_bound sheds of a: %v", v)
	}
	// The Messages API: Anthropic's overloaded answer.
	_, aerr = c.Admit(context.Background(), Request{Model: "m", Tenant: "d", Dialect: apireq.Messages})
	if aerr == nil || aerr.Status != 529 {
		t.Fatalf("Messages request shed: %+v", aerr)
	}
	rec := httptest.NewRecorder()
	aerr.Write(rec, apireq.Messages)
	var body struct {
		Type  string                `json:"type"`
		Error struct{ Type string } `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Type != "error" || body.Error.Type != "overloaded_error" {
		t.Fatalf("529 body %s", rec.Body.String())
	}
	ms, err := strconv.Atoi(rec.Header().Get("Retry-After-Ms"))
	if err != nil || rec.Header().Get("Retry-After") == "" || ms < int(minRetryAfter/time.Millisecond) {
		t.Fatalf("529 headers %v", rec.Header())
	}
}

// Once the fleet's drain rate is measured, a request whose flow would
// wait beyond its band's bound is shed on arrival, its Retry-After when
// the requests ahead of it will have left (by the bound at the latest;
// within the ±10 % spread); a tenant less served than the noisy one is
// next in order, and queues.
func TestControllerPredictsTheWait(t *testing.T) {
	cfg := flowConfig()
	cfg.Interactive.MaxWait = 1500 * time.Millisecond
	f := &fleet{capacity: 0}
	c := start(t, cfg, "e1", f)
	now := time.Now()
	c.mu.Lock()
	q := c.queue("m")
	noisy := q.flow(flowKey{tenant: "noisy"}, now.Add(-time.Hour))
	noisy.count = decayed{v: rateWindow.Seconds(), at: now} // 1 request/s
	noisy.served = decayed{v: window.Seconds(), at: now}
	for i := 0; i < 4; i++ {
		q.push(flowKey{tenant: "noisy"}, 1, now, now.Add(cfg.Interactive.MaxWait))
	}
	c.mu.Unlock()
	_, aerr := c.Admit(context.Background(), Request{Model: "m", Tenant: "noisy", Dialect: apireq.Chat})
	if aerr == nil || aerr.Status != http.StatusTooManyRequests {
		t.Fatalf("noisy's fifth request at 1/s, max_wait 1.5s: %+v", aerr)
	}
	// Its estimate is 5 s (4 queued ahead, itself, at 1/s), but the last
	// of those queued leaves at its bound, 1.5 s from now: Retry-After 1.5 s.
	if aerr.RetryAfter < 1350*time.Millisecond || aerr.RetryAfter > 1650*time.Millisecond || !strings.Contains(aerr.Message, "would wait longer than the band's max_wait (1.5s); the requests queued ahead of it will have left in about 1.5s") {
		t.Fatalf("Retry-After %v (%s), want 1.5s ± 10%%", aerr.RetryAfter, aerr.Message)
	}
	if v := count(c.m.Shed.WithLabelValues("interactive", "noisy", "predicted_wait")); v != 1 {
		t.Fatalf("predicted_wait sheds: %v", v)
	}
	res := admitAll(t, c, f, Interactive, "small")
	f.set(1)
	if r := <-res; r.err != nil || r.tenant != "small" {
		t.Fatalf("small, next in fair order, served: %+v", r)
	}
}

// Off, nothing waits or is shed, whatever the fleet's room; requests are
// still counted by tenant and band.
func TestControllerOffOnlyCounts(t *testing.T) {
	cfg := flowConfig()
	cfg.Enabled = false
	f := &fleet{capacity: 0}
	c := start(t, cfg, "e1", f)
	for i := 0; i < 3; i++ {
		if waited, aerr := c.Admit(context.Background(), Request{Model: "m", Tenant: "a", Band: Batch}); aerr != nil || waited != 0 {
			t.Fatalf("off: %v %v", waited, aerr)
		}
	}
	if v := count(c.m.Served.WithLabelValues("batch", "a")); v != 3 {
		t.Fatalf("served %v", v)
	}
}

// The tenant: the configured header, else a keyed hash of the API key
// (the same on every edge sharing the internal key; never the key), else
// "default"; a malformed header is a 400 naming it. The band: batch for
// background priority or service_tier flex.
func TestTenantAndBand(t *testing.T) {
	c := start(t, flowConfig(), "e1", &fleet{})
	other := start(t, flowConfig(), "e2", &fleet{})
	h := http.Header{}
	h.Set("Authorization", "Bearer sk-secret-key")
	a, _ := c.Tenant(h)
	b, _ := other.Tenant(http.Header{"X-Api-Key": {"sk-secret-key"}})
	if !strings.HasPrefix(a, "key-") || len(a) != 20 || a != b || strings.Contains(a, "secret") {
		t.Fatalf("key tenants %q, %q: want one keyed hash on every edge", a, b)
	}
	h.Set("X-Tether-Tenant", " acme ")
	if got, _ := c.Tenant(h); got != "acme" {
		t.Fatalf("header tenant %q", got)
	}
	if got, _ := c.Tenant(http.Header{}); got != "default" {
		t.Fatalf("no tenant, no key: %q", got)
	}
	h.Set("X-Tether-Tenant", "two words")
	if _, aerr := c.Tenant(h); aerr == nil || aerr.Status != 400 || aerr.Param != "x-tether-tenant" {
		t.Fatalf("bad header: %+v", aerr)
	}
	off := flowConfig()
	off.Enabled = false
	if got, aerr := start(t, off, "e3", &fleet{}).Tenant(h); aerr != nil || got != "key-"+a[4:] {
		t.Fatalf("flow control off: a bad header is ignored, got %q %+v", got, aerr)
	}
	for _, tc := range []struct {
		p    routing.Priority
		tier string
		want Band
	}{{routing.PriorityNormal, "", Interactive}, {routing.PriorityBackground, "", Batch}, {routing.PriorityNormal, `"flex"`, Batch},
		{routing.PriorityInteractive, `"flex"`, Interactive}, {routing.PriorityNormal, `7`, Interactive}} {
		if got := BandOf(tc.p, json.RawMessage(tc.tier)); got != tc.want {
			t.Errorf("BandOf(%v, %s) = %v, want %v", tc.p, tc.tier, got, tc.want)
		}
	}
}

// Two edges over real NATS share one fleet with room for one request at a
// time: edge 2's noisy tenant, already served, holds back while edge 1's
// small tenant waits, so the room goes to small, whichever edge sees it
// first.
func TestEdgesHoldBackForALessServedTenantElsewhere(t *testing.T) {
	ns := natstest.Start(t, nil)
	conn := func() *nats.Conn {
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	shared := &fleet{capacity: 0}
	// Edge 2 holds back for edge 1 longer than the shipped grace: on a
	// starved host edge 1's round may come later than that, and this test
	// judges the fair order, not the fallback.
	patient := func(c *Controller) { c.yieldGrace = time.Minute }
	e1 := startWith(t, flowConfig(), "e1", &sharedFleet{fleet: shared, conn: conn()}, patient)
	e2 := startWith(t, flowConfig(), "e2", &sharedFleet{fleet: shared, conn: conn()}, patient)
	// noisy has been served on edge 2.
	e2.mu.Lock()
	nf := e2.queue("m").flow(flowKey{tenant: "noisy"}, time.Now())
	for i := 0; i < 5; i++ {
		e2.models["m"].charge(nf, 1, time.Now())
	}
	e2.pub.dirty = true
	e2.mu.Unlock()
	// The fleet counts a request from its release on either edge: on a
	// starved host the goroutine that waited for edge 1's release may run
	// long after edge 1 published that small's queue is empty, and the
	// room edge 2 then saw was not free.
	shared.mu.Lock()
	shared.dispatched = func() int { return e1.dispatches() + e2.dispatches() - 5 }
	shared.mu.Unlock()
	noisy := admitAll(t, e2, shared, Interactive, "noisy", "noisy")
	small := admitAll(t, e1, shared, Interactive, "small", "small")
	waitfor.True(t, 10*time.Second, "each edge hears the other's queue", func() bool {
		e1.mu.Lock()
		o1 := e1.peers.others("m", time.Now())
		e1.mu.Unlock()
		e2.mu.Lock()
		o2 := e2.peers.others("m", time.Now())
		e2.mu.Unlock()
		return o1[flowKey{tenant: "noisy"}].queued == 2 && o2[flowKey{tenant: "small"}].queued == 2 &&
			o1[flowKey{tenant: "noisy"}].last.After(time.Now()) // when its last queued request reaches its bound
	})
	for i := 0; i < 2; i++ {
		// The stand-in fleet counts an admitted request at once, where an
		// edge's views count it when its hop is sent: until its release
		// settles, edge 1 counts it twice.
		waitfor.True(t, 10*time.Second, "edge 1's last release settled", func() bool {
			e1.mu.Lock()
			defer e1.mu.Unlock()
			return e1.models["m"] == nil || e1.models["m"].pending(time.Now()) == 0
		})
		shared.set(shared.capacity + 1)
		select {
		case r := <-small:
			if r.err != nil {
				t.Fatal(r.err)
			}
		case r := <-noisy:
			t.Fatalf("room %d went to %s on edge 2 (err %v) while small, less served, waited on edge 1", i, r.tenant, r.err)
		case <-time.After(30 * time.Second):
			t.Fatal("no release")
		}
	}
}

// sharedFleet is one fleet seen by several edges, each with its own NATS
// connection.
type sharedFleet struct {
	*fleet
	conn *nats.Conn
}

func (s *sharedFleet) NATS() *nats.Conn { return s.conn }

// count is a counter's value.
func count(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
