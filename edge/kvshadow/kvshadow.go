// Package kvshadow is the edge's model of the prefix caches of engines that
// publish no KV events (vLLM, SGLang or trtllm-serve configured directly as
// static workers): one paged LRU cache (worker/kvcache) per instance and
// rank, sized from the engine's reported KV capacity, fed by the prompts the
// edge routes there and corrected by each response's
// usage.prompt_tokens_details.cached_tokens.
//
// The shadow turns what it stores and evicts into sequence-numbered
// Approximate batches for the edge's KV index (routing/kvindex), so such an
// instance earns cache credit in placement, while the index never treats the
// shadow's "no" as evidence of eviction (docs/engines.md, the KV rows).
//
// It reads no clock and does no I/O: the same calls always produce the same
// batches. It is safe for concurrent use; batches reach the index in
// sequence order because they are applied under the shadow's lock.
package kvshadow

import (
	"fmt"
	"sync"

	"github.com/tether-project/tether/routing/kvindex"
	"github.com/tether-project/tether/worker/kvcache"
)

// MaxBlocksPerRank bounds one rank's shadow (memory: about 40 bytes a
// block), whatever capacity an engine reports.
const MaxBlocksPerRank = 1 << 22

// Index is where the shadow's batches go (*kvindex.Index).
type Index interface {
	Apply(b kvindex.Batch) (kvindex.Outcome, error)
}

// Shadows holds the shadow caches of every instance an edge models.
type Shadows struct {
	ix Index

	mu       sync.Mutex
	byID     map[string]*shadow
	nextBoot uint64
}

type shadow struct {
	ranks    []*kvcache.Cache
	capacity int // blocks per rank
	boot     uint64
	seq      uint64 // last batch sent to the index (0: none yet)
}

// Placement is what Route did, for the response's correction.
type Placement struct {
	Instance string
	Rank     int
	Boot     uint64
	// Hit is the number of leading prompt blocks the shadow held before
	// the request: the cache it predicted.
	Hit int
}

// New returns an empty set of shadows feeding ix. firstBoot numbers the
// shadows' boots (each shadow, and each rebuild, takes the next number); it
// should differ from any boot id the instances could report themselves.
func New(ix Index, firstBoot uint64) *Shadows {
	return &Shadows{ix: ix, byID: map[string]*shadow{}, nextBoot: max(firstBoot, 1)}
}

// Route records that the prompt with block hashes blocks was sent to
// instance on rank (negative: unknown, modelled as rank 0), an engine with
// ranks ranks of capacity blocks each. It returns the placement for
// Correct; ok is false when nothing was modelled (no blocks, no capacity).
// A changed capacity or rank count starts a new, empty shadow (a new boot):
// the index drops the old model at once.
func (s *Shadows) Route(instance string, rank, ranks, capacity int, blocks []uint64) (p Placement, ok bool, err error) {
	capacity = min(capacity, MaxBlocksPerRank)
	if instance == "" || capacity <= 0 || len(blocks) == 0 {
		return Placement{}, false, nil
	}
	ranks = min(max(ranks, 1), kvindex.MaxRanks)
	if rank < 0 || rank >= ranks {
		rank = 0
	}
	if len(blocks) > capacity {
		// A prompt longer than the cache: the engine keeps at most its
		// capacity, and a chain is only usable from its head.
		blocks = blocks[:capacity]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.byID[instance]
	if sh == nil || sh.capacity != capacity || len(sh.ranks) != ranks {
		sh = &shadow{ranks: make([]*kvcache.Cache, ranks), capacity: capacity, boot: s.nextBoot}
		s.nextBoot++
		s.byID[instance] = sh
	}
	c := sh.ranks[rank]
	if c == nil {
		c = kvcache.New(capacity)
		sh.ranks[rank] = c
	}
	// The request's blocks become the most recently used; they are not
	// held referenced for the request's lifetime (the edge does not know
	// when the engine frees them), so the model never runs out of room.
	hit, stored, removed, aerr := c.Acquire(blocks)
	if aerr != nil {
		return Placement{}, false, fmt.Errorf("kvshadow: route %s rank %d: %w", instance, rank, aerr)
	}
	c.Release(blocks)
	p = Placement{Instance: instance, Rank: rank, Boot: sh.boot, Hit: hit}
	if len(stored) == 0 && len(removed) == 0 && sh.seq > 0 {
		return p, true, nil
	}
	return p, true, s.sendLocked(instance, sh, kvindex.RankEvent{Rank: rank, Removed: removed, Stored: stored})
}

// Correct applies a response's report: the engine reused cachedBlocks
// leading blocks of the prompt routed at p. When that is fewer than the
// shadow predicted, the shadow held more than the engine: the prompt's
// chain beyond what the engine reported is evicted from the shadow, so the
// next request sharing it is credited only what the engine proved. The
// edge cannot tell an engine that evicted the chain (and has just
// recomputed it) from one that keeps less than the shadow thinks (a smaller
// cache, other edges' traffic, prefix caching off); it believes the engine.
// A correction for a shadow rebuilt since Route is ignored.
func (s *Shadows) Correct(p Placement, blocks []uint64, cachedBlocks int) error {
	if cachedBlocks < 0 || cachedBlocks >= p.Hit {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.byID[p.Instance]
	if sh == nil || sh.boot != p.Boot || p.Rank >= len(sh.ranks) || sh.ranks[p.Rank] == nil {
		return nil
	}
	blocks = blocks[:min(len(blocks), sh.capacity)]
	removed := sh.ranks[p.Rank].Remove(blocks[min(cachedBlocks, len(blocks)):])
	if len(removed) == 0 {
		return nil
	}
	return s.sendLocked(p.Instance, sh, kvindex.RankEvent{Rank: p.Rank, Removed: removed})
}

// Forget drops instance's shadow (the instance left, or publishes its own
// KV events now). It does not touch the index.
func (s *Shadows) Forget(instance string) {
	s.mu.Lock()
	delete(s.byID, instance)
	s.mu.Unlock()
}

// Has reports whether instance is modelled.
func (s *Shadows) Has(instance string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[instance] != nil
}

// sendLocked applies the next batch of sh to the index. Seq 1 of a boot is
// the baseline: the index drops whatever it held for the instance before.
// A refused batch leaves the index's copy stale, so the shadow starts over
// under a new boot at the next Route.
func (s *Shadows) sendLocked(instance string, sh *shadow, ev kvindex.RankEvent) error {
	sh.seq++
	out, err := s.ix.Apply(kvindex.Batch{Instance: instance, Boot: sh.boot, Seq: sh.seq, Approximate: true,
		Events: []kvindex.RankEvent{ev}})
	if err == nil && out != kvindex.Applied {
		err = fmt.Errorf("index answered %v", out)
	}
	if err != nil {
		delete(s.byID, instance)
		return fmt.Errorf("kvshadow: %s boot %d seq %d: %w", instance, sh.boot, sh.seq, err)
	}
	return nil
}
