package dispatch

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing"
)

// Dispatches shared over NATS. A worker's load report counts the requests
// it received before the report; each edge adds what it dispatched since,
// so that back-to-back placements do not all see the same idle instance.
// With several edges, each would see only its own dispatches, and edges
// would place by views that differ by what the others sent since the last
// report. So every edge tells the others each request it sends
// (tether.v1.dispatch.<edge>: instance and prompt tokens) and again when it
// ended, and counts theirs as it counts its own: until the instance's next
// report or the request's end (fleetview's NoteHeardDispatch). The trace
// replay measured it (BENCHMARKS.md, "Sharing edge state"): with five edges
// and heavy load, per-edge counts made edges place conversations
// differently from one edge; with shared counts they place as one edge
// does.

// dispatchShare is this edge's side: the ids of its own dispatches, and
// the other edges' dispatches it counts until they end.
type dispatchShare struct {
	seq atomic.Uint64

	mu sync.Mutex
	// heard maps another edge's dispatch to the release of its count;
	// order bounds them (oldest first): one whose end is never heard
	// counts until the instance's next report, then its entry is only
	// memory, dropped once maxHeardDispatches newer ones came.
	heard map[heardDispatch]func()
	order []heardDispatch
}

type heardDispatch struct {
	edge string
	id   uint64
}

// maxHeardDispatches bounds the other edges' dispatches remembered.
const maxHeardDispatches = 65536

// noteDispatch counts a request this edge sends to h's instance on its
// fleet view and tells the other edges, with the route's entry in its
// working sets (h.Work); done (idempotent) ends both when the hop ends.
func (e *Dispatcher) noteDispatch(h *route.Hop, promptTokens int) (done func()) {
	release := e.edge.Fleet().NoteDispatch(h.Instance, promptTokens)
	d := telemetry.Dispatch{Edge: e.nodeID, ID: e.dispatches.seq.Add(1), Fleet: fleetview.TelemetryFleet(h.Fleet), Instance: h.Instance,
		PromptTokens: min(max(promptTokens, 0), telemetry.MaxDispatchPromptTokens)}
	if w := h.Work; len(w.Key) <= telemetry.MaxDispatchWorkBytes {
		d.Work, d.Blocks = w.Key, min(max(w.Blocks, 0), telemetry.MaxDispatchPromptTokens)
	}
	e.announceDispatch(d)
	d.Work, d.Blocks = "", 0 // the end says nothing of the working sets
	var once sync.Once
	return func() {
		once.Do(func() {
			release()
			d.Done = true
			e.announceDispatch(d)
		})
	}
}

// announceDispatch queues d for the other edges (the edge's publisher
// sends it off the request path; dropped when its queue is full or NATS is
// not connected: the others then count only their own).
func (e *Dispatcher) announceDispatch(d telemetry.Dispatch) {
	pub := e.edge.Publisher()
	if pub == nil {
		return
	}
	data, err := telemetry.EncodeDispatch(d)
	if err != nil {
		return // an id NATS subjects cannot carry
	}
	pub.Publish(telemetry.DispatchSubject(e.nodeID), data, e.dispatchTold)
}

// dispatchTold counts a dispatch message's fate.
func (e *Dispatcher) dispatchTold(sent bool) {
	if sent {
		e.metrics.DispatchMsgs.WithLabelValues("sent").Inc()
	} else {
		e.metrics.DispatchMsgs.WithLabelValues("dropped").Inc()
	}
}

// listenDispatches subscribes to the other edges' dispatches (no NATS:
// nothing to hear).
func (e *Dispatcher) listenDispatches() error {
	if e.edge.NATS() == nil {
		return nil
	}
	e.dispatches.heard = map[heardDispatch]func(){}
	if _, err := e.edge.NATS().Subscribe(telemetry.DispatchSubjectAll, e.onDispatch); err != nil {
		return fmt.Errorf("edge: subscribe %s: %w", telemetry.DispatchSubjectAll, err)
	}
	return nil
}

func (e *Dispatcher) onDispatch(m *nats.Msg) {
	d, err := telemetry.DecodeDispatch(m.Subject, m.Data)
	if err != nil {
		e.metrics.DispatchMsgs.WithLabelValues("invalid").Inc()
		return
	}
	if d.Edge == e.nodeID {
		return
	}
	e.metrics.DispatchMsgs.WithLabelValues("heard").Inc()
	switch {
	case d.Answer != nil:
		e.hearAnswer(d)
		return
	case d.Strain != nil:
		e.router.HearStrain(d.Instance, d.Strain.Overloaded)
		return
	}
	e.dispatches.hear(d, e.edge.Fleet().NoteHeardDispatch)
	e.hearWork(d)
}

// hearWork notes another edge's route in the working sets of the model
// its instance serves (routing Decider.HearRoute).
func (e *Dispatcher) hearWork(d telemetry.Dispatch) {
	if d.Done || d.Work == "" || d.Blocks <= 0 {
		return
	}
	now := e.now()
	if dec, r, ok := e.catalogue.DecisionOf(fleetview.FleetOf(d.Fleet), d.Instance, now); ok {
		dec.HearRoute(r, routing.Work{Key: d.Work, Blocks: d.Blocks}, d.Instance, now)
	}
}

// grade grades h's KV index claim against the engine's answer about the
// prompt's cache (edge/route RecordAnswer) and tells the other edges, on
// the dispatch subject (internal/telemetry Dispatch.Answer): every edge's
// breakers see every edge's answers, so a disagreeing index is degraded on
// all edges at once, whichever served its instance.
func (e *Dispatcher) grade(rq *route.Request, h *route.Hop, promptTokens, cachedTokens int) {
	a, ok := e.router.RecordAnswer(rq, h, promptTokens, cachedTokens)
	if !ok {
		return
	}
	clip := func(v int64) int { return int(min(max(v, 0), telemetry.MaxDispatchPromptTokens)) }
	e.announceDispatch(telemetry.Dispatch{Edge: e.nodeID, Done: true, Fleet: fleetview.TelemetryFleet(a.Fleet), Instance: a.Instance,
		PromptTokens: clip(a.PromptTokens), Answer: &telemetry.DispatchAnswer{Source: a.Source.String(), BlockSize: int(a.BlockSize),
			PredictedTokens: clip(a.PredictedTokens), CachedTokens: clip(a.CachedTokens)}})
}

// TellStrain tells the other edges a transition of this edge's overload
// history of instance (edge/route strain.go), on the dispatch subject.
func (e *Dispatcher) TellStrain(f fsm.Fleet, instance string, overloaded bool) {
	e.announceDispatch(telemetry.Dispatch{Edge: e.nodeID, Done: true, Fleet: fleetview.TelemetryFleet(f), Instance: instance,
		Strain: &telemetry.DispatchStrain{Overloaded: overloaded}})
}

// hearAnswer grades another edge's answer as this edge's own.
func (e *Dispatcher) hearAnswer(d telemetry.Dispatch) {
	src, err := fsm.ParseKVSource(d.Answer.Source)
	if err != nil {
		src = fsm.KVSourceUnknown
	}
	e.edge.Fleet().RecordAnswer(fleetview.Answer{Fleet: fleetview.FleetOf(d.Fleet), Instance: d.Instance, Source: src,
		BlockSize: int64(d.Answer.BlockSize), PromptTokens: int64(d.PromptTokens), PredictedTokens: int64(d.Answer.PredictedTokens),
		CachedTokens: int64(d.Answer.CachedTokens)}, false, e.now())
}

// hear counts another edge's dispatch through note, or releases its count
// when d says it ended.
func (s *dispatchShare) hear(d telemetry.Dispatch, note func(instance string, promptTokens int) func()) {
	k := heardDispatch{edge: d.Edge, id: d.ID}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.Done {
		if release, ok := s.heard[k]; ok {
			delete(s.heard, k)
			release()
		}
		return
	}
	if _, ok := s.heard[k]; ok {
		return // a repeat
	}
	for len(s.order) > 0 && (len(s.heard) >= maxHeardDispatches || len(s.order) >= 2*maxHeardDispatches) {
		delete(s.heard, s.order[0])
		s.order = s.order[1:]
	}
	s.heard[k] = note(d.Instance, d.PromptTokens)
	s.order = append(s.order, k)
}
