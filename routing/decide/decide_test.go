package decide

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// machineLog is a log of one fsm.Machine: proposals commit at once (or fail
// with ErrUnavailable while down). Another edge's Bind can be slipped in
// before a proposal (race).
type machineLog struct {
	m     *fsm.Machine
	index uint64
	down  bool
	race  fsm.Event // committed just before the next proposal
	// late: a proposal times out (ErrUnavailable) but commits after all;
	// AwaitCommitted applies it.
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
	rs, err := l.m.Apply(fsm.Entry{Index: l.index, Time: t0.UnixNano(), Data: data})
	if err != nil {
		return fsm.Result{}, err
	}
	l.events = append(l.events, ev)
	return rs[0], nil
}

func (l *machineLog) State() *fsm.State   { return l.m.State() }
func (l *machineLog) Down(time.Time) bool { return false }
func (l *machineLog) AwaitCommitted(context.Context) {
	if l.pending != nil {
		_, _ = l.apply(l.pending)
		l.pending = nil
	}
}
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
	queued   []fsm.Event
	degraded map[string]fsm.Bind
	touched  []string
	links    []string
}

func (r *queueRecorder) Record(ev fsm.Event) { r.queued = append(r.queued, ev) }
func (r *queueRecorder) RecordDegraded(b fsm.Bind) {
	if r.degraded == nil {
		r.degraded = map[string]fsm.Bind{}
	}
	r.degraded[b.Key] = b
}
func (r *queueRecorder) DegradedBinding(_ fsm.Fleet, key string) (fsm.Binding, bool) {
	b, ok := r.degraded[key]
	return fsm.Binding{Fleet: b.Fleet, Key: b.Key, Instance: b.Instance}, ok
}
func (r *queueRecorder) Touch(k fsm.FleetKey)   { r.touched = append(r.touched, k.Key) }
func (r *queueRecorder) TouchLink(child string) { r.links = append(r.links, child) }

type staticFleet struct {
	views    []routing.InstanceView
	fresh    bool
	excluded [][]string
}

func (f *staticFleet) Views(_ time.Time, exclude []string) *routing.Views {
	f.excluded = append(f.excluded, exclude)
	vs := append([]routing.InstanceView(nil), f.views...)
	for i := range vs {
		for _, x := range exclude {
			if vs[i].ID == x {
				vs[i].Healthy = false
			}
		}
	}
	v, err := routing.NewViews(vs)
	if err != nil {
		panic(err)
	}
	return v
}
func (f *staticFleet) UnheardAtStartup(time.Time, string) bool { return false }
func (f *staticFleet) DegradedAllowed(time.Time) (bool, string) {
	if f.fresh {
		return true, ""
	}
	return false, "state not known current"
}

func idle(ids ...string) []routing.InstanceView {
	out := make([]routing.InstanceView, len(ids))
	for i, id := range ids {
		out[i] = routing.InstanceView{ID: id, Fleet: fsm.FleetContext, URL: "http://" + id, Healthy: true, Ranks: 1, VerifiesHints: true}
	}
	return out
}

type rig struct {
	log    *machineLog
	rec    *queueRecorder
	fleet  *staticFleet
	d      *Decider
	router *routing.Router
}

func newRig(t *testing.T) *rig {
	t.Helper()
	cfg := routing.DefaultConfig()
	cfg.Type = routing.RouterConversation
	router, err := routing.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{log: newMachineLog(t, "a", "b", "c"), rec: &queueRecorder{}, fleet: &staticFleet{views: idle("a", "b", "c"), fresh: true}, router: router}
	r.d = &Decider{Log: r.log, Recorder: r.rec, Fleet: r.fleet, Overload: routing.NewOverloadTracker()}
	return r
}

func req(key string) routing.Request {
	return routing.Request{Fleet: fsm.FleetContext, Key: key, ConversationID: key, RequestID: key + "#1", Edge: "e1", Now: t0,
		Spread: routing.SpreadFor(key + "#1")}
}

func TestNewKeyBindsThenSticks(t *testing.T) {
	r := newRig(t)
	h, fail := r.d.Route(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if h.Outcome != OutcomeNewBind || !h.Bound || h.Binding.Instance != h.Instance || len(r.log.events) != 1 {
		t.Fatalf("first request: %+v, log %v", h, r.log.events)
	}
	again, fail := r.d.Route(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if again.Outcome != OutcomeSticky || again.Instance != h.Instance || len(r.log.events) != 1 || len(r.rec.touched) != 1 {
		t.Fatalf("second request: %+v, log %v, touched %v", again, r.log.events, r.rec.touched)
	}
}

// Another edge's Bind commits first: the request goes where the log says.
func TestRacingBindUsesTheCommittedWinner(t *testing.T) {
	r := newRig(t)
	// Find where this edge would place the key, then let another edge bind
	// it elsewhere first.
	probe := newRig(t)
	h, fail := probe.d.Route(context.Background(), probe.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	other := "a"
	if h.Instance == "a" {
		other = "b"
	}
	r.log.race = fsm.Bind{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", Instance: other}
	got, fail := r.d.Route(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if got.Instance != other || got.Outcome != OutcomeSticky || !got.Bound {
		t.Fatalf("got %+v, want sticky on the winner %s", got, other)
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
	r.fleet.views[0].QueuedRequests = 100
	h, fail := r.d.Route(context.Background(), r.router, req("conv"), nil)
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
	again, fail := r.d.Reroute(context.Background(), r.router, req("conv"), h)
	if fail != nil {
		t.Fatal(fail)
	}
	if ov := lastOverflow(t, r.log); again.Instance == h.Instance || ov.To != again.Instance || ov.Reason != fsm.OverflowUnhealthy {
		t.Fatalf("retry %+v, committed %+v", again, ov)
	}
}

// RELIABILITY.md F7: an edge that sees a bound key's instance unhealthy
// detours it, and the log holds that Overflow before the request is
// served (it was queued for the recorder, and committed seconds after the
// answer, so nothing in the log said why the key was served elsewhere).
func TestUnhealthyDetourIsCommittedBeforeServing(t *testing.T) {
	r := newRig(t)
	r.log.commit(t, fsm.Bind{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", Instance: "a"})
	r.fleet.views[0].Healthy = false
	h, fail := r.d.Route(context.Background(), r.router, req("conv"), nil)
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
// out), an unhealthy bound instance's key is refused, not detoured
// unrecorded; a saturated (healthy) one stays where it is bound.
func TestOverflowTheLogCannotCommit(t *testing.T) {
	for _, mode := range []string{"down", "timed out"} {
		t.Run(mode, func(t *testing.T) {
			r := newRig(t)
			r.log.commit(t, fsm.Bind{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", Instance: "a"})
			r.log.down, r.log.late = mode == "down", mode == "timed out"
			r.fleet.views[0].Healthy = false
			if h, fail := r.d.Route(context.Background(), r.router, req("conv"), nil); fail == nil || fail.Kind != FailDetourUnrecorded ||
				fail.Instance != "a" || !errors.Is(fail.Err, ErrUnavailable) {
				t.Fatalf("unhealthy bound instance: hop %+v, failure %+v; want FailDetourUnrecorded naming a", h, fail)
			}
			r.log.pending = nil
			r.fleet.views[0].Healthy, r.fleet.views[0].QueuedRequests = true, 100
			h, fail := r.d.Route(context.Background(), r.router, req("conv"), nil)
			if fail != nil || h.Instance != "a" || h.Outcome != OutcomeSticky || len(r.rec.queued) != 0 {
				t.Fatalf("saturated bound instance: hop %+v, failure %v, queued %v; want sticky on a", h, fail, r.rec.queued)
			}
		})
	}
}

// Another edge rebinds the key while this one records its detour: the
// request follows the log's new binding.
func TestOverflowFollowsABindingMovedMeanwhile(t *testing.T) {
	r := newRig(t)
	r.log.commit(t, fsm.Bind{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", Instance: "a"})
	r.fleet.views[0].Healthy = false
	r.log.race = fsm.Overflow{Fleet: fsm.FleetContext, Key: "conv", From: "a", To: "c", Reason: fsm.OverflowUnhealthy, Rebind: true}
	h, fail := r.d.Route(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if h.Instance != "c" || h.Outcome != OutcomeSticky || h.Binding.Instance != "c" {
		t.Fatalf("got %+v, want sticky on c, where the log moved the key", h)
	}
}

// The log cannot commit: a fresh edge places by rendezvous and remembers the
// Bind; the key's next request follows it; a lagging edge refuses.
func TestDegradedPlacement(t *testing.T) {
	r := newRig(t)
	r.log.down = true
	h, fail := r.d.Route(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if h.Outcome != OutcomeDegraded || r.rec.degraded["conv"].Instance != h.Instance {
		t.Fatalf("got %+v, degraded %v", h, r.rec.degraded)
	}
	again, fail := r.d.Route(context.Background(), r.router, req("conv"), nil)
	if fail != nil || again.Instance != h.Instance || again.Outcome != OutcomeDegraded {
		t.Fatalf("second request %+v %v", again, fail)
	}
	r2 := newRig(t)
	r2.log.down, r2.fleet.fresh = true, false
	if _, fail := r2.d.Route(context.Background(), r2.router, req("conv"), nil); fail == nil || fail.Kind != FailStateUnknown {
		t.Fatalf("lagging edge: %v, want FailStateUnknown", fail)
	}
}

// A Bind that timed out but commits after all (the common case under load,
// issue 13 D1): the request is served from the committed binding, sticky,
// not placed degraded beside it.
func TestTimedOutBindThatCommitsIsServedFromTheLog(t *testing.T) {
	r := newRig(t)
	r.log.late = true
	h, fail := r.d.Route(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatal(fail)
	}
	b, ok := r.log.State().Lookup(fsm.FleetContext, "conv")
	if !ok || h.Outcome != OutcomeSticky || h.Instance != b.Instance || len(r.rec.degraded) != 0 {
		t.Fatalf("got %+v (binding %+v, %v), degraded %v: want sticky on the committed binding", h, b, ok, r.rec.degraded)
	}
}

// A Bind that committed while this replica had not applied it by the
// deadline (a loaded follower): the leader's result is valid, so the request
// is served as a new bind, not refused as if the log could not commit.
func TestCommittedBindServedBeforeThisReplicaApplies(t *testing.T) {
	r := newRig(t)
	r.log.committedLate = true
	h, fail := r.d.Route(context.Background(), r.router, req("conv"), nil)
	if fail != nil {
		t.Fatalf("refused: %v", fail)
	}
	if h.Outcome != OutcomeNewBind || !h.Bound || h.Binding.Instance != h.Instance || len(r.rec.degraded) != 0 {
		t.Fatalf("got %+v, degraded %v: want a new bind from the committed result", h, r.rec.degraded)
	}
}

func TestFailuresAreClassified(t *testing.T) {
	r := newRig(t)
	r.fleet.views = nil
	_, fail := r.d.Route(context.Background(), r.router, req("conv"), nil)
	if fail == nil || fail.Kind != FailNoInstances || !errors.Is(fail.Err, routing.ErrNoInstances) {
		t.Fatalf("empty fleet: %+v", fail)
	}
}

func TestRecordIdentity(t *testing.T) {
	r := newRig(t)
	r.d.RecordIdentity(routing.Identity{ConversationID: "child", NewLink: true, Link: fsm.Link{Child: "child", Parent: "p", Root: "p"}})
	if len(r.rec.queued) != 1 {
		t.Fatalf("new link: queued %v", r.rec.queued)
	}
}
