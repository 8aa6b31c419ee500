package routing

import (
	"fmt"
	"math"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/kvindex"
)

// Condition is why a bound key cannot stay on the instance of view v (nil:
// the edge has no view of it): unhealthy or saturated; 0 when it can. The
// edge feeds OverloadTracker.Observe(id, Condition(v) != 0, now) on every
// view refresh.
//
// An open cache circuit breaker (v.CacheDegraded) is not a condition: it
// stops placement crediting the instance's cache, but never moves a bound
// key by itself. A bound key's own cache is judged by the cache-lost rule
// (overflow.cache_lost_below), which looks at the key's prompt; the breaker
// measures the whole instance, and a flapping breaker moved keys back and
// forth with reason circuit_open.
func (r *Router) Condition(v *InstanceView) fsm.OverflowReason {
	switch {
	case v == nil || !v.Healthy:
		return fsm.OverflowUnhealthy
	case r.saturated(v) || r.overHard(v):
		return fsm.OverflowSaturated
	}
	return 0
}

// stayOrMove routes a request whose key is bound to b.Instance: sticky while
// that instance is healthy (an open cache circuit breaker does not move
// it), unless it lost the conversation's cache (cacheLost) or waiting
// there costs more than moving (relieve). An unhealthy bound instance's
// request overflows to the best other instance (placed as by place,
// excluding the bound one), rebinding once in.Overload says the strain has
// lasted rebind_after. When neither the bound instance nor any other can
// take the request (all over their hard limits), it is shed. A key on an
// instance an operator drained moves with a rebind (vacate). With
// overflow.relief_factor 0, a saturated bound instance's request overflows
// as an unhealthy one's does, but only to an instance below the overflow
// thresholds (else it stays).
//
// The sticky path allocates nothing.
func (r *Router) stayOrMove(req Request, b fsm.Binding, in Inputs) (route, error) {
	v, ok := in.Views.Lookup(b.Instance)
	if !ok {
		v = nil
	}
	reason := r.Condition(v)
	if v != nil && v.Healthy && v.Drained {
		return r.vacate(&req, b.Instance, v, &in), nil
	}
	if r.cfg.Overflow.Weigh && (reason == 0 || reason == fsm.OverflowSaturated) {
		if rt, ok := r.weigh(&req, &b, v, reason, &in); ok {
			return rt, nil
		}
	}
	if reason == fsm.OverflowUnhealthy || (reason != 0 && r.cfg.Overflow.ReliefFactor == 0) {
		return r.leave(&req, b.Instance, v, reason, &in)
	}
	if r.overHard(v) && (r.noneBelowHard(&req, &in, b.Instance) || !r.weighs(&req, &in)) {
		// Every instance over its hard limit: shed. Over its own, with
		// no cache to weigh: overflow to one below it.
		return r.leave(&req, b.Instance, v, reason, &in)
	}
	if rt, ok := r.cacheLost(&req, &b, &in); ok {
		return rt, nil
	}
	if rt, ok := r.relieve(&req, &b, v, &in); ok {
		return rt, nil
	}
	return route{Action: actionSticky, Instance: b.Instance, URL: v.URL, Rank: -1, Reason: reason}, nil
}

// noneBelowHard reports whether every healthy instance of the fleet other
// than bound is over its hard limits (or there is none).
func (r *Router) noneBelowHard(req *Request, in *Inputs, bound string) bool {
	for _, v := range in.Views.Fleet(req.Fleet) {
		if v.Healthy && !v.Draining && v.ID != bound && !r.overHard(&v) {
			return false
		}
	}
	return true
}

// relieve moves a key off its healthy bound instance v when the wait there
// costs more than overflow.relief_factor times moving, both in prefill
// tokens: the wait is the prefill queued ahead on v (backlog); moving costs
// the prefill of the prompt's part the best other instance below its hard
// limits (by placement score) lacks, the prefill queued there, and the
// cached tokens of other conversations the prompt evicts there
// (Router.evicted). A conversation queued behind less than that stays,
// however many requests queue ahead of it; one stuck behind more work than
// rebuilding its cache elsewhere moves with its binding (a rebind, reason
// saturated), and its next turns find their cache where it went. The
// factor covers what a move costs beyond this request: the fleet computes
// the conversation again, and the reports the comparison reads are up to a
// telemetry interval old (every edge may move keys to the same idle-looking
// instance). ok is false when the key stays.
func (r *Router) relieve(req *Request, b *fsm.Binding, v *InstanceView, in *Inputs) (route, bool) {
	if !r.weighs(req, in) {
		return route{}, false
	}
	rho := r.cfg.Overflow.ReliefFactor
	wait := r.backlog(v, r.unknownRequest(req))
	if wait <= 0 {
		return route{}, false
	}
	// No move costs less than the least backlog elsewhere plus the
	// prompt's part the best other holder lacks: most requests stop here,
	// before scoring anything.
	p := float64(max(req.PromptTokens, len(req.Blocks)*r.cfg.BlockSize))
	least, ok := r.leastBacklog(req, in, b.Instance)
	if !ok || wait <= rho*least {
		return route{}, false // no move costs less than the least backlog: no KV match needed
	}
	if !r.heldEnoughElsewhere(req, b, in, least+p-wait/rho) {
		return route{}, false
	}
	buf := getCandidates()
	defer putCandidates(buf)
	cands, minTier := r.eligible(req, in, b.Instance, (*buf)[:0])
	*buf = cands
	if len(cands) == 0 || minTier == tierOver {
		return route{}, false
	}
	rt := r.choose(req, in, filterTier(cands, minTier))
	var move float64
	for i := range cands {
		if c := &cands[i]; c.v.ID == rt.Instance {
			move = r.backlog(c.v, r.unknownRequest(req)) + p - float64(c.cached) + r.cfg.Weights.Evict*r.evicted(req, in, c)
		}
	}
	if wait <= rho*move {
		return route{}, false
	}
	rt.Action, rt.From, rt.Reason, rt.Rebind = actionOverflow, b.Instance, fsm.OverflowSaturated, true
	return rt, true
}

// weighs reports whether the relief rule can weigh req's bound instance:
// it is on, the router uses the cache and has a KV index, the prompt's
// blocks are known, the fleet is the context fleet (a generation worker's
// prompt blocks arrive by transfer each turn, and its binding keeps the
// conversation's decode state), and the request is its key's own
// conversation's (a sub-agent routed by its parent's key follows the
// parent).
func (r *Router) weighs(req *Request, in *Inputs) bool {
	return r.cfg.Overflow.ReliefFactor > 0 && in.Prefix != nil && len(req.Blocks) > 0 && r.cfg.Type.usesCache() &&
		req.Fleet == fsm.FleetContext && (req.ConversationID == "" || req.ConversationID == req.Key)
}

// heldEnoughElsewhere reports whether an instance other than the key's
// bound one holds more than x tokens of the prompt's leading blocks (the
// move beats staying only then: wait > rho × (least + p − held)). Before
// the KV index's walk of the whole prompt, one lookup of the block that
// would take an instance past x: nobody else holding it, nobody holds
// that much, which is what most bound conversations find.
func (r *Router) heldEnoughElsewhere(req *Request, b *fsm.Binding, in *Inputs, x float64) bool {
	bs := float64(r.cfg.BlockSize)
	if x < 0 {
		return true
	}
	if x >= float64(len(req.Blocks))*bs {
		return false
	}
	if need := int(x/bs) + 1; !in.Prefix.HeldByOther(b.Instance, req.Blocks[need-1], req.Now) {
		return false
	}
	return float64(r.heldElsewhere(req, b, in)*r.cfg.BlockSize) > x
}

// heldElsewhere is the most leading prompt blocks the KV index says an
// instance other than the key's bound one holds.
func (r *Router) heldElsewhere(req *Request, b *fsm.Binding, in *Inputs) int {
	mp := matchPool.Get().(*[]kvindex.Match)
	matches := in.Prefix.Match(req.Blocks, req.Now, (*mp)[:0])
	other := 0
	for _, m := range matches {
		if m.Instance != b.Instance {
			other = max(other, m.Blocks)
		}
	}
	*mp = matches[:0]
	matchPool.Put(mp)
	return other
}

// leastBacklog is the least backlog among the fleet's healthy instances
// other than bound below their hard limits; ok is false when there is none.
func (r *Router) leastBacklog(req *Request, in *Inputs, bound string) (float64, bool) {
	least, ok := 0.0, false
	views := in.Views.Fleet(req.Fleet)
	for i := range views {
		v := &views[i]
		if !v.Healthy || v.Draining || v.ID == bound || r.overHard(v) {
			continue
		}
		if bl := r.backlog(v, r.unknownRequest(req)); !ok || bl < least {
			least, ok = bl, true
		}
		if least == 0 {
			break // no backlog is below none: the rest cannot lower it
		}
	}
	return least, ok
}

// cacheLost is the cache-lost rebind (overflow.cache_lost_below): when the
// KV index, with a trusted baseline for the bound instance, says it does not
// hold the block at that fraction of the conversation's previous prompt
// there (block ⌈f·n⌉ of its n blocks, as this edge's working sets recorded
// them, its own routes and those heard; the prompt's first block when no
// route there is recorded),
// the key is placed again among the
// instances below the overflow thresholds, the bound one included, and
// moves only to one that scores strictly better (a tie stays, so an idle
// cold fleet does not shuffle keys). A binding whose cache was evicted buys
// nothing by staying, and moving it then costs nothing; left alone it would
// pin the conversation to a cold instance while another holds its shared
// prefix. Only the key's own conversation asks (a sub-agent's request
// routed by its parent's key never moves the family). A binding used less
// than cache_lost_min_idle ago is not judged: the blocks its last request
// stored may not have reached this edge's index yet. ok is false when the
// key stays.
func (r *Router) cacheLost(req *Request, b *fsm.Binding, in *Inputs) (route, bool) {
	below := r.cfg.Overflow.CacheLostBelow
	if below <= 0 || len(req.Blocks) == 0 || in.Prefix == nil || !r.cfg.Type.usesCache() || !req.Fleet.Valid() {
		return route{}, false
	}
	if req.Now.UnixNano()-b.LastUsed < int64(r.cfg.Overflow.CacheLostMinIdle) {
		return route{}, false
	}
	bound := b.Instance
	if req.ConversationID != "" && req.ConversationID != req.Key {
		// A sub-agent routed by its parent's key follows the parent's
		// placement (docs/subagent-routing.md: parent instance and ADP rank).
		// Its prompt differs from the parent's and may never have been on
		// the instance: its absence says nothing about the key's cache.
		return route{}, false
	}
	// One block, not a walk: a block's KV depends on every block before it
	// and paged prefix caches evict a chain from its tail, so an instance
	// that still holds the block at the boundary almost always holds the
	// run before it, and one that does not holds less than the fraction.
	// The fraction is of what the instance stored for the conversation,
	// not of this prompt: a turn that more than doubles the conversation
	// (a long tool result) leaves its cache intact.
	boundary := max(1, min(len(req.Blocks), int(math.Ceil(below*float64(r.storedBlocks(req, in, bound))))))
	// The cache the key can use is on its rank: an ADP worker sends a
	// bound conversation to the rank it reported (RankObserved), and
	// another rank's copy of the prefix gives it no hit.
	rank := -1
	if b.HasRank {
		rank = int(b.Rank)
	}
	held, synced := in.Prefix.Holds(bound, rank, req.Blocks[boundary-1], req.Now)
	if !synced || held {
		return route{}, false
	}
	if rank >= 0 {
		// Score the bound instance by what its rank holds (fewer than
		// boundary blocks, so the walk is short), not its best rank's.
		q := *req
		q.bound = &boundCredit{instance: bound, rank: rank}
		for q.bound.blocks < boundary-1 {
			if h, _ := in.Prefix.Holds(bound, rank, req.Blocks[q.bound.blocks], req.Now); !h {
				break
			}
			q.bound.blocks++
		}
		req = &q
	}
	buf := getCandidates()
	defer putCandidates(buf)
	cands, minTier := r.eligible(req, in, "", (*buf)[:0])
	*buf = cands
	if len(cands) == 0 || minTier != tierOK {
		return route{}, false
	}
	cands = filterTier(cands, tierOK)
	rt := r.choose(req, in, cands)
	if rt.Instance == bound {
		return route{}, false
	}
	for i := range cands {
		// A draining bound instance is not a candidate: its keys leave.
		if cands[i].v.ID == bound && cands[i].score >= rt.Decision.Candidates[0].Score {
			return route{}, false
		}
	}
	rt.Action, rt.From, rt.Reason, rt.Rebind = actionOverflow, bound, fsm.OverflowCacheLost, true
	return rt, true
}

// storedBlocks is the prompt blocks of the conversation's previous request
// on instance, as this edge's working sets recorded it (its routes and
// those heard; at most this prompt's); 1 when none is recorded there.
func (r *Router) storedBlocks(req *Request, in *Inputs, instance string) int {
	if in.Work != nil {
		if inst, blocks, ok := in.Work.Key(req.workKey(), req.Now); ok && inst == instance && blocks > 0 {
			return min(blocks, len(req.Blocks))
		}
	}
	return 1
}

// weigh is the per-request comparison (OverflowConfig.Weigh): the bound
// instance and every other below the hard limits are scored as for a new
// placement (cached tokens saved against prefill queued ahead); the key
// stays unless another scores strictly better, and then moves with its
// binding. It reports false when it does not apply (a sub-agent routed by
// its parent's key, a binding used too recently for its cache evidence, no
// cache to weigh), leaving the threshold rules to decide.
func (r *Router) weigh(req *Request, b *fsm.Binding, v *InstanceView, reason fsm.OverflowReason, in *Inputs) (route, bool) {
	if v == nil || in.Prefix == nil || len(req.Blocks) == 0 || !r.cfg.Type.usesCache() || !req.Fleet.Valid() {
		return route{}, false
	}
	if req.ConversationID != "" && req.ConversationID != req.Key {
		return route{}, false
	}
	if req.Now.UnixNano()-b.LastUsed < int64(r.cfg.Overflow.CacheLostMinIdle) {
		return route{}, false
	}
	bound := b.Instance
	buf := getCandidates()
	defer putCandidates(buf)
	cands, minTier := r.eligible(req, in, "", (*buf)[:0])
	*buf = cands
	if len(cands) == 0 || minTier == tierOver {
		return route{}, false
	}
	out := cands[:0]
	for _, c := range cands {
		if c.tier != tierOver {
			out = append(out, c)
		}
	}
	cands = out
	stay := route{Action: actionSticky, Instance: bound, URL: v.URL, Rank: -1, Reason: reason}
	rt := r.choose(req, in, cands)
	if rt.Instance == bound {
		return stay, true
	}
	for i := range cands {
		if cands[i].v.ID == bound && cands[i].score >= rt.Decision.Candidates[0].Score {
			return stay, true
		}
	}
	rt.Action, rt.From, rt.Rebind = actionOverflow, bound, true
	rt.Reason = fsm.OverflowCacheLost
	if reason != 0 {
		rt.Reason = reason
	}
	return rt, true
}

// vacate moves a key off its drained instance v (an operator drained it,
// usually to remove it): to the best other instance below its hard limits,
// those below the overflow thresholds first, with a rebind, so every edge
// follows and the instance empties as its conversations take their next
// turns. With no such instance the key stays (sticky, reason drained): a
// drained instance still serves, and a drain never fails a request; a
// drained instance over its own hard limit sheds as any other.
func (r *Router) vacate(req *Request, bound string, v *InstanceView, in *Inputs) route {
	buf := getCandidates()
	defer putCandidates(buf)
	cands, minTier := r.eligible(req, in, bound, (*buf)[:0])
	*buf = cands
	if len(cands) == 0 || minTier == tierOver {
		if r.overHard(v) {
			return r.shed(req, cands, v)
		}
		return route{Action: actionSticky, Instance: bound, URL: v.URL, Rank: -1, Reason: fsm.OverflowDrained}
	}
	rt := r.choose(req, in, filterTier(cands, minTier))
	rt.Action, rt.From, rt.Reason, rt.Rebind = actionOverflow, bound, fsm.OverflowDrained, true
	return rt
}

func (r *Router) leave(req *Request, bound string, v *InstanceView, reason fsm.OverflowReason, in *Inputs) (route, error) {
	if !req.Fleet.Valid() {
		return route{}, fmt.Errorf("routing: route key %q: invalid fleet %v", req.Key, req.Fleet)
	}
	buf := getCandidates()
	defer putCandidates(buf)
	cands, minTier := r.eligible(req, in, bound, (*buf)[:0])
	*buf = cands
	stay := route{Action: actionSticky, Instance: bound, Rank: -1, Reason: reason}
	if v != nil {
		stay.URL = v.URL
	}
	if reason == fsm.OverflowUnhealthy {
		switch {
		case len(cands) == 0:
			return route{}, fmt.Errorf("routing: %s key %q bound to unhealthy %s: %w", req.Fleet, req.Key, bound, ErrNoInstances)
		case minTier == tierOver:
			return r.shed(req, cands, nil), nil
		}
	} else if len(cands) == 0 || minTier != tierOK {
		if v != nil && r.overHard(v) && (len(cands) == 0 || minTier == tierOver) {
			return r.shed(req, cands, v), nil
		}
		return stay, nil
	}
	rt := r.choose(req, in, filterTier(cands, minTier))
	rt.Action = actionOverflow
	rt.From = bound
	rt.Reason = reason
	if in.Overload != nil && r.cfg.Overflow.RebindAfter > 0 {
		if since, ok := in.Overload.OverloadedSince(bound); ok && !req.Now.Before(since.Add(r.cfg.Overflow.RebindAfter)) {
			rt.Rebind = true
		}
	}
	return rt, nil
}
