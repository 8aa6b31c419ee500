// Package decide is the edge's routing decision for one fleet's part of a
// request: sticky to a committed binding, an overflow or rebind committed
// in the log before it is served, a new placement dispatched at once while
// its Bind is proposed beside it (the first committed Bind decides the
// binding; later requests follow it), an unbound placement for unkeyed
// requests, and what each records.
//
// The edge (edge/route.go) runs it in production and the trace benchmark
// (ops/bench) runs it in virtual time: both call Decider.Decide and
// Decider.Reroute, so the benchmark measures the product's decision. The
// package does no I/O itself and reads no clock (time is the request's Now):
// the log, the recorder, this edge's own Bind proposals, the fleet views
// and the KV index are small interfaces the caller implements
// (routing/DESIGN.md §7).
package decide

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
)

// Outcomes (the edge's metric label and span attribute).
const (
	OutcomeSticky   = "sticky"
	OutcomeNewBind  = "new_bind"
	OutcomeOverflow = "overflow"
	// OutcomeDegraded: a new key placed by this edge's own decision while
	// it cannot know the committed placement (the log cannot commit, or
	// its state is not known current), or a key served on this edge's own
	// Bind proposal whose fate it could not learn in time.
	OutcomeDegraded = "degraded"
	OutcomeShed     = "shed"
	OutcomeUnbound  = "unbound"
	// OutcomeRefused: hard affinity the log could not confirm (503, retry).
	OutcomeRefused = "refused"
)

// Why a decision was degraded (Hop.Degraded; the edge's metric label).
const (
	// DegradedLogDown: no leader, and a proposal just failed for it.
	DegradedLogDown = "log_down"
	// DegradedStateNotCurrent: this edge's replica was not known current
	// (not caught up since start, no leader contact within the window, or
	// lagging the leader beyond it).
	DegradedStateNotCurrent = "state_not_current"
	// DegradedCommitTimeout: commit_first, and the Bind's fate was not
	// known by the propose timeout.
	DegradedCommitTimeout = "commit_timeout"
	// DegradedOverflowUnrecorded: an overflow could not be committed and
	// the key stayed on a bound instance this edge's views call unhealthy.
	DegradedOverflowUnrecorded = "overflow_unrecorded"
)

// DegradedCauses lists every Degraded* cause.
var DegradedCauses = []string{DegradedLogDown, DegradedStateNotCurrent, DegradedCommitTimeout,
	DegradedOverflowUnrecorded}

// PolicyPending is the policy of a request served on this edge's own Bind
// proposal before its replica applied the log's answer.
const PolicyPending = "pending"

// PolicyFollowed is the policy of a new key placed where another edge's
// placement, heard before the log committed it, put it.
const PolicyFollowed = "followed"

// PolicySubAgentOwn is the policy of a sub-agent placed under its own
// conversation id after its parent's instance lost its context (escape).
const PolicySubAgentOwn = "subagent_own"

// ErrUnavailable is what Log.Propose wraps when the log cannot commit now
// (no quorum, no leader, or the proposal timed out).
var ErrUnavailable = errors.New("affinity log unavailable")

// ErrCommitted is what Log.Propose wraps when the event committed (its
// result is valid and returned) but this edge's replica has not applied it
// yet: the decision uses the result, which the log holds for every edge,
// instead of treating the log as unable to commit.
var ErrCommitted = errors.New("affinity log committed the event; this replica has not applied it yet")

// Log is the affinity log as one edge sees it: its replica's state and a
// proposal that returns once the event committed.
type Log interface {
	// State is this edge's replica (what it has applied).
	State() *fsm.State
	// Propose commits ev and returns its result. An error wrapping
	// ErrUnavailable means the log cannot commit right now; one wrapping
	// ErrCommitted comes with a valid result.
	Propose(ctx context.Context, ev fsm.Event) (fsm.Result, error)
	// Down reports that the log is known unable to commit (a proposal
	// would only wait for its timeout).
	Down(now time.Time) bool
}

// Placements are this edge's own Bind proposals, from the moment the
// decision makes one until this edge's replica has applied the log's
// answer to it. The edge proposes each with one proposal id and retries it
// (same id) while the log cannot commit; a Bind that loses to another
// edge's is answered with the binding in force.
type Placements interface {
	// Propose sends b to the log now and returns at once; now is when the
	// request was placed (the dispatch the agreement lag is measured
	// from). A key with a proposal of this edge in flight is not proposed
	// again.
	Propose(b fsm.Bind, now time.Time)
	// Pending returns this edge's proposal for the key, and the log's
	// answer once it is known.
	Pending(f fsm.Fleet, key string) (Pending, bool)
	// Await waits until the key's proposal is settled, at most the
	// caller's propose timeout (or ctx), and returns it as Pending does.
	Await(ctx context.Context, f fsm.Fleet, key string) (Pending, bool)
	// Heard returns another edge's recent placement of the key, heard
	// before this edge's replica has the key's binding (the edges tell
	// each other their new placements as they dispatch them).
	Heard(f fsm.Fleet, key string) (fsm.Bind, bool)
}

// Pending is one of this edge's Bind proposals.
type Pending struct {
	Bind fsm.Bind
	// At is when the request that proposed it was placed.
	At time.Time
	// Settled: the proposal committed and Result is the log's answer: a
	// Bind that created the binding (Created), lost to the binding in
	// force (Found, another Decision), or was rejected.
	Settled bool
	Result  fsm.Result
}

// Recorder records what a request does not wait for, as the edge's
// recorder and touch batcher do: events are committed later, in batches.
type Recorder interface {
	// Record queues ev (a parent link) for the log. Overflows are not
	// recorded here: they are committed through Log.Propose before the
	// request is served (Decider.overflow).
	Record(ev fsm.Event)
	// Touch marks a bound key used (one Touch batch per interval);
	// TouchLink a sub-agent's parent link.
	Touch(k fsm.FleetKey)
	TouchLink(child string)
}

// FleetView is this edge's view of the workers.
type FleetView interface {
	// Views are the routing views at now, with the excluded instances
	// (failed hops) unhealthy. Feeding the edge's overload tracker is the
	// fleet's part.
	Views(now time.Time, exclude []string) *routing.Views
	// UnheardAtStartup reports that this edge has not heard from inst
	// since it started and its startup gate is open (edge/readiness.go).
	UnheardAtStartup(now time.Time, inst string) bool
	// StateCurrent reports whether this edge's replica is known to be
	// current (caught up since start, in contact with a leader, not
	// lagging beyond its bound), and if not, why. A new key placed while
	// it is not is counted degraded; hard affinity is refused.
	StateCurrent(now time.Time) (bool, string)
}

// Index is the edge's KV index: prefix matches, and the prediction that a
// prompt sent somewhere will be cached there.
type Index interface {
	routing.PrefixMatcher
	Predict(instance string, blocks []uint64, now time.Time)
}

// Decider holds one edge's decision inputs. Index and Overload may be nil.
type Decider struct {
	Log        Log
	Recorder   Recorder
	Placements Placements
	Fleet      FleetView
	Index      Index
	Overload   routing.OverloadHistory
	// CommitFirst makes a new key's first request wait for its Bind to
	// commit before it is dispatched (placement.commit_first), instead of
	// dispatching at once beside the proposal. A proposal whose fate is
	// not known by the propose timeout is then served where it proposed,
	// counted degraded. Hard affinity always waits.
	CommitFirst bool
}

// Hop is where one fleet's part of a request goes.
type Hop struct {
	Fleet    fsm.Fleet
	Key      string
	Instance string
	URL      string
	Rank     int // believed rank (-1 unknown); the worker's answer wins
	Cached   int // prompt tokens believed cached on the instance
	Outcome  string
	// Degraded says why, when Outcome is OutcomeDegraded.
	Degraded string
	Policy   string
	Reason   fsm.OverflowReason
	From     string // the bound instance an overflow left ("" otherwise)
	Bound    bool   // the key is bound (sticky, new bind, overflow, degraded)
	Binding  fsm.Binding
	Excluded []string
	// StateIndex is the index of this edge's replica state the decision
	// read: the checkers judge the hop against the key's placement there.
	StateIndex uint64
	// Speculative: the key's placement is this edge's own Bind proposal,
	// not yet known committed (Binding has epoch 0).
	Speculative bool
	// OwnKey: a sub-agent's request routed by its own conversation id
	// (Key), not its parent's root: its context left the parent's
	// instance (Decider.escape).
	OwnKey bool
	// TelemetryLate: no candidate was healthy, and the silent ones (late
	// telemetry, no evidence of failure) were counted healthy for this
	// decision (wake). It says nothing of the log: the decision followed
	// the committed placement as it would have with fresh telemetry, so it
	// is not degraded.
	TelemetryLate bool
}

// FailureKind classifies a request the decision could not place.
type FailureKind uint8

const (
	// FailNoInstances: no healthy instance in the fleet (503).
	FailNoInstances FailureKind = iota + 1
	// FailRouting: the router failed otherwise (503).
	FailRouting
	// FailShed: every instance is over its hard limits (429, RetryAfter).
	FailShed
	// FailLog: recording a placement failed (503).
	FailLog
	// FailRejected: the log refused the placement and has no binding (503).
	FailRejected
	// FailStateUnknown: hard affinity, and the log cannot confirm the
	// key's placement now (503, RetryAfter set by the edge).
	FailStateUnknown
	// FailNoAlternative: a hop failed and no other instance can take it (502).
	FailNoAlternative
	// FailDetourUnrecorded: a bound key's instance failed this request and
	// the log cannot record a detour now (503, RetryAfter set by the
	// edge). Instance is the bound instance.
	FailDetourUnrecorded
)

// Failure is why a request was not placed; the edge renders it.
type Failure struct {
	Kind       FailureKind
	Fleet      fsm.Fleet
	Key        string
	Instance   string
	RetryAfter time.Duration // FailShed
	Err        error
	Detail     string // the log's reason, or why the state is not known current
}

func (f *Failure) Error() string {
	if f.Err != nil {
		return f.Err.Error()
	}
	return f.Detail
}

func routeFailure(f fsm.Fleet, key string, rt routing.Route, err error) *Failure {
	switch {
	case err != nil && errors.Is(err, routing.ErrNoInstances):
		return &Failure{Kind: FailNoInstances, Fleet: f, Key: key, Err: err}
	case err != nil:
		return &Failure{Kind: FailRouting, Fleet: f, Key: key, Err: err}
	}
	return &Failure{Kind: FailShed, Fleet: f, Key: key, RetryAfter: rt.RetryAfter}
}

// RecordIdentity records what a request's identity asks for: a new
// sub-agent's parent link (off the request path), or a use of an existing
// one.
func (d *Decider) RecordIdentity(id routing.Identity) {
	switch {
	case id.NewLink:
		d.Recorder.Record(id.Link)
	case id.SubAgent() && id.ConversationID != "":
		d.Recorder.TouchLink(id.ConversationID)
	}
}

// Route decides where req (its Fleet, Key and Now set) goes with router,
// after the hop prev failed (nil for a first attempt), and predicts the
// prompt on the chosen instance so a burst sharing the prefix lands
// together until the worker's own KV event arrives.
func (d *Decider) Route(ctx context.Context, router *routing.Router, req routing.Request, prev *Hop) (*Hop, *Failure) {
	h, fail := d.Decide(ctx, router, req, prev)
	if fail != nil {
		return nil, fail
	}
	d.predict(h.Instance, req)
	return h, nil
}

func (d *Decider) predict(instance string, req routing.Request) {
	if d.Index != nil {
		d.Index.Predict(instance, req.Blocks, req.Now)
	}
}

func (d *Decider) inputs(views *routing.Views, st *fsm.State) routing.Inputs {
	in := routing.Inputs{Views: views, Bindings: st, Overload: d.Overload}
	if d.Index != nil {
		in.Prefix = d.Index
	}
	return in
}

// decision is one Decide or Reroute call's working state.
type decision struct {
	d      *Decider
	ctx    context.Context
	router *routing.Router
	req    routing.Request
	h      *Hop
	in     routing.Inputs
	st     *fsm.State
	// moves counts how often the decision followed a binding that moved
	// (or vanished) while it was recording an overflow.
	moves int
	// answeredUnbound: a commit of this decision was answered with the key
	// unbound, which is newer than any earlier answer this edge holds.
	answeredUnbound bool
	// detour is the last detour this decision committed (a recorded
	// Overflow it did not serve because the key had moved meanwhile).
	detour *routing.Route
	// placedLast: the last resort placed the key anew.
	placedLast bool
	// woken: silent instances count as healthy (wake).
	woken bool
}

// maxMoves bounds how many times one decision follows a binding other
// edges moved, evicted or re-placed while it was recording its overflow.
const maxMoves = 3

func (d *Decider) start(ctx context.Context, router *routing.Router, req routing.Request, h *Hop) *decision {
	views := d.Fleet.Views(req.Now, h.Excluded)
	st := d.Log.State()
	h.StateIndex = st.Index()
	return &decision{d: d, ctx: ctx, router: router, req: req, h: h, in: d.inputs(views, st), st: st}
}

// Decide is Route without the prediction.
func (d *Decider) Decide(ctx context.Context, router *routing.Router, req routing.Request, prev *Hop) (*Hop, *Failure) {
	h := &Hop{Fleet: req.Fleet, Key: req.Key, Rank: -1}
	if prev != nil {
		h.Excluded = append(h.Excluded, prev.Excluded...)
		h.Excluded = append(h.Excluded, prev.Instance)
	}
	x := d.start(ctx, router, req, h)
	if h.Key == "" || !router.Config().Type.Binds() {
		rt, err := router.Place(req, x.in)
		if err != nil || rt.Action == routing.ActionShed {
			return nil, routeFailure(h.Fleet, h.Key, rt, err)
		}
		x.set(rt, OutcomeUnbound)
		return h, nil
	}
	return x.keyed()
}

// keyed routes a key by what this edge knows of its placement: the
// replica's binding, else this edge's own proposal (or the log's answer to
// it), else a new placement.
func (x *decision) keyed() (*Hop, *Failure) {
	if x.subAgent() {
		// A sub-agent that left its parent's instance (escape) follows its
		// own placement from then on.
		if b, ok := x.st.Lookup(x.h.Fleet, x.req.ConversationID); ok {
			x.asOwn()
			return x.bound(b)
		}
		if _, ok := x.d.Placements.Pending(x.h.Fleet, x.req.ConversationID); ok {
			x.asOwn()
			return x.unbound()
		}
	}
	if b, ok := x.st.Lookup(x.h.Fleet, x.h.Key); ok {
		return x.bound(b)
	}
	return x.unbound()
}

// subAgent reports whether the request is a sub-agent's routed by its
// parent's key.
func (x *decision) subAgent() bool {
	return x.req.ConversationID != "" && x.req.ConversationID != x.req.Key
}

// asOwn routes the rest of the decision by the sub-agent's own
// conversation id.
func (x *decision) asOwn() {
	x.req.Key = x.req.ConversationID
	x.h.Key, x.h.OwnKey = x.req.Key, true
}

// escape is where a sub-agent whose own context its parent's instance no
// longer holds goes instead, placed under its own conversation id (its own
// binding from then on). Siblings share their parent's instance while its
// cache holds their contexts; when they compete for it and evict each
// other, each child whose blocks are gone is placed by the cache-lost rule
// as a conversation of its own: it moves only to an instance that scores
// strictly better for its prompt (its cached prefix, the queue ahead), and
// otherwise stays with its parent. A child's first request always follows
// the parent (it has no context of its own yet: no committed parent link).
func (x *decision) escape(b fsm.Binding) (routing.Route, bool) {
	if !x.subAgent() || b.Epoch == 0 || !x.router.Config().Overflow.SubAgentCacheLost {
		return routing.Route{}, false
	}
	link, ok := x.st.Link(x.req.ConversationID)
	if !ok || link.Root != x.req.Key {
		return routing.Route{}, false
	}
	own := x.req
	own.Key = own.ConversationID
	mine := fsm.Binding{Fleet: b.Fleet, Key: own.Key, ConversationID: own.Key, Instance: b.Instance, Epoch: b.Epoch,
		BoundAt: link.CreatedAt, LastUsed: link.LastUsed, Rank: b.Rank, HasRank: b.HasRank}
	rt, err := x.router.RouteBound(own, mine, x.in)
	if err != nil || rt.Action != routing.ActionOverflow || rt.Reason != fsm.OverflowCacheLost {
		return routing.Route{}, false
	}
	x.req = own
	x.h.Key, x.h.OwnKey = own.Key, true
	rt.Action, rt.From, rt.Rebind, rt.Reason = routing.ActionBind, "", false, 0
	rt.Decision.Policy = PolicySubAgentOwn
	return rt, true
}

// unbound routes a key the log does not bind (as far as this edge knows):
// on this edge's own proposal or the log's answer to it, else where
// another edge just placed it, else anew.
func (x *decision) unbound() (*Hop, *Failure) {
	if p, ok := x.pending(); ok {
		if p.Settled {
			// The log answered (another edge's Bind may have won);
			// this replica has not applied it yet.
			return x.bound(p.Result.Binding)
		}
		return x.ownProposal(p)
	}
	if rt, ok := x.heard(); ok {
		return x.placeOn(rt)
	}
	return x.place()
}

// heard is the route to another edge's heard placement of the key, if its
// instance can take the request here: the key's request that reaches this
// edge before its replica has the Bind joins that placement (and proposes
// it too) instead of racing it with a placement of its own.
func (x *decision) heard() (routing.Route, bool) {
	if x.answeredUnbound {
		return routing.Route{}, false // the log since said the key is unbound
	}
	b, ok := x.d.Placements.Heard(x.h.Fleet, x.h.Key)
	if !ok || b.Fleet != x.h.Fleet {
		return routing.Route{}, false
	}
	v, ok := x.in.Views.Lookup(b.Instance)
	if !ok || !v.Healthy || v.Fleet != x.h.Fleet {
		return routing.Route{}, false
	}
	return routing.Route{Action: routing.ActionBind, Instance: b.Instance, URL: v.URL, Rank: -1,
		Decision: fsm.Decision{Edge: x.req.Edge, Policy: PolicyFollowed, RequestID: x.req.RequestID}}, true
}

// pending is this edge's own proposal for the key while it still says
// something the replica does not: in flight, or settled with a binding the
// replica has not applied. A settled answer the replica has applied (the
// key since evicted) or a rejected one says nothing more.
func (x *decision) pending() (Pending, bool) {
	p, ok := x.d.Placements.Pending(x.h.Fleet, x.h.Key)
	switch {
	case !ok:
		return Pending{}, false
	case !p.Settled:
		return p, true
	case !p.Result.Found || p.Result.Binding.Instance == "" || x.answeredUnbound:
		return Pending{}, false
	case x.st.EpochIndex(p.Result.Binding.Epoch) <= x.st.Index():
		return Pending{}, false
	}
	return p, true
}

// place places a key no binding or proposal of this edge covers, proposes
// its Bind and, for soft affinity, dispatches at once: the same decision
// every edge makes from the same committed state and views. The first
// committed Bind decides the binding; a request that raced and lost costs
// at most its own cache hit, and the key's next request follows the log.
func (x *decision) place() (*Hop, *Failure) {
	rt, err := x.router.Place(x.req, x.in)
	if errors.Is(err, routing.ErrNoInstances) && x.wake() {
		rt, err = x.router.Place(x.req, x.in)
	}
	if err != nil || rt.Action == routing.ActionShed {
		return nil, routeFailure(x.h.Fleet, x.h.Key, rt, err)
	}
	if rt.Action != routing.ActionBind {
		x.set(rt, OutcomeUnbound)
		return x.h, nil
	}
	return x.placeOn(rt)
}

// placeOn proposes the Bind of route rt and serves it (soft affinity) or
// waits for the log's answer (commit_first, hard affinity).
func (x *decision) placeOn(rt routing.Route) (*Hop, *Failure) {
	degraded, why := x.current()
	if x.req.Hard && degraded != "" {
		return nil, &Failure{Kind: FailStateUnknown, Fleet: x.h.Fleet, Key: x.h.Key, Detail: why}
	}
	bind := rt.BindEvent(x.req)
	x.d.Placements.Propose(bind, x.req.Now)
	if x.d.CommitFirst || x.req.Hard {
		if p, ok := x.d.Placements.Await(x.ctx, x.h.Fleet, x.h.Key); ok && p.Settled {
			return x.settled(rt, p)
		}
		if x.req.Hard {
			return nil, &Failure{Kind: FailStateUnknown, Fleet: x.h.Fleet, Key: x.h.Key,
				Detail: "the key's Bind did not commit within the propose timeout"}
		}
		degraded = DegradedCommitTimeout // its fate unknown: served where it was proposed
	}
	x.set(rt, OutcomeNewBind)
	x.degrade(degraded)
	x.h.Bound, x.h.Speculative, x.h.Binding = true, true, proposed(bind, x.req.Now)
	return x.h, nil
}

// settled routes by the log's answer to this edge's Bind of rt.
func (x *decision) settled(rt routing.Route, p Pending) (*Hop, *Failure) {
	res := p.Result
	switch {
	case res.Found && res.Binding.Instance == rt.Instance && res.Created:
		x.set(rt, OutcomeNewBind)
		x.h.Bound, x.h.Binding = true, res.Binding
		return x.h, nil
	case res.Found:
		// Another edge bound the key first: its placement is the one
		// every edge uses.
		return x.bound(res.Binding)
	}
	// Rejected (the instance went down meanwhile): route by what the
	// log says now, or place again without that instance.
	if b, ok := x.d.Log.State().Lookup(x.h.Fleet, x.h.Key); ok {
		return x.bound(b)
	}
	if x.moves++; x.moves > maxMoves {
		return nil, &Failure{Kind: FailRejected, Fleet: x.h.Fleet, Key: x.h.Key, Instance: rt.Instance, Detail: res.Reason}
	}
	x.exclude(rt.Instance)
	return x.place()
}

// ownProposal serves a key on this edge's own Bind proposal, in flight: an
// edge never contradicts its own proposal. Only an instance that cannot
// take the request sends it elsewhere, through a committed Overflow.
func (x *decision) ownProposal(p Pending) (*Hop, *Failure) {
	if x.req.Hard {
		if q, ok := x.d.Placements.Await(x.ctx, x.h.Fleet, x.h.Key); ok && q.Settled {
			if q.Result.Found {
				return x.bound(q.Result.Binding)
			}
			return x.unbound()
		}
		return nil, &Failure{Kind: FailStateUnknown, Fleet: x.h.Fleet, Key: x.h.Key,
			Detail: "the key's Bind has not committed yet"}
	}
	b := proposed(p.Bind, p.At)
	if v, ok := x.in.Views.Lookup(b.Instance); ok && v.Healthy {
		x.set(routing.Route{Action: routing.ActionSticky, Instance: b.Instance, URL: v.URL, Rank: -1}, OutcomeSticky)
		degraded, _ := x.current()
		x.degrade(degraded)
		x.h.Policy, x.h.Bound, x.h.Speculative, x.h.Binding = PolicyPending, true, true, b
		return x.h, nil
	}
	return x.bound(b)
}

// wake counts the silent instances (unhealthy only because their
// telemetry is late) as healthy for the rest of the decision, when no
// instance is healthy: a fleet's workers can all report late at once (their
// processes starved), and a soft-affinity request is better placed among
// workers that are probably alive than refused. The hop says so
// (Hop.TelemetryLate). It reports false when nothing changed (hard
// affinity, or none silent).
func (x *decision) wake() bool {
	if x.req.Hard || x.woken {
		return false
	}
	var all []routing.InstanceView
	woke := false
	for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
		for _, v := range x.in.Views.Fleet(f) {
			if !v.Healthy && v.Silent && !slices.Contains(x.h.Excluded, v.ID) {
				v.Healthy, woke = true, true
			}
			all = append(all, v)
		}
	}
	if !woke {
		return false
	}
	views, err := routing.NewViews(all)
	if err != nil {
		return false
	}
	x.in.Views, x.woken = views, true
	x.h.TelemetryLate = true
	return true
}

// current reports why this edge cannot know the committed placement now
// (a Degraded* cause and a sentence), or "" when it can.
func (x *decision) current() (string, string) {
	if x.d.Log.Down(x.req.Now) {
		return DegradedLogDown, "the affinity log cannot commit right now"
	}
	if ok, why := x.d.Fleet.StateCurrent(x.req.Now); !ok {
		return DegradedStateNotCurrent, why
	}
	return "", ""
}

// degrade marks the hop degraded for cause (nothing when cause is "").
func (x *decision) degrade(cause string) {
	if cause != "" {
		x.h.Outcome, x.h.Degraded = OutcomeDegraded, cause
	}
}

// proposed is the binding a Bind proposal stands for until it commits
// (epoch 0: no placement of the log).
func proposed(b fsm.Bind, at time.Time) fsm.Binding {
	return fsm.Binding{Fleet: b.Fleet, Key: b.Key, ConversationID: b.ConversationID, Instance: b.Instance,
		Decision: b.Decision, BoundAt: at.UnixNano(), LastUsed: at.UnixNano()}
}

// set fills the hop from a route; a route without a URL (sticky to an
// instance the views do not list) takes the log's.
func (x *decision) set(rt routing.Route, outcome string) {
	h := x.h
	h.Instance, h.URL, h.Rank, h.Cached, h.Outcome = rt.Instance, rt.URL, rt.Rank, rt.CachedTokens, outcome
	h.Degraded = ""
	h.Policy = rt.Decision.Policy
	h.Reason = rt.Reason
	h.Speculative = false
	h.From = ""
	if outcome == OutcomeOverflow {
		h.From = rt.From
	}
	if h.URL == "" {
		if v, ok := x.in.Views.Lookup(rt.Instance); ok {
			h.URL = v.URL
		} else if rec, ok := x.st.Instance(rt.Instance); ok {
			h.URL = rec.URL
		}
	}
}

// bound routes a key bound to b (a committed binding, or this edge's own
// proposal with epoch 0): sticky, or an overflow committed in the log
// before it is served (a rebind moves the binding for every edge).
func (x *decision) bound(b fsm.Binding) (*Hop, *Failure) {
	h := x.h
	if x.d.unheardAtStartup(x.req.Now, h.Fleet, b.Instance, h.Excluded, x.in.Views) {
		return x.stay(b, ""), nil
	}
	rt, err := x.router.RouteBound(x.req, b, x.in)
	if errors.Is(err, routing.ErrNoInstances) && x.wake() {
		rt, err = x.router.RouteBound(x.req, b, x.in)
	}
	if err != nil || rt.Action == routing.ActionShed {
		return nil, routeFailure(h.Fleet, h.Key, rt, err)
	}
	if rt.Action == routing.ActionOverflow {
		if b.Epoch == 0 {
			// Not a placement of the log yet: nothing to move.
			rt.Rebind = false
		}
		return x.overflow(b, rt)
	}
	if esc, ok := x.escape(b); ok {
		return x.placeOn(esc)
	}
	h.Bound, h.Binding = true, b
	x.set(rt, OutcomeSticky)
	if h.Policy == "" {
		h.Policy = "bound"
	}
	x.d.Recorder.Touch(fsm.FleetKey{Fleet: h.Fleet, Key: h.Key})
	return h, nil
}

// stay serves a bound key on its own instance (url "" takes the views' or
// the log's).
func (x *decision) stay(b fsm.Binding, url string) *Hop {
	x.set(routing.Route{Action: routing.ActionSticky, Instance: b.Instance, URL: url, Rank: -1}, OutcomeSticky)
	x.h.Policy, x.h.Bound, x.h.Binding = "bound", true, b
	x.h.Speculative = b.Epoch == 0
	x.d.Recorder.Touch(fsm.FleetKey{Fleet: x.h.Fleet, Key: x.h.Key})
	return x.h
}

// overflow commits the detour rt of a key bound to b, then serves it. The
// log holds every departure from a binding before the detour is served, so
// any edge, operator or checker reading the key's history sees the
// placement a request was served under (docs/ARCHITECTURE.md, "Overflow and
// rebind"). When the log cannot commit, a healthy bound instance keeps the
// request (only its load or cache made it leave); an unhealthy one is
// refused with a retry hint rather than detoured unrecorded. Whatever
// other edges did to the key meanwhile — moved it, evicted it, or rebound
// it — the decision follows the log's answer instead of failing.
func (x *decision) overflow(b fsm.Binding, rt routing.Route) (*Hop, *Failure) {
	h := x.h
	ev := rt.OverflowEvent(x.req)
	if ev.Reason == fsm.OverflowCacheLost && x.d.Log.State().FeatureLevel() < fsm.FeatureLevelRanks {
		// The reason is new at level 2; an older voter would record it
		// unnamed. Its nearest older name: the cache stopped paying.
		ev.Reason = fsm.OverflowCircuitOpen
	}
	if x.d.Log.Down(x.req.Now) {
		return x.unrecorded(b, ErrUnavailable)
	}
	res, err := x.d.propose(x.ctx, ev)
	switch {
	case errors.Is(err, ErrUnavailable):
		// It may still commit: then it excuses nothing served, and a
		// rebind moves the key for the client's retry.
		return x.unrecorded(b, err)
	case err != nil:
		return nil, &Failure{Kind: FailLog, Fleet: h.Fleet, Key: h.Key, Err: err}
	}
	moved := res.Found && res.Binding.Epoch != b.Epoch
	switch {
	case res.Status == fsm.StatusApplied && !rt.Rebind:
		if moved {
			// The detour is recorded, but another edge moved the key
			// meanwhile (a new epoch): follow the log's binding, as every
			// edge does. (A retry's b names the failed hop's instance,
			// not the binding's: the epoch tells.)
			x.detour = &rt
			return x.again(res)
		}
		x.set(rt, OutcomeOverflow)
		// A key whose binding vanished before the detour committed is
		// served on the recorded detour, unbound.
		h.Bound, h.Binding = res.Found, b
		return h, nil
	case res.Status == fsm.StatusApplied:
		x.set(rt, OutcomeOverflow)
		h.Bound, h.Binding = true, res.Binding
		return h, nil
	case res.Status == fsm.StatusRejected:
		// The rebind's target went down meanwhile.
		x.exclude(rt.Instance)
	}
	// The rebind did not hold for the binding this edge read: another
	// edge moved the key, or evicted it (placed anew), or b was a retry's
	// failed hop rather than the binding.
	return x.again(res)
}

// again routes by the log's answer to an overflow that did not serve: its
// binding, or a new placement when the key is no longer bound.
func (x *decision) again(res fsm.Result) (*Hop, *Failure) {
	if x.moves++; x.moves > maxMoves {
		return x.lastResort(res)
	}
	if !res.Found {
		x.answeredUnbound = true
		return x.unbound()
	}
	return x.bound(res.Binding)
}

// lastResort ends a decision whose key kept moving under it: the log's
// binding if its instance can take the request, else a detour it
// recorded, else a retry.
func (x *decision) lastResort(res fsm.Result) (*Hop, *Failure) {
	if b, ok := x.d.Log.State().Lookup(x.h.Fleet, x.h.Key); ok && !res.Found {
		res.Binding, res.Found = b, true
	}
	if res.Found {
		if v, ok := x.in.Views.Lookup(res.Binding.Instance); ok && v.Healthy {
			return x.stay(res.Binding, v.URL), nil
		}
	}
	if x.detour != nil {
		x.set(*x.detour, OutcomeOverflow)
		x.h.Bound, x.h.Binding = res.Found, res.Binding
		return x.h, nil
	}
	if !res.Found && !x.placedLast {
		// The log answered the key unbound: a new placement, once.
		x.placedLast = true
		return x.unbound()
	}
	return nil, &Failure{Kind: FailRejected, Fleet: x.h.Fleet, Key: x.h.Key, Instance: res.Binding.Instance, Detail: "the binding kept moving"}
}

// exclude marks inst unhealthy for the rest of the decision.
func (x *decision) exclude(inst string) {
	if inst == "" || slices.Contains(x.h.Excluded, inst) {
		return
	}
	x.h.Excluded = append(x.h.Excluded, inst)
	x.in.Views = x.d.Fleet.Views(x.req.Now, x.h.Excluded)
}

// propose is Log.Propose with a committed result taken as success: the
// event is in the log (the result is the leader's apply), only this
// replica lags, so the request is served by it rather than refused.
func (d *Decider) propose(ctx context.Context, ev fsm.Event) (fsm.Result, error) {
	res, err := d.Log.Propose(ctx, ev)
	if errors.Is(err, ErrCommitted) {
		return res, nil
	}
	return res, err
}

// unrecorded is the decision when an overflow cannot be committed: the
// key stays on its bound instance — a healthy one because only its load or
// cache made it leave; an unhealthy one, counted degraded, because this
// edge's view of it (stale telemetry on a starved host, often) is a guess
// and a refusal is certain, and if it is really gone the hop fails and the
// retry detours once the log can record it. Only an instance that already
// failed this request is refused with a retry hint rather than detoured
// unrecorded.
func (x *decision) unrecorded(b fsm.Binding, err error) (*Hop, *Failure) {
	v, ok := x.in.Views.Lookup(b.Instance)
	if ok && v.Healthy {
		return x.stay(b, v.URL), nil
	}
	if !slices.Contains(x.h.Excluded, b.Instance) {
		url := ""
		if ok {
			url = v.URL
		}
		h := x.stay(b, url)
		if h.URL != "" {
			h.Outcome, h.Degraded = OutcomeDegraded, DegradedOverflowUnrecorded
			return h, nil
		}
	}
	return nil, &Failure{Kind: FailDetourUnrecorded, Fleet: x.h.Fleet, Key: x.h.Key, Instance: b.Instance, Err: err}
}

// unheardAtStartup reports whether inst, a key's bound instance, is one
// this edge has not heard from since it (re)started, while the startup gate
// is open and the log records it up. Such an instance is not known to be
// unhealthy, only not yet heard: the key stays on it (at the log's URL)
// instead of detouring. Without this, a restarted edge that gets traffic
// before the workers' telemetry reaches it detoured every bound
// conversation it served, and lost the detours' records when it was killed
// again (the soak caught it). An instance that is really gone fails the
// hop, and the retry overflows as usual, recorded before it is sent.
func (d *Decider) unheardAtStartup(now time.Time, f fsm.Fleet, inst string, excluded []string, views *routing.Views) bool {
	if slices.Contains(excluded, inst) {
		return false
	}
	if views != nil {
		if _, ok := views.Lookup(inst); ok {
			return false
		}
	}
	if !d.Fleet.UnheardAtStartup(now, inst) {
		return false
	}
	rec, ok := d.Log.State().Instance(inst)
	return ok && rec.Fleet == f && rec.Status == fsm.InstanceUp && rec.URL != ""
}

// Reroute picks another instance after the hop failed: a bound key
// overflows (recorded before it is sent), an unbound request is placed
// again, both excluding every instance that failed. req carries the retry's
// Now; its RoundRobin is not used for a bound key.
func (d *Decider) Reroute(ctx context.Context, router *routing.Router, req routing.Request, failed *Hop) (*Hop, *Failure) {
	if !failed.Bound {
		return d.Route(ctx, router, req, failed)
	}
	excluded := append(append([]string(nil), failed.Excluded...), failed.Instance)
	req.Fleet, req.Key, req.RoundRobin = failed.Fleet, failed.Key, 0
	h := &Hop{Fleet: failed.Fleet, Key: failed.Key, Rank: -1, Excluded: excluded}
	x := d.start(ctx, router, req, h)
	b := failed.Binding
	b.Instance = failed.Instance
	out, fail := x.bound(b)
	if fail != nil {
		return nil, fail
	}
	if out.Instance == failed.Instance {
		return nil, &Failure{Kind: FailNoAlternative, Fleet: failed.Fleet, Key: failed.Key, Instance: failed.Instance}
	}
	d.predict(out.Instance, req)
	return out, nil
}
