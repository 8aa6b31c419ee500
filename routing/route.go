package routing

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hash64"
	"github.com/tether-project/tether/routing/kvindex"
)

// Action says what the edge does with a request.
type Action uint8

const (
	// ActionSticky: serve on the key's bound instance; nothing to record
	// (the edge batches a Touch).
	ActionSticky Action = iota + 1
	// ActionBind: a new key was placed; serve on Instance and propose
	// Route.BindEvent. With Degraded, the log could not commit: serve
	// anyway and propose the Bind once it can.
	ActionBind
	// ActionServe: serve on Instance and record nothing (an unkeyed
	// request, or a router that does not bind).
	ActionServe
	// ActionOverflow: the bound instance cannot take the request; serve
	// on Instance and propose Route.OverflowEvent.
	ActionOverflow
	// ActionShed: every candidate is over its hard limit; answer 429 with
	// Retry-After.
	ActionShed
)

func (a Action) String() string {
	switch a {
	case ActionSticky:
		return "sticky"
	case ActionBind:
		return "bind"
	case ActionServe:
		return "serve"
	case ActionOverflow:
		return "overflow"
	case ActionShed:
		return "shed"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// Decision policy names (fsm.Decision.Policy).
const (
	PolicyLeastLoaded = "least_loaded"        // load only (no prefix cached anywhere, or no index)
	PolicyKVAware     = "kv_aware"            // cache credit against load
	PolicyRoundRobin  = "round_robin"         // the edge's counter
	PolicyDegraded    = "degraded_rendezvous" // log cannot commit: rendezvous over the last agreed instances
	PolicyShed        = "shed"                // nothing placed
)

// ErrNoInstances: no healthy, non-draining instance in the fleet (the edge
// answers 503).
var ErrNoInstances = errors.New("no healthy instance")

// BindingCounter reads live binding counts per instance from the replicated
// state (the fewest-bindings tie-break).
type BindingCounter interface {
	BindingCount(f fsm.Fleet, instance string) int
}

// PrefixMatcher reports how many leading blocks of a prompt each instance
// holds (Match), and whether one instance holds one block on one rank (any
// rank: -1), with whether that answer rests on a trusted baseline (Holds);
// *kvindex.Index implements it.
type PrefixMatcher interface {
	Match(blocks []uint64, now time.Time, dst []kvindex.Match) []kvindex.Match
	Holds(instance string, rank int, block uint64, now time.Time) (held, synced bool)
}

// Inputs are the state a decision reads. Views is required; the rest may be
// nil (no bindings known, no KV index, no overload history).
type Inputs struct {
	Views    *Views
	Bindings BindingCounter
	Prefix   PrefixMatcher
	Overload OverloadHistory
}

// Request is one request as routing sees it.
type Request struct {
	Fleet          fsm.Fleet
	Key            string // routing key on Fleet ("" = unkeyed); Identity.Key(Fleet)
	ConversationID string
	RequestID      string
	Edge           string // deciding edge's node id, for the log
	Priority       Priority
	PromptTokens   int      // prompt length; caps cache credit (0: unknown)
	Blocks         []uint64 // the prompt's chained block hashes (internal/prefix)
	Spread         uint64   // unkeyed tie-break (SpreadFor(RequestID))
	RoundRobin     uint64   // the edge's counter, for RouterRoundRobin
	Now            time.Time
	// Adapter is the request's LoRA adapter ("" the base model): an
	// instance that must load it costs Weights.LoRALoad (routing/lora.go).
	Adapter string
	// Hard: a miss is an error (state that lives in one engine process),
	// so the key's placement must be committed before it is served
	// (routing/decide waits for it; the router itself ignores it).
	Hard bool

	// bound, set by the cache-lost check only, replaces the bound
	// instance's cache credit (its best rank's) with its binding's rank's.
	bound *boundCredit
}

// boundCredit is the cache a bound key can use on its instance: the
// leading blocks its rank holds.
type boundCredit struct {
	instance string
	rank     int
	blocks   int
}

// Route is a routing decision.
type Route struct {
	Action   Action
	Instance string // where to send the request (empty for ActionShed)
	URL      string
	// Rank is the ADP rank believed to hold the cached prefix (-1:
	// unknown or predicted only). Informational: the worker places ranks.
	Rank int
	// CachedTokens: prompt tokens the chosen instance is believed to hold.
	CachedTokens int
	// From is the bound instance, for ActionOverflow.
	From string
	// Reason: for ActionOverflow, why the request left its instance; for
	// ActionSticky, non-zero when the bound instance is strained but no
	// better instance exists (the request stays).
	Reason fsm.OverflowReason
	// Rebind: the overflow moves the binding (the strain outlasted
	// rebind_after), so every edge follows.
	Rebind bool
	// Degraded: decided without the log (PlaceDegraded).
	Degraded   bool
	RetryAfter time.Duration // for ActionShed, a whole number of seconds
	// Decision explains a placement for the log (empty for sticky).
	Decision fsm.Decision
}

// BindEvent is the event recording an ActionBind route.
func (rt Route) BindEvent(req Request) fsm.Bind {
	return fsm.Bind{Fleet: req.Fleet, Key: req.Key, ConversationID: req.ConversationID, Instance: rt.Instance, Decision: rt.Decision}
}

// OverflowEvent is the event recording an ActionOverflow route.
func (rt Route) OverflowEvent(req Request) fsm.Overflow {
	return fsm.Overflow{Fleet: req.Fleet, Key: req.Key, From: rt.From, To: rt.Instance, Reason: rt.Reason, Rebind: rt.Rebind, Decision: rt.Decision}
}

// Router makes routing decisions for one fleet configuration. It holds no
// state besides its configuration; safe for concurrent use.
type Router struct {
	cfg Config
}

// NewRouter validates cfg and returns a Router.
func NewRouter(cfg Config) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Router{cfg: cfg}, nil
}

// Config returns the router's configuration.
func (r *Router) Config() Config { return r.cfg }

type tier uint8

const (
	tierOK        tier = iota // below the overflow thresholds
	tierSaturated             // at or above an overflow threshold
	tierOver                  // at or above a hard (shed) limit
)

func (r *Router) saturated(v *InstanceView) bool {
	o := r.cfg.Overflow
	return (o.QueuedRequests > 0 && v.QueuedRequests >= o.QueuedRequests) ||
		(o.ActivePromptTokens > 0 && v.ActivePromptTokens >= o.ActivePromptTokens)
}

func (r *Router) overHard(v *InstanceView) bool {
	s := r.cfg.Shed
	return (s.MaxQueuedRequests > 0 && v.QueuedRequests >= s.MaxQueuedRequests) ||
		(s.MaxQueuedPrefillTokens > 0 && v.QueuedPrefillTokens >= s.MaxQueuedPrefillTokens)
}

func (r *Router) tierOf(v *InstanceView) tier {
	switch {
	case r.overHard(v):
		return tierOver
	case r.saturated(v):
		return tierSaturated
	}
	return tierOK
}

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

// RouteBound routes a request whose key is bound to b.Instance: sticky while
// that instance is healthy and below the overflow thresholds (an open cache
// circuit breaker does not move it). Otherwise the request overflows to the
// best other instance (placed as by Place, excluding the bound one); for
// saturation only an instance below the thresholds qualifies, else the
// request stays. The overflow rebinds once in.Overload says the strain has
// lasted rebind_after. When neither the bound instance nor any other can
// take the request (all over their hard limits), it is shed. A healthy bound
// instance that lost the prompt's cache may give the key up (cacheLost). A
// key on an instance an operator drained moves with a rebind (vacate).
//
// The sticky path allocates nothing.
func (r *Router) RouteBound(req Request, b fsm.Binding, in Inputs) (Route, error) {
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
	if reason == 0 {
		if rt, ok := r.cacheLost(&req, &b, &in); ok {
			return rt, nil
		}
		return Route{Action: ActionSticky, Instance: b.Instance, URL: v.URL, Rank: -1}, nil
	}
	return r.leave(&req, b.Instance, v, reason, &in)
}

// cacheLost is the cache-lost rebind (overflow.cache_lost_below): when the
// KV index, with a trusted baseline for the bound instance, says it does not
// hold the prompt's block at that fraction (block ⌈f·n⌉ of n), the key is
// placed again among the
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
func (r *Router) cacheLost(req *Request, b *fsm.Binding, in *Inputs) (Route, bool) {
	below := r.cfg.Overflow.CacheLostBelow
	if below <= 0 || len(req.Blocks) == 0 || in.Prefix == nil || !r.cfg.Type.usesCache() || !req.Fleet.Valid() {
		return Route{}, false
	}
	if req.Now.UnixNano()-b.LastUsed < int64(r.cfg.Overflow.CacheLostMinIdle) {
		return Route{}, false
	}
	bound := b.Instance
	if req.ConversationID != "" && req.ConversationID != req.Key {
		// A sub-agent routed by its parent's key follows the parent's
		// placement (docs/subagent-routing.md: parent instance and ADP rank).
		// Its prompt differs from the parent's and may never have been on
		// the instance: its absence says nothing about the key's cache.
		return Route{}, false
	}
	// One block, not a walk: a block's KV depends on every block before it
	// and paged prefix caches evict a chain from its tail, so an instance
	// that still holds the block at the boundary almost always holds the
	// run before it, and one that does not holds less than the fraction.
	boundary := max(1, min(len(req.Blocks), int(math.Ceil(below*float64(len(req.Blocks))))))
	// The cache the key can use is on its rank: an ADP worker sends a
	// bound conversation to the rank it reported (RankObserved), and
	// another rank's copy of the prefix gives it no hit.
	rank := -1
	if b.HasRank {
		rank = int(b.Rank)
	}
	held, synced := in.Prefix.Holds(bound, rank, req.Blocks[boundary-1], req.Now)
	if !synced || held {
		return Route{}, false
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
		return Route{}, false
	}
	cands = filterTier(cands, tierOK)
	rt := r.choose(req, in, cands)
	if rt.Instance == bound {
		return Route{}, false
	}
	for i := range cands {
		// A draining bound instance is not a candidate: its keys leave.
		if cands[i].v.ID == bound && cands[i].score >= rt.Decision.Candidates[0].Score {
			return Route{}, false
		}
	}
	rt.Action, rt.From, rt.Reason, rt.Rebind = ActionOverflow, bound, fsm.OverflowCacheLost, true
	return rt, true
}

// weigh is the per-request comparison (OverflowConfig.Weigh): the bound
// instance and every other below the hard limits are scored as for a new
// placement (cached tokens saved against prefill queued ahead); the key
// stays unless another scores strictly better, and then moves with its
// binding. It reports false when it does not apply (a sub-agent routed by
// its parent's key, a binding used too recently for its cache evidence, no
// cache to weigh), leaving the threshold rules to decide.
func (r *Router) weigh(req *Request, b *fsm.Binding, v *InstanceView, reason fsm.OverflowReason, in *Inputs) (Route, bool) {
	if v == nil || in.Prefix == nil || len(req.Blocks) == 0 || !r.cfg.Type.usesCache() || !req.Fleet.Valid() {
		return Route{}, false
	}
	if req.ConversationID != "" && req.ConversationID != req.Key {
		return Route{}, false
	}
	if req.Now.UnixNano()-b.LastUsed < int64(r.cfg.Overflow.CacheLostMinIdle) {
		return Route{}, false
	}
	bound := b.Instance
	buf := getCandidates()
	defer putCandidates(buf)
	cands, minTier := r.eligible(req, in, "", (*buf)[:0])
	*buf = cands
	if len(cands) == 0 || minTier == tierOver {
		return Route{}, false
	}
	out := cands[:0]
	for _, c := range cands {
		if c.tier != tierOver {
			out = append(out, c)
		}
	}
	cands = out
	stay := Route{Action: ActionSticky, Instance: bound, URL: v.URL, Rank: -1, Reason: reason}
	rt := r.choose(req, in, cands)
	if rt.Instance == bound {
		return stay, true
	}
	for i := range cands {
		if cands[i].v.ID == bound && cands[i].score >= rt.Decision.Candidates[0].Score {
			return stay, true
		}
	}
	rt.Action, rt.From, rt.Rebind = ActionOverflow, bound, true
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
func (r *Router) vacate(req *Request, bound string, v *InstanceView, in *Inputs) Route {
	buf := getCandidates()
	defer putCandidates(buf)
	cands, minTier := r.eligible(req, in, bound, (*buf)[:0])
	*buf = cands
	if len(cands) == 0 || minTier == tierOver {
		if r.overHard(v) {
			return r.shed(req, cands, v)
		}
		return Route{Action: ActionSticky, Instance: bound, URL: v.URL, Rank: -1, Reason: fsm.OverflowDrained}
	}
	rt := r.choose(req, in, filterTier(cands, minTier))
	rt.Action, rt.From, rt.Reason, rt.Rebind = ActionOverflow, bound, fsm.OverflowDrained, true
	return rt
}

func (r *Router) leave(req *Request, bound string, v *InstanceView, reason fsm.OverflowReason, in *Inputs) (Route, error) {
	if !req.Fleet.Valid() {
		return Route{}, fmt.Errorf("routing: route key %q: invalid fleet %v", req.Key, req.Fleet)
	}
	buf := getCandidates()
	defer putCandidates(buf)
	cands, minTier := r.eligible(req, in, bound, (*buf)[:0])
	*buf = cands
	stay := Route{Action: ActionSticky, Instance: bound, Rank: -1, Reason: reason}
	if v != nil {
		stay.URL = v.URL
	}
	if reason == fsm.OverflowUnhealthy {
		switch {
		case len(cands) == 0:
			return Route{}, fmt.Errorf("routing: %s key %q bound to unhealthy %s: %w", req.Fleet, req.Key, bound, ErrNoInstances)
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
	rt.Action = ActionOverflow
	rt.From = bound
	rt.Reason = reason
	if in.Overload != nil && r.cfg.Overflow.RebindAfter > 0 {
		if since, ok := in.Overload.OverloadedSince(bound); ok && !req.Now.Before(since.Add(r.cfg.Overflow.RebindAfter)) {
			rt.Rebind = true
		}
	}
	return rt, nil
}

// Place places a new key, or an unkeyed request, on req.Fleet. Candidates
// are the fleet's healthy, non-draining instances; those below the overflow
// thresholds are preferred, then those below the hard limits; when every
// candidate is over its hard limit the request is shed. Among the preferred,
// RouterRoundRobin takes the counter's turn; the other routers take the best
// score (see Weights; RouterLoadBalancing gives no cache credit, nor does an
// instance whose circuit is open), then the fewest live bindings (binding
// routers, keyed requests), then the highest rendezvous weight of the key
// (or of req.Spread), then the smaller id. The result depends only on the
// inputs, never on the order of the views.
func (r *Router) Place(req Request, in Inputs) (Route, error) {
	if !req.Fleet.Valid() {
		return Route{}, fmt.Errorf("routing: place key %q: invalid fleet %v", req.Key, req.Fleet)
	}
	buf := getCandidates()
	defer putCandidates(buf)
	cands, minTier := r.eligible(&req, &in, "", (*buf)[:0])
	*buf = cands
	if len(cands) == 0 {
		return Route{}, fmt.Errorf("routing: place %s key %q: %w", req.Fleet, req.Key, ErrNoInstances)
	}
	if minTier == tierOver {
		return r.shed(&req, cands, nil), nil
	}
	rt := r.choose(&req, &in, filterTier(cands, minTier))
	rt.Action = ActionServe
	if req.Key != "" && r.cfg.Type.Binds() {
		rt.Action = ActionBind
	}
	return rt, nil
}

// PlaceDegraded places a new key while the affinity log cannot commit: by
// rendezvous hashing of the key over the fleet's instances the log last
// agreed on (records with status up), so every edge picks the same instance
// without talking to the others. Instances this edge's views report
// unhealthy are skipped in rendezvous order (edges that agree on health still
// agree on the choice). The route is ActionBind with Degraded set: the edge
// serves it, counts it, and proposes the Bind once the log commits again
// (the first committed Bind wins). Unkeyed requests need no log and are
// placed as by Place.
func (r *Router) PlaceDegraded(req Request, instances []fsm.Instance, in Inputs) (Route, error) {
	if req.Key == "" || !r.cfg.Type.Binds() {
		return r.Place(req, in)
	}
	kh := KeyHash(req.Key)
	type option struct {
		inst *fsm.Instance
		w    uint64
	}
	higher := func(a, b option) bool { return a.w > b.w || (a.w == b.w && a.inst.ID < b.inst.ID) }
	var top [fsm.MaxCandidates]option // highest weights among up instances, best first
	n, up := 0, 0
	var chosen option // highest weight among those not reported unhealthy
	for i := range instances {
		it := &instances[i]
		if it.Fleet != req.Fleet || !it.TakesNewKeys() || it.ID == "" {
			continue
		}
		up++
		o := option{it, rendezvousWeight(kh, it.ID)}
		if v, ok := in.Views.Lookup(it.ID); !ok || v.Healthy {
			if chosen.inst == nil || higher(o, chosen) {
				chosen = o
			}
		}
		j := n
		if j == len(top) {
			if !higher(o, top[j-1]) {
				continue
			}
			j--
		} else {
			n++
		}
		for j > 0 && higher(o, top[j-1]) {
			top[j] = top[j-1]
			j--
		}
		top[j] = o
	}
	if chosen.inst == nil {
		return Route{}, fmt.Errorf("routing: degraded placement of %s key %q over %d up instances: %w", req.Fleet, req.Key, up, ErrNoInstances)
	}
	// Candidates: the chosen one first, then the others in rendezvous
	// order. Score is the rendezvous weight as a fraction of 2^64.
	dec := fsm.Decision{Edge: req.Edge, Policy: PolicyDegraded, RequestID: req.RequestID, Candidates: make([]fsm.Candidate, 0, n)}
	score := func(o option) float64 { return float64(o.w>>11) / (1 << 53) }
	dec.Candidates = append(dec.Candidates, fsm.Candidate{Instance: chosen.inst.ID, Score: score(chosen)})
	for _, o := range top[:n] {
		if o.inst != chosen.inst && len(dec.Candidates) < fsm.MaxCandidates {
			dec.Candidates = append(dec.Candidates, fsm.Candidate{Instance: o.inst.ID, Score: score(o)})
		}
	}
	url := chosen.inst.URL
	if v, ok := in.Views.Lookup(chosen.inst.ID); ok && v.URL != "" {
		url = v.URL
	}
	return Route{Action: ActionBind, Instance: chosen.inst.ID, URL: url, Rank: -1, Degraded: true, Decision: dec}, nil
}

// candidate is one instance being scored.
type candidate struct {
	v      *InstanceView
	tier   tier
	blocks int   // leading prompt blocks held
	rank   int   // rank holding them (-1: unknown/predicted)
	cached int64 // prompt tokens believed cached
	// offBlocks: leading prompt blocks one rank holds in an offloaded
	// tier, when more than blocks; offRank that rank.
	offBlocks int
	offRank   int
	score     float64
	tieKeys   bool // bindings and hrw computed
	bindings  int
	hrw       uint64
}

var candidatePool = sync.Pool{New: func() any { s := make([]candidate, 0, 64); return &s }}
var matchPool = sync.Pool{New: func() any { s := make([]kvindex.Match, 0, 64); return &s }}

func getCandidates() *[]candidate { return candidatePool.Get().(*[]candidate) }
func putCandidates(p *[]candidate) {
	clear(*p) // drop view pointers
	*p = (*p)[:0]
	candidatePool.Put(p)
}

// eligible appends the fleet's healthy, non-draining instances other than
// exclude, with their tiers, in id order.
func (r *Router) eligible(req *Request, in *Inputs, exclude string, dst []candidate) ([]candidate, tier) {
	minTier := tierOver
	views := in.Views.Fleet(req.Fleet)
	for i := range views {
		v := &views[i]
		if !v.Healthy || v.Draining || v.ID == exclude {
			continue
		}
		t := r.tierOf(v)
		minTier = min(minTier, t)
		dst = append(dst, candidate{v: v, tier: t, rank: -1})
	}
	return dst, minTier
}

// filterTier keeps the candidates of tier t, in place.
func filterTier(cands []candidate, t tier) []candidate {
	out := cands[:0]
	for _, c := range cands {
		if c.tier == t {
			out = append(out, c)
		}
	}
	return out
}

func (r *Router) loadCost(v *InstanceView, p Priority) float64 {
	w := &r.cfg.Weights
	qf := 1.0
	if p == PriorityInteractive {
		qf = w.InteractiveQueueFactor
	}
	return qf*(w.Queue*float64(v.QueuedPrefillTokens)+w.QueuedRequest*float64(v.QueuedRequests)) +
		w.Decode*float64(v.ActivePromptTokens)
}

// ranker orders candidates: score, then (binding routers, keyed requests)
// fewest live bindings, then highest rendezvous weight, then smaller id. The
// tie-break keys cost a map lookup and a hash each, so they are computed only
// when two scores tie.
type ranker struct {
	in          *Inputs
	fleet       fsm.Fleet
	keyHash     uint64
	useBindings bool
}

func (rk *ranker) tieKeys(c *candidate) {
	if c.tieKeys {
		return
	}
	c.tieKeys = true
	c.hrw = rendezvousWeight(rk.keyHash, c.v.ID)
	if rk.useBindings {
		c.bindings = rk.in.Bindings.BindingCount(rk.fleet, c.v.ID)
	}
}

// better reports whether a ranks before b.
func (rk *ranker) better(a, b *candidate) bool {
	if a.score != b.score {
		return a.score > b.score
	}
	rk.tieKeys(a)
	rk.tieKeys(b)
	if rk.useBindings && a.bindings != b.bindings {
		return a.bindings < b.bindings
	}
	if a.hrw != b.hrw {
		return a.hrw > b.hrw
	}
	return a.v.ID < b.v.ID
}

// choose picks among cands (non-empty, in id order) and fills the route and
// its decision.
func (r *Router) choose(req *Request, in *Inputs, cands []candidate) Route {
	dec := fsm.Decision{Edge: req.Edge, RequestID: req.RequestID}
	if r.cfg.Type == RouterRoundRobin {
		c := &cands[req.RoundRobin%uint64(len(cands))]
		dec.Policy = PolicyRoundRobin
		dec.Candidates = []fsm.Candidate{{Instance: c.v.ID, LoadTokens: loadTokens(c.v)}}
		return Route{Instance: c.v.ID, URL: c.v.URL, Rank: -1, Decision: dec}
	}
	dec.Policy = PolicyLeastLoaded
	if r.cfg.Type.usesCache() && in.Prefix != nil && len(req.Blocks) > 0 {
		mp := matchPool.Get().(*[]kvindex.Match)
		matches := in.Prefix.Match(req.Blocks, req.Now, (*mp)[:0])
		for _, m := range matches {
			// cands are in id order: binary search.
			i := sort.Search(len(cands), func(i int) bool { return cands[i].v.ID >= m.Instance })
			if i < len(cands) && cands[i].v.ID == m.Instance && m.Blocks > 0 {
				cands[i].blocks, cands[i].rank = m.Blocks, m.Rank
			}
			if i < len(cands) && cands[i].v.ID == m.Instance && m.Offloaded > m.Blocks {
				cands[i].offBlocks, cands[i].offRank = m.Offloaded, m.OffloadedRank
			}
		}
		*mp = matches[:0]
		matchPool.Put(mp)
		if bc := req.bound; bc != nil {
			i := sort.Search(len(cands), func(i int) bool { return cands[i].v.ID >= bc.instance })
			if i < len(cands) && cands[i].v.ID == bc.instance {
				cands[i].blocks, cands[i].rank = bc.blocks, bc.rank
			}
		}
	}
	w := &r.cfg.Weights
	cacheWeight := w.Cache
	if req.Priority == PriorityBackground {
		cacheWeight *= w.BackgroundCacheFactor
	}
	rk := ranker{in: in, fleet: req.Fleet, keyHash: hash64.Mix64(req.Spread)}
	if req.Key != "" {
		rk.keyHash = KeyHash(req.Key)
		rk.useBindings = r.cfg.Type.Binds() && in.Bindings != nil
	}
	for i := range cands {
		c := &cands[i]
		if c.blocks > 0 {
			c.cached = int64(c.blocks) * int64(r.cfg.BlockSize)
			if req.PromptTokens > 0 {
				c.cached = min(c.cached, int64(req.PromptTokens))
			}
		}
		credit := 0.0
		if tokens := float64(c.cached) + w.OffloadedBlock*float64(r.offloadedTokens(c, req)); tokens > 0 && !c.v.CacheDegraded {
			credit = cacheWeight * tokens
			dec.Policy = PolicyKVAware
		}
		c.score = credit - r.loadCost(c.v, req.Priority) - r.adapterCost(c.v, req.Adapter)
	}
	// The best MaxCandidates, best first, by insertion.
	var top [fsm.MaxCandidates]*candidate
	n := 0
	for i := range cands {
		c := &cands[i]
		j := n
		if j == len(top) {
			if !rk.better(c, top[j-1]) {
				continue
			}
			j--
		} else {
			n++
		}
		for j > 0 && rk.better(c, top[j-1]) {
			top[j] = top[j-1]
			j--
		}
		top[j] = c
	}
	dec.Candidates = make([]fsm.Candidate, n)
	for i := 0; i < n; i++ {
		c := top[i]
		dec.Candidates[i] = fsm.Candidate{Instance: c.v.ID, Score: c.score, CachedTokens: clampU32(c.cached), LoadTokens: loadTokens(c.v)}
	}
	best := top[0]
	rank := -1
	if best.cached > 0 {
		rank = best.rank
	} else if r.offloadedTokens(best, req) > 0 && r.cfg.Weights.OffloadedBlock > 0 {
		rank = best.offRank // its offloaded tier holds the prompt
	}
	return Route{Instance: best.v.ID, URL: best.v.URL, Rank: rank, CachedTokens: int(best.cached), Decision: dec}
}

// offloadedTokens is the prompt tokens after c's GPU-cached ones that only
// an offloaded tier of one of c's ranks holds: the engine loads them back
// (vLLM's offloading connector looks up the blocks that follow its GPU
// prefix hit) rather than computing them.
func (r *Router) offloadedTokens(c *candidate, req *Request) int64 {
	if c.offBlocks <= c.blocks {
		return 0
	}
	n := int64(c.offBlocks) * int64(r.cfg.BlockSize)
	if req.PromptTokens > 0 {
		n = min(n, int64(req.PromptTokens))
	}
	return max(n-c.cached, 0)
}

// shed builds the 429 route. Retry-After is the time the least-loaded
// candidate (bound included, when given) needs to drain below its hard
// limits at the configured prefill rate, rounded up to whole seconds and
// bounded by shed.retry_after_min/max.
func (r *Router) shed(req *Request, cands []candidate, bound *InstanceView) Route {
	wait := math.Inf(1)
	for i := range cands {
		wait = math.Min(wait, r.drainSeconds(cands[i].v))
	}
	if bound != nil {
		wait = math.Min(wait, r.drainSeconds(bound))
	}
	s := r.cfg.Shed
	d := s.RetryAfterMin
	if !math.IsInf(wait, 1) && !math.IsNaN(wait) {
		if secs := math.Ceil(wait); secs >= s.RetryAfterMax.Seconds() {
			d = s.RetryAfterMax
		} else {
			d = max(d, time.Duration(secs)*time.Second)
		}
	}
	return Route{Action: ActionShed, Rank: -1, RetryAfter: d, Decision: fsm.Decision{Edge: req.Edge, Policy: PolicyShed, RequestID: req.RequestID}}
}

// drainSeconds estimates how long v needs to get below its hard limits.
func (r *Router) drainSeconds(v *InstanceView) float64 {
	s := r.cfg.Shed
	need := 0.0 // prefill tokens to drain
	if s.MaxQueuedRequests > 0 && v.QueuedRequests >= s.MaxQueuedRequests {
		perRequest := r.cfg.Weights.QueuedRequest
		if v.QueuedRequests > 0 && v.QueuedPrefillTokens > 0 {
			perRequest = float64(v.QueuedPrefillTokens) / float64(v.QueuedRequests)
		}
		need = math.Max(need, float64(v.QueuedRequests-s.MaxQueuedRequests+1)*perRequest)
	}
	if s.MaxQueuedPrefillTokens > 0 && v.QueuedPrefillTokens >= s.MaxQueuedPrefillTokens {
		need = math.Max(need, float64(v.QueuedPrefillTokens-s.MaxQueuedPrefillTokens+1))
	}
	return need / s.PrefillTokensPerSecond
}

func loadTokens(v *InstanceView) uint32 {
	return clampU32(max(v.QueuedPrefillTokens, 0) + max(v.ActivePromptTokens, 0))
}

func clampU32(x int64) uint32 {
	switch {
	case x <= 0:
		return 0
	case x > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(x)
}
