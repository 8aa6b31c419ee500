package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/routing/kvindex"
)

// A simulated edge runs the edge's decision (routing.Decider) over what a
// real edge has: its own replica of the log (committed entries only), its
// own fleet view and KV index, its own overload tracker and breakers, and a
// recorder whose events commit later. The types below are those inputs.

// decider builds edge e's decision over the simulator's state.
func (s *simulator) decider(e *simEdge) *routing.Decider {
	d := &routing.Decider{Log: simLog{s, e}, Recorder: simRecorder{s, e}, Placements: simPlacements{s, e}, Fleet: simFleet{s, e},
		Overload: e.overload, CommitFirst: s.cfg.CommitFirst}
	if e.index != nil {
		d.Index = simIndex{s, e}
	}
	return d
}

// simIndex is edge e's KV index; with shared predictions, a prediction
// made after placing reaches every edge's index.
type simIndex struct {
	s *simulator
	e *simEdge
}

func (x simIndex) Match(blocks []uint64, now time.Time, dst []kvindex.Match) []kvindex.Match {
	return x.e.index.Match(blocks, now, dst)
}

func (x simIndex) Holds(instance string, rank int, block uint64, now time.Time) (bool, bool) {
	return x.e.index.Holds(instance, rank, block, now)
}

func (x simIndex) HeldByOther(instance string, block uint64, now time.Time) bool {
	return x.e.index.HeldByOther(instance, block, now)
}

func (x simIndex) Predict(instance string, blocks []uint64, now time.Time) {
	x.e.index.Predict(instance, blocks, now)
	if !x.s.cfg.Share.Predictions {
		return
	}
	// Heard ShareLatency later; the prediction's lifetime counts from then.
	for _, o := range x.s.edges {
		if o != x.e && o.index != nil {
			o.index.Predict(instance, blocks, now.Add(x.s.cfg.ShareLatency))
		}
	}
}

// simLog is edge e's view of the affinity log.
type simLog struct {
	s *simulator
	e *simEdge
}

func (l simLog) log() (*virtualLog, int) {
	if l.e.local != nil {
		return l.e.local, 0
	}
	if l.s.log == nil {
		return nil, 0
	}
	return l.s.log, l.e.num
}

func (l simLog) State() *fsm.State {
	lg, r := l.log()
	if lg == nil {
		return l.s.emptyLog.State()
	}
	st, err := lg.State(r, l.s.now)
	if err != nil {
		l.s.fail(err)
		return l.s.emptyLog.State()
	}
	return st
}

// Propose commits ev; the request waits until it committed.
func (l simLog) Propose(_ context.Context, ev fsm.Event) (fsm.Result, error) {
	if _, ok := ev.(fsm.Overflow); ok {
		// The decision commits every overflow before serving it.
		l.s.res.Overflows++
	}
	lg, _ := l.log()
	if lg == nil {
		return fsm.Result{}, errors.New("bench: this policy has no affinity log")
	}
	rs, at, err := lg.Propose(l.s.now, []fsm.Event{ev})
	if err != nil {
		return fsm.Result{}, err
	}
	l.e.waitUntil = max(l.e.waitUntil, at)
	return rs[0], nil
}

// Down: the simulated log always commits (partitions are not modelled).
func (simLog) Down(time.Time) bool { return false }

// simPlacements are edge e's own Bind proposals: each goes to the log when
// the request is placed and commits after the log's latency, when the
// edge learns its answer (its replica applies the entry at the same
// virtual time).
type simPlacements struct {
	s *simulator
	e *simEdge
}

type simProposal struct {
	bind     fsm.Bind
	at       time.Duration // placed
	commitAt time.Duration
	res      fsm.Result
}

func (p simPlacements) Propose(b fsm.Bind, _ time.Time) {
	k := fsm.FleetKey{Fleet: b.Fleet, Key: b.Key}
	if old, ok := p.e.proposals[k]; ok && p.s.now < old.commitAt {
		return
	}
	lg, _ := simLog(p).log()
	if lg == nil {
		p.s.fail(errors.New("bench: this policy has no affinity log"))
		return
	}
	rs, at, err := lg.Propose(p.s.now, []fsm.Event{b})
	if err != nil {
		p.s.fail(err)
		return
	}
	p.e.proposals[k] = &simProposal{bind: b, at: p.s.now, commitAt: at, res: rs[0]}
	if rs[0].Found && rs[0].Binding.Instance != b.Instance {
		p.s.res.LostBinds++
	}
}

func (p simPlacements) Pending(f fsm.Fleet, key string) (routing.Pending, bool) {
	k := fsm.FleetKey{Fleet: f, Key: key}
	o, ok := p.e.proposals[k]
	if !ok {
		return routing.Pending{}, false
	}
	if p.s.now >= o.commitAt {
		// Answered, and applied by this edge's replica at the same time.
		delete(p.e.proposals, k)
		return routing.Pending{Bind: o.bind, At: epoch.Add(o.at), Settled: true, Result: o.res}, true
	}
	return routing.Pending{Bind: o.bind, At: epoch.Add(o.at)}, true
}

// Heard: another edge's proposal of the key in flight, heard
// ShareLatency after that edge placed it (with shared placements). Of
// several, the first heard (the earliest placed), as the edge keeps it.
func (p simPlacements) Heard(f fsm.Fleet, key string) (fsm.Bind, bool) {
	if !p.s.cfg.Share.Placements {
		return fsm.Bind{}, false
	}
	k := fsm.FleetKey{Fleet: f, Key: key}
	var first *simProposal
	for _, o := range p.s.edges {
		if o == p.e {
			continue
		}
		x, ok := o.proposals[k]
		if ok && x.at+p.s.cfg.ShareLatency <= p.s.now && p.s.now < x.commitAt && (first == nil || x.at < first.at) {
			first = x
		}
	}
	if first == nil {
		return fsm.Bind{}, false
	}
	return first.bind, true
}

// Await: the request waits until the proposal commits (a simulated
// proposal never times out).
func (p simPlacements) Await(_ context.Context, f fsm.Fleet, key string) (routing.Pending, bool) {
	o, ok := p.e.proposals[fsm.FleetKey{Fleet: f, Key: key}]
	if !ok {
		return routing.Pending{}, false
	}
	p.e.waitUntil = max(p.e.waitUntil, o.commitAt)
	return routing.Pending{Bind: o.bind, At: epoch.Add(o.at), Settled: true, Result: o.res}, true
}

// simRecorder commits what the edge's recorder would, when it would: the
// proposal goes out now and commits after the log's latency; nothing waits.
type simRecorder struct {
	s *simulator
	e *simEdge
}

func (r simRecorder) Record(ev fsm.Event) {
	lg, _ := simLog(r).log()
	if lg == nil {
		return
	}
	if _, _, err := lg.Propose(r.s.now, []fsm.Event{ev}); err != nil {
		r.s.fail(err)
	}
}

func (r simRecorder) Touch(k fsm.FleetKey) { r.s.touch(r.e, k.Key, "") }
func (r simRecorder) TouchLink(child string) {
	r.s.touch(r.e, "", child)
}

// simFleet is edge e's fleet view.
type simFleet struct {
	s *simulator
	e *simEdge
}

func (f simFleet) Views(time.Time, []string) *routing.Views {
	v, err := f.s.views(f.e)
	if err != nil {
		f.s.fail(err)
		v, _ = routing.NewViews(nil)
	}
	return v
}

func (simFleet) UnheardAtStartup(time.Time, string) bool { return false }
func (simFleet) StateCurrent(time.Time) (bool, string)   { return true, "" }

// fail keeps the first error an adapter met; the event loop returns it.
func (s *simulator) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// route places a request at edge e: identity as the edge resolves it, then
// the edge's decision. It returns inst -1 with a retry delay when the
// request is shed, and the affinity id the worker's scheduler receives
// from a verified sub-agent hint.
func (s *simulator) route(edge int, ar *agentRun, req *Request, call int) (inst int, affinity string, retry time.Duration, err error) {
	e := s.edges[edge]
	e.waitUntil = 0
	if s.cfg.Policy == PolicyRandom {
		return s.pickRand.IntN(len(s.instances)), "", 0, nil
	}
	if s.cfg.Policy.isPeer() {
		inst, wait, err := s.routePeer(edge, ar, req)
		e.waitUntil = wait
		return inst, "", 0, err
	}
	now := epoch.Add(s.now)
	requestID := fmt.Sprintf("%s#%d", ar.agent.ID, call)
	rreq := routing.Request{
		Fleet: fsm.FleetContext, RequestID: requestID, Edge: e.id,
		PromptTokens: req.PromptTokens, Spread: routing.SpreadFor(requestID), Now: now, RoundRobin: e.rr,
		Adapter: req.Adapter,
	}
	e.rr++
	if e.index != nil {
		rreq.Blocks = req.Blocks
	}
	var id routing.Identity
	if s.cfg.Policy.binds() {
		h := http.Header{}
		h.Set("x-session-id", ar.agent.ID)
		if ar.agent.Parent != nil && (s.cfg.Policy != PolicyTetherParentFirst || call == 0) {
			// The agent gateway sends the parent header on every sub-agent
			// request (only tether configures it, so the others ignore it).
			h.Set(ParentHeader, ar.agent.Parent.ID)
		}
		if id, err = routing.ResolveIdentity(s.ident, "", h, e.dec.Log.State()); err != nil {
			return 0, "", 0, err
		}
		rreq.Key, rreq.ConversationID = id.Key(fsm.FleetContext), id.ConversationID
		e.dec.RecordIdentity(id)
		s.sweep(e, rreq.Key)
	}
	hop, fail := e.dec.Decide(s.ctx, s.router, rreq, nil)
	if s.err != nil {
		return 0, "", 0, s.err
	}
	if fail != nil {
		if fail.Kind == routing.FailShed {
			return -1, "", fail.RetryAfter, nil
		}
		return 0, "", 0, fail
	}
	if hop.Outcome == routing.OutcomeOverflow && hop.Binding.Instance == hop.Instance {
		s.res.Rebinds++
	}
	idx, ok := s.byID[hop.Instance]
	if !ok {
		return 0, "", 0, fmt.Errorf("routed to unknown instance %q", hop.Instance)
	}
	s.tellWork(e, idx, hop.Work)
	e.noteAdapter(idx, req.Adapter, s.now) // as the edge's fleet view does (lora.go)
	if id.SubAgent() && hop.Bound && hop.OnRootInstance() {
		affinity = rreq.Key // the signed hint's affinity id: the root key (edge/dispatch: sendHint)
	}
	return idx, affinity, 0, nil
}

// sweep stands in for the leader's session_ttl sweeper: a key whose
// committed last use is older than the TTL is evicted before it is routed
// again (keys that never return are not evicted: fewer commits). The
// binding's LastUsed is what the log committed (its Bind or the latest
// Touch batch), as a real edge reads it.
func (s *simulator) sweep(e *simEdge, key string) {
	if s.cfg.SessionTTL <= 0 {
		return
	}
	st := e.dec.Log.State()
	b, ok := st.Lookup(fsm.FleetContext, key)
	if !ok || s.now-time.Unix(0, b.LastUsed).Sub(epoch) <= s.cfg.SessionTTL {
		return
	}
	lg, _ := simLog{s, e}.log()
	// The sweeper ran long ago: the eviction committed before this request.
	saved := lg.latency
	lg.latency = CommitLatency{}
	_, _, err := lg.Propose(s.now, []fsm.Event{fsm.Evict{Fleet: fsm.FleetContext, Key: key, Reason: fsm.EvictTTL, Epoch: b.Epoch}})
	lg.latency = saved
	if err != nil {
		s.fail(err)
		return
	}
	s.res.TTLEvictions++
}

// touch queues a Touch of key (and/or a sub-agent's link) at edge e,
// flushed every TouchInterval like the edge's touch batching.
func (s *simulator) touch(e *simEdge, key, link string) {
	if key != "" && !e.touchPending[key] {
		e.touchPending[key] = true
		e.touchKeys = append(e.touchKeys, fsm.FleetKey{Fleet: fsm.FleetContext, Key: key})
	}
	if link != "" && !e.touchPending["\x00link:"+link] {
		e.touchPending["\x00link:"+link] = true
		e.touchLinks = append(e.touchLinks, link)
	}
	if !e.touchArmed {
		e.touchArmed = true
		s.push(&event{at: s.now + s.cfg.TouchInterval, kind: evTouchFlush, edge: e.num})
	}
}

func (s *simulator) flushTouches(edge int) error {
	e := s.edges[edge]
	e.touchArmed = false
	if len(e.touchKeys) == 0 && len(e.touchLinks) == 0 {
		return nil
	}
	ev := fsm.Touch{Keys: e.touchKeys, Links: e.touchLinks}
	e.touchKeys, e.touchLinks = nil, nil
	clear(e.touchPending)
	lg, _ := simLog{s, e}.log()
	if lg == nil {
		return nil
	}
	if _, _, err := lg.Propose(s.now, []fsm.Event{ev}); err != nil {
		return fmt.Errorf("bench: %s: touch: %w", e.id, err)
	}
	return nil
}

// hearKV applies published batches to every edge's index. A batch a
// restarted edge already has from its resync is a duplicate and ignored.
func (s *simulator) hearKV(batches []kvindex.Batch) error {
	for _, batch := range batches {
		for _, e := range s.edges {
			if e.index == nil {
				continue
			}
			if out, err := e.index.Apply(batch); err != nil || (out != kvindex.Applied && out != kvindex.Duplicate) {
				return fmt.Errorf("bench: %s: kv batch %d of %s: outcome %v (err %v)", e.id, batch.Seq, batch.Instance, out, err)
			}
			if e.heard == nil {
				e.heard = map[string]uint64{}
			}
			e.heard[batch.Instance] = max(e.heard[batch.Instance], batch.Seq)
		}
	}
	return nil
}

// armKVFlush schedules instance i's next KV flush: the first flush tick
// (a multiple of KVFlushInterval) at or after its oldest batch is ready.
func (s *simulator) armKVFlush(i int) {
	in := s.instances[i]
	if in.kvArmed || len(in.kvPending) == 0 {
		return
	}
	iv := s.cfg.KVFlushInterval
	at := max(in.kvPending[0].ready, s.now)
	at = (at + iv - 1) / iv * iv
	in.kvArmed = true
	s.push(&event{at: at, kind: evKVFlush, inst: i})
}

// flushKV publishes instance i's ready batches, in sequence order, to every
// edge's index.
func (s *simulator) flushKV(i int) error {
	in := s.instances[i]
	in.kvArmed = false
	k := 0
	var ready []kvindex.Batch
	for k < len(in.kvPending) && in.kvPending[k].ready <= s.now {
		ready = append(ready, in.kvPending[k].batch)
		k++
	}
	in.kvPending = in.kvPending[k:]
	if s.cfg.EdgeRestarts > 0 && s.cfg.KVEvents.Mode != KVEventsNone {
		s.kvLog = append(s.kvLog, ready...)
	}
	switch s.cfg.KVEvents.Mode {
	case KVEventsNone:
	case KVEventsLag:
		if len(ready) > 0 {
			s.push(&event{at: s.now + s.cfg.KVEvents.Lag, kind: evKVHear, batches: ready})
		}
	default:
		if err := s.hearKV(ready); err != nil {
			return err
		}
	}
	s.armKVFlush(i)
	return nil
}
