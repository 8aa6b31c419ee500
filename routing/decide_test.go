package routing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/kvindex"
	"github.com/tether-project/tether/routing/overload"
)

var tDecide = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// machineLog is a log of one fsm.Machine: proposals commit at once (or fail
// with ErrUnavailable while down). Another edge's Bind can be slipped in
// before a proposal (race).
type machineLog struct {
	m     *fsm.Machine
	index uint64
	down  bool
	race  fsm.Event // committed just before the next proposal
	// late: a proposal times out (ErrUnavailable) but commits after all,
	// kept in pending until commitPending.
	late    bool
	pending fsm.Event
	// committedLate: proposals commit, but Propose reports that this
	// replica had not applied them in time (ErrCommitted, valid result).
	committedLate bool
	events        []fsm.Event
}

func newMachineLog(t *testing.T, instances ...string) *machineLog {
	l := &machineLog{m: fsm.NewMachine()}
	for _, id := range instances {
		l.commit(t, fsm.InstanceState{Instance: id, Fleet: fsm.FleetContext, URL: "http://" + id, Status: fsm.InstanceUp,
			FeatureLevel: fsm.FeatureLevelMax, Ranks: 1})
	}
	l.events = nil
	return l
}

func (l *machineLog) commit(t testing.TB, ev fsm.Event) fsm.Result {
	t.Helper()
	r, err := l.apply(ev)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (l *machineLog) apply(ev fsm.Event) (fsm.Result, error) {
	data, err := fsm.EncodeEntry([]fsm.Proposal{{ID: fsm.ProposalID{byte(l.index + 1), byte((l.index + 1) >> 8)}, Event: ev}})
	if err != nil {
		return fsm.Result{}, err
	}
	l.index++
	rs, err := l.m.Apply(fsm.Entry{Index: l.index, Time: tDecide.UnixNano(), Data: data})
	if err != nil {
		return fsm.Result{}, err
	}
	l.events = append(l.events, ev)
	return rs[0], nil
}

func (l *machineLog) State() *fsm.State   { return l.m.State() }
func (l *machineLog) Down(time.Time) bool { return l.down }
func (l *machineLog) Propose(_ context.Context, ev fsm.Event) (fsm.Result, error) {
	if l.down {
		return fsm.Result{}, fmt.Errorf("propose: %w", ErrUnavailable)
	}
	if l.late {
		l.pending = ev
		return fsm.Result{}, fmt.Errorf("propose: timed out: %w", ErrUnavailable)
	}
	if l.race != nil {
		if _, err := l.apply(l.race); err != nil {
			return fsm.Result{}, err
		}
		l.race = nil
	}
	res, err := l.apply(ev)
	if err == nil && l.committedLate {
		err = fmt.Errorf("propose: %w", ErrCommitted)
	}
	return res, err
}

// queueRecorder keeps what the edge's recorder would queue.
type queueRecorder struct {
	queued  []fsm.Event
	touched []string
	links   []string
}

func (r *queueRecorder) Record(ev fsm.Event)    { r.queued = append(r.queued, ev) }
func (r *queueRecorder) Touch(k fsm.FleetKey)   { r.touched = append(r.touched, k.Key) }
func (r *queueRecorder) TouchLink(child string) { r.links = append(r.links, child) }

type staticFleet struct {
	views    []InstanceView
	fresh    bool
	excluded [][]string
}

func (f *staticFleet) Views(_ time.Time, exclude []string) *Views {
	f.excluded = append(f.excluded, exclude)
	return viewsOf(f.views, func(v *InstanceView) bool { return slices.Contains(exclude, v.ID) })
}

// viewsOf is views with the instances down marks unhealthy.
func viewsOf(views []InstanceView, down func(*InstanceView) bool) *Views {
	vs := append([]InstanceView(nil), views...)
	for i := range vs {
		if down(&vs[i]) {
			vs[i].Healthy = false
		}
	}
	v, err := NewViews(vs)
	if err != nil {
		panic(err)
	}
	return v
}
func (f *staticFleet) UnheardAtStartup(time.Time, string) bool { return false }
func (f *staticFleet) StateCurrent(time.Time) (bool, string) {
	if f.fresh {
		return true, ""
	}
	return false, "state not known current"
}

func idleViews(ids ...string) []InstanceView {
	out := make([]InstanceView, len(ids))
	for i, id := range ids {
		out[i] = InstanceView{ID: id, Fleet: fsm.FleetContext, URL: "http://" + id, Healthy: true, Ranks: 1, VerifiesHints: true}
	}
	return out
}

// ownPlacements are an edge's own Bind proposals over a machineLog: with
// hold set a proposal stays in flight until settle; otherwise it commits
// (through the log's Propose, races and all) when made.
type ownPlacements struct {
	log   *machineLog
	hold  bool
	props map[string]*ownProp
	made  []fsm.Bind
	heard map[string]fsm.Bind // other edges' placements heard
}

type ownProp struct {
	p   Pending
	err error
}

func (o *ownPlacements) Propose(b fsm.Bind, now time.Time) {
	if o.props == nil {
		o.props = map[string]*ownProp{}
	}
	if x, ok := o.props[b.Key]; ok && !x.p.Settled {
		return
	}
	o.made = append(o.made, b)
	x := &ownProp{p: Pending{Bind: b, At: now}}
	o.props[b.Key] = x
	if !o.hold {
		o.settle(b.Key)
	}
}

// settle commits the key's proposal (unless the log is down or late).
func (o *ownPlacements) settle(key string) {
	x := o.props[key]
	res, err := o.log.Propose(context.Background(), x.p.Bind)
	if errors.Is(err, ErrCommitted) {
		err = nil
	}
	if err == nil {
		x.p.Settled, x.p.Result = true, res
	}
	x.err = err
}

func (o *ownPlacements) Pending(_ fsm.Fleet, key string) (Pending, bool) {
	x, ok := o.props[key]
	if !ok {
		return Pending{}, false
	}
	return x.p, true
}

func (o *ownPlacements) Await(ctx context.Context, f fsm.Fleet, key string) (Pending, bool) {
	return o.Pending(f, key)
}

func (o *ownPlacements) Heard(_ fsm.Fleet, key string) (fsm.Bind, bool) {
	b, ok := o.heard[key]
	return b, ok
}

type rig struct {
	log    *machineLog
	rec    *queueRecorder
	own    *ownPlacements
	fleet  *staticFleet
	d      *Decider
	router *Router
}

func newRig(t *testing.T) *rig {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Type = RouterConversation
	router, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{log: newMachineLog(t, "a", "b", "c"), rec: &queueRecorder{}, fleet: &staticFleet{views: idleViews("a", "b", "c"), fresh: true}, router: router}
	r.own = &ownPlacements{log: r.log}
	r.d = &Decider{Log: r.log, Recorder: r.rec, Placements: r.own, Fleet: r.fleet, Overload: overload.NewTracker()}
	return r
}

func req(key string) Request {
	return Request{Fleet: fsm.FleetContext, Key: key, ConversationID: key, RequestID: key + "#1", Edge: "e1", Now: tDecide,
		Spread: SpreadFor(key + "#1")}
}

func TestNewKeyBindsThenSticks(t *testing.T) {
	r := newRig(t)
	h, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if h.Outcome != OutcomeNewBind || !h.Bound || h.Binding.Instance != h.Instance || len(r.log.events) != 1 {
		t.Fatalf("first request: %+v, log %v", h, r.log.events)
	}
	again, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if again.Outcome != OutcomeSticky || again.Instance != h.Instance || len(r.log.events) != 1 || len(r.rec.touched) != 1 {
		t.Fatalf("second request: %+v, log %v, touched %v", again, r.log.events, r.rec.touched)
	}
}

// Another edge's Bind commits first. Dispatched at once, the request goes
// where this edge placed it (the race costs at most its cache hit) and the
// key's next request follows the log's winner; with commit_first the
// request itself waits and goes to the winner.
func TestRacingBindUsesTheCommittedWinner(t *testing.T) {
	probe := newRig(t)
	h, fail := probe.d.Decide(context.Background(), probe.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	other := "a"
	if h.Instance == "a" {
		other = "b"
	}
	for _, commitFirst := range []bool{false, true} {
		r := newRig(t)
		r.d.CommitFirst = commitFirst
		r.log.race = fsm.Bind{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", Instance: other}
		got, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
		if fail != nil {
			t.Fatal(fail)
		}
		switch {
		case commitFirst && (got.Instance != other || got.Outcome != OutcomeSticky || !got.Bound || got.Speculative):
			t.Fatalf("commit first: got %+v, want sticky on the winner %s", got, other)
		case !commitFirst && (got.Instance != h.Instance || got.Outcome != OutcomeNewBind || !got.Speculative):
			t.Fatalf("speculative: got %+v, want a new bind on %s dispatched at once", got, h.Instance)
		}
		next, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
		if fail != nil || next.Instance != other || next.Outcome != OutcomeSticky {
			t.Fatalf("next request %+v %v, want sticky on the winner %s", next, fail, other)
		}
	}
}

// A new key is dispatched before its Bind commits; while the proposal is in
// flight the key's requests go where it proposed, whatever a new placement
// would say now: an edge never contradicts its own proposal. Once the log
// answers, the answer rules, before the replica applies it.
func TestOwnProposalIsNeverContradicted(t *testing.T) {
	r := newRig(t)
	r.own.hold = true
	h, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if h.Outcome != OutcomeNewBind || !h.Speculative || !h.Bound || h.Binding.Epoch != 0 || len(r.own.made) != 1 ||
		r.own.made[0].Instance != h.Instance || len(r.log.events) != 0 {
		t.Fatalf("got %+v, proposals %v, log %v: want a dispatch beside an uncommitted Bind", h, r.own.made, r.log.events)
	}
	// The proposed instance now looks worst: a fresh placement would go
	// elsewhere, the key does not.
	for i := range r.fleet.views {
		if r.fleet.views[i].ID == h.Instance {
			r.fleet.views[i].QueuedRequests = 5
		}
	}
	again, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil || again.Instance != h.Instance || again.Policy != PolicyPending || !again.Speculative || len(r.own.made) != 1 {
		t.Fatalf("second request %+v %v, proposals %v: want it on the proposal %s", again, fail, r.own.made, h.Instance)
	}
	// Another edge's Bind commits first; this edge's proposal is answered
	// with it (the replica here has applied it too).
	other := "a"
	if h.Instance == "a" {
		other = "b"
	}
	r.log.race = fsm.Bind{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", Instance: other}
	r.own.settle("conv")
	third, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil || third.Instance != other || third.Outcome != OutcomeSticky || third.Speculative {
		t.Fatalf("after the answer: %+v %v, want sticky on the winner %s", third, fail, other)
	}
}

// The log answered this edge's Bind (another edge won) but this replica
// has not applied it: the answer, not the proposal, places the request.
func TestSettledAnswerRulesBeforeTheReplicaApplies(t *testing.T) {
	r := newRig(t)
	r.own.hold = true
	h, _ := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	other := "a"
	if h.Instance == "a" {
		other = "b"
	}
	x := r.own.props["conv"]
	x.p.Settled = true
	x.p.Result = fsm.Result{Status: fsm.StatusSuperseded, Found: true,
		Binding: fsm.Binding{Fleet: fsm.FleetContext, Key: "conv", Instance: other, Epoch: fsm.MakeEpoch(r.log.index+5, 0)}}
	got, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil || got.Instance != other || got.Outcome != OutcomeSticky {
		t.Fatalf("got %+v %v, want sticky on the log's answer %s", got, fail, other)
	}
}

// A proposal's instance becomes unhealthy before the log answered: the
// request leaves it through a committed Overflow (not a rebind: nothing is
// bound yet), never by a silent new guess.
func TestOwnProposalUnhealthyDetoursThroughTheLog(t *testing.T) {
	r := newRig(t)
	r.own.hold = true
	h, _ := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	for i := range r.fleet.views {
		if r.fleet.views[i].ID == h.Instance {
			r.fleet.views[i].Healthy = false
		}
	}
	got, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil || got.Instance == h.Instance || got.Outcome != OutcomeOverflow {
		t.Fatalf("got %+v %v, want an overflow away from %s", got, fail, h.Instance)
	}
	if ov := lastOverflow(t, r.log); ov.From != h.Instance || ov.To != got.Instance || ov.Rebind {
		t.Fatalf("committed %+v", ov)
	}
}

// The log cannot commit, or this edge's state is not known current: a new
// key is still placed by the edge's own decision (counted degraded), never
// refused; the key's next request stays on it. Hard affinity is refused.
func TestDegradedPlacement(t *testing.T) {
	for _, why := range []string{"log down", "state not current"} {
		t.Run(why, func(t *testing.T) {
			r := newRig(t)
			r.own.hold = true
			r.log.down = why == "log down"
			r.fleet.fresh = why != "state not current"
			h, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
			if fail != nil {
				t.Fatal(fail)
			}
			if h.Outcome != OutcomeDegraded || !h.Speculative || len(r.own.made) != 1 || r.own.made[0].Instance != h.Instance ||
				r.own.made[0].Decision.Policy == PolicyDegraded {
				t.Fatalf("got %+v, proposals %v", h, r.own.made)
			}
			again, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
			if fail != nil || again.Instance != h.Instance || again.Outcome != OutcomeDegraded {
				t.Fatalf("second request %+v %v", again, fail)
			}
			hard := req("stored")
			hard.Hard = true
			if _, fail := r.d.Decide(context.Background(), r.router, hard, nil); fail == nil || fail.Kind != FailStateUnknown {
				t.Fatalf("hard affinity: %v, want FailStateUnknown", fail)
			}
		})
	}
}

// commit_first: the request waits for its Bind. A Bind whose answer does
// not come in time is served where it was proposed, counted degraded —
// never on a second guess — and the key's next request stays there until
// the log answers; a late commit then rules.
func TestCommitFirstTimedOutServesTheProposal(t *testing.T) {
	r := newRig(t)
	r.d.CommitFirst = true
	h, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil || h.Outcome != OutcomeNewBind || h.Speculative || h.Binding.Epoch == 0 {
		t.Fatalf("committed in time: %+v %v", h, fail)
	}
	r2 := newRig(t)
	r2.d.CommitFirst = true
	r2.own.hold = true
	h, fail = r2.d.Decide(context.Background(), r2.router, req("conv"), nil)
	if fail != nil || h.Outcome != OutcomeDegraded || !h.Speculative || r2.own.made[0].Instance != h.Instance {
		t.Fatalf("timed out: %+v %v, proposals %v", h, fail, r2.own.made)
	}
	again, fail := r2.d.Decide(context.Background(), r2.router, req("conv"), nil)
	if fail != nil || again.Instance != h.Instance || len(r2.own.made) != 1 {
		t.Fatalf("next request %+v %v, proposals %v", again, fail, r2.own.made)
	}
	r2.own.settle("conv")
	third, fail := r2.d.Decide(context.Background(), r2.router, req("conv"), nil)
	if fail != nil || third.Instance != h.Instance || third.Outcome != OutcomeSticky {
		t.Fatalf("after the late commit %+v %v", third, fail)
	}
}

// Another edge's placement of a new key, heard before this replica has its
// Bind: the key's request here joins it (and proposes the same instance)
// rather than racing it with a placement of its own; a heard instance
// that cannot take the request is ignored.
func TestHeardPlacementIsFollowed(t *testing.T) {
	probe := newRig(t)
	h, _ := probe.d.Decide(context.Background(), probe.router, req("conv"), nil)
	other := "a"
	if h.Instance == "a" {
		other = "b"
	}
	r := newRig(t)
	r.own.hold = true
	r.own.heard = map[string]fsm.Bind{"conv": {Fleet: fsm.FleetContext, Key: "conv", Instance: other}}
	got, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil || got.Instance != other || got.Policy != PolicyFollowed || got.Outcome != OutcomeNewBind ||
		len(r.own.made) != 1 || r.own.made[0].Instance != other || r.own.made[0].Decision.Policy != PolicyFollowed {
		t.Fatalf("got %+v %v, proposals %v: want the heard placement on %s followed and proposed", got, fail, r.own.made, other)
	}
	r2 := newRig(t)
	r2.own.heard = map[string]fsm.Bind{"conv": {Fleet: fsm.FleetContext, Key: "conv", Instance: other}}
	for i := range r2.fleet.views {
		if r2.fleet.views[i].ID == other {
			r2.fleet.views[i].Healthy = false
		}
	}
	if got, fail := r2.d.Decide(context.Background(), r2.router, req("conv"), nil); fail != nil || got.Instance == other {
		t.Fatalf("heard placement on an unhealthy instance: %+v %v", got, fail)
	}
}

// A rebind of a key the log evicted between this edge's lookup and the
// overflow's commit is placed anew, not an error (with sub-agent affinity
// off, the trace replay hit it: 'overflow: context key … is not bound').
func TestRebindOfAnEvictedKeyIsPlacedAnew(t *testing.T) {
	r := newRig(t)
	r.log.commit(t, fsm.Bind{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", Instance: "a"})
	b, _ := r.log.State().Lookup(fsm.FleetContext, "conv")
	overLimit(&r.fleet.views[0])
	ov := overload.NewTracker()
	ov.Observe("a", true, tDecide.Add(-time.Hour))
	ov.Observe("a", true, tDecide)
	r.d.Overload = ov
	r.log.race = fsm.Evict{Fleet: fsm.FleetContext, Key: "conv", Reason: fsm.EvictTTL, Epoch: b.Epoch}
	h, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatalf("failed: %+v", fail)
	}
	if h.Outcome != OutcomeNewBind || h.Instance == "a" || len(r.own.made) != 1 || r.own.made[0].Instance != h.Instance {
		t.Fatalf("got %+v, proposals %v: want a new placement", h, r.own.made)
	}
	if got, ok := r.log.State().Lookup(fsm.FleetContext, "conv"); !ok || got.Instance != h.Instance {
		t.Fatalf("binding %+v %v", got, ok)
	}
}

// lastOverflow is the log's last committed event, which must be an Overflow.
func lastOverflow(t *testing.T, l *machineLog) fsm.Overflow {
	t.Helper()
	if len(l.events) == 0 {
		t.Fatal("nothing committed")
	}
	ov, ok := l.events[len(l.events)-1].(fsm.Overflow)
	if !ok {
		t.Fatalf("last committed event %T %+v, want an Overflow", l.events[len(l.events)-1], l.events[len(l.events)-1])
	}
	return ov
}

// A saturated bound instance overflows; the overflow is committed before
// the hop is returned, on a first attempt and on a retry.
func TestOverflowIsCommittedBeforeItIsServed(t *testing.T) {
	r := newRig(t)
	r.log.commit(t, fsm.Bind{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", Instance: "a"})
	overLimit(&r.fleet.views[0])
	h, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if h.Outcome != OutcomeOverflow || h.Instance == "a" || len(r.rec.queued) != 0 {
		t.Fatalf("got %+v, queued %v: want an overflow, nothing left for later", h, r.rec.queued)
	}
	if ov := lastOverflow(t, r.log); ov.From != "a" || ov.To != h.Instance || ov.Reason != fsm.OverflowSaturated {
		t.Fatalf("committed %+v, want a→%s saturated", ov, h.Instance)
	}
	// The hop failed: the retry excludes it and commits before sending.
	again, fail := r.d.Decide(context.Background(), r.router, req("conv"), h)
	if fail != nil {
		t.Fatal(fail)
	}
	if ov := lastOverflow(t, r.log); again.Instance == h.Instance || ov.To != again.Instance || ov.Reason != fsm.OverflowUnhealthy {
		t.Fatalf("retry %+v, committed %+v", again, ov)
	}
}

// An edge that sees a bound key's instance unhealthy detours it, and the
// log holds that Overflow before the request is served (queued for the
// recorder, it would commit seconds after the answer, and nothing in the
// log would say why the key was served elsewhere).
func TestUnhealthyDetourIsCommittedBeforeServing(t *testing.T) {
	r := newRig(t)
	r.log.commit(t, fsm.Bind{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", Instance: "a"})
	r.fleet.views[0].Healthy = false
	h, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if h.Outcome != OutcomeOverflow || h.Instance == "a" || !h.Bound || h.Binding.Instance != "a" {
		t.Fatalf("got %+v: want a detour of the key bound to a", h)
	}
	if len(r.rec.queued) != 0 {
		t.Fatalf("overflow left for the recorder: %v", r.rec.queued)
	}
	if ov := lastOverflow(t, r.log); ov.From != "a" || ov.To != h.Instance || ov.Reason != fsm.OverflowUnhealthy || ov.Rebind {
		t.Fatalf("committed %+v, want a→%s unhealthy", ov, h.Instance)
	}
}

// When the log cannot commit the overflow (no quorum, or the proposal timed
// out), a key is not detoured unrecorded: an unhealthy bound instance is
// tried all the same (counted degraded), and refused only once it failed
// the request; a saturated (healthy) one stays where it is bound.
func TestOverflowTheLogCannotCommit(t *testing.T) {
	for _, mode := range []string{"down", "timed out"} {
		t.Run(mode, func(t *testing.T) {
			r := newRig(t)
			r.log.commit(t, fsm.Bind{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", Instance: "a"})
			r.log.down, r.log.late = mode == "down", mode == "timed out"
			r.fleet.views[0].Healthy = false
			h, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
			if fail != nil || h.Instance != "a" || h.Outcome != OutcomeDegraded {
				t.Fatalf("unhealthy bound instance: hop %+v, failure %+v; want a degraded stay on a", h, fail)
			}
			// The hop to a failed: the retry has nowhere to go unrecorded.
			if h, fail := r.d.Decide(context.Background(), r.router, req("conv"), h); fail == nil || fail.Kind != FailDetourUnrecorded ||
				fail.Instance != "a" || !errors.Is(fail.Err, ErrUnavailable) {
				t.Fatalf("retry after a failed hop: hop %+v, failure %+v; want FailDetourUnrecorded naming a", h, fail)
			}
			r.log.pending = nil
			r.fleet.views[0].Healthy = true
			overLimit(&r.fleet.views[0])
			h, fail = r.d.Decide(context.Background(), r.router, req("conv"), nil)
			if fail != nil || h.Instance != "a" || h.Outcome != OutcomeSticky || len(r.rec.queued) != 0 {
				t.Fatalf("saturated bound instance: hop %+v, failure %v, queued %v; want sticky on a", h, fail, r.rec.queued)
			}
		})
	}
}

// A bound instance this edge cannot connect to (Unreachable), when the
// log cannot commit the detour: refused at once with a retry hint, not
// tried unrecorded (the hop would only wait out a connect to fail); the
// log up, the key detours through a committed overflow as from any
// unhealthy instance, and a silent view of it is never woken.
func TestUnreachableBoundInstanceIsNotTriedUnrecorded(t *testing.T) {
	r := newRig(t)
	r.log.commit(t, fsm.Bind{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", Instance: "a"})
	r.log.down = true
	r.fleet.views[0].Healthy, r.fleet.views[0].Unreachable = false, true
	if h, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil); fail == nil || fail.Kind != FailDetourUnrecorded || fail.Instance != "a" {
		t.Fatalf("unreachable bound instance, log down: hop %+v, failure %+v; want FailDetourUnrecorded naming a", h, fail)
	}
	r.log.down, r.log.pending = false, nil
	h, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil || h.Instance == "a" || h.Outcome != OutcomeOverflow {
		t.Fatalf("log up: hop %+v, failure %v; want a committed overflow off a", h, fail)
	}
	if ov := lastOverflow(t, r.log); ov.From != "a" || ov.Reason != fsm.OverflowUnhealthy {
		t.Fatalf("committed %+v", ov)
	}
}

// Another edge rebinds the key while this one records its detour: the
// request follows the log's new binding.
func TestOverflowFollowsABindingMovedMeanwhile(t *testing.T) {
	r := newRig(t)
	r.log.commit(t, fsm.Bind{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", Instance: "a"})
	r.fleet.views[0].Healthy = false
	r.log.race = fsm.Overflow{Fleet: fsm.FleetContext, Key: "conv", From: "a", To: "c", Reason: fsm.OverflowUnhealthy, Rebind: true}
	h, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if h.Instance != "c" || h.Outcome != OutcomeSticky || h.Binding.Instance != "c" {
		t.Fatalf("got %+v, want sticky on c, where the log moved the key", h)
	}
}

func TestFailuresAreClassified(t *testing.T) {
	r := newRig(t)
	r.fleet.views = nil
	_, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail == nil || fail.Kind != FailNoInstances || !errors.Is(fail.Err, ErrNoInstances) {
		t.Fatalf("empty fleet: %+v", fail)
	}
}

func TestRecordIdentity(t *testing.T) {
	r := newRig(t)
	r.d.RecordIdentity(Identity{ConversationID: "child", NewLink: true, Link: fsm.Link{Child: "child", Parent: "p", Root: "p"}})
	if len(r.rec.queued) != 1 {
		t.Fatalf("new link: queued %v", r.rec.queued)
	}
}

// Every instance unhealthy only because its telemetry is late (starved
// workers): soft affinity is placed among them as it would be with fresh
// telemetry (the hop marked TelemetryLate, not degraded: the log's
// placement is known), and a bound key stays on its instance; hard
// affinity and instances with evidence of failure are not.
func TestSilentInstancesAreUsedWhenNoneIsHealthy(t *testing.T) {
	r := newRig(t)
	for i := range r.fleet.views {
		r.fleet.views[i].Healthy, r.fleet.views[i].Silent = false, true
	}
	h, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil || h.Outcome != OutcomeNewBind || h.Degraded != "" || !h.TelemetryLate {
		t.Fatalf("new key: %+v %v, want a new placement among the silent instances, not degraded", h, fail)
	}
	r.own.settle("conv")
	again, fail := r.d.Decide(context.Background(), r.router, req("conv"), nil)
	if fail != nil || again.Instance != h.Instance || again.Outcome != OutcomeSticky || again.Degraded != "" || !again.TelemetryLate {
		t.Fatalf("bound key: %+v %v, want a sticky stay on %s marked telemetry-late", again, fail, h.Instance)
	}
	hard := req("stored")
	hard.Hard = true
	if _, fail := r.d.Decide(context.Background(), r.router, hard, nil); fail == nil || fail.Kind != FailNoInstances {
		t.Fatalf("hard affinity: %v, want FailNoInstances", fail)
	}
	for i := range r.fleet.views {
		r.fleet.views[i].Silent = false
	}
	if _, fail := r.d.Decide(context.Background(), r.router, req("other"), nil); fail == nil || fail.Kind != FailNoInstances {
		t.Fatalf("no silent instance: %v, want FailNoInstances", fail)
	}
}

// heldIndex is a KV index where only the listed instances hold the prompt
// (every block), with a trusted baseline everywhere.
type heldIndex struct{ held map[string]bool }

func (x heldIndex) Match(blocks []uint64, _ time.Time, dst []kvindex.Match) []kvindex.Match {
	for inst := range x.held {
		dst = append(dst, kvindex.Match{Instance: inst, Blocks: len(blocks), Rank: 0})
	}
	return dst
}
func (x heldIndex) Holds(instance string, _ int, _ uint64, _ time.Time) (bool, bool) {
	return x.held[instance], true
}
func (x heldIndex) HeldByOther(instance string, _ uint64, _ time.Time) bool {
	for inst := range x.held {
		if inst != instance {
			return true
		}
	}
	return false
}
func (heldIndex) Predict(string, []uint64, time.Time) {}

// With overflow.subagent_cache_lost, a sub-agent (routed by its parent's
// root) whose own context the root's instance no longer holds, while
// another instance holds it, is placed under its own conversation id there
// and follows that binding from then on; its first request (no committed
// link) always follows the parent. Off, it always follows the parent.
func TestSubAgentEscapesOnlyWhenItsContextIsGone(t *testing.T) {
	for _, on := range []bool{true, false} {
		cfg := DefaultConfig()
		cfg.Type = RouterConversation
		cfg.BlockSize = 4
		cfg.Overflow.CacheLostMinIdle = 0
		cfg.Overflow.SubAgentCacheLost = on
		cfg.Overflow.SubAgentFirstWithParent = false
		r := newRigWith(t, cfg)
		r.d.Index = heldIndex{held: map[string]bool{"b": true}}
		r.log.commit(t, fsm.Bind{Fleet: fsm.FleetContext, Key: "root", ConversationID: "root", Instance: "a"})
		child := Request{Fleet: fsm.FleetContext, Key: "root", ConversationID: "child", RequestID: "child#1", Edge: "e1",
			Now: tDecide.Add(time.Minute), PromptTokens: 64, Blocks: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}
		first, fail := r.d.Decide(context.Background(), r.router, child, nil)
		if fail != nil || first.Instance != "a" || first.OwnKey {
			t.Fatalf("on=%v first request %+v %v: want the parent's a", on, first, fail)
		}
		r.log.commit(t, fsm.Link{Child: "child", Parent: "root", Root: "root", Depth: 1})
		child.RequestID = "child#2"
		got, fail := r.d.Decide(context.Background(), r.router, child, nil)
		switch {
		case fail != nil:
			t.Fatal(fail)
		case on && (got.Instance != "b" || !got.OwnKey || got.Key != "child" || got.Policy != PolicySubAgentOwn || got.RootInstance != "a"):
			t.Fatalf("escape on: %+v, want the child placed on b under its own id, its root on a", got)
		case !on && (got.Instance != "a" || got.OwnKey):
			t.Fatalf("escape off: %+v, want the parent's a", got)
		}
		if on {
			child.RequestID = "child#3"
			r.stickyOnOwnBinding(t, child, "b")
		}
	}
}

// With overflow.subagent_tree_budget, a sub-agent past its first request
// (the working sets hold its previous prompt) whose prompt does not fit
// beside the working set routed to its parent's instance (its parent's
// and siblings' prompts and every other conversation's, as the edges
// routed them) is placed under its own id,
// when another instance has room for it, and follows that binding from
// then on; one that fits, a first request, or one with no room elsewhere
// follows the parent. Off, every request follows the parent.
func TestSubAgentGoesItsOwnWayWhenItsTreeDoesNotFit(t *testing.T) {
	for _, on := range []bool{true, false} {
		cfg := DefaultConfig()
		cfg.Overflow.SubAgentTreeBudget = on
		cfg.Overflow.SubAgentFirstWithParent = false
		r := newRigWith(t, cfg)
		for i := range r.fleet.views {
			r.fleet.views[i].KVTotalBlocks = 100
		}
		r.log.commit(t, fsm.Bind{Fleet: fsm.FleetContext, Key: "root", ConversationID: "root", Instance: "a"})
		// The parent's last prompt (50 blocks) and a sibling's (40) went
		// to a.
		r.d.workSet(r.router).Note(workKey(fsm.FleetContext, "root", ""), "a", 50, tDecide.Add(-time.Second))
		r.d.workSet(r.router).Note(workKey(fsm.FleetContext, "sib", ""), "a", 40, tDecide.Add(-time.Second))
		decide := func(conv string, n int, blocks []uint64) *Hop {
			t.Helper()
			req := Request{Fleet: fsm.FleetContext, Key: "root", ConversationID: conv, RequestID: fmt.Sprintf("%s#%d", conv, n), Edge: "e1",
				Now: tDecide, PromptTokens: len(blocks) * 64, Blocks: blocks}
			got, fail := r.d.Decide(context.Background(), r.router, req, nil)
			if fail != nil {
				t.Fatalf("on=%v %s: %v", on, req.RequestID, fail)
			}
			return got
		}
		onParents := func(h *Hop, what string) {
			t.Helper()
			if h.Instance != "a" || h.OwnKey {
				t.Fatalf("on=%v, %s: %+v, want the parent's a", on, what, h)
			}
		}
		// Past its first request, small fits beside the 90 blocks of its
		// tree (its own previous prompt not counted twice).
		onParents(decide("small", 1, blocks(3, 5)), "a first request, 95 of 100 blocks")
		r.log.commit(t, fsm.Link{Child: "small", Parent: "root", Root: "root", Depth: 1})
		onParents(decide("small", 2, blocks(3, 5)), "95 of 100 blocks")
		// A first request follows the parent even where it does not fit
		// (115 of 100): it goes where the prefix it shares is. Its second
		// does not fit either and goes its own way.
		onParents(decide("big", 1, blocks(4, 20)), "a first request, 115 of 100 blocks")
		r.log.commit(t, fsm.Link{Child: "big", Parent: "root", Root: "root", Depth: 1})
		got := decide("big", 2, blocks(4, 20))
		switch {
		case on && (got.Instance == "a" || !got.OwnKey || got.Key != "big" || got.Policy != PolicySubAgentOwn || got.RootInstance != "a"):
			t.Fatalf("budget on, 115 of 100 blocks: %+v, want big placed off a under its own id, its root on a", got)
		case !on:
			onParents(got, "budget off, 115 of 100 blocks")
		}
		if on {
			r.stickyOnOwnBinding(t, Request{Fleet: fsm.FleetContext, Key: "root", ConversationID: "big", RequestID: "big#3", Edge: "e1",
				Now: tDecide, PromptTokens: 20 * 64, Blocks: blocks(4, 20)}, got.Instance)
		}
		// Another edge sent an unrelated conversation's prompt (10
		// blocks) to a: small (95 of 100 beside its tree) no longer fits
		// beside everything a holds.
		r.d.HearRoute(r.router, Work{Key: workKey(fsm.FleetContext, "stranger", ""), Blocks: 10}, "a", tDecide.Add(-time.Second))
		got = decide("small", 3, blocks(3, 5))
		switch {
		case on && (got.Instance == "a" || !got.OwnKey):
			t.Fatalf("budget on, 105 of 100 blocks with another conversation's: %+v, want small placed off a", got)
		case !on:
			onParents(got, "budget off, 105 of 100 blocks")
		}
		// Every other instance's cache is full too: a move would evict
		// the contexts there instead, so a sub-agent past its first
		// request that does not fit stays.
		for _, id := range []string{"b", "c"} {
			r.d.HearRoute(r.router, Work{Key: workKey(fsm.FleetContext, "crowd-"+id, ""), Blocks: 100}, id, tDecide.Add(-time.Second))
		}
		onParents(decide("late", 1, blocks(6, 20)), "a first request, no room on any other instance")
		r.log.commit(t, fsm.Link{Child: "late", Parent: "root", Root: "root", Depth: 1})
		onParents(decide("late", 2, blocks(6, 20)), "no room on any other instance")
	}
}

// With overflow.subagent_first_with_parent (off by default), a sub-agent's
// first request follows its parent's binding; once its parent link is
// committed, its requests are placed under its own id — where its own
// context is cached — and stick to that binding. Off, every request
// follows the parent.
func TestSubAgentFollowsItsParentOnItsFirstRequestOnly(t *testing.T) {
	for _, on := range []bool{true, false} {
		cfg := DefaultConfig()
		cfg.Overflow.SubAgentFirstWithParent = on
		r := newRigWith(t, cfg)
		r.log.commit(t, fsm.Bind{Fleet: fsm.FleetContext, Key: "root", ConversationID: "root", Instance: "a"})
		child := Request{Fleet: fsm.FleetContext, Key: "root", ConversationID: "child", RequestID: "child#1", Edge: "e1",
			Now: tDecide, PromptTokens: 64, Blocks: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}
		first, fail := r.d.Decide(context.Background(), r.router, child, nil)
		if fail != nil || first.Instance != "a" || first.OwnKey {
			t.Fatalf("on=%v: first request %+v %v, want the parent's a", on, first, fail)
		}
		r.log.commit(t, fsm.Link{Child: "child", Parent: "root", Root: "root", Depth: 1})
		// Its context is cached on b now (say the parent's instance
		// evicted it); the parent stays on a.
		r.d.Index = heldIndex{held: map[string]bool{"b": true}}
		child.RequestID, child.Now = "child#2", tDecide.Add(time.Minute)
		got, fail := r.d.Decide(context.Background(), r.router, child, nil)
		switch {
		case fail != nil:
			t.Fatal(fail)
		case on && (got.Instance != "b" || !got.OwnKey || got.Key != "child" || got.Policy != PolicySubAgentOwn || got.Outcome != OutcomeNewBind || got.RootInstance != "a"):
			t.Fatalf("on: second request %+v, want a new binding of child on b, its root on a", got)
		case !on && (got.Instance != "a" || got.OwnKey):
			t.Fatalf("off: second request %+v, want the parent's a", got)
		}
		if on {
			child.RequestID, child.Now = "child#3", tDecide.Add(2*time.Minute)
			r.stickyOnOwnBinding(t, child, "b")
		}
	}
}

// newRigWith is newRig with a router of cfg.
func newRigWith(t *testing.T, cfg Config) *rig {
	t.Helper()
	router, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t)
	r.router = router
	return r
}

// stickyOnOwnBinding decides req and fails unless it is sticky on its own
// key's binding on instance.
func (r *rig) stickyOnOwnBinding(t *testing.T, req Request, instance string) {
	t.Helper()
	got, fail := r.d.Decide(context.Background(), r.router, req, nil)
	if fail != nil || got.Instance != instance || !got.OwnKey || got.Outcome != OutcomeSticky || got.RootInstance == "" {
		t.Fatalf("%s: %+v %v, want sticky on its own binding on %s, its root's instance told", req.RequestID, got, fail, instance)
	}
}

// Two edges over one log: the conversations one edge routed count in the
// other's working sets once it hears them (the route's Hop.Work, through
// Decider.HearRoute), so the other does not place a new conversation where
// it would evict them, as one edge would not.
func TestHeardRoutesCountInTheWorkingSets(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Type = RouterConversation
	cfg.Weights.LiveBinding = 0 // placement by load and eviction only
	router, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t)
	r.router = router
	for i := range r.fleet.views {
		r.fleet.views[i].KVTotalBlocks = 100
		if r.fleet.views[i].ID != "a" {
			r.fleet.views[i].QueuedPrefillTokens = 500 // a is the least loaded
		}
	}
	edge2 := func() *Decider {
		return &Decider{Log: r.log, Recorder: &queueRecorder{}, Placements: &ownPlacements{log: r.log}, Fleet: r.fleet, Overload: overload.NewTracker()}
	}
	busy := req("busy")
	busy.Blocks, busy.PromptTokens = blocks(7, 90), 90*cfg.BlockSize
	h, fail := r.d.Decide(context.Background(), router, busy, nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if h.Instance != "a" || h.Work != (Work{Key: "context/busy", Blocks: 90}) {
		t.Fatalf("busy: on %s, work %+v; want a, {context/busy 90}", h.Instance, h.Work)
	}
	fresh := func(key string) Request {
		q := req(key)
		q.Edge = "e2"
		q.Blocks, q.PromptTokens = blocks(8, 50), 50*cfg.BlockSize
		return q
	}
	if h2, fail := edge2().Decide(context.Background(), router, fresh("fresh-1"), nil); fail != nil || h2.Instance != "a" {
		t.Fatalf("an edge that did not hear busy's route: %+v %v, want a (the least loaded)", h2, fail)
	}
	heard := edge2()
	heard.HearRoute(router, Work{}, "a", tDecide) // nothing to note: ignored
	heard.HearRoute(router, h.Work, h.Instance, tDecide)
	if h2, fail := heard.Decide(context.Background(), router, fresh("fresh-2"), nil); fail != nil || h2.Instance == "a" {
		t.Fatalf("an edge that heard busy's 90 blocks on a's 100: %+v %v, want b or c", h2, fail)
	}
}
