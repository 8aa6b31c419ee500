package routing

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/tether-project/tether/fsm"
)

// Decide decides where fleet req.Fleet's part of a request goes (req's
// Fleet, Key and Now set) under router, the fleet's rules: the first
// attempt (prev nil), or another instance after the hop prev failed — a
// bound key then overflows (recorded before it is sent), an unbound request
// is placed again, both excluding every instance that failed. It predicts
// the prompt on the chosen instance, so a burst sharing the prefix lands
// together until the worker's own KV event arrives.
//
// Decide is the decision's one entry point; its walk goes down: this
// file's steps (the key's placement in the log, this edge's proposals, a
// committed overflow), the stay-or-move rules of a bound key (stay.go),
// placement (place.go), the mechanisms below (routing/kvindex,
// routing/overload, routing/rendezvous).
func (d *Decider) Decide(ctx context.Context, router *Router, req Request, prev *Hop) (*Hop, *Failure) {
	var h *Hop
	var fail *Failure
	if prev != nil && prev.Bound {
		h, fail = d.reroute(ctx, router, req, prev)
	} else {
		h, fail = d.decide(ctx, router, req, prev)
	}
	if fail != nil {
		return nil, fail
	}
	if d.Index != nil {
		router.predicted(h, &req, d.Index)
		d.Index.Predict(h.Instance, req.Blocks, req.Now)
	}
	k := req.workKey()
	if k != "" && len(req.Blocks) > 0 {
		h.Work = Work{Key: k, Blocks: len(req.Blocks)}
	}
	d.workSet(router).Note(k, h.Instance, len(req.Blocks), req.Now)
	return h, nil
}

// predicted sets what the index holds of req's prompt on h's instance (any
// rank, or a live prediction): the longest run of leading blocks it holds,
// found by bisection (a paged prefix cache holds a chain's head whenever it
// holds a later block), whatever the decision was (a sticky turn does not
// score the index).
func (r *Router) predicted(h *Hop, req *Request, ix PrefixMatcher) {
	if !r.cfg.Type.usesCache() || len(req.Blocks) == 0 || h.Instance == "" {
		return
	}
	lo, hi := 0, len(req.Blocks)
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if held, _ := ix.Holds(h.Instance, -1, req.Blocks[mid-1], req.Now); held {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	tokens := lo * r.cfg.BlockSize
	if req.PromptTokens > 0 {
		tokens = min(tokens, req.PromptTokens)
	}
	h.Predicted, h.HasPrediction = tokens, true
}

func routeFailure(f fsm.Fleet, key string, rt route, err error) *Failure {
	switch {
	case err != nil && errors.Is(err, ErrNoInstances):
		return &Failure{Kind: FailNoInstances, Fleet: f, Key: key, Err: err}
	case err != nil:
		return &Failure{Kind: FailRouting, Fleet: f, Key: key, Err: err}
	}
	return &Failure{Kind: FailShed, Fleet: f, Key: key, RetryAfter: rt.RetryAfter}
}

// RecordIdentity records what a request's identity asks for: a new
// sub-agent's parent link (off the request path), or a use of an existing
// one.
func (d *Decider) RecordIdentity(id Identity) {
	switch {
	case id.NewLink:
		d.Recorder.Record(id.Link)
	case id.SubAgent() && id.ConversationID != "":
		d.Recorder.TouchLink(id.ConversationID)
	}
}

func (d *Decider) inputs(views *Views, st *fsm.State, router *Router) Inputs {
	in := Inputs{Views: views, Bindings: st, Overload: d.Overload, Work: d.workSet(router)}
	if d.Index != nil {
		in.Prefix = d.Index
	}
	return in
}

// decision is one Decide call's working state.
type decision struct {
	d      *Decider
	ctx    context.Context
	router *Router
	req    Request
	h      *Hop
	in     Inputs
	st     *fsm.State
	// moves counts how often the decision followed a binding that moved
	// (or vanished) while it was recording an overflow.
	moves int
	// answeredUnbound: a commit of this decision was answered with the key
	// unbound, which is newer than any earlier answer this edge holds.
	answeredUnbound bool
	// detour is the last detour this decision committed (a recorded
	// Overflow it did not serve because the key had moved meanwhile).
	detour *route
	// placedLast: the last resort placed the key anew.
	placedLast bool
	// woken: silent instances count as healthy (wake).
	woken bool
	// treeOwn: a sub-agent placed under its own id because its agent
	// tree does not fit its parent's instance (treeFits).
	treeOwn bool
}

// maxMoves bounds how many times one decision follows a binding other
// edges moved, evicted or re-placed while it was recording its overflow.
const maxMoves = 3

func (d *Decider) start(ctx context.Context, router *Router, req Request, h *Hop) *decision {
	views := d.Fleet.Views(req.Now, h.Excluded)
	st := d.Log.State()
	h.StateIndex = st.Index()
	return &decision{d: d, ctx: ctx, router: router, req: req, h: h, in: d.inputs(views, st, router), st: st}
}

// decide is a first decision (prev nil), or one after the unbound hop prev
// failed: the whole decision over the views without the failed instances.
func (d *Decider) decide(ctx context.Context, router *Router, req Request, prev *Hop) (*Hop, *Failure) {
	h := &Hop{Fleet: req.Fleet, Key: req.Key, Rank: -1}
	if prev != nil {
		h.Excluded = append(h.Excluded, prev.Excluded...)
		h.Excluded = append(h.Excluded, prev.Instance)
	}
	x := d.start(ctx, router, req, h)
	if h.Key == "" || !router.Config().Type.Binds() {
		rt, err := router.place(req, x.in)
		if err != nil || rt.Action == actionShed {
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
		if x.ownAfterFirst() || !x.treeFits() {
			x.asOwn()
			x.treeOwn = true
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

// ownAfterFirst reports whether a sub-agent routed by its parent's key
// is past its first request (overflow.subagent_first_with_parent: its
// parent link is committed in this edge's replica), on the context fleet
// (the generation fleet's binding keeps the tree's decode state). Its first request went
// with its parent, where its siblings' shared prefix is; from its second it
// is placed under its own id — credited its own context where that first
// request left it, charged the prefill queued and the cache its prompt
// would evict from each instance's working set — and is sticky there. Long
// siblings on their parent's instance evict each other's contexts and the
// parent's; placed each on its own, only the ones that fit stay together.
func (x *decision) ownAfterFirst() bool {
	if !x.router.cfg.Overflow.SubAgentFirstWithParent || x.h.Fleet != fsm.FleetContext {
		return false
	}
	link, ok := x.st.Link(x.req.ConversationID)
	return ok && link.Root == x.req.Key
}

// treeFits reports whether a sub-agent following its parent's binding fits
// its parent's instance (overflow.subagent_tree_budget). Its first request
// always does: it goes where its parent's prompt, the prefix it shares, is
// cached. From its second (the working sets hold its previous prompt: any
// edge routed it within the window, whatever the log has committed) its
// context is its own, grown turn by turn, and the prefix it shares is a
// small part of it: it fits while the working set routed to the parent's
// instance within the window — the parent's and its siblings' last prompts
// and every other conversation's, as every edge routed them — plus this
// prompt (its own previous one no longer counted) is at most the
// instance's KV capacity. Past that each turn there evicts another's
// context. A sub-agent that does not fit goes its own way only when
// another instance has room for it (roomFor): a move into a full cache
// would evict the contexts there instead. It is then placed under its own
// id (credited its context where it is cached, the queue and the cache it
// would evict weighed, the parent's instance among the candidates), and is
// sticky from then on. It fits when the parent is not bound (it is placed
// by the parent's key) or the instance reports no capacity.
func (x *decision) treeFits() bool {
	if !x.router.cfg.Overflow.SubAgentTreeBudget || x.in.Work == nil || x.h.Fleet != fsm.FleetContext {
		return true
	}
	if _, _, seen := x.in.Work.Key(x.req.workKey(), x.req.Now); !seen {
		return true
	}
	b, ok := x.st.Lookup(x.h.Fleet, x.h.Key)
	if !ok {
		return true
	}
	v, ok := x.in.Views.Lookup(b.Instance)
	if !ok || v.KVTotalBlocks <= 0 {
		return true
	}
	n := int64(len(x.req.Blocks))
	return x.in.workBeside(&x.req, b.Instance)+n <= v.KVTotalBlocks || !x.router.roomFor(&x.req, &x.in, b.Instance, n)
}

// roomFor reports whether an instance eligible for req other than instance
// has room for n prompt blocks beside the working set routed to it within
// the window.
func (r *Router) roomFor(req *Request, in *Inputs, instance string, n int64) bool {
	buf := getCandidates()
	defer putCandidates(buf)
	cands, _ := r.eligible(req, in, instance, (*buf)[:0])
	*buf = cands
	for _, c := range cands {
		if c.v.KVTotalBlocks > 0 && in.workBeside(req, c.v.ID)+n <= c.v.KVTotalBlocks {
			return true
		}
	}
	return false
}

// asOwn routes the rest of the decision by the sub-agent's own
// conversation id, noting where its parent's root is bound.
func (x *decision) asOwn() {
	if b, ok := x.st.Lookup(x.h.Fleet, x.h.Key); ok {
		x.h.RootInstance = b.Instance
	}
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
func (x *decision) escape(b fsm.Binding) (route, bool) {
	if !x.subAgent() || b.Epoch == 0 || !x.router.Config().Overflow.SubAgentCacheLost {
		return route{}, false
	}
	link, ok := x.st.Link(x.req.ConversationID)
	if !ok || link.Root != x.req.Key {
		return route{}, false
	}
	own := x.req
	own.Key = own.ConversationID
	mine := fsm.Binding{Fleet: b.Fleet, Key: own.Key, ConversationID: own.Key, Instance: b.Instance, Epoch: b.Epoch,
		BoundAt: link.CreatedAt, LastUsed: link.LastUsed, Rank: b.Rank, HasRank: b.HasRank}
	rt, err := x.router.stayOrMove(own, mine, x.in)
	if err != nil || rt.Action != actionOverflow || rt.Reason != fsm.OverflowCacheLost {
		return route{}, false
	}
	x.req = own
	x.h.Key, x.h.OwnKey, x.h.RootInstance = own.Key, true, b.Instance
	rt.Action, rt.From, rt.Rebind, rt.Reason = actionBind, "", false, 0
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
func (x *decision) heard() (route, bool) {
	if x.answeredUnbound {
		return route{}, false // the log since said the key is unbound
	}
	b, ok := x.d.Placements.Heard(x.h.Fleet, x.h.Key)
	if !ok || b.Fleet != x.h.Fleet {
		return route{}, false
	}
	v, ok := x.in.Views.Lookup(b.Instance)
	if !ok || !v.Healthy || v.Fleet != x.h.Fleet {
		return route{}, false
	}
	return route{Action: actionBind, Instance: b.Instance, URL: v.URL, Rank: -1,
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
	rt, err := x.router.place(x.req, x.in)
	if errors.Is(err, ErrNoInstances) && x.wake() {
		rt, err = x.router.place(x.req, x.in)
	}
	if err != nil || rt.Action == actionShed {
		return nil, routeFailure(x.h.Fleet, x.h.Key, rt, err)
	}
	if rt.Action != actionBind {
		x.set(rt, OutcomeUnbound)
		return x.h, nil
	}
	if x.treeOwn {
		rt.Decision.Policy = PolicySubAgentOwn
	}
	return x.placeOn(rt)
}

// placeOn proposes the Bind of route rt and serves it (soft affinity) or
// waits for the log's answer (commit_first, hard affinity).
func (x *decision) placeOn(rt route) (*Hop, *Failure) {
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
func (x *decision) settled(rt route, p Pending) (*Hop, *Failure) {
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
		x.set(route{Action: actionSticky, Instance: b.Instance, URL: v.URL, Rank: -1}, OutcomeSticky)
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
	var all []InstanceView
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
	views, err := NewViews(all)
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
func (x *decision) set(rt route, outcome string) {
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
	rt, err := x.router.stayOrMove(x.req, b, x.in)
	if errors.Is(err, ErrNoInstances) && x.wake() {
		rt, err = x.router.stayOrMove(x.req, b, x.in)
	}
	if err != nil || rt.Action == actionShed {
		return nil, routeFailure(h.Fleet, h.Key, rt, err)
	}
	if rt.Action == actionOverflow {
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
	x.set(route{Action: actionSticky, Instance: b.Instance, URL: url, Rank: -1}, OutcomeSticky)
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
func (x *decision) overflow(b fsm.Binding, rt route) (*Hop, *Failure) {
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
// failed this request, or that this edge cannot connect to (Unreachable:
// the hop would wait out a connect only to fail), is refused with a retry
// hint rather than detoured unrecorded.
func (x *decision) unrecorded(b fsm.Binding, err error) (*Hop, *Failure) {
	v, ok := x.in.Views.Lookup(b.Instance)
	if ok && v.Healthy {
		return x.stay(b, v.URL), nil
	}
	if !slices.Contains(x.h.Excluded, b.Instance) && !(ok && v.Unreachable) {
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
func (d *Decider) unheardAtStartup(now time.Time, f fsm.Fleet, inst string, excluded []string, views *Views) bool {
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

// reroute moves a bound key off the instance of the hop that failed: an
// overflow, recorded before it is sent, excluding every instance that
// failed. req carries the retry's Now; its RoundRobin is not used.
func (d *Decider) reroute(ctx context.Context, router *Router, req Request, failed *Hop) (*Hop, *Failure) {
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
	return out, nil
}
