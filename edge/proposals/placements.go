package proposals

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing"
)

// Placements are this edge's own Bind proposals (routing/routing.Placements):
// from the request that placed a new key until this edge's replica has
// applied the log's answer. A new key's request is dispatched at once; its
// Bind goes to the log beside it, with one proposal id for every attempt,
// so a proposal that timed out but committed is answered as a duplicate
// with the binding in force rather than applied twice. While the answer is
// unknown the key's requests through this edge go where it proposed (an
// edge never contradicts its own proposal); once the answer is known they
// go where the log says, even before the replica applies it.
type Placements struct {
	e *env

	mu    sync.Mutex
	byKey map[fsm.FleetKey]*ownBind
	// order holds the proposals by creation; settled ones leave from the
	// front once the replica has applied their answer.
	order     []*ownBind
	unsettled int

	// heard are the other edges' placements of new keys, as they tell them
	// over NATS (newest per key; heardOrder bounds them, oldest first).
	heard      map[fsm.FleetKey]heardBind
	heardOrder []fsm.FleetKey
	sub        *nats.Subscription
}

type heardBind struct {
	bind fsm.Bind
	at   time.Time // edge clock when heard
}

// maxHeard bounds the heard placements remembered.
const maxHeard = 65536

// heardTTL is how long a heard placement is followed: the other edge's
// Bind commits, and this edge applies it, well within it.
func (p *Placements) heardTTL() time.Duration {
	return max(4*p.e.cfg.ProposeTimeout, 2*time.Second)
}

type ownBind struct {
	key  fsm.FleetKey
	id   fsm.ProposalID
	bind fsm.Bind
	at   time.Time // the placement (the request's time)
	sent time.Time // wall clock of the first attempt
	// Served counts requests served on the proposal before it settled.
	served int
	// rank is the attention-DP rank a worker reported for a request
	// Served on the proposal (hasRank), recorded once the Bind wins.
	rank    uint32
	hasRank bool
	settled bool
	res     fsm.Result
	done    chan struct{} // closed when settled or dropped
	gone    bool          // replaced or dropped
	// evidence is the placement's Evidence, held until the log answers
	// the Bind so that the log records it after the Bind it explains.
	evidence *fsm.Evidence
}

// maxPlacements bounds the proposals remembered; beyond it the oldest are
// forgotten (counted dropped) and their keys' next requests placed anew.
const maxPlacements = 65536

func newPlacements(e *env) *Placements {
	return &Placements{e: e, byKey: map[fsm.FleetKey]*ownBind{}, heard: map[fsm.FleetKey]heardBind{}}
}

var _ routing.Placements = (*Placements)(nil)

// Propose sends b to the log unless a proposal of the key is in flight.
func (p *Placements) Propose(b fsm.Bind, now time.Time) {
	k := fsm.FleetKey{Fleet: b.Fleet, Key: b.Key}
	o := &ownBind{key: k, id: cluster.NewProposalID(), bind: b, at: now, sent: time.Now(), done: make(chan struct{})}
	st := p.e.edge.Node().State()
	p.mu.Lock()
	if old, ok := p.byKey[k]; ok {
		if !old.settled {
			p.mu.Unlock()
			return
		}
		old.gone = true
	}
	p.byKey[k] = o
	p.order = append(p.order, o)
	p.unsettled++
	p.sweepLocked(st)
	p.mu.Unlock()
	p.announce(b)
	if p.e.proposer.Down() {
		// A proposal would only wait out its timeout: the recorder
		// retries it (same id) once the log is back.
		p.e.recorder.addBind(o.id, o.bind)
		return
	}
	go p.send(o)
}

// send is a proposal's first attempt; a failure leaves it to the
// recorder's retries.
func (p *Placements) send(o *ownBind) {
	ctx, cancel := context.WithTimeout(p.e.ctx, p.e.cfg.ProposeTimeout)
	start := time.Now()
	rs, err := p.e.edge.Node().ProposeIdempotent(ctx, []fsm.Proposal{{ID: o.id, Event: o.bind}})
	cancel()
	var res fsm.Result
	if len(rs) == 1 {
		res = rs[0]
	}
	p.e.proposer.Observe(fsm.TypeBind, res, err, time.Since(start))
	switch {
	case len(rs) == 1 && (err == nil || errors.Is(err, cluster.ErrNotApplied)):
		p.settle(o.id, o.bind, res)
	case closedHere(err) || p.e.ctx.Err() != nil:
		p.drop(o.id, o.bind, "closed")
	default:
		p.e.recorder.addBind(o.id, o.bind)
	}
}

// closedHere reports whether a proposal failed because this edge's own
// node is closed, after which nothing can retry it. A leader that answered
// a forwarded proposal "closed" while it shut down (a RemoteError wrapping
// ErrClosed, which the node's retries end on when no new leader took over
// within the propose timeout) leaves the proposal to the next leader: it is
// retried like any proposal the log could not commit, never dropped.
func closedHere(err error) bool {
	if !errors.Is(err, cluster.ErrClosed) {
		return false
	}
	var remote *cluster.RemoteError
	return !errors.As(err, &remote) || !errors.Is(remote, cluster.ErrClosed)
}

// settle records the log's answer to proposal id.
func (p *Placements) settle(id fsm.ProposalID, b fsm.Bind, res fsm.Result) {
	k := fsm.FleetKey{Fleet: b.Fleet, Key: b.Key}
	p.mu.Lock()
	o, ok := p.byKey[k]
	if !ok || o.id != id || o.settled {
		p.mu.Unlock()
		return
	}
	o.settled, o.res = true, res
	p.unsettled--
	close(o.done)
	served, rank, hasRank, evidence := o.served, o.rank, o.hasRank, o.evidence
	o.evidence = nil
	p.mu.Unlock()
	if evidence != nil {
		// Queued apart: settle may run under the recorder's lock.
		go p.e.recorder.Add(*evidence, nil)
	}

	m := p.e.metrics
	m.BindSettle.Observe(time.Since(o.sent).Seconds())
	result := "lost"
	switch {
	case res.Status == fsm.StatusRejected || !res.Found:
		result = "rejected"
	case res.Binding.Decision.Edge == b.Decision.Edge && res.Binding.Decision.RequestID == b.Decision.RequestID:
		result = "won"
	case res.Binding.Instance == b.Instance:
		result = "agreed"
	}
	m.Placements.WithLabelValues(b.Fleet.String(), result).Inc()
	if hasRank && (result == "won" || result == "agreed") {
		// Queued apart: settle may run under the recorder's lock.
		ev := fsm.RankObserved{Fleet: b.Fleet, Key: b.Key, Epoch: res.Binding.Epoch, Rank: rank}
		go p.e.recorder.AddRank(ev)
	}
	if served > 0 {
		on := "on_binding"
		if result == "lost" || result == "rejected" {
			on = "off_binding"
		}
		m.SpeculativeServed.WithLabelValues(b.Fleet.String(), on).Add(float64(served))
	}
}

// HoldEvidence keeps ev, the Evidence of a placement whose Bind is still in
// flight, for settle to queue; it reports false when there is no such
// Bind (the caller queues ev itself).
func (p *Placements) HoldEvidence(ev fsm.Evidence) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	o, ok := p.byKey[fsm.FleetKey{Fleet: ev.Fleet, Key: ev.Key}]
	if !ok || o.settled || o.bind.Decision.RequestID != ev.RequestID {
		return false
	}
	o.evidence = &ev
	return true
}

// drop forgets proposal id (the recorder gave it up, or the edge stops).
func (p *Placements) drop(id fsm.ProposalID, b fsm.Bind, reason string) {
	k := fsm.FleetKey{Fleet: b.Fleet, Key: b.Key}
	p.mu.Lock()
	o, ok := p.byKey[k]
	if !ok || o.id != id {
		p.mu.Unlock()
		return
	}
	p.forgetLocked(o)
	p.mu.Unlock()
	p.e.metrics.Placements.WithLabelValues(b.Fleet.String(), "dropped").Inc()
	p.e.log.Debug("placement dropped", "fleet", b.Fleet, "key", b.Key, "reason", reason)
}

func (p *Placements) forgetLocked(o *ownBind) {
	if !o.settled {
		p.unsettled--
		close(o.done)
	}
	o.gone = true
	delete(p.byKey, o.key)
}

// sweepLocked forgets, from the oldest, proposals whose answer the replica
// has applied (and any beyond maxPlacements).
func (p *Placements) sweepLocked(st *fsm.State) {
	n := 0
	for n < len(p.order) {
		o := p.order[n]
		switch {
		case o.gone:
		case len(p.order)-n > maxPlacements:
			if !o.settled {
				p.e.metrics.Placements.WithLabelValues(o.key.Fleet.String(), "dropped").Inc()
			}
			p.forgetLocked(o)
		case o.settled && (!o.res.Found || st.EpochIndex(o.res.Binding.Epoch) <= st.Index()):
			p.forgetLocked(o)
		default:
			p.order = p.order[n:]
			return
		}
		p.order[n] = nil
		n++
	}
	p.order = p.order[:0]
}

func (o *ownBind) pending() routing.Pending {
	return routing.Pending{Bind: o.bind, At: o.at, Settled: o.settled, Result: o.res}
}

// Pending returns the key's proposal.
func (p *Placements) Pending(f fsm.Fleet, key string) (routing.Pending, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o, ok := p.byKey[fsm.FleetKey{Fleet: f, Key: key}]
	if !ok {
		return routing.Pending{}, false
	}
	return o.pending(), true
}

// Await waits up to propose_timeout for the key's proposal to settle.
func (p *Placements) Await(ctx context.Context, f fsm.Fleet, key string) (routing.Pending, bool) {
	p.mu.Lock()
	o, ok := p.byKey[fsm.FleetKey{Fleet: f, Key: key}]
	p.mu.Unlock()
	if !ok {
		return routing.Pending{}, false
	}
	t := time.NewTimer(p.e.cfg.ProposeTimeout)
	defer t.Stop()
	select {
	case <-o.done:
	case <-ctx.Done():
	case <-t.C:
	}
	return p.Pending(f, key)
}

// Served counts a request served on the key's proposal before it settled
// (tether_edge_speculative_requests_total, judged when it settles).
func (p *Placements) Served(f fsm.Fleet, key string) {
	p.mu.Lock()
	if o, ok := p.byKey[fsm.FleetKey{Fleet: f, Key: key}]; ok && !o.settled {
		o.served++
	}
	p.mu.Unlock()
}

// NoteRank takes the rank a worker reported for a request served on the
// key's proposal on instance: remembered until the log answers it, or, if
// it already did with this placement, returned for recording now.
func (p *Placements) NoteRank(f fsm.Fleet, key, instance string, rank uint32) (fsm.RankObserved, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o, ok := p.byKey[fsm.FleetKey{Fleet: f, Key: key}]
	switch {
	case !ok || o.bind.Instance != instance:
	case !o.settled:
		o.rank, o.hasRank = rank, true
	case o.res.Found && o.res.Binding.Instance == instance && (!o.res.Binding.HasRank || o.res.Binding.Rank != rank):
		return fsm.RankObserved{Fleet: f, Key: key, Epoch: o.res.Binding.Epoch, Rank: rank}, true
	}
	return fsm.RankObserved{}, false
}

// Listen subscribes to the other edges' placements (no NATS: nothing to
// hear, nothing announced).
func (p *Placements) Listen() error {
	if p.e.edge.NATS() == nil {
		return nil
	}
	sub, err := p.e.edge.NATS().Subscribe(telemetry.PlacementSubjectAll, p.onPlacement)
	if err != nil {
		return fmt.Errorf("edge: subscribe %s: %w", telemetry.PlacementSubjectAll, err)
	}
	p.sub = sub
	return nil
}

// announce tells the other edges where this edge placed a new key, the
// moment it dispatches it: queued on the edge's publisher, sent off the
// request path (dropped when its queue is full or NATS is not connected:
// the log alone tells then).
func (p *Placements) announce(b fsm.Bind) {
	pub := p.e.edge.Publisher()
	if pub == nil {
		return
	}
	data, err := telemetry.EncodePlacement(telemetry.Placement{Edge: p.e.cfg.NodeID, Fleet: fleetview.TelemetryFleet(b.Fleet), Key: b.Key,
		ConversationID: b.ConversationID, Instance: b.Instance, RequestID: b.Decision.RequestID})
	if err != nil {
		return // an id NATS subjects cannot carry: the log alone tells
	}
	pub.Publish(telemetry.PlacementSubject(p.e.cfg.NodeID), data, p.told)
}

// told counts a placement message's fate.
func (p *Placements) told(sent bool) {
	if sent {
		p.e.metrics.PlacementMsgs.WithLabelValues("sent").Inc()
	} else {
		p.e.metrics.PlacementMsgs.WithLabelValues("dropped").Inc()
	}
}

func (p *Placements) onPlacement(m *nats.Msg) {
	pl, err := telemetry.DecodePlacement(m.Subject, m.Data)
	if err != nil {
		p.e.metrics.PlacementMsgs.WithLabelValues("invalid").Inc()
		return
	}
	if pl.Edge == p.e.cfg.NodeID {
		return
	}
	f := fleetview.FleetOf(pl.Fleet)
	k := fsm.FleetKey{Fleet: f, Key: pl.Key}
	p.e.metrics.PlacementMsgs.WithLabelValues("heard").Inc()
	now := p.e.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	ttl := p.heardTTL()
	old, ok := p.heard[k]
	if !ok {
		p.heardOrder = append(p.heardOrder, k)
	}
	// The first placement heard stands for its time: it was proposed
	// first, so its Bind most likely commits first, and an edge that placed
	// the key again without having heard it (the two raced) does not pull
	// the edges that heard both after its own placement. Another edge
	// following the same instance renews it.
	if !ok || now.Sub(old.at) >= ttl || old.bind.Instance == pl.Instance {
		p.heard[k] = heardBind{bind: fsm.Bind{Fleet: f, Key: pl.Key, ConversationID: pl.ConversationID, Instance: pl.Instance,
			Decision: fsm.Decision{Edge: pl.Edge, RequestID: pl.RequestID}}, at: now}
	}
	// Forget, from the oldest, what is past its time or beyond the bound.
	for len(p.heardOrder) > 0 {
		old := p.heardOrder[0]
		hb, ok := p.heard[old]
		if ok && len(p.heard) <= maxHeard && now.Sub(hb.at) < ttl {
			break
		}
		if ok && (len(p.heard) > maxHeard || now.Sub(hb.at) >= ttl) {
			delete(p.heard, old)
		}
		p.heardOrder = p.heardOrder[1:]
	}
}

// Heard returns another edge's placement of the key heard within
// heardTTL.
func (p *Placements) Heard(f fsm.Fleet, key string) (fsm.Bind, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	hb, ok := p.heard[fsm.FleetKey{Fleet: f, Key: key}]
	if !ok || p.e.cfg.Now().Sub(hb.at) >= p.heardTTL() {
		return fsm.Bind{}, false
	}
	return hb.bind, true
}

// InFlight counts proposals whose answer this edge does not know yet.
func (p *Placements) InFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unsettled
}
