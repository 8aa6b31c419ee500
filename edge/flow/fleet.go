package flow

import (
	"math"
	"time"

	"github.com/tether-project/tether/internal/telemetry"
)

// peerFresh is how long another edge's state counts after it arrived: a
// few heartbeats. An edge that stopped publishing (gone, or cut off from
// NATS) stops counting: the others then order and estimate by what they
// still hear.
const peerFresh = 4 * heartbeat

// peerFlow is one flow's figures at another edge.
type peerFlow struct {
	queued       int
	served, rate float64   // served decayed to the state's arrival
	last         time.Time // when the last of its queued requests reaches its bound
}

// peer is another edge's last state.
type peer struct {
	seq    uint64
	at     time.Time // when it arrived (this edge's clock)
	models map[string]map[flowKey]peerFlow
}

// peers are the other edges' states by node id.
type peers map[string]*peer

// hear takes another edge's state, arrived at now; it reports whether it
// replaced the one held (a repeat or an older one does not).
func (ps peers) hear(s telemetry.FlowState, now time.Time) bool {
	if p := ps[s.Edge]; p != nil && s.Seq <= p.seq && now.Sub(p.at) < peerFresh {
		return false
	}
	p := &peer{seq: s.Seq, at: now, models: make(map[string]map[flowKey]peerFlow, len(s.Models))}
	for _, m := range s.Models {
		fs := make(map[flowKey]peerFlow, len(m.Flows))
		for _, f := range m.Flows {
			b, ok := parseBand(f.Band)
			if !ok {
				continue
			}
			k := flowKey{band: b, tenant: f.Tenant}
			pf := fs[k]
			pf.queued += f.Queued
			pf.served += f.Served
			pf.rate += f.Rate
			if f.Queued > 0 {
				pf.last = later(pf.last, now.Add(time.Duration(f.LastMilli)*time.Millisecond))
			}
			fs[k] = pf
		}
		p.models[m.Model] = fs
	}
	ps[s.Edge] = p
	return true
}

// others sums the fresh peers' flows of model at now (served decayed to
// now); nil when no fresh peer has the model.
func (ps peers) others(model string, now time.Time) map[flowKey]peerFlow {
	var out map[flowKey]peerFlow
	for id, p := range ps {
		age := now.Sub(p.at)
		if age >= peerFresh {
			if age >= 4*peerFresh {
				delete(ps, id)
			}
			continue
		}
		fs := p.models[model]
		if len(fs) == 0 {
			continue
		}
		if out == nil {
			out = make(map[flowKey]peerFlow, len(fs))
		}
		decay := 1.0
		if age > 0 {
			decay = math.Exp(-age.Seconds() / window.Seconds())
		}
		for k, f := range fs {
			o := out[k]
			o.queued += f.queued
			o.served += f.served * decay
			o.rate += f.rate
			o.last = later(o.last, f.last)
			out[k] = o
		}
	}
	return out
}

// plan is what a dispatch round on this edge may do for one model: the
// band it serves (the highest with requests queued anywhere in the
// fleet), the least fleet-wide service among that band's queued flows,
// the margin within which a flow counts as even with it, and the queued
// requests of the flows within it, here and in the whole fleet.
type plan struct {
	band        Band
	min, margin float64
	local       int
	fleet       int
}

// fleetServed is k's service over the fleet: this edge's and the others'.
func (q *queue) fleetServed(k flowKey, others map[flowKey]peerFlow, now time.Time) float64 {
	s := others[k].served
	if f := q.flows[k]; f != nil {
		s += f.served.value(now, window)
	}
	return s
}

// plan looks at the fleet's queued flows; ok is false when nothing is
// queued anywhere.
func (q *queue) plan(others map[flowKey]peerFlow, now time.Time) (plan, bool) {
	for b := Interactive; b < numBands; b++ {
		p := plan{band: b, min: math.Inf(1), margin: 2 * max(q.avgCost, 1)}
		any := false
		q.eachBacklogged(b, others, func(k flowKey, local, fleet int) {
			any = true
			p.min = min(p.min, q.fleetServed(k, others, now))
		})
		if !any {
			continue
		}
		q.eachBacklogged(b, others, func(k flowKey, local, fleet int) {
			if q.fleetServed(k, others, now) <= p.min+p.margin {
				p.local += local
				p.fleet += fleet
			}
		})
		return p, true
	}
	return plan{}, false
}

// eachBacklogged calls fn for every flow of band b with requests queued
// here or at another edge, with its queued requests here and fleet-wide.
func (q *queue) eachBacklogged(b Band, others map[flowKey]peerFlow, fn func(k flowKey, local, fleet int)) {
	for k, f := range q.flows {
		if k.band == b && (f.queued() > 0 || others[k].queued > 0) {
			fn(k, f.queued(), f.queued()+others[k].queued)
		}
	}
	for k, o := range others {
		if k.band == b && o.queued > 0 && q.flows[k] == nil {
			fn(k, 0, o.queued)
		}
	}
}

// pick is the flow this edge dispatches next under p: among its own
// queued flows of p's band within the margin of the least served, the
// least served (the least recently picked among equals). nil: every
// flow within the margin is queued at other edges only, which serve it.
func (q *queue) pick(p plan, others map[flowKey]peerFlow, now time.Time) *flowQ {
	var best *flowQ
	bestServed := 0.0
	for k, f := range q.flows {
		if k.band != p.band || f.queued() == 0 {
			continue
		}
		s := q.fleetServed(k, others, now)
		if s > p.min+p.margin {
			continue
		}
		if best == nil || s < bestServed || s == bestServed && f.picked < best.picked {
			best, bestServed = f, s
		}
	}
	return best
}

// pickLocal is the flow to dispatch when this edge stops holding back for
// the others (they did not take the headroom): its own least served flow
// of its highest queued band.
func (q *queue) pickLocal(others map[flowKey]peerFlow, now time.Time) *flowQ {
	for b := Interactive; b < numBands; b++ {
		if q.queued[b] == 0 {
			continue
		}
		return q.pick(plan{band: b, min: math.Inf(1)}, others, now)
	}
	return nil
}

// estimate is how long the next request of flow k would wait for the
// requests ahead of it to be dispatched, from the fleet's measured rates.
// A queued flow that is being served drains at its own dispatch rate (the
// share the fair order gives it, its measured rate). Any other request
// waits for its place in the fair order at the model's rate: behind every
// request of a higher band, its own flow's queue, and the requests of the
// other flows of its band that are less served than it will be once its
// turn comes. ok is false while nothing has been dispatched to measure by.
func (q *queue) estimate(k flowKey, others map[flowKey]peerFlow, now time.Time) (time.Duration, bool) {
	queued := others[k].queued
	rate := others[k].rate
	if f := q.flows[k]; f != nil {
		queued += f.queued()
		rate += f.rate(now)
	}
	if queued > 0 && rate > 0 {
		return seconds(float64(queued+1) / rate), true
	}
	total := q.totalRate(others, now)
	if total <= 0 {
		return 0, false
	}
	cost := max(q.avgCost, 1)
	turn := q.fleetServed(k, others, now) + float64(queued+1)*cost // k's service once its request is dispatched
	ahead := queued + 1
	for b := Interactive; b <= k.band; b++ {
		q.eachBacklogged(b, others, func(o flowKey, _, fleet int) {
			switch {
			case b < k.band:
				ahead += fleet
			case o != k:
				if before := math.Ceil((turn - q.fleetServed(o, others, now)) / cost); before > 0 {
					ahead += min(fleet, int(min(before, float64(fleet))))
				}
			}
		})
	}
	return seconds(float64(ahead) / total), true
}

// drain is when the requests now queued ahead of a new request of flow k
// will have left the queue, dispatched or refused at their bound: the
// estimate (at the fleet's measured rate), but no later than when the
// last of k's requests queued anywhere reaches its bound (each leaves by
// its own deadline; past it, none of them is ahead). 0 while nothing was
// measured.
func (q *queue) drain(k flowKey, others map[flowKey]peerFlow, now time.Time) time.Duration {
	est, ok := q.estimate(k, others, now)
	if !ok {
		return 0
	}
	last := others[k].last
	if f := q.flows[k]; f != nil {
		if e := f.items.Back(); e != nil {
			last = later(last, e.Value.(*waiter).deadline)
		}
	}
	if !last.IsZero() {
		est = min(est, max(last.Sub(now), 0))
	}
	return est
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// totalRate is the model's dispatches per second over the fleet.
func (q *queue) totalRate(others map[flowKey]peerFlow, now time.Time) float64 {
	total := 0.0
	for _, f := range q.flows {
		total += f.rate(now)
	}
	for _, o := range others {
		total += o.rate
	}
	return total
}

func seconds(s float64) time.Duration {
	if s > float64(math.MaxInt64/int64(time.Second)) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}
