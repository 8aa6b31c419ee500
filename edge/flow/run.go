package flow

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/internal/telemetry"
)

// Start subscribes to the other edges' flow states (nothing without
// NATS, or while flow control is off).
func (c *Controller) Start() error {
	conn := c.edge.NATS()
	if !c.cfg.Enabled || conn == nil {
		return nil
	}
	sub, err := conn.Subscribe(telemetry.FlowSubjectAll, c.onState)
	if err != nil {
		return fmt.Errorf("edge: subscribe %s: %w", telemetry.FlowSubjectAll, err)
	}
	c.mu.Lock()
	c.sub = sub
	c.mu.Unlock()
	return nil
}

// Close ends the controller: waiting requests are refused (503, retry on
// another edge) and the states of the other edges no longer heard.
func (c *Controller) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	close(c.done)
	if c.sub != nil {
		_ = c.sub.Unsubscribe()
	}
}

// Run dispatches queued requests as the fleet has room and tells the other
// edges this edge's state, until done closes.
func (c *Controller) Run(done <-chan struct{}) {
	if !c.cfg.Enabled {
		return
	}
	t := time.NewTimer(heartbeat)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-c.done:
			return
		case <-c.wake:
		case <-t.C:
		}
		t.Reset(c.round(c.edge.Now()))
	}
}

// round dispatches what the fleet has room for, sends this edge's state
// when due, and returns when the next round is due.
func (c *Controller) round(now time.Time) time.Duration {
	for _, m := range c.queuedModels() {
		h := c.edge.Headroom(m, now)
		c.mu.Lock()
		if q := c.models[m]; q != nil {
			if c.dispatch(q, c.peers.others(m, now), h, now) {
				c.pub.dirty = true
			}
		}
		c.mu.Unlock()
	}
	c.publish(now)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, q := range c.models {
		if q.total() > 0 {
			return poll
		}
	}
	if c.pub.dirty {
		return coalesce
	}
	return heartbeat
}

// queuedModels are the models with requests queued on this edge.
func (c *Controller) queuedModels() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for m, q := range c.models {
		if q.total() > 0 {
			out = append(out, m)
		}
	}
	sort.Strings(out)
	return out
}

// dispatch releases up to this edge's claim on the fleet's headroom h, in
// fair order (plan, pick); it reports whether it released any. The claim
// is the headroom in proportion to this edge's share of the fleet's
// queued requests that are next in order, so edges holding the same
// tenant's queue do not all fill the same room. When every next request
// is another edge's, this edge holds back, for c.yieldGrace at most while
// there is room. c.mu held.
func (c *Controller) dispatch(q *queue, others map[flowKey]peerFlow, h int, now time.Time) bool {
	q.expire(now)
	h -= q.pending(now)
	if h <= 0 {
		q.yieldSince = time.Time{}
		return false
	}
	p, ok := q.plan(others, now)
	if !ok {
		return false
	}
	claim := h
	if p.fleet > p.local {
		claim = int(math.Ceil(float64(h) * float64(p.local) / float64(p.fleet)))
	}
	released := 0
	for released < claim {
		f := q.pick(p, others, now)
		if f == nil {
			break
		}
		q.release(f, now)
		released++
		if p, ok = q.plan(others, now); !ok {
			break
		}
	}
	if released > 0 || q.total() == 0 {
		q.yieldSince = time.Time{}
		return released > 0
	}
	if q.yieldSince.IsZero() {
		q.yieldSince = now
		return false
	}
	if now.Sub(q.yieldSince) < c.yieldGrace {
		return false
	}
	for ; released < h; released++ {
		f := q.pickLocal(others, now)
		if f == nil {
			break
		}
		q.release(f, now)
	}
	q.yieldSince = time.Time{}
	return released > 0
}

// onState takes another edge's flow state.
func (c *Controller) onState(m *nats.Msg) {
	s, err := telemetry.DecodeFlowState(m.Subject, m.Data)
	if err != nil {
		c.m.Messages.WithLabelValues("invalid").Inc()
		return
	}
	if s.Edge == c.nodeID {
		return
	}
	c.m.Messages.WithLabelValues("heard").Inc()
	c.mu.Lock()
	changed := c.peers.hear(s, c.edge.Now())
	c.mu.Unlock()
	if changed {
		c.signal()
	}
}

// publish sends this edge's state when it changed (at most every
// coalesce) or a heartbeat is due, and sets the drain rate gauges.
func (c *Controller) publish(now time.Time) {
	conn := c.edge.NATS()
	c.mu.Lock()
	due := c.pub.dirty && now.Sub(c.pub.last) >= coalesce ||
		now.Sub(c.pub.last) >= heartbeat && (len(c.models) > 0 || c.pub.nonEmpty)
	if !due {
		c.mu.Unlock()
		return
	}
	for name, q := range c.models {
		q.gc(now)
		c.m.DrainRate.WithLabelValues(name).Set(q.totalRate(c.peers.others(name, now), now))
		if len(q.flows) == 0 {
			delete(c.models, name)
		}
	}
	c.pub.seq++
	s := c.stateLocked(now)
	c.pub.dirty, c.pub.last, c.pub.nonEmpty = false, now, len(s.Models) > 0
	c.mu.Unlock()
	if conn == nil || !conn.IsConnected() {
		return
	}
	data, err := telemetry.EncodeFlowState(s)
	if err != nil {
		c.log.Warn("flow control: state not sent", "err", err)
		return
	}
	if conn.Publish(telemetry.FlowSubject(c.nodeID), data) == nil {
		c.m.Messages.WithLabelValues("sent").Inc()
	}
}

// stateLocked is this edge's flow state at now: every model's flows, the
// queued ones first when there are more than a message holds. c.mu held.
func (c *Controller) stateLocked(now time.Time) telemetry.FlowState {
	s := telemetry.FlowState{Edge: c.nodeID, Seq: c.pub.seq}
	type entry struct {
		model string
		e     telemetry.FlowEntry
	}
	var all []entry
	for name, q := range c.models {
		for k, f := range q.flows {
			e := telemetry.FlowEntry{Tenant: k.tenant, Band: k.band.String(), Queued: f.queued(),
				Served: min(f.served.value(now, window), telemetry.MaxFlowFigure), Rate: min(f.rate(now), telemetry.MaxFlowFigure)}
			if b := f.items.Back(); b != nil {
				e.LastMilli = min(max(b.Value.(*waiter).deadline.Sub(now).Milliseconds(), 0), telemetry.MaxFlowLastMs)
			}
			all = append(all, entry{name, e})
		}
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i].e, all[j].e
		if a.Queued != b.Queued {
			return a.Queued > b.Queued
		}
		return a.Served > b.Served
	})
	if len(all) > telemetry.MaxFlowEntries {
		all = all[:telemetry.MaxFlowEntries]
	}
	byModel := map[string]int{}
	for _, e := range all {
		i, ok := byModel[e.model]
		if !ok {
			i = len(s.Models)
			byModel[e.model] = i
			s.Models = append(s.Models, telemetry.FlowModel{Model: e.model})
		}
		s.Models[i].Flows = append(s.Models[i].Flows, e.e)
	}
	return s
}
