package routing

import (
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hash64"
	"github.com/tether-project/tether/routing/kvindex"
	"github.com/tether-project/tether/routing/rendezvous"
)

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

// backlog is the prefill work queued ahead on v, in prompt tokens: the
// prompts the edges dispatched there since its last report, plus an
// estimate of what it has queued — its queued requests times the prompt
// tokens it holds per admitted request (its active prompt tokens over its
// queued and active requests), less the share its cache serves (its
// window hit rate). The estimate misses a running prefill, however long.
// With placement.reported_prefill, an instance that reports the prefill
// it has still to compute (PrefillReported: its queued prompts' uncached
// part and what its running prefills have left) counts that instead —
// except in a new key's placement (backlogFor). A worker that reports no
// token figures (an engine scraped for request counts) is taken to queue
// requests of unknown tokens each (Router.unknownRequest).
func (r *Router) backlog(v *InstanceView, unknown float64) float64 {
	return backlogOf(v, unknown, r.cfg.ReportedPrefill)
}

// backlogFor is the backlog req weighs v by: a new key's placement, which
// places a conversation for its lifetime, reads the estimate (the load
// the instance carries as its request counts show it) even with
// placement.reported_prefill — a prefill running at that instant is over
// in seconds, and placing conversations away from it packed them worse
// (BENCHMARKS.md) — while a bound turn's stay-or-move and an unkeyed
// request, which are about this request's wait, read what is reported.
func (r *Router) backlogFor(v *InstanceView, req *Request) float64 {
	return backlogOf(v, r.unknownRequest(req), r.cfg.ReportedPrefill && !(req.placing && req.Key != ""))
}

func backlogOf(v *InstanceView, unknown float64, reported bool) float64 {
	if reported && v.PrefillReported {
		return float64(max(v.QueuedPrefillTokens, 0) + max(v.PrefillTokens, 0))
	}
	miss := 1.0
	if h := v.HitRate; h > 0 && h <= 1 {
		miss = 1 - h
	}
	q := max(v.QueuedRequests, 0)
	per := 0.0
	switch n := q + max(v.ActiveRequests, 0); {
	case v.ActivePromptTokens > 0 && n > 0:
		per = float64(v.ActivePromptTokens) / float64(n)
	case v.QueuedPrefillTokens <= 0:
		per = max(unknown, 0)
	}
	return float64(max(v.QueuedPrefillTokens, 0)) + miss*per*float64(q)
}

// unknownRequest is what a queued request whose size its worker does not
// report counts in the backlog: a conversation's turn, as a live binding
// counts (weights.live_binding), or this prompt when it is longer.
func (r *Router) unknownRequest(req *Request) float64 {
	return max(float64(req.PromptTokens), r.cfg.Weights.LiveBinding)
}

// overHard reports whether v is at or above one of its hard limits
// (ShedConfig): the seconds of prefill queued ahead on it, its queued
// requests, the prompt tokens dispatched to it since its last report. The
// same for every request, so every decision and the overload tracker
// (Condition) agree on it.
func (r *Router) overHard(v *InstanceView) bool {
	s := &r.cfg.Shed
	return (s.MaxBacklogSeconds > 0 && r.backlogSeconds(v) >= s.MaxBacklogSeconds) ||
		(s.MaxQueuedRequests > 0 && v.QueuedRequests >= s.MaxQueuedRequests) ||
		(s.MaxQueuedPrefillTokens > 0 && v.QueuedPrefillTokens >= s.MaxQueuedPrefillTokens)
}

// backlogSeconds is v's backlog in seconds of prefill at
// shed.prefill_tokens_per_second, counting the work its figures show: a
// queued request whose size its worker does not report (an engine scraped
// for request counts only) counts nothing here, where placement and relief
// take it for a turn. Refusing a request is dearer than queueing it on a
// guess; such a fleet sheds by shed.max_queued_requests.
func (r *Router) backlogSeconds(v *InstanceView) float64 {
	return r.backlog(v, 0) / r.cfg.Shed.PrefillTokensPerSecond
}

// backlogLimit is shed.max_backlog_seconds in prefill tokens: the backlog
// (as backlogSeconds counts it) at which an instance is over the limit.
func (r *Router) backlogLimit() float64 {
	return r.cfg.Shed.MaxBacklogSeconds * r.cfg.Shed.PrefillTokensPerSecond
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

// place places a new key, or an unkeyed request, on req.Fleet. Candidates
// are the fleet's healthy, non-draining instances; those below the overflow
// thresholds are preferred, then those below the hard limits; when every
// candidate is over its hard limit the request is shed. Among the preferred,
// RouterRoundRobin takes the counter's turn; the other routers take the best
// score (see Weights; RouterLoadBalancing gives no cache credit, nor does an
// instance whose circuit is open), then the fewest live bindings (binding
// routers, keyed requests), then the highest rendezvous weight of the key
// (or of req.Spread), then the smaller id. The result depends only on the
// inputs, never on the order of the views.
func (r *Router) place(req Request, in Inputs) (route, error) {
	if !req.Fleet.Valid() {
		return route{}, fmt.Errorf("routing: place key %q: invalid fleet %v", req.Key, req.Fleet)
	}
	buf := getCandidates()
	defer putCandidates(buf)
	cands, minTier := r.eligible(&req, &in, "", (*buf)[:0])
	*buf = cands
	if len(cands) == 0 {
		return route{}, fmt.Errorf("routing: place %s key %q: %w", req.Fleet, req.Key, ErrNoInstances)
	}
	if minTier == tierOver {
		return r.shed(&req, cands, nil), nil
	}
	req.placing = true
	rt := r.choose(&req, &in, filterTier(cands, minTier))
	rt.Action = actionServe
	if req.Key != "" && r.cfg.Type.Binds() {
		rt.Action = actionBind
	}
	return rt, nil
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

func (r *Router) loadCost(v *InstanceView, req *Request) float64 {
	w := &r.cfg.Weights
	qf := 1.0
	if req.Priority == PriorityInteractive {
		qf = w.InteractiveQueueFactor
	}
	return qf*(w.Queue*r.backlogFor(v, req)+w.QueuedRequest*float64(v.QueuedRequests)) +
		w.Decode*float64(v.ActivePromptTokens)
}

// evicted is the prompt tokens placing req on c's instance stores beyond
// the KV budget the working set of the other conversations routed there
// lately leaves it: of the prompt blocks the instance does not hold, those
// that do not fit beside that working set. Each evicts a block another
// conversation will compute again. A prompt larger than the instance's
// cache is not stored and evicts nothing.
func (r *Router) evicted(req *Request, in *Inputs, c *candidate) float64 {
	n := int64(len(req.Blocks))
	if in.Work == nil || c.v.KVTotalBlocks <= 0 || n == 0 || n > c.v.KVTotalBlocks {
		return 0
	}
	over := min(n-int64(c.blocks), max(in.workBeside(req, c.v.ID), 0)+n-c.v.KVTotalBlocks)
	if over <= 0 {
		return 0
	}
	return float64(over * int64(r.cfg.BlockSize))
}

// workBeside is the working set routed to instance within the window,
// in blocks, without req's own conversation's last prompt (the one req
// follows, which its prompt replaces there).
func (in *Inputs) workBeside(req *Request, instance string) int64 {
	l := in.Work.Load(instance, req.Now)
	if inst, blocks, ok := in.Work.Key(req.workKey(), req.Now); ok && inst == instance {
		l.Blocks -= int64(blocks)
	}
	return l.Blocks
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
	c.hrw = rendezvous.Weight(rk.keyHash, c.v.ID)
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
func (r *Router) choose(req *Request, in *Inputs, cands []candidate) route {
	dec := fsm.Decision{Edge: req.Edge, RequestID: req.RequestID}
	if r.cfg.Type == RouterRoundRobin {
		c := &cands[req.RoundRobin%uint64(len(cands))]
		dec.Policy = PolicyRoundRobin
		dec.Candidates = []fsm.Candidate{{Instance: c.v.ID, LoadTokens: loadTokens(c.v)}}
		return route{Instance: c.v.ID, URL: c.v.URL, Rank: -1, Decision: dec}
	}
	if r.cfg.Type.usesCache() && in.Prefix != nil && len(req.Blocks) > 0 {
		creditCache(req, in, cands)
	}
	dec.Policy = r.score(req, in, cands)
	rk := ranker{in: in, fleet: req.Fleet, keyHash: hash64.Mix64(req.Spread)}
	if req.Key != "" {
		rk.keyHash = rendezvous.KeyHash(req.Key)
		rk.useBindings = r.cfg.Type.Binds() && in.Bindings != nil
	}
	top, n := rk.top(cands)
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
	return route{Instance: best.v.ID, URL: best.v.URL, Rank: rank, CachedTokens: int(best.cached), Decision: dec}
}

// creditCache sets each candidate's leading prompt blocks held (and the
// rank holding them, and what an offloaded tier holds beyond them) from the
// KV index; a bound key's instance is credited its binding's rank's
// (Request.bound).
func creditCache(req *Request, in *Inputs, cands []candidate) {
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

// score sets each candidate's cached tokens and score (Weights) and
// returns the decision's policy: kv_aware when some cache was credited.
func (r *Router) score(req *Request, in *Inputs, cands []candidate) string {
	w := &r.cfg.Weights
	cacheWeight := w.Cache
	if req.Priority == PriorityBackground {
		cacheWeight *= w.BackgroundCacheFactor
	}
	policy := PolicyLeastLoaded
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
			policy = PolicyKVAware
		}
		c.score = credit - r.loadCost(c.v, req) - r.adapterCost(c.v, req.Adapter)
		if w.Evict > 0 {
			c.score -= w.Evict * r.evicted(req, in, c)
		}
	}
	r.spread(req, in, cands)
	return policy
}

// spread charges each candidate weights.live_binding per live binding it
// holds, for a new key whose prompt no candidate holds more of than
// another (a new conversation, or one whose cache is gone everywhere) and
// whose LoRA adapter, if any, costs the same everywhere: nothing in the
// cache or the adapter slots tells the instances apart, and the
// conversations already bound to each are the load it will have, which its
// queue does not show yet when many start together. A key whose prefix
// some instance holds more of (a sub-agent beside its siblings), or whose
// adapter some instance holds and another would load, is placed by cache,
// adapter cost and load, bindings breaking ties.
func (r *Router) spread(req *Request, in *Inputs, cands []candidate) {
	w := r.cfg.Weights.LiveBinding
	if !req.placing || w <= 0 || req.Key == "" || !r.cfg.Type.Binds() || in.Bindings == nil || len(cands) == 0 {
		return
	}
	adapter0 := r.adapterCost(cands[0].v, req.Adapter)
	for i := range cands {
		if cands[i].cached != cands[0].cached || r.adapterCost(cands[i].v, req.Adapter) != adapter0 {
			return
		}
	}
	for i := range cands {
		cands[i].score -= w * float64(in.Bindings.BindingCount(req.Fleet, cands[i].v.ID))
	}
}

// top returns the best fsm.MaxCandidates of cands, best first, and how many
// there are.
func (rk *ranker) top(cands []candidate) ([fsm.MaxCandidates]*candidate, int) {
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
	return top, n
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
func (r *Router) shed(req *Request, cands []candidate, bound *InstanceView) route {
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
	return route{Action: actionShed, Rank: -1, RetryAfter: d, Decision: fsm.Decision{Edge: req.Edge, Policy: PolicyShed, RequestID: req.RequestID}}
}

// drainSeconds estimates how long v needs to get below its hard limits:
// the most prefill work one of the limits it is over needs drained (the
// backlog above max_backlog_seconds' worth, the excess requests at their
// average queued tokens, the excess queued tokens), at
// shed.prefill_tokens_per_second.
func (r *Router) drainSeconds(v *InstanceView) float64 {
	s := &r.cfg.Shed
	need := 0.0 // prefill tokens to drain
	if s.MaxBacklogSeconds > 0 {
		if bl, limit := r.backlog(v, 0), r.backlogLimit(); bl >= limit {
			need = bl - limit
		}
	}
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
