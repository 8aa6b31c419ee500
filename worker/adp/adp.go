// Package adp is the worker's attention-data-parallel rank scheduler: it
// chooses the ADP rank each request runs on so that a conversation's turns,
// and the sub-agents of a parent, reuse the prefix cache of one rank.
//
// Returning conversations go to their bound rank; a verified sub-agent hint
// sends the child to its parent's binding; new conversations follow the
// placement policy (round_robin, least_tokens, least_queued). A saturated
// home rank overflows to another rank without losing the binding. Bindings
// live in an LRU of bounded size.
//
// The scheduler is deterministic (no clock, no randomness: the same calls
// give the same decisions) and safe for concurrent use.
package adp

import (
	"fmt"
	"sync"
)

// Options configure a Scheduler. Config.Options builds them from the
// configuration file's keys.
type Options struct {
	Ranks                int       // ADP ranks (>= 1)
	ConversationAffinity bool      // kv_cache_routing_conversation_affinity
	Placement            Placement // kv_cache_routing_new_conv_placement
	// MaxSessions bounds the conversation→rank bindings (LRU by last
	// use); 0 means DefaultMaxSessions.
	MaxSessions int
	// MaxRequestsPerRank is the number of placed, unfinished requests at
	// which a rank is saturated; 0 means no cap.
	MaxRequestsPerRank int
	// OnBindingEvicted, if set, is called for every binding evicted to
	// respect MaxSessions, after the scheduler's lock is released.
	OnBindingEvicted func(key string, rank int)
}

// Request is what the scheduler needs to know about one request.
type Request struct {
	// ConversationID is the request's own conversation ("" for none).
	ConversationID string
	// AffinityID is the parent's conversation id from a sub-agent hint.
	// The caller sets it only after verifying the hint's signature.
	AffinityID string
	// PromptTokens is the request's input length (load accounting).
	PromptTokens int
	// CachedTokens are the prompt tokens each rank holds as a cached
	// prefix (index = rank; missing ranks hold none). Read by the kv_aware
	// placement only.
	CachedTokens []int
	// AdapterRanks are the ranks holding the request's LoRA adapter
	// (index = rank): a placement by the policy (a new or unbound
	// conversation) keeps to those of them that are not saturated, when
	// there are any, so no other rank loads the adapter. Bound
	// conversations keep their rank.
	AdapterRanks []bool
	// LogRank is the rank the edges' affinity log records for the key
	// (HasLogRank): a conversation this scheduler holds no binding for (a
	// restarted worker) is bound there again rather than placed anew, so
	// its rank, and the edges' view of it, survive the restart. A binding
	// the scheduler holds wins; an out-of-range rank is ignored.
	LogRank    int
	HasLogRank bool
	// Prompt is the request's prompt tokens, read only when the request
	// has no key (no conversation, no affinity) and affinity is on: a
	// prompt that begins with a recent unkeyed request's whole prompt runs
	// on that request's rank (continuation.go). nil: placed by the policy.
	Prompt []uint32
}

// Reason says how a decision's home rank was found.
type Reason uint8

const (
	// ReasonUnbound: no conversation id, or affinity disabled; placed by
	// the policy and not bound.
	ReasonUnbound Reason = iota
	// ReasonNew: the key had no binding; placed by the policy and bound.
	ReasonNew
	// ReasonBound: the key's existing binding (a returning conversation,
	// or a sub-agent joining its parent).
	ReasonBound
	// ReasonContinues: no key, and the prompt continues a recent unkeyed
	// request's prompt: that request's rank, not bound.
	ReasonContinues
)

func (r Reason) String() string {
	switch r {
	case ReasonUnbound:
		return "unbound"
	case ReasonNew:
		return "new"
	case ReasonBound:
		return "bound"
	case ReasonContinues:
		return "continues"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Decision is where a request runs and why.
type Decision struct {
	Rank   int
	Reason Reason
	// Key is the binding key used: the AffinityID for sub-agents, else
	// the ConversationID; "" when unbound.
	Key string
	// Subagent is true when Key is the parent's conversation id.
	Subagent bool
	// HomeRank is the key's bound rank (-1 when unbound). It differs from
	// Rank only when Overflow is set.
	HomeRank int
	// Overflow is set when the home rank was saturated and the request
	// went elsewhere; the binding is kept.
	Overflow bool
	// Ticket tracks the request's load on Rank: pass it to Start when the
	// request begins running and to Finish when it ends.
	Ticket Ticket
}

// RankLoad is one rank's load as the scheduler accounts it.
type RankLoad struct {
	Rank         int
	PromptTokens int // prompt tokens of placed, unfinished requests
	Active       int // requests started and not finished
	Queued       int // requests placed and not started
}

// Counters are cumulative scheduler figures for telemetry.
type Counters struct {
	Placements      int64 // decisions made
	Bound           int64 // requests that found their own conversation's binding
	SubagentBound   int64 // sub-agent requests that found the parent's binding
	NewBindings     int64 // bindings created
	Unbound         int64 // requests placed without a binding
	Overflows       int64 // requests sent away from a saturated home rank
	AllSaturated    int64 // decisions made while every rank was saturated
	BindingsEvicted int64 // bindings evicted to respect MaxSessions
	Restored        int64 // bindings created on the rank the affinity log records (LogRank)
	Continuations   int64 // unkeyed requests placed on the rank of the prompt they continue
	Bindings        int   // bindings held now
}

// Scheduler places requests on ranks. It is safe for concurrent use.
type Scheduler struct {
	opts        Options
	maxSessions int

	mu     sync.Mutex
	loads  []RankLoad
	cursor int   // round-robin position; also breaks ties of the least_* policies
	cached []int // the request being placed: cached prompt tokens by rank (kv_aware)
	// adapterRanks: the request being placed: ranks holding its adapter.
	adapterRanks []bool
	bindings     bindingLRU
	// conts: recent unkeyed prompts and their ranks (continuation.go).
	conts    continuationIndex
	counters Counters
}

// New returns a scheduler, or an error naming the invalid option.
func New(opts Options) (*Scheduler, error) {
	if opts.Ranks < 1 {
		return nil, fmt.Errorf("adp: ranks must be at least 1, got %d", opts.Ranks)
	}
	if opts.Placement > KVAware {
		return nil, fmt.Errorf("adp: %s: unknown placement %d", PlacementKey, opts.Placement)
	}
	if opts.MaxSessions < 0 || opts.MaxRequestsPerRank < 0 {
		return nil, fmt.Errorf("adp: max sessions (%d) and max requests per rank (%d) must not be negative",
			opts.MaxSessions, opts.MaxRequestsPerRank)
	}
	s := &Scheduler{opts: opts, maxSessions: opts.MaxSessions}
	if s.maxSessions == 0 {
		s.maxSessions = DefaultMaxSessions
	}
	s.loads = make([]RankLoad, opts.Ranks)
	for i := range s.loads {
		s.loads[i].Rank = i
	}
	s.bindings = newBindingLRU(min(s.maxSessions, 1024))
	s.conts = newContinuationIndex()
	return s, nil
}

// Ranks is the number of ranks.
func (s *Scheduler) Ranks() int { return s.opts.Ranks }

// Placement is the new-conversation placement policy.
func (s *Scheduler) Placement() Placement { return s.opts.Placement }

// Place chooses a rank for req and records it there as queued (its prompt
// tokens count toward the rank's load from now on, so later placements see
// it). Call Start and Finish with the returned ticket.
func (s *Scheduler) Place(req Request) Decision {
	var evicted [1]evictedBinding
	ph := s.promptHashes(&req)
	s.mu.Lock()
	d, n := s.placeLocked(req, ph, evicted[:0])
	s.mu.Unlock()
	ph.release()
	s.report(n)
	return d
}

// promptHashes hashes the prompt of a request the continuation index
// reads (nil for any other).
func (s *Scheduler) promptHashes(req *Request) *promptHashes {
	if !s.opts.ConversationAffinity || req.ConversationID != "" || req.AffinityID != "" || req.Prompt == nil {
		return nil
	}
	return hashPrompt(req.Prompt)
}

// PlaceBatch places requests that arrived together, in order; each
// placement sees the load of those placed before it in the batch.
func (s *Scheduler) PlaceBatch(reqs []Request) []Decision {
	out := make([]Decision, len(reqs))
	var evicted []evictedBinding
	hs := make([]*promptHashes, len(reqs))
	for i := range reqs {
		hs[i] = s.promptHashes(&reqs[i])
	}
	s.mu.Lock()
	for i, r := range reqs {
		out[i], evicted = s.placeLocked(r, hs[i], evicted)
	}
	s.mu.Unlock()
	for _, ph := range hs {
		ph.release()
	}
	s.report(evicted)
	return out
}

// Assign records a request on a rank chosen elsewhere (for example a
// generation-only run sent to a given rank), so it counts toward the load.
func (s *Scheduler) Assign(rank, promptTokens int) (Ticket, error) {
	if rank < 0 || rank >= s.opts.Ranks {
		return Ticket{}, fmt.Errorf("adp: assign to rank %d: only ranks 0..%d exist", rank, s.opts.Ranks-1)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.enqueueLocked(rank, promptTokens), nil
}

// Start marks the ticket's request as running (queued → active). Starting
// a ticket twice, or one already finished, does nothing.
func (s *Scheduler) Start(t *Ticket) {
	if t == nil || t.state != ticketQueued || t.rank >= len(s.loads) {
		return
	}
	s.mu.Lock()
	l := &s.loads[t.rank]
	l.Queued--
	l.Active++
	s.mu.Unlock()
	t.state = ticketActive
}

// Finish removes the ticket's request from the load, whether it started or
// not. Finishing a ticket twice does nothing.
func (s *Scheduler) Finish(t *Ticket) {
	if t == nil || (t.state != ticketQueued && t.state != ticketActive) || t.rank >= len(s.loads) {
		return
	}
	s.mu.Lock()
	l := &s.loads[t.rank]
	if t.state == ticketQueued {
		l.Queued--
	} else {
		l.Active--
	}
	l.PromptTokens -= t.tokens
	s.mu.Unlock()
	t.state = ticketDone
}

// Loads returns every rank's load, indexed by rank.
func (s *Scheduler) Loads() []RankLoad {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]RankLoad, len(s.loads))
	copy(out, s.loads)
	return out
}

// Counters returns the cumulative figures.
func (s *Scheduler) Counters() Counters {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.counters
	c.Bindings = s.bindings.len()
	return c
}

// Binding returns the rank bound to key, without refreshing its recency.
func (s *Scheduler) Binding(key string) (rank int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bindings.peek(key)
}

type evictedBinding struct {
	key  string
	rank int
}

func (s *Scheduler) report(evicted []evictedBinding) {
	if s.opts.OnBindingEvicted == nil {
		return
	}
	for _, e := range evicted {
		s.opts.OnBindingEvicted(e.key, e.rank)
	}
}

func (s *Scheduler) placeLocked(req Request, ph *promptHashes, evicted []evictedBinding) (Decision, []evictedBinding) {
	s.counters.Placements++
	s.cached = req.CachedTokens
	s.adapterRanks = req.AdapterRanks
	defer func() { s.cached, s.adapterRanks = nil, nil }()
	d := Decision{HomeRank: -1}
	if s.saturatedCount() == len(s.loads) {
		s.counters.AllSaturated++
	}
	key, subagent := req.ConversationID, false
	if req.AffinityID != "" {
		key, subagent = req.AffinityID, true
	}
	switch {
	case ph != nil:
		s.placeUnkeyed(&d, req.Prompt, ph)
	case !s.opts.ConversationAffinity || key == "":
		d.Rank = s.choose(-1)
		d.Reason = ReasonUnbound
		s.counters.Unbound++
	default:
		d.Key, d.Subagent = key, subagent
		if home, ok := s.bindings.touch(key); ok {
			d.Reason, d.HomeRank, d.Rank = ReasonBound, home, home
			if subagent {
				s.counters.SubagentBound++
			} else {
				s.counters.Bound++
			}
			if s.saturated(home) {
				// Overflow: run elsewhere this time, keep the binding so
				// the conversation returns home once the rank drains.
				if r := s.choose(home); r != home {
					d.Rank, d.Overflow = r, true
					s.counters.Overflows++
				}
			}
		} else {
			d.Rank = s.choose(-1)
			if req.HasLogRank && req.LogRank >= 0 && req.LogRank < len(s.loads) {
				d.Rank = req.LogRank
				s.counters.Restored++
			}
			d.Reason, d.HomeRank = ReasonNew, d.Rank
			s.counters.NewBindings++
			if k, r, ok := s.bindings.add(key, d.Rank, s.maxSessions); ok {
				evicted = append(evicted, evictedBinding{k, r})
				s.counters.BindingsEvicted++
			}
		}
	}
	d.Ticket = s.enqueueLocked(d.Rank, req.PromptTokens)
	return d, evicted
}

// placeUnkeyed places a request without a key whose prompt hashes are
// ph: on the rank of the recent unkeyed prompt it continues (its home,
// overflowing as a bound key's when saturated), else by the policy; then
// remembers its prompt on the rank it runs on.
func (s *Scheduler) placeUnkeyed(d *Decision, prompt []uint32, ph *promptHashes) {
	if home, ok := s.conts.lookup(prompt, ph); ok && home < len(s.loads) {
		d.Reason, d.HomeRank, d.Rank = ReasonContinues, home, home
		s.counters.Continuations++
		if s.saturated(home) {
			if r := s.choose(home); r != home {
				d.Rank, d.Overflow = r, true
				s.counters.Overflows++
			}
		}
	} else {
		d.Rank, d.Reason = s.choose(-1), ReasonUnbound
		s.counters.Unbound++
	}
	s.conts.remember(ph, d.Rank, s.maxSessions)
}

func (s *Scheduler) enqueueLocked(rank, promptTokens int) Ticket {
	promptTokens = max(promptTokens, 0)
	l := &s.loads[rank]
	l.Queued++
	l.PromptTokens += promptTokens
	return Ticket{rank: rank, tokens: promptTokens, state: ticketQueued}
}

func (s *Scheduler) saturated(rank int) bool {
	limit := s.opts.MaxRequestsPerRank
	l := &s.loads[rank]
	return limit > 0 && l.Active+l.Queued >= limit
}

func (s *Scheduler) saturatedCount() int {
	if s.opts.MaxRequestsPerRank == 0 {
		return 0
	}
	n := 0
	for r := range s.loads {
		if s.saturated(r) {
			n++
		}
	}
	return n
}

// choose applies the placement policy over the unsaturated ranks, scanning
// from the round-robin cursor so ties rotate. If every rank is saturated it
// returns prefer when that is a rank (stay home), else applies the policy
// over all ranks. The cursor moves past the chosen rank.
func (s *Scheduler) choose(prefer int) int {
	n := len(s.loads)
	best := -1
	adapterOnly := prefer < 0 && s.adapterRankFree()
	for pass := 0; pass < 2 && best < 0; pass++ {
		if pass == 1 && prefer >= 0 {
			return prefer
		}
		for i := 0; i < n; i++ {
			r := (s.cursor + i) % n
			if pass == 0 && (s.saturated(r) || (adapterOnly && !s.holdsAdapter(r))) {
				continue
			}
			if best < 0 || s.better(r, best) {
				best = r
				if s.opts.Placement == RoundRobin {
					break
				}
			}
		}
	}
	s.cursor = (best + 1) % n
	return best
}

// better reports whether rank a strictly beats rank b under the policy
// (equal loads keep the earlier rank in cursor order).
func (s *Scheduler) better(a, b int) bool {
	la, lb := &s.loads[a], &s.loads[b]
	qa, qb := la.Active+la.Queued, lb.Active+lb.Queued
	switch s.opts.Placement {
	case LeastTokens:
		if la.PromptTokens != lb.PromptTokens {
			return la.PromptTokens < lb.PromptTokens
		}
		return qa < qb
	case LeastQueued:
		if qa != qb {
			return qa < qb
		}
		return la.PromptTokens < lb.PromptTokens
	case KVAware:
		sa, sb := s.cachedOn(a)-la.PromptTokens, s.cachedOn(b)-lb.PromptTokens
		if sa != sb {
			return sa > sb
		}
		return qa < qb
	}
	return false
}

func (s *Scheduler) holdsAdapter(rank int) bool {
	return rank < len(s.adapterRanks) && s.adapterRanks[rank]
}

// adapterRankFree: some unsaturated rank holds the request's adapter.
func (s *Scheduler) adapterRankFree() bool {
	for r := range s.loads {
		if s.holdsAdapter(r) && !s.saturated(r) {
			return true
		}
	}
	return false
}

func (s *Scheduler) cachedOn(rank int) int {
	if rank < len(s.cached) {
		return s.cached[rank]
	}
	return 0
}

type ticketState uint8

const (
	ticketNone ticketState = iota
	ticketQueued
	ticketActive
	ticketDone
)

// Ticket is one placed request's share of a rank's load. The zero Ticket
// is inert. A Ticket is used by one goroutine (the request's) and must not
// be copied once started: Start and Finish record its state in place.
type Ticket struct {
	rank   int
	tokens int
	state  ticketState
}

// Rank is the rank the ticket's load is on.
func (t *Ticket) Rank() int { return t.rank }
