// Package decide is the edge's routing decision for one fleet's part of a
// request: sticky to a committed binding, an overflow or rebind committed
// in the log before it is served, a new placement proposed through the affinity log (the
// committed winner is used), a degraded placement when the log cannot
// commit, an unbound placement for unkeyed requests, and what each records.
//
// The edge (edge/route.go) runs it in production and the trace benchmark
// (ops/bench) runs it in virtual time: both call Decider.Decide and
// Decider.Reroute, so the benchmark measures the product's decision. The
// package does no I/O itself and reads no clock (time is the request's Now):
// the log, the recorder, the fleet views and the KV index are small
// interfaces the caller implements (routing/DESIGN.md §7).
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
	OutcomeDegraded = "degraded"
	OutcomeShed     = "shed"
	OutcomeUnbound  = "unbound"
	// OutcomeRefused: the log could not commit and this edge's state was
	// not known to be current, so it did not guess (503, retry).
	OutcomeRefused = "refused"
)

// ErrUnavailable is what Log.Propose wraps when the log cannot commit now
// (no quorum, no leader): the decision falls back to a degraded placement.
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
	// AwaitCommitted applies what the log already knows committed (bounded
	// by the propose timeout) after a proposal timed out: the timed-out
	// Bind may still commit, and another edge may have bound the key first.
	AwaitCommitted(ctx context.Context)
}

// Recorder records what a request does not wait for, as the edge's
// recorder and touch batcher do: events are committed later, in batches.
type Recorder interface {
	// Record queues ev (a parent link) for the log. Overflows are not
	// recorded here: they are committed through Log.Propose before the
	// request is served (Decider.overflow).
	Record(ev fsm.Event)
	// RecordDegraded remembers a placement made without the log and
	// queues its Bind; DegradedBinding returns it until it is recorded.
	RecordDegraded(b fsm.Bind)
	DegradedBinding(f fsm.Fleet, key string) (fsm.Binding, bool)
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
	// DegradedAllowed reports whether this edge's state is known current
	// enough to place a new key without the log, and if not, why.
	DegradedAllowed(now time.Time) (bool, string)
}

// Index is the edge's KV index: prefix matches, and the prediction that a
// prompt sent somewhere will be cached there.
type Index interface {
	routing.PrefixMatcher
	Predict(instance string, blocks []uint64, now time.Time)
}

// Decider holds one edge's decision inputs. Index and Overload may be nil.
type Decider struct {
	Log      Log
	Recorder Recorder
	Fleet    FleetView
	Index    Index
	Overload routing.OverloadHistory
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
	Policy   string
	Reason   fsm.OverflowReason
	From     string // the bound instance an overflow left ("" otherwise)
	Bound    bool   // the key is bound (sticky, new bind, overflow, degraded)
	Binding  fsm.Binding
	Excluded []string
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
	// FailStateUnknown: the log cannot commit and this edge's state is not
	// known current (503, RetryAfter set by the edge).
	FailStateUnknown
	// FailNoAlternative: a hop failed and no other instance can take it (502).
	FailNoAlternative
	// FailDetourUnrecorded: a bound key must leave its unhealthy instance
	// and the log cannot record the overflow now (503, RetryAfter set by
	// the edge). Instance is the bound instance.
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
	Detail     string // the log's reason, or why degraded placement was refused
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

// Decide is Route without the prediction.
func (d *Decider) Decide(ctx context.Context, router *routing.Router, req routing.Request, prev *Hop) (*Hop, *Failure) {
	f := req.Fleet
	h := &Hop{Fleet: f, Key: req.Key, Rank: -1}
	if prev != nil {
		h.Excluded = append(h.Excluded, prev.Excluded...)
		h.Excluded = append(h.Excluded, prev.Instance)
	}
	views := d.Fleet.Views(req.Now, h.Excluded)
	st := d.Log.State()
	in := d.inputs(views, st)
	set := d.setter(h, views, st)

	if h.Key == "" || !router.Config().Type.Binds() {
		rt, err := router.Place(req, in)
		if err != nil || rt.Action == routing.ActionShed {
			return nil, routeFailure(f, h.Key, rt, err)
		}
		set(rt, OutcomeUnbound)
		return h, nil
	}

	// A key placed while the log could not commit stays where it went
	// until its Bind is recorded.
	if b, ok := d.Recorder.DegradedBinding(f, h.Key); ok {
		if _, bound := st.Lookup(f, h.Key); !bound {
			rt, err := router.RouteBound(req, b, in)
			if err == nil && rt.Action == routing.ActionSticky {
				set(rt, OutcomeDegraded)
				h.Policy, h.Bound, h.Binding = routing.PolicyDegraded, true, b
				return h, nil
			}
		}
	}

	if b, ok := st.Lookup(f, h.Key); ok {
		return d.routeBound(ctx, h, router, req, in, b, set)
	}

	rt, err := router.Place(req, in)
	if err != nil || rt.Action == routing.ActionShed {
		return nil, routeFailure(f, h.Key, rt, err)
	}
	if rt.Action != routing.ActionBind {
		set(rt, OutcomeUnbound)
		return h, nil
	}
	if d.Log.Down(req.Now) {
		return d.placeDegraded(h, router, req, in, set)
	}
	res, err := d.propose(ctx, rt.BindEvent(req))
	switch {
	case errors.Is(err, ErrUnavailable):
		if b, ok := d.boundAfterTimeout(ctx, f, h.Key); ok {
			return d.routeBound(ctx, h, router, req, in, b, set)
		}
		return d.placeDegraded(h, router, req, in, set)
	case err != nil:
		return nil, &Failure{Kind: FailLog, Fleet: f, Key: h.Key, Err: err}
	case res.Status == fsm.StatusRejected || !res.Found:
		// The log refused the instance (it went down meanwhile): route
		// by what the log says now.
		if b, ok := d.Log.State().Lookup(f, h.Key); ok {
			return d.routeBound(ctx, h, router, req, in, b, set)
		}
		return nil, &Failure{Kind: FailRejected, Fleet: f, Key: h.Key, Instance: rt.Instance, Detail: res.Reason}
	}
	won := res.Binding
	if won.Instance != rt.Instance {
		// Another edge bound the key first: its placement is the one
		// every edge uses.
		return d.routeBound(ctx, h, router, req, in, won, set)
	}
	set(rt, OutcomeNewBind)
	h.Bound, h.Binding = true, won
	return h, nil
}

// propose is Log.Propose with a committed result taken as success: the
// event is in the log (the result is the leader's apply), only this
// replica lags, so the request is served by it rather than refused or
// placed without the log.
func (d *Decider) propose(ctx context.Context, ev fsm.Event) (fsm.Result, error) {
	res, err := d.Log.Propose(ctx, ev)
	if errors.Is(err, ErrCommitted) {
		return res, nil
	}
	return res, err
}

// boundAfterTimeout looks for a binding of key after its Bind timed out.
// Under load a timed-out Bind that still commits, or another edge's Bind of
// the same key, is the common case, not a dead log: the key is then served
// from the binding the log holds, as any bound key, rather than refused or
// placed degraded (issue 13, D1). ok is false while the key is unbound.
func (d *Decider) boundAfterTimeout(ctx context.Context, f fsm.Fleet, key string) (fsm.Binding, bool) {
	if b, ok := d.Log.State().Lookup(f, key); ok {
		return b, true
	}
	d.Log.AwaitCommitted(ctx)
	return d.Log.State().Lookup(f, key)
}

type setFunc func(routing.Route, string)

// setter fills h from a route; a route without a URL (sticky to an
// instance the views do not list) takes the log's.
func (d *Decider) setter(h *Hop, views *routing.Views, st *fsm.State) setFunc {
	return func(rt routing.Route, outcome string) {
		h.Instance, h.URL, h.Rank, h.Cached, h.Outcome = rt.Instance, rt.URL, rt.Rank, rt.CachedTokens, outcome
		h.Policy = rt.Decision.Policy
		h.Reason = rt.Reason
		if h.URL == "" {
			if v, ok := views.Lookup(rt.Instance); ok {
				h.URL = v.URL
			} else if rec, ok := st.Instance(rt.Instance); ok {
				h.URL = rec.URL
			}
		}
	}
}

// routeBound routes a key bound to b: sticky, or an overflow committed in
// the log before it is served (a rebind moves the binding for every edge).
func (d *Decider) routeBound(ctx context.Context, h *Hop, router *routing.Router, req routing.Request, in routing.Inputs,
	b fsm.Binding, set setFunc) (*Hop, *Failure) {
	return d.routeBoundAt(ctx, h, router, req, in, b, set, 0)
}

// maxFollow bounds how many times one decision follows a binding another
// edge moved while this one was recording its overflow.
const maxFollow = 2

func (d *Decider) routeBoundAt(ctx context.Context, h *Hop, router *routing.Router, req routing.Request, in routing.Inputs,
	b fsm.Binding, set setFunc, followed int) (*Hop, *Failure) {
	if d.unheardAtStartup(req.Now, h.Fleet, b.Instance, h.Excluded, in.Views) {
		return d.stay(h, b, "", set), nil
	}
	rt, err := router.RouteBound(req, b, in)
	if err != nil || rt.Action == routing.ActionShed {
		return nil, routeFailure(h.Fleet, h.Key, rt, err)
	}
	if rt.Action == routing.ActionOverflow {
		return d.overflow(ctx, h, router, req, in, b, rt, set, followed)
	}
	h.Bound, h.Binding = true, b
	set(rt, OutcomeSticky)
	if h.Policy == "" {
		h.Policy = "bound"
	}
	d.Recorder.Touch(fsm.FleetKey{Fleet: h.Fleet, Key: h.Key})
	return h, nil
}

// stay serves a bound key on its own instance (url "" takes the views' or
// the log's).
func (d *Decider) stay(h *Hop, b fsm.Binding, url string, set setFunc) *Hop {
	set(routing.Route{Action: routing.ActionSticky, Instance: b.Instance, URL: url, Rank: -1}, OutcomeSticky)
	h.Policy, h.Bound, h.Binding = "bound", true, b
	d.Recorder.Touch(fsm.FleetKey{Fleet: h.Fleet, Key: h.Key})
	return h
}

// overflow commits the detour rt of a key bound to b, then serves it. The
// log holds every departure from a binding before the detour is served, so
// any edge, operator or checker reading the key's history sees the
// placement a request was served under (docs/ARCHITECTURE.md, "Overflow and
// rebind"). Recorded off the request path instead, a detour was served
// seconds before its Overflow committed, or never if the edge died first
// (RELIABILITY.md F4, F7). When the log cannot commit, a healthy bound
// instance keeps the request (only its load or cache made it leave); an
// unhealthy one is refused with a retry hint rather than detoured
// unrecorded.
func (d *Decider) overflow(ctx context.Context, h *Hop, router *routing.Router, req routing.Request, in routing.Inputs,
	b fsm.Binding, rt routing.Route, set setFunc, followed int) (*Hop, *Failure) {
	ev := rt.OverflowEvent(req)
	if ev.Reason == fsm.OverflowCacheLost && d.Log.State().FeatureLevel() < fsm.FeatureLevelRanks {
		// The reason is new at level 2; an older voter would record it
		// unnamed. Its nearest older name: the cache stopped paying.
		ev.Reason = fsm.OverflowCircuitOpen
	}
	if d.Log.Down(req.Now) {
		return d.unrecorded(h, in, b, set, ErrUnavailable)
	}
	res, err := d.propose(ctx, ev)
	switch {
	case errors.Is(err, ErrUnavailable):
		// It may still commit: then it excuses nothing served, and a
		// rebind moves the key for the client's retry.
		return d.unrecorded(h, in, b, set, err)
	case err != nil:
		return nil, &Failure{Kind: FailLog, Fleet: h.Fleet, Key: h.Key, Err: err}
	}
	if res.Found && res.Binding.Epoch != b.Epoch && (!rt.Rebind || res.Status != fsm.StatusApplied) {
		// Another edge moved the key (a new epoch) while this one decided:
		// follow the log's binding, as every edge does. (A retry's b names
		// the failed hop's instance, not the binding's: the epoch tells.)
		if followed >= maxFollow {
			return nil, &Failure{Kind: FailRejected, Fleet: h.Fleet, Key: h.Key, Instance: rt.Instance, Detail: "the binding kept moving"}
		}
		return d.routeBoundAt(ctx, h, router, req, in, res.Binding, set, followed+1)
	}
	if res.Status != fsm.StatusApplied {
		// A rebind the log refused (its target went down meanwhile).
		return nil, &Failure{Kind: FailRejected, Fleet: h.Fleet, Key: h.Key, Instance: rt.Instance, Detail: res.Reason}
	}
	set(rt, OutcomeOverflow)
	h.From = rt.From
	h.Bound, h.Binding = true, b
	if rt.Rebind && res.Found {
		h.Binding = res.Binding
	}
	return h, nil
}

// unrecorded is the decision when an overflow cannot be committed: stay on
// a healthy bound instance, else refuse.
func (d *Decider) unrecorded(h *Hop, in routing.Inputs, b fsm.Binding, set setFunc, err error) (*Hop, *Failure) {
	if v, ok := in.Views.Lookup(b.Instance); ok && v.Healthy {
		return d.stay(h, b, v.URL, set), nil
	}
	return nil, &Failure{Kind: FailDetourUnrecorded, Fleet: h.Fleet, Key: h.Key, Instance: b.Instance, Err: err}
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

// placeDegraded places a new key by rendezvous over the instances the log
// last agreed on, serves it, and remembers to record the Bind.
//
// Only an edge whose state is known to be current guesses: a lagging one
// may not know that the log already bound the key elsewhere, so it refuses
// (the edge answers 503 with Retry-After); the client's retry is placed
// correctly.
func (d *Decider) placeDegraded(h *Hop, router *routing.Router, req routing.Request, in routing.Inputs, set setFunc) (*Hop, *Failure) {
	if ok, why := d.Fleet.DegradedAllowed(req.Now); !ok {
		return nil, &Failure{Kind: FailStateUnknown, Fleet: h.Fleet, Key: h.Key, Detail: why}
	}
	rt, err := router.PlaceDegraded(req, d.Log.State().Instances(), in)
	if err != nil {
		return nil, routeFailure(h.Fleet, h.Key, rt, err)
	}
	set(rt, OutcomeDegraded)
	bind := rt.BindEvent(req)
	d.Recorder.RecordDegraded(bind)
	h.Bound = true
	h.Binding = fsm.Binding{Fleet: bind.Fleet, Key: bind.Key, ConversationID: bind.ConversationID, Instance: bind.Instance, Decision: bind.Decision}
	return h, nil
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
	views := d.Fleet.Views(req.Now, excluded)
	st := d.Log.State()
	in := d.inputs(views, st)
	req.Fleet, req.Key, req.RoundRobin = failed.Fleet, failed.Key, 0
	h := &Hop{Fleet: failed.Fleet, Key: failed.Key, Rank: -1, Excluded: excluded}
	b := failed.Binding
	b.Instance = failed.Instance
	set := func(rt routing.Route, outcome string) {
		h.Instance, h.URL, h.Rank, h.Cached, h.Outcome, h.Policy, h.Reason = rt.Instance, rt.URL, rt.Rank, rt.CachedTokens, outcome, rt.Decision.Policy, rt.Reason
	}
	out, fail := d.routeBound(ctx, h, router, req, in, b, set)
	if fail != nil {
		return nil, fail
	}
	if out.Instance == failed.Instance {
		return nil, &Failure{Kind: FailNoAlternative, Fleet: failed.Fleet, Key: failed.Key, Instance: failed.Instance}
	}
	d.predict(out.Instance, req)
	return out, nil
}
