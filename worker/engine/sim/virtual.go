package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"time"

	"github.com/tether-project/tether/worker/engine"
	"github.com/tether-project/tether/worker/kvcache"
)

// VirtualRequest is one request for a VirtualRank.
type VirtualRequest struct {
	Phase engine.Phase
	// Hashes are the prompt's chained block hashes (internal/prefix, or a
	// trace's namespaced hash ids), one per cached block. The rank keeps
	// the slice until the request is released: do not modify it.
	Hashes       []uint64
	PromptTokens int
	OutputTokens int // completion tokens, >= 1 (context-only runs produce 1)
	// Adapter is the request's LoRA adapter ("" the base model). With
	// Config.MaxLoRAs set it must hold one of the rank's adapter slots
	// while it runs (lora.go).
	Adapter string
}

// VirtualResult is a request's computed schedule. Times named At are
// absolute engine times; the others are durations.
type VirtualResult struct {
	ArrivalAt    time.Duration
	StartAt      time.Duration // prefill (or transfer) began: blocks acquired
	FirstTokenAt time.Duration // first token out
	DoneAt       time.Duration // last token out; blocks released

	Queue    time.Duration // StartAt - ArrivalAt: FIFO prefill and KV-space waits
	Prefill  time.Duration
	Transfer time.Duration
	Decode   time.Duration
	TTFT     time.Duration // FirstTokenAt - ArrivalAt

	// AdapterLoad is the time spent loading the request's adapter into a
	// slot before its prefill (0 when the rank held it); LoadedAdapter
	// says a load happened.
	AdapterLoad   time.Duration
	LoadedAdapter bool

	TokenTime        time.Duration // one decode step of this request
	CachedTokens     int           // prompt tokens served from the cache
	TransferTokens   int           // generation-only: prompt tokens received
	CompletionTokens int

	// Stored and Removed are the block hashes this admission put into and
	// evicted from the rank's cache (the KV events it causes).
	Stored, Removed []uint64

	id uint64 // admission sequence number, for cancel
}

// VirtualRank is one ADP rank's cache and schedule in virtual time. It has
// no clock: callers pass the time of every call. It is not safe for
// concurrent use (Engine serializes per rank; the harness is single-threaded).
//
// Admissions apply their cache operations at their start time: Admit first
// releases every admitted request done by then, so the cache state seen by a
// request is the state at the moment its prefill begins, including blocks
// stored by requests ahead of it in the queue.
type VirtualRank struct {
	rank int
	cfg  Config

	cache         *kvcache.Cache
	prefillFreeAt time.Duration // when the rank's prefill resource is next free
	lastArrival   time.Duration
	pending       runHeap // admitted, not released: ordered by DoneAt, then admission
	// live are the admitted requests not done at the last call's time:
	// what Stats counts. pending cannot: an admission releases what is
	// done by its own start, which a queued request's is far after now.
	live   runHeap
	seq    uint64
	window hitWindow
	lora   loraSlots // LoRA adapter slots (lora.go)
}

// NewVirtualRank returns an idle rank (cfg's Ranks and TimeScale are ignored).
func NewVirtualRank(rank int, cfg Config) (*VirtualRank, error) {
	c, err := cfg.normalized()
	if err != nil {
		return nil, err
	}
	return &VirtualRank{
		rank:   rank,
		cfg:    c,
		cache:  kvcache.New(c.CapacityBlocks),
		window: newHitWindow(c.StatsWindow),
	}, nil
}

// PrefillTime is the compute time this rank spends prefilling uncached
// prompt tokens, without any wait (its fixed overhead plus the tokens at
// its prefill rate).
func (r *VirtualRank) PrefillTime(uncached int) time.Duration {
	return r.cfg.prefillTime(uncached)
}

// Admit schedules req arriving at now. Arrivals must not go back in time.
// Context and aggregated requests wait for the rank's prefill resource in
// FIFO order; every request waits for KV space while earlier requests hold
// it. A prompt needing more blocks than the rank has fails with
// ErrPromptTooLarge.
func (r *VirtualRank) Admit(now time.Duration, req VirtualRequest) (VirtualResult, error) {
	if now < r.lastArrival {
		return VirtualResult{}, fmt.Errorf("admit at %v after an arrival at %v: %w", now, r.lastArrival, ErrTimeWentBackwards)
	}
	if err := validateVirtual(req); err != nil {
		return VirtualResult{}, err
	}
	if len(req.Hashes) > r.cache.Capacity() {
		return VirtualResult{}, fmt.Errorf("rank %d: %d blocks, capacity %d: %w", r.rank, len(req.Hashes), r.cache.Capacity(), ErrPromptTooLarge)
	}
	r.lastArrival = now
	r.liveThrough(now)
	start := now
	usesPrefill := req.Phase != engine.PhaseGenerationOnly
	if usesPrefill {
		start = max(start, r.prefillFreeAt)
	}
	r.releaseThrough(start)
	var loaded bool
	if start, loaded = r.acquireAdapter(req.Adapter, start); loaded {
		start += r.cfg.LoRALoadTime // the load holds the rank before the prefill
	}
	hit, stored, removed, start, err := r.acquire(req.Hashes, start)
	if err != nil {
		return VirtualResult{}, err
	}
	res := VirtualResult{ArrivalAt: now, StartAt: start, Stored: stored, Removed: removed, LoadedAdapter: loaded}
	if loaded {
		res.AdapterLoad = r.cfg.LoRALoadTime
	}
	res.CachedTokens = min(hit*r.cfg.BlockSize, req.PromptTokens)
	occupancy := float64(r.cache.Used()) / float64(r.cache.Capacity())
	res.TokenTime = r.cfg.tokenTime(occupancy)
	r.times(&res, req, start)
	if usesPrefill {
		r.prefillFreeAt = res.FirstTokenAt
	}
	r.window.record(start, int64(req.PromptTokens), int64(res.CachedTokens))
	r.seq++
	res.id = r.seq
	a := &admitted{
		id: r.seq, doneAt: res.DoneAt, startAt: start, firstTokenAt: res.FirstTokenAt,
		promptTokens: req.PromptTokens, hashes: req.Hashes, usesPrefill: usesPrefill, adapter: req.Adapter,
	}
	if usesPrefill {
		a.uncached = req.PromptTokens - res.CachedTokens
	}
	heap.Push(&r.pending, a)
	heap.Push(&r.live, a)
	r.lora.hold(req.Adapter)
	return res, nil
}

// acquire takes the KV blocks of a prompt from start on: when the rank has
// no space, it waits for the running requests to finish one by one, in the
// order they end, and frees their blocks. It returns the blocks hit, the
// blocks stored and evicted, and when the request can start.
func (r *VirtualRank) acquire(hashes []uint64, start time.Duration) (hit int, stored, removed []uint64, at time.Duration, err error) {
	for {
		hit, stored, removed, err = r.cache.Acquire(hashes)
		if err == nil {
			return hit, stored, removed, start, nil
		}
		if !errors.Is(err, kvcache.ErrNoSpace) || len(r.pending) == 0 {
			return 0, nil, nil, start, fmt.Errorf("rank %d: acquire: %w", r.rank, err)
		}
		// Wait for the next running request to finish and free its blocks.
		next := heap.Pop(&r.pending).(*admitted)
		r.release(next)
		start = max(start, next.doneAt)
	}
}

// times fills res's phases for req starting at start: the transfer or the
// prefill to the first token, then one decode step per further token.
func (r *VirtualRank) times(res *VirtualResult, req VirtualRequest, start time.Duration) {
	switch req.Phase {
	case engine.PhaseGenerationOnly:
		res.TransferTokens = req.PromptTokens - res.CachedTokens
		res.Transfer = r.cfg.transferTime(res.TransferTokens)
		res.FirstTokenAt = start + res.Transfer
		res.CompletionTokens = req.OutputTokens
	case engine.PhaseContextOnly:
		res.Prefill = r.cfg.prefillTime(req.PromptTokens - res.CachedTokens)
		res.FirstTokenAt = start + res.Prefill
		res.CompletionTokens = 1
	default:
		res.Prefill = r.cfg.prefillTime(req.PromptTokens - res.CachedTokens)
		res.FirstTokenAt = start + res.Prefill
		res.CompletionTokens = req.OutputTokens
	}
	// The first token comes out of prefill (or, generation-only, from the
	// context side); each further token is one decode step.
	res.Decode = time.Duration(res.CompletionTokens-1) * res.TokenTime
	res.DoneAt = res.FirstTokenAt + res.Decode
	res.Queue = start - res.ArrivalAt
	res.TTFT = res.FirstTokenAt - res.ArrivalAt
}

func validateVirtual(req VirtualRequest) error {
	switch {
	case req.Phase > engine.PhaseGenerationOnly:
		return fmt.Errorf("unknown phase %d: %w", req.Phase, ErrInvalidRequest)
	case req.PromptTokens < 0:
		return fmt.Errorf("negative prompt tokens %d: %w", req.PromptTokens, ErrInvalidRequest)
	case req.OutputTokens < 1:
		return fmt.Errorf("output tokens must be at least 1, got %d: %w", req.OutputTokens, ErrInvalidRequest)
	}
	return nil
}

// Advance releases the blocks of every request done by now.
func (r *VirtualRank) Advance(now time.Duration) {
	r.releaseThrough(now)
	r.liveThrough(now)
}

// liveThrough forgets the requests done by now.
func (r *VirtualRank) liveThrough(now time.Duration) {
	for len(r.live) > 0 && r.live[0].doneAt <= now {
		heap.Pop(&r.live)
	}
}

func (r *VirtualRank) releaseThrough(t time.Duration) {
	for len(r.pending) > 0 && r.pending[0].doneAt <= t {
		r.release(heap.Pop(&r.pending).(*admitted))
	}
}

// release gives back what an admitted request held: its blocks and its
// adapter slot.
func (r *VirtualRank) release(a *admitted) {
	r.cache.Release(a.hashes)
	r.lora.unhold(a.adapter)
}

// cancel drops an admitted request at now: its blocks are released at once
// and, if it holds the last prefill slot, the slot is returned.
func (r *VirtualRank) cancel(id uint64, now time.Duration) {
	for i, p := range r.live {
		if p.id == id {
			heap.Remove(&r.live, i)
			break
		}
	}
	for i, p := range r.pending {
		if p.id != id {
			continue
		}
		heap.Remove(&r.pending, i)
		r.release(p)
		if p.usesPrefill && p.firstTokenAt == r.prefillFreeAt && now < p.firstTokenAt {
			r.prefillFreeAt = max(now, p.startAt)
		}
		return
	}
}

// Stats returns the rank's figures at now (after releasing what is done).
// Requests whose start is after now are queued; the others are active.
func (r *VirtualRank) Stats(now time.Duration) engine.RankStats {
	r.releaseThrough(now)
	r.liveThrough(now)
	s := engine.RankStats{
		Rank:          r.rank,
		KVBlocksUsed:  r.cache.Used(),
		KVBlocksTotal: r.cache.Capacity(),
		Evictions:     r.cache.Evictions(),
	}
	for _, p := range r.live {
		s.ActivePromptTokens += p.promptTokens
		s.PrefillTokens += p.prefillLeft(now)
		if p.startAt > now {
			s.QueuedRequests++
		} else {
			s.ActiveRequests++
		}
	}
	s.WindowLookupTokens, s.WindowHitTokens = r.window.sum(now)
	s.LoRAAdapters, s.LoRARunning, s.LoRALoads = r.lora.stats()
	return s
}

// Match is the number of leading blocks of hashes resident on the rank.
func (r *VirtualRank) Match(hashes []uint64) int { return r.cache.Match(hashes) }

// Contains reports whether block h is resident on the rank.
func (r *VirtualRank) Contains(h uint64) bool { return r.cache.Contains(h) }

// Referenced is the number of blocks held by admitted, unreleased requests.
func (r *VirtualRank) Referenced() int { return r.cache.Referenced() }

// admitted is one admitted request until its blocks are released.
type admitted struct {
	id                            uint64
	startAt, firstTokenAt, doneAt time.Duration
	promptTokens                  int
	uncached                      int // prompt tokens its prefill computes (0 without a prefill)
	hashes                        []uint64
	usesPrefill                   bool
	adapter                       string
}

// prefillLeft is the part of the request's prefill not computed by now.
func (a *admitted) prefillLeft(now time.Duration) int {
	return PrefillLeft(a.uncached, a.startAt, a.firstTokenAt, now)
}

// PrefillLeft is the part of a prefill of uncached tokens, running from
// start to firstToken at a constant rate, not computed by now: all of it
// before it starts, the rest while it runs, none after. The rank's
// PrefillTokens sums it over the admitted requests.
func PrefillLeft(uncached int, start, firstToken, now time.Duration) int {
	switch {
	case uncached <= 0 || now >= firstToken:
		return 0
	case now <= start:
		return uncached
	}
	return int(float64(uncached) * float64(firstToken-now) / float64(firstToken-start))
}

type runHeap []*admitted

func (h runHeap) Len() int { return len(h) }
func (h runHeap) Less(i, j int) bool {
	if h[i].doneAt != h[j].doneAt {
		return h[i].doneAt < h[j].doneAt
	}
	return h[i].id < h[j].id
}
func (h runHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *runHeap) Push(x any)   { *h = append(*h, x.(*admitted)) }
func (h *runHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

// hitWindow sums prompt tokens looked up and hit over a rolling window of
// engine time, in hitBuckets buckets (the window's edge moves a bucket at a
// time).
type hitWindow struct {
	width   time.Duration
	buckets [hitBuckets]hitBucket
}

const hitBuckets = 60

type hitBucket struct {
	index         int64 // absolute bucket number (time / width); -1 when empty
	lookups, hits int64
}

func newHitWindow(window time.Duration) hitWindow {
	w := hitWindow{width: max(window/hitBuckets, 1)}
	for i := range w.buckets {
		w.buckets[i].index = -1
	}
	return w
}

func (w *hitWindow) record(at time.Duration, lookups, hits int64) {
	idx := int64(at / w.width)
	b := &w.buckets[idx%hitBuckets]
	if b.index != idx {
		if b.index > idx {
			return // older than what the slot holds: already outside the window
		}
		*b = hitBucket{index: idx}
	}
	b.lookups += lookups
	b.hits += hits
}

// sum covers the buckets of the last window before now, plus any recorded
// ahead of now (requests already admitted to start later).
func (w *hitWindow) sum(now time.Duration) (lookups, hits int64) {
	oldest := int64(now/w.width) - hitBuckets + 1
	for _, b := range w.buckets {
		if b.index >= oldest {
			lookups += b.lookups
			hits += b.hits
		}
	}
	return lookups, hits
}
