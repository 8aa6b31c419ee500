package adp

import "sync"

// Continuations: a request without a conversation key whose prompt begins
// with the whole prompt of a recent unkeyed request is that request's
// conversation going on (an agent loop's next call: the OpenAI Agents SDK
// sends no session key by default), and runs on the rank that request ran
// on, where its prefix is cached. A new conversation that only shares a
// prefix with others (a system prompt) does not continue any of them and
// is placed by the policy.
//
// The scheduler remembers, for each recent unkeyed prompt, its length,
// its hash and its rank, indexed by the hash of its leading whole
// ContinuationBlock-token blocks. A prompt is looked up at each of its own
// block boundaries, from the longest, and a candidate is confirmed by
// hashing the prompt up to the candidate's length: the prompts must agree
// token for token (up to 64-bit hash collisions), not only block by block.
// The index holds at most MaxSessions prompts (least recently used first
// out) and costs one hash pass over the prompt, outside the lock.

// ContinuationBlock is the granularity of the continuation index: prompts
// shorter than one block are not remembered (an engine caches whole blocks
// only, so they leave nothing to reuse).
const ContinuationBlock = 16

const (
	contSeed  = 14695981039346656037 // FNV-1a offset basis
	contPrime = 1099511628211        // FNV-1a prime
)

func contStep(h uint64, tok uint32) uint64 { return (h ^ uint64(tok)) * contPrime }

// promptHashes is one prompt's hash state at each block boundary (index j:
// after j*ContinuationBlock tokens) and after its last token.
type promptHashes struct {
	bounds []uint64
	full   uint64
	n      int
}

var hashPool = sync.Pool{New: func() any { return &promptHashes{bounds: make([]uint64, 0, 256)} }}

// hashPrompt computes p's hashes (put them back with release).
func hashPrompt(p []uint32) *promptHashes {
	ph := hashPool.Get().(*promptHashes)
	ph.bounds, ph.n = ph.bounds[:0], len(p)
	h := uint64(contSeed)
	for i, tok := range p {
		if i%ContinuationBlock == 0 {
			ph.bounds = append(ph.bounds, h)
		}
		h = contStep(h, tok)
	}
	if len(p)%ContinuationBlock == 0 {
		ph.bounds = append(ph.bounds, h)
	}
	ph.full = h
	return ph
}

func (ph *promptHashes) release() {
	if ph != nil && cap(ph.bounds) <= 1<<16 {
		hashPool.Put(ph)
	}
}

// contEntry is one remembered prompt.
type contEntry struct {
	key        uint64 // hash at its last block boundary (the index key)
	full       uint64 // hash of the whole prompt
	n          int    // its length in tokens
	rank       int
	prev, next int32 // recency list (-1: none)
}

// continuationIndex is the bounded index of recent unkeyed prompts.
type continuationIndex struct {
	byKey      map[uint64]int32
	nodes      []contEntry
	free       []int32
	head, tail int32 // most and least recently used
}

func newContinuationIndex() continuationIndex {
	return continuationIndex{byKey: map[uint64]int32{}, head: -1, tail: -1}
}

func (c *continuationIndex) len() int { return len(c.byKey) }

// lookup returns the rank of the longest remembered prompt that p (its
// hashes ph) begins with, and true; it refreshes that entry's recency.
func (c *continuationIndex) lookup(p []uint32, ph *promptHashes) (int, bool) {
	for j := len(ph.bounds) - 1; j >= 0; j-- {
		i, ok := c.byKey[ph.bounds[j]]
		if !ok {
			continue
		}
		e := &c.nodes[i]
		start := j * ContinuationBlock
		if e.n < start || e.n >= start+ContinuationBlock || e.n > len(p) {
			continue
		}
		h := ph.bounds[j]
		for _, tok := range p[start:e.n] {
			h = contStep(h, tok)
		}
		if h != e.full {
			continue
		}
		c.touch(i)
		return e.rank, true
	}
	return 0, false
}

// remember records p (its hashes ph) as run on rank, replacing the prompt
// with the same leading blocks, evicting the least recently used beyond
// max entries.
func (c *continuationIndex) remember(ph *promptHashes, rank, max int) {
	if ph.n < ContinuationBlock {
		return
	}
	key := ph.bounds[ph.n/ContinuationBlock]
	if i, ok := c.byKey[key]; ok {
		e := &c.nodes[i]
		e.full, e.n, e.rank = ph.full, ph.n, rank
		c.touch(i)
		return
	}
	if len(c.byKey) >= max && c.tail >= 0 {
		c.remove(c.tail)
	}
	var i int32
	if n := len(c.free); n > 0 {
		i, c.free = c.free[n-1], c.free[:n-1]
	} else {
		c.nodes = append(c.nodes, contEntry{})
		i = int32(len(c.nodes) - 1)
	}
	c.nodes[i] = contEntry{key: key, full: ph.full, n: ph.n, rank: rank, prev: -1, next: c.head}
	if c.head >= 0 {
		c.nodes[c.head].prev = i
	}
	c.head = i
	if c.tail < 0 {
		c.tail = i
	}
	c.byKey[key] = i
}

func (c *continuationIndex) unlink(i int32) {
	e := &c.nodes[i]
	if e.prev >= 0 {
		c.nodes[e.prev].next = e.next
	} else {
		c.head = e.next
	}
	if e.next >= 0 {
		c.nodes[e.next].prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = -1, -1
}

func (c *continuationIndex) touch(i int32) {
	if c.head == i {
		return
	}
	c.unlink(i)
	e := &c.nodes[i]
	e.next = c.head
	if c.head >= 0 {
		c.nodes[c.head].prev = i
	}
	c.head = i
	if c.tail < 0 {
		c.tail = i
	}
}

func (c *continuationIndex) remove(i int32) {
	c.unlink(i)
	delete(c.byKey, c.nodes[i].key)
	c.free = append(c.free, i)
}
