package flow

import (
	"container/list"
	"math"
	"time"

	"github.com/tether-project/tether/internal/telemetry"
)

// Band is a request's priority band: every queued interactive request is
// dispatched before any batch one.
type Band uint8

const (
	// Interactive: someone waits for the answer (the default).
	Interactive Band = iota
	// Batch: nobody waits (x-tether-priority: batch or background,
	// service_tier: flex).
	Batch
	numBands
)

func (b Band) String() string {
	if b == Batch {
		return telemetry.FlowBandBatch
	}
	return telemetry.FlowBandInter
}

// parseBand is the band named in a flow state.
func parseBand(s string) (Band, bool) {
	switch s {
	case telemetry.FlowBandInter:
		return Interactive, true
	case telemetry.FlowBandBatch:
		return Batch, true
	}
	return 0, false
}

// window is τ of the service that orders the flows: a dispatch weighs
// exp(-age/τ). Long enough that shares hold over many requests; short
// enough that a tenant idle for a while starts again nearly even (its
// advantage fades within a few τ).
const window = 10 * time.Second

// rateWindow is τ of the dispatch rates the wait estimates (and so
// Retry-After) divide by: shorter than window, so an estimate follows the
// fleet's rate as it is now rather than over the last window.
const rateWindow = 3 * time.Second

// decayed is a sum of amounts, each weighed exp(-age/τ).
type decayed struct {
	v  float64
	at time.Time
}

func (d decayed) value(now time.Time, tau time.Duration) float64 {
	if d.at.IsZero() || !now.After(d.at) {
		return d.v
	}
	return d.v * math.Exp(-now.Sub(d.at).Seconds()/tau.Seconds())
}

func (d *decayed) add(now time.Time, x float64, tau time.Duration) {
	d.v, d.at = d.value(now, tau)+x, now
}

// rateOf turns a count decayed over rateWindow, measured since since, into
// a rate per second: the count over the window, corrected for a
// measurement younger than the window (the first requests are not
// diluted by the time before them).
func rateOf(count float64, since, now time.Time) float64 {
	age := now.Sub(since).Seconds()
	if count <= 0 || age <= 0 {
		return 0
	}
	w := rateWindow.Seconds()
	return count / (w * (1 - math.Exp(-age/w)))
}

// flowKey names a flow: one tenant's requests of one band.
type flowKey struct {
	band   Band
	tenant string
}

// waiter is one queued request.
type waiter struct {
	flow     *flowQ
	elem     *list.Element
	cost     float64
	enq      time.Time
	deadline time.Time     // its band's bound: never released at or after it
	at       time.Time     // when it was released
	ready    chan struct{} // closed when released
	state    waiterState
}

type waiterState uint8

const (
	waiting waiterState = iota
	released
	removed
)

// flowQ is one flow on this edge: its queued requests, first in first out,
// and the service this edge dispatched for it.
type flowQ struct {
	key    flowKey
	items  list.List // *waiter
	served decayed   // cost dispatched (window)
	count  decayed   // requests dispatched (rateWindow)
	since  time.Time // first seen (rates)
	picked uint64    // the pick sequence of its last dispatch (round-robin tie-break)
}

func (f *flowQ) queued() int { return f.items.Len() }

// rate is this edge's dispatches per second of f.
func (f *flowQ) rate(now time.Time) float64 {
	return rateOf(f.count.value(now, rateWindow), f.since, now)
}

// queue is one model's flows on this edge: the fair queue. Its methods do
// no I/O and read no clock (times are parameters); the controller holds its
// lock around them.
type queue struct {
	flows  map[flowKey]*flowQ
	queued [numBands]int // waiters per band
	picks  uint64
	// avgCost is the mean cost of recent dispatches: the margin within
	// which two flows' service counts as even.
	avgCost float64
	// releases are the times of recent dispatches: counted against the
	// fleet's headroom until the fleet view shows them (settle).
	releases []time.Time
	// yieldSince is when this edge first held back for another edge's
	// flow with headroom left (zero: not holding back).
	yieldSince time.Time
}

func newQueue() *queue { return &queue{flows: map[flowKey]*flowQ{}} }

// flow returns the flow of k, created at now.
func (q *queue) flow(k flowKey, now time.Time) *flowQ {
	f := q.flows[k]
	if f == nil {
		f = &flowQ{key: k, since: now}
		q.flows[k] = f
	}
	return f
}

// push queues a request of cost on flow k at now, to wait until deadline
// at most.
func (q *queue) push(k flowKey, cost float64, now, deadline time.Time) *waiter {
	f := q.flow(k, now)
	w := &waiter{flow: f, cost: cost, enq: now, deadline: deadline, ready: make(chan struct{})}
	w.elem = f.items.PushBack(w)
	q.queued[k.band]++
	return w
}

// remove takes a waiting request out of its queue (shed or gone).
func (q *queue) remove(w *waiter) {
	if w.state != waiting {
		return
	}
	w.flow.items.Remove(w.elem)
	w.state = removed
	q.queued[w.flow.key.band]--
}

// release dispatches the head of f at now: its service counts, its waiter
// is woken.
func (q *queue) release(f *flowQ, now time.Time) *waiter {
	e := f.items.Front()
	if e == nil {
		return nil
	}
	w := e.Value.(*waiter)
	f.items.Remove(e)
	q.queued[f.key.band]--
	w.state, w.at = released, now
	q.charge(f, w.cost, now)
	close(w.ready)
	return w
}

// expire takes the requests whose deadline passed out of their queues
// (their own goroutines shed them): a request is never released after
// waiting its band's bound. A flow's requests share a band, so its
// expired ones are at its front.
func (q *queue) expire(now time.Time) {
	for _, f := range q.flows {
		for e := f.items.Front(); e != nil; e = f.items.Front() {
			w := e.Value.(*waiter)
			if now.Before(w.deadline) {
				break
			}
			q.remove(w)
		}
	}
}

// charge counts a dispatch of cost on f at now (a queued request's release,
// or one admitted at once).
func (q *queue) charge(f *flowQ, cost float64, now time.Time) {
	f.served.add(now, cost, window)
	f.count.add(now, 1, rateWindow)
	q.picks++
	f.picked = q.picks
	if q.avgCost == 0 {
		q.avgCost = cost
	} else {
		q.avgCost += (cost - q.avgCost) / 16
	}
	q.releases = append(q.releases, now)
}

// pending is the dispatches of the last settle before now (the fleet
// view may not count them yet); older ones are forgotten.
func (q *queue) pending(now time.Time) int {
	i := 0
	for i < len(q.releases) && now.Sub(q.releases[i]) >= settle {
		i++
	}
	if i > 0 {
		q.releases = append(q.releases[:0], q.releases[i:]...)
	}
	return len(q.releases)
}

// settle is how long a dispatch counts against the fleet's headroom on
// this edge: the time it takes to show in the fleet view (the hop's
// dispatch is counted on the instance when it is sent, a few
// milliseconds after the release).
const settle = 50 * time.Millisecond

// total is the requests queued in every band.
func (q *queue) total() int {
	n := 0
	for _, c := range q.queued {
		n += c
	}
	return n
}

// idle reports whether f may be forgotten: nothing queued, its service
// decayed to nothing.
func (f *flowQ) idle(now time.Time, avgCost float64) bool {
	return f.queued() == 0 && f.served.value(now, window) < max(avgCost, 1)*1e-3
}

// maxFlows bounds the flows one model keeps beyond those with requests
// queued: past it, flows with nothing queued are forgotten (their service
// with them) until it holds.
const maxFlows = 16384

// gc forgets idle flows, and flows with nothing queued beyond maxFlows.
func (q *queue) gc(now time.Time) {
	for k, f := range q.flows {
		if f.idle(now, q.avgCost) {
			delete(q.flows, k)
		}
	}
	for k, f := range q.flows {
		if len(q.flows) <= maxFlows {
			break
		}
		if f.queued() == 0 {
			delete(q.flows, k)
		}
	}
}
