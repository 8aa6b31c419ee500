package flow

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// drain releases n requests from q in fair order (this edge alone) and
// returns the tenants in the order released.
func drain(t *testing.T, q *queue, others map[flowKey]peerFlow, n int, now time.Time) []string {
	t.Helper()
	var out []string
	for i := 0; i < n; i++ {
		p, ok := q.plan(others, now)
		if !ok {
			break
		}
		f := q.pick(p, others, now)
		if f == nil {
			t.Fatalf("release %d: nothing picked with %d queued here", i, q.total())
		}
		q.release(f, now)
		out = append(out, f.key.tenant)
	}
	return out
}

func fill(q *queue, b Band, tenant string, n int, cost float64, now time.Time) []*waiter {
	var ws []*waiter
	for i := 0; i < n; i++ {
		ws = append(ws, q.push(flowKey{band: b, tenant: tenant}, cost, now, now.Add(time.Hour)))
	}
	return ws
}

// Equal costs: the tenants take turns (the least served first, the least
// recently served among equals), whatever their backlog; the noisy one
// gets the rest once the others are drained.
func TestFairOrderTakesTurnsAcrossTenants(t *testing.T) {
	q := newQueue()
	fill(q, Interactive, "noisy", 10, 1, t0)
	fill(q, Interactive, "b", 2, 1, t0)
	fill(q, Interactive, "c", 2, 1, t0)
	got := drain(t, q, nil, 14, t0)
	seen := map[string]int{}
	for i, tenant := range got[:6] {
		seen[tenant]++
		if i >= 3 && seen[tenant] != 2 || i < 3 && seen[tenant] != 1 {
			t.Fatalf("first six releases %v: each tenant once per turn", got[:6])
		}
	}
	if strings.Join(got[6:], ",") != "noisy,noisy,noisy,noisy,noisy,noisy,noisy,noisy" {
		t.Fatalf("after b and c drained: %v, want the noisy tenant's eight", got[6:])
	}
	// FIFO within a tenant: its first request queued is its first out.
	w := fill(q, Interactive, "d", 2, 1, t0)
	drain(t, q, nil, 1, t0)
	if w[0].state != released || w[1].state != waiting {
		t.Fatal("a tenant's requests leave in the order they came")
	}
}

// With fairness in tokens, a tenant of short prompts gets as many tokens
// through as one of long prompts: ten times the requests.
func TestFairOrderCountsCost(t *testing.T) {
	q := newQueue()
	fill(q, Interactive, "long", 50, 1000, t0)
	fill(q, Interactive, "short", 500, 100, t0)
	got := drain(t, q, nil, 110, t0)
	n := map[string]int{}
	for _, tenant := range got {
		n[tenant]++
	}
	if n["long"] != 10 || n["short"] != 100 {
		t.Fatalf("released %v, want 10 long (10,000 tokens) and 100 short (10,000 tokens)", n)
	}
}

// Every queued interactive request goes before any batch one.
func TestBandsInOrder(t *testing.T) {
	q := newQueue()
	fill(q, Batch, "a", 3, 1, t0)
	fill(q, Interactive, "b", 2, 1, t0)
	got := drain(t, q, nil, 5, t0)
	if strings.Join(got, ",") != "b,b,a,a,a" {
		t.Fatalf("released %v, want the interactive two first", got)
	}
	// An interactive request queued at another edge holds this edge's
	// batch back: that edge serves it.
	fill(q, Batch, "a", 1, 1, t0)
	others := map[flowKey]peerFlow{{band: Interactive, tenant: "x"}: {queued: 1}}
	p, ok := q.plan(others, t0)
	if !ok || p.band != Interactive || q.pick(p, others, t0) != nil {
		t.Fatalf("plan %+v %v: batch here must wait for the interactive request elsewhere", p, ok)
	}
	if f := q.pickLocal(others, t0); f == nil || f.key.tenant != "a" {
		t.Fatal("once the others did not take the room, this edge serves its own batch")
	}
}

// Service counts over the fleet: a tenant the other edges served a lot
// waits here behind one they did not, and this edge holds back for a less
// served tenant that only another edge has queued.
func TestFairOrderIsFleetWide(t *testing.T) {
	q := newQueue()
	fill(q, Interactive, "a", 4, 1, t0)
	fill(q, Interactive, "b", 4, 1, t0)
	others := map[flowKey]peerFlow{{band: Interactive, tenant: "a"}: {served: 3}}
	got := drain(t, q, others, 4, t0)
	if strings.Join(got, ",") != "b,b,b,a" {
		t.Fatalf("released %v: b first until its fleet-wide service caught up with a's", got)
	}
	q = newQueue()
	fill(q, Interactive, "a", 4, 1, t0)
	for i := 0; i < 10; i++ {
		q.charge(q.flow(flowKey{band: Interactive, tenant: "a"}, t0), 1, t0)
	}
	others = map[flowKey]peerFlow{{band: Interactive, tenant: "small"}: {queued: 2, served: 1}}
	p, ok := q.plan(others, t0)
	if !ok || q.pick(p, others, t0) != nil || p.local != 0 || p.fleet != 2 {
		t.Fatalf("plan %+v: this edge's a (served 10) must hold back for small (served 1) queued elsewhere", p)
	}
	// Within the margin (two average requests) both count as even.
	others[flowKey{band: Interactive, tenant: "small"}] = peerFlow{queued: 2, served: 9.5}
	if p, _ = q.plan(others, t0); q.pick(p, others, t0) == nil || p.local != 4 || p.fleet != 6 {
		t.Fatalf("plan %+v: a and small are even; the claim splits by their queues here (4) and in the fleet (6)", p)
	}
}

// Service decays: a tenant served heavily long ago is almost new.
func TestServiceDecays(t *testing.T) {
	q := newQueue()
	a := q.flow(flowKey{band: Interactive, tenant: "a"}, t0)
	for i := 0; i < 100; i++ {
		q.charge(a, 1, t0)
	}
	later := t0.Add(10 * window)
	if v := a.served.value(later, window); v > 100*math.Exp(-9.9) {
		t.Fatalf("service after ten windows %v, want about %v", v, 100*math.Exp(-10))
	}
	if r := a.rate(t0.Add(rateWindow)); math.Abs(r-100/rateWindow.Seconds()/(1-math.Exp(-1))*math.Exp(-1)) > 1e-9 {
		t.Fatalf("rate one rate window after a burst of 100: %v", r)
	}
}

// Dispatches count against the fleet's headroom until the fleet view
// shows them (settle), then no more.
func TestPendingReleasesSettle(t *testing.T) {
	q := newQueue()
	f := q.flow(flowKey{tenant: "a"}, t0)
	q.charge(f, 1, t0)
	q.charge(f, 1, t0.Add(settle/2))
	if n := q.pending(t0.Add(settle / 2)); n != 2 {
		t.Fatalf("pending %d, want 2", n)
	}
	if n := q.pending(t0.Add(settle)); n != 1 {
		t.Fatalf("pending %d after the first settled, want 1", n)
	}
}

// The wait estimate: a queued flow drains at its own measured rate; a new
// one waits for its place in the fair order at the model's rate (behind
// every request of a higher band and those of less served flows); nothing
// is estimated before anything was dispatched.
func TestEstimateFromDrainRate(t *testing.T) {
	q := newQueue()
	if _, ok := q.estimate(flowKey{tenant: "a"}, nil, t0); ok {
		t.Fatal("an estimate before any dispatch")
	}
	// Flow a was served 2 requests/s over the fleet (1 here, 1 by the
	// others) and has 5 queued (3 here, 2 elsewhere): the next waits for
	// six dispatches of a, 3 s.
	a := flowKey{band: Interactive, tenant: "a"}
	fill(q, Interactive, "a", 3, 1, t0)
	others := map[flowKey]peerFlow{a: {queued: 2, rate: 1}}
	f := q.flows[a]
	f.since = t0.Add(-100 * window)
	f.count = decayed{v: rateWindow.Seconds(), at: t0} // 1 request/s here
	if d, ok := q.estimate(a, others, t0); !ok || math.Abs(d.Seconds()-3) > 1e-6 {
		t.Fatalf("queued flow: %v %v, want 3s", d, ok)
	}
	// A new interactive tenant, as served as a (not at all): one request
	// of a, then its own, at the model's 2/s: 1 s. A new batch tenant
	// waits behind the 5 interactive requests too: (5+1)/2 = 3 s.
	if d, _ := q.estimate(flowKey{band: Interactive, tenant: "new"}, others, t0); math.Abs(d.Seconds()-1) > 1e-6 {
		t.Fatalf("new interactive flow: %v, want 1s", d)
	}
	if d, _ := q.estimate(flowKey{band: Batch, tenant: "new"}, others, t0); math.Abs(d.Seconds()-3) > 1e-6 {
		t.Fatalf("new batch flow: %v, want 3s", d)
	}
}

// A removed waiter leaves its queue; removing twice or after release
// changes nothing; idle flows are forgotten.
func TestRemoveAndForget(t *testing.T) {
	q := newQueue()
	ws := fill(q, Batch, "a", 2, 1, t0)
	q.remove(ws[0])
	q.remove(ws[0])
	if q.total() != 1 || q.queued[Batch] != 1 {
		t.Fatalf("queued %d after a removal", q.total())
	}
	drain(t, q, nil, 1, t0)
	q.remove(ws[1])
	if ws[1].state != released || q.total() != 0 {
		t.Fatal("a released waiter stays released")
	}
	q.gc(t0.Add(window))
	if len(q.flows) != 1 {
		t.Fatal("a flow served one window ago is not idle yet")
	}
	q.gc(t0.Add(20 * window))
	if len(q.flows) != 0 {
		t.Fatal("a flow whose service decayed to nothing is forgotten")
	}
}

// A request is never released once its band's bound passed: it leaves
// the queue (its own goroutine sheds it) and the next one is served.
func TestExpiredRequestsAreNotReleased(t *testing.T) {
	q := newQueue()
	k := flowKey{tenant: "a"}
	old := q.push(k, 1, t0, t0.Add(time.Second))
	young := q.push(k, 1, t0.Add(time.Second/2), t0.Add(3*time.Second/2))
	q.expire(t0.Add(time.Second))
	if old.state != removed || young.state != waiting || q.total() != 1 {
		t.Fatalf("after the first deadline: old %v, young %v, %d queued", old.state, young.state, q.total())
	}
	if got := drain(t, q, nil, 1, t0.Add(time.Second)); len(got) != 1 || young.state != released || young.at.Sub(young.enq) != time.Second/2 {
		t.Fatalf("released %v; young waited %v", got, young.at.Sub(young.enq))
	}
}

// Memory is bounded: beyond maxFlows, flows with nothing queued are
// forgotten however recently served; queued ones stay.
func TestFlowsAreBounded(t *testing.T) {
	q := newQueue()
	for i := range maxFlows + 100 {
		q.charge(q.flow(flowKey{tenant: strconv.Itoa(i)}, t0), 1, t0)
	}
	w := q.push(flowKey{tenant: "queued"}, 1, t0, t0.Add(time.Hour))
	q.gc(t0)
	if len(q.flows) > maxFlows || q.flows[flowKey{tenant: "queued"}] != w.flow {
		t.Fatalf("%d flows after gc (max %d), the queued one kept: %v", len(q.flows), maxFlows, q.flows[flowKey{tenant: "queued"}] != nil)
	}
}

// The queue ahead has left, at the latest, when the last request of the
// flow queued anywhere reaches its bound: the drain time is the estimate
// capped there, here or at another edge.
func TestDrainEndsWithTheLastQueued(t *testing.T) {
	q := newQueue()
	a := flowKey{tenant: "a"}
	q.push(a, 1, t0, t0.Add(2*time.Second))
	f := q.flows[a]
	f.since = t0.Add(-time.Hour)
	f.count = decayed{v: rateWindow.Seconds() / 10, at: t0} // 0.1 request/s: an estimate of 20 s
	if d := q.drain(a, nil, t0); d != 2*time.Second {
		t.Fatalf("drain %v, want 2s (the last queued here leaves by then)", d)
	}
	others := map[flowKey]peerFlow{a: {queued: 1, last: t0.Add(3 * time.Second)}}
	if d := q.drain(a, others, t0); d != 3*time.Second {
		t.Fatalf("drain %v, want 3s (the last queued at another edge leaves by then)", d)
	}
	if d, _ := q.estimate(a, others, t0); d != 30*time.Second {
		t.Fatalf("estimate %v, want 30s (3 at 0.1/s)", d)
	}
}
