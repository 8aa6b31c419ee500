package routing

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/overload"
)

// world is a log shared by one edge under test and "other edges" whose
// events interleave with its decisions: a leader machine that orders every
// event, the edge's replica (which may lag it), the edge's own Bind
// proposals (in flight until the world commits them) and the key's history
// by log index, which the zero-margin rule judges each answer against.
type world struct {
	t       *testing.T
	rng     *rand.Rand
	leader  *fsm.Machine
	replica *fsm.Machine
	entries []fsm.Entry
	index   uint64
	applied uint64 // the replica's
	// history: per key, the binding in force after each index that changed
	// it (instance "" = unbound).
	history map[string][]placementAt
	// answered: per request id, the instances its own commits (Overflows,
	// Binds) named and the binding the log answered each with.
	answered map[string][]string
	own      map[string]*ownProp
	heard    map[string]fsm.Bind // other edges' placements, heard
	made     int
	views    []InstanceView
	fresh    bool
	now      time.Time
}

type placementAt struct {
	index    uint64
	instance string
	epoch    uint64
}

var worldInstances = []string{"a", "b", "c", "d"}

func newWorld(t *testing.T, seed uint64) *world {
	w := &world{t: t, rng: rand.New(rand.NewPCG(seed, 7)), leader: fsm.NewMachine(), replica: fsm.NewMachine(),
		history: map[string][]placementAt{}, answered: map[string][]string{},
		own: map[string]*ownProp{}, heard: map[string]fsm.Bind{}, views: idleViews(worldInstances...), fresh: true, now: tDecide}
	for _, id := range worldInstances {
		w.commit(fsm.InstanceState{Instance: id, Fleet: fsm.FleetContext, URL: "http://" + id, Status: fsm.InstanceUp,
			FeatureLevel: fsm.FeatureLevelMax, Ranks: 1})
	}
	w.catchUp()
	return w
}

// commit orders ev in the leader and records what it did to its key.
func (w *world) commit(ev fsm.Event) fsm.Result {
	w.t.Helper()
	w.index++
	data, err := fsm.EncodeEntry([]fsm.Proposal{{ID: fsm.ProposalID{byte(w.index), byte(w.index >> 8), byte(w.index >> 16), 1}, Event: ev}})
	if err != nil {
		w.t.Fatal(err)
	}
	e := fsm.Entry{Index: w.index, Time: w.now.UnixNano(), Data: data}
	rs, err := w.leader.Apply(e)
	if err != nil {
		w.t.Fatal(err)
	}
	w.entries = append(w.entries, e)
	var key, rid, named string
	switch ev := ev.(type) {
	case fsm.Bind:
		key, rid, named = ev.Key, ev.Decision.RequestID, ev.Instance
	case fsm.Overflow:
		key, rid = ev.Key, ev.Decision.RequestID
		if rs[0].Status == fsm.StatusApplied {
			named = ev.To
		}
	case fsm.Evict:
		key = ev.Key
	}
	if rid != "" {
		if named != "" {
			w.answered[rid] = append(w.answered[rid], named)
		}
		if rs[0].Found {
			w.answered[rid] = append(w.answered[rid], rs[0].Binding.Instance)
		} else {
			w.answered[rid] = append(w.answered[rid], "") // the log answered: unbound
		}
	}
	for _, ev := range rs[0].Evicted {
		w.record(ev.Key)
	}
	if key != "" {
		w.record(key)
	}
	return rs[0]
}

// noneUsable reports that no instance is healthy in the views, up in this
// edge's replica (the views merge it) and up in the leader's log.
func (w *world) noneUsable() bool {
	for _, v := range w.views {
		in, ok := w.leader.State().Instance(v.ID)
		rin, rok := w.replica.State().Instance(v.ID)
		if v.Healthy && ok && in.Status != fsm.InstanceDown && rok && rin.Status != fsm.InstanceDown {
			return false
		}
	}
	return true
}

// down counts the instances the leader's log records down.
func (w *world) down() int {
	n := 0
	for _, in := range w.leader.State().Instances() {
		if in.Status == fsm.InstanceDown {
			n++
		}
	}
	return n
}

// record notes key's placement after the latest entry if it changed.
func (w *world) record(key string) {
	{
		b, ok := w.leader.State().Lookup(fsm.FleetContext, key)
		p := placementAt{index: w.index}
		if ok {
			p.instance, p.epoch = b.Instance, b.Epoch
		}
		h := w.history[key]
		if len(h) == 0 || h[len(h)-1].instance != p.instance || h[len(h)-1].epoch != p.epoch {
			w.history[key] = append(h, p)
		}
	}
}

// catchUp applies every leader entry to the replica.
func (w *world) catchUp() { w.catchUpTo(w.index) }

func (w *world) catchUpTo(index uint64) {
	for w.applied < index {
		if _, err := w.replica.Apply(w.entries[w.applied]); err != nil {
			w.t.Fatal(err)
		}
		w.applied++
	}
}

// at is the key's placement in force at index (instance "" = unbound).
func (w *world) at(key string, index uint64) placementAt {
	var p placementAt
	for _, h := range w.history[key] {
		if h.index > index {
			break
		}
		p = h
	}
	return p
}

// other is another edge's event on key, committed now.
func (w *world) other(key string) {
	b, bound := w.leader.State().Lookup(fsm.FleetContext, key)
	inst := worldInstances[w.rng.IntN(len(worldInstances))]
	dec := fsm.Decision{Edge: "other", Policy: "kv_aware", RequestID: fmt.Sprintf("other-%d", w.index)}
	switch n := w.rng.IntN(5); {
	case n == 4:
		// The leader records an instance down (its bindings evicted) or
		// up again: Binds and rebinds to a down instance are rejected.
		status := fsm.InstanceDown
		if in, ok := w.leader.State().Instance(inst); ok && in.Status == fsm.InstanceDown {
			status = fsm.InstanceUp
		} else if w.down() >= 2 {
			return
		}
		w.commit(fsm.InstanceState{Instance: inst, Fleet: fsm.FleetContext, URL: "http://" + inst, Status: status,
			FeatureLevel: fsm.FeatureLevelMax, Ranks: 1})
	case !bound || n == 0:
		b := fsm.Bind{Fleet: fsm.FleetContext, Key: key, ConversationID: key, Instance: inst, Decision: dec}
		// Heard as that edge dispatches it; committed now, or never (the
		// edge died first).
		w.heard[key] = b
		if w.rng.IntN(4) != 0 {
			w.commit(b)
		}
	case n == 1 && inst != b.Instance:
		w.commit(fsm.Overflow{Fleet: fsm.FleetContext, Key: key, From: b.Instance, To: inst, Reason: fsm.OverflowSaturated, Rebind: true, Decision: dec})
	case n == 2:
		w.commit(fsm.Evict{Fleet: fsm.FleetContext, Key: key, Reason: fsm.EvictTTL, Epoch: b.Epoch})
	default:
		w.commit(fsm.Touch{Keys: []fsm.FleetKey{{Fleet: fsm.FleetContext, Key: key}}})
	}
}

// The decision's interfaces over the world.

type worldLog struct{ w *world }

func (l worldLog) State() *fsm.State   { return l.w.replica.State() }
func (l worldLog) Down(time.Time) bool { return false }
func (l worldLog) Propose(_ context.Context, ev fsm.Event) (fsm.Result, error) {
	w := l.w
	// Other edges act between this edge's lookup and its commit (up to
	// twice: far more often than on a real key).
	for range w.rng.IntN(3) {
		w.other(keyOf(ev))
	}
	res := w.commit(ev)
	if w.rng.IntN(4) == 0 {
		return res, fmt.Errorf("slow replica: %w", ErrCommitted)
	}
	w.catchUp()
	return res, nil
}

func keyOf(ev fsm.Event) string {
	switch ev := ev.(type) {
	case fsm.Bind:
		return ev.Key
	case fsm.Overflow:
		return ev.Key
	}
	return ""
}

type worldPlacements struct{ w *world }

func (p worldPlacements) Propose(b fsm.Bind, now time.Time) {
	if x, ok := p.w.own[b.Key]; ok && !x.p.Settled {
		return
	}
	p.w.made++
	p.w.own[b.Key] = &ownProp{p: Pending{Bind: b, At: now}}
}

func (p worldPlacements) Heard(_ fsm.Fleet, key string) (fsm.Bind, bool) {
	b, ok := p.w.heard[key]
	return b, ok
}

func (p worldPlacements) Pending(_ fsm.Fleet, key string) (Pending, bool) {
	x, ok := p.w.own[key]
	if !ok {
		return Pending{}, false
	}
	return x.p, true
}

func (p worldPlacements) Await(_ context.Context, f fsm.Fleet, key string) (Pending, bool) {
	if x, ok := p.w.own[key]; ok && !x.p.Settled && p.w.rng.IntN(2) == 0 {
		p.w.settle(key)
	}
	return p.Pending(f, key)
}

// settle commits the edge's proposal of key; the replica may lag the
// answer.
func (w *world) settle(key string) {
	x := w.own[key]
	for range w.rng.IntN(2) {
		w.other(key)
	}
	x.p.Result, x.p.Settled = w.commit(x.p.Bind), true
	if w.rng.IntN(2) == 0 {
		w.catchUp()
	}
}

type worldFleet struct{ w *world }

func (f worldFleet) Views(_ time.Time, exclude []string) *Views {
	st := f.w.replica.State()
	return viewsOf(f.w.views, func(v *InstanceView) bool {
		// As the edge merges the log's records.
		in, ok := st.Instance(v.ID)
		return ok && in.Status == fsm.InstanceDown || slices.Contains(exclude, v.ID)
	})
}
func (f worldFleet) UnheardAtStartup(time.Time, string) bool { return false }
func (f worldFleet) StateCurrent(time.Time) (bool, string) {
	if f.w.fresh {
		return true, ""
	}
	return false, "lagging"
}

// judge applies the zero-margin rule to one answer: served on the placement
// in force in the state the decision read; or on what this request's own
// commits named (a detour, a new Bind) or the log answered them with (the
// binding in force); or — the key unbound there, or in the log's answer
// to one of this request's commits — on this edge's own proposal or the
// log's answer to it.
func (w *world) judge(rq Request, h *Hop, own Pending, hadOwn bool) error {
	p := w.at(rq.Key, h.StateIndex)
	switch {
	case p.instance != "" && h.Instance == p.instance:
		return nil
	}
	unbound := p.instance == ""
	for _, inst := range w.answered[rq.RequestID] {
		if inst == h.Instance {
			return nil
		}
		unbound = unbound || inst == ""
	}
	if x, ok := w.own[rq.Key]; ok && x.p.Bind.Decision.RequestID == rq.RequestID && x.p.Bind.Instance == h.Instance {
		return nil // this request's own proposal, in flight
	}
	if unbound && hadOwn {
		if own.Bind.Instance == h.Instance || (own.Settled && own.Result.Found && own.Result.Binding.Instance == h.Instance) {
			return nil
		}
	}
	return fmt.Errorf("request %s (key %s, state %d: placed %q epoch %d) served on %s (%s/%s); own proposal %+v (%v)",
		rq.RequestID, rq.Key, h.StateIndex, p.instance, p.epoch, h.Instance, h.Outcome, h.Policy, own, hadOwn)
}

// The decision is total and never answers off the rule, whatever other
// edges do between its lookup and its commits: random interleavings of
// lookups, binds, overflows and rebinds, evictions, touches, lagging
// replicas, slow answers to this edge's own proposals, unhealthy and
// saturated instances, and retries after failed hops.
func TestDecisionOverRandomInterleavings(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Type = RouterConversation
	cfg.Overflow.RebindAfter = time.Second
	router, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	seeds := 400
	if testing.Short() {
		seeds = 100
	}
	keys := []string{"k0", "k1", "k2"}
	for seed := range seeds {
		w := newWorld(t, uint64(seed))
		overload := overload.NewTracker()
		d := &Decider{Log: worldLog{w}, Recorder: &queueRecorder{}, Placements: worldPlacements{w}, Fleet: worldFleet{w},
			Overload: overload, CommitFirst: seed%3 == 0}
		for step := range 80 {
			w.now = w.now.Add(time.Duration(w.rng.IntN(3000)) * time.Millisecond)
			key := keys[w.rng.IntN(len(keys))]
			switch w.rng.IntN(6) {
			case 0:
				w.other(key)
			case 1:
				if x, ok := w.own[key]; ok && !x.p.Settled {
					w.settle(key)
				}
			case 2:
				w.catchUpTo(w.applied + uint64(w.rng.IntN(int(w.index-w.applied)+1)))
			}
			// Instances come and go, fill and drain (at least one healthy).
			for i := range w.views {
				v := &w.views[i]
				v.Healthy = w.rng.IntN(5) != 0
				v.QueuedRequests = w.rng.IntN(12)
				overload.Observe(v.ID, v.QueuedRequests >= cfg.Overflow.QueuedRequests, w.now)
			}
			// One instance up in the log and healthy (two at most are down).
			for {
				v := &w.views[w.rng.IntN(len(w.views))]
				if in, ok := w.replica.State().Instance(v.ID); ok && in.Status != fsm.InstanceDown {
					v.Healthy = true
					break
				}
			}
			w.fresh = w.rng.IntN(6) != 0

			rq := req(key)
			rq.RequestID = fmt.Sprintf("%s#%d", key, step)
			rq.Now = w.now
			own, hadOwn := worldPlacements{w}.Pending(fsm.FleetContext, key)
			h, fail := d.Decide(context.Background(), router, rq, nil)
			if fail != nil && fail.Kind == FailNoInstances && w.noneUsable() {
				continue // every healthy instance went down in the log meanwhile
			}
			if fail != nil {
				t.Fatalf("seed %d step %d: %s failed: %+v", seed, step, rq.RequestID, fail)
			}
			if err := w.judge(rq, h, own, hadOwn); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			if w.rng.IntN(4) == 0 {
				// The hop failed: the retry goes elsewhere, by the same rule.
				own, hadOwn = worldPlacements{w}.Pending(fsm.FleetContext, key)
				again, fail := d.Decide(context.Background(), router, rq, h)
				if fail != nil {
					if fail.Kind == FailNoAlternative || fail.Kind == FailNoInstances {
						continue
					}
					t.Fatalf("seed %d step %d: retry of %s failed: %+v", seed, step, rq.RequestID, fail)
				}
				if again.Instance == h.Instance {
					t.Fatalf("seed %d step %d: retry went back to the failed %s", seed, step, h.Instance)
				}
				if err := w.judge(rq, again, own, hadOwn); err != nil {
					t.Fatalf("seed %d step %d: retry: %v", seed, step, err)
				}
			}
		}
	}
}
