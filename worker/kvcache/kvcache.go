// Package kvcache is one attention-DP rank's paged prefix cache: fixed-size
// token blocks named by chained block hashes (internal/prefix), a fixed
// capacity in blocks, reference counts while requests run, and LRU eviction of
// unreferenced blocks only.
//
// A Cache is not safe for concurrent use: each rank has its own cache and its
// caller serializes the calls (the simulated engine holds the rank's lock).
// It has no clock and no randomness, so the same call sequence always stores
// and evicts the same blocks.
package kvcache

import (
	"errors"
	"fmt"
)

// ErrNoSpace is returned (wrapped) by Acquire when a request needs more
// blocks than the cache can free by evicting unreferenced blocks.
var ErrNoSpace = errors.New("kvcache: not enough free blocks")

const none = -1

// entry is one resident block. Unreferenced entries sit on the LRU list;
// referenced ones are off it (they cannot be evicted).
type entry struct {
	hash       uint64
	refs       int32
	prev, next int32  // LRU neighbours (toward the MRU head, toward the LRU tail)
	mark       uint32 // Acquire's epoch: counts each resident block once per call
}

// Cache holds up to Capacity blocks.
type Cache struct {
	capacity   int
	index      hashTable
	entries    []entry // grows up to capacity, then recycled through free
	free       []int32
	head, tail int32 // LRU list of unreferenced entries: head most recent
	lruLen     int
	referenced int
	evictions  int64
	epoch      uint32
}

// New returns an empty cache of capacityBlocks blocks (negative means 0).
func New(capacityBlocks int) *Cache {
	if capacityBlocks < 0 {
		capacityBlocks = 0
	}
	return &Cache{
		capacity: capacityBlocks,
		index:    newHashTable(min(capacityBlocks, 4096)),
		head:     none,
		tail:     none,
	}
}

// Capacity is the number of blocks the cache can hold.
func (c *Cache) Capacity() int { return c.capacity }

// Used is the number of resident blocks, referenced or not.
func (c *Cache) Used() int { return c.index.count }

// Referenced is the number of resident blocks held by running requests.
func (c *Cache) Referenced() int { return c.referenced }

// Evictions is the number of blocks evicted since the cache was created.
func (c *Cache) Evictions() int64 { return c.evictions }

// Contains reports whether block h is resident.
func (c *Cache) Contains(h uint64) bool {
	_, ok := c.index.get(h)
	return ok
}

// Match returns how many leading blocks of hashes are resident. It changes
// nothing (no recency update) and does not allocate.
func (c *Cache) Match(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := c.index.get(h); !ok {
			return i
		}
	}
	return len(hashes)
}

// Acquire references every block of hashes for a running request, inserting
// the missing ones and evicting least recently used unreferenced blocks to
// make room. hitBlocks is the number of leading blocks that were already
// resident (the reusable prefix); stored and removed list the hashes that
// entered and left the cache, for KV events (nil when none).
//
// If the missing blocks cannot all fit, Acquire returns an error wrapping
// ErrNoSpace and changes nothing. A hash repeated within one call is
// referenced once per occurrence (Release it as often); the space check then
// counts each missing occurrence, which is conservative.
func (c *Cache) Acquire(hashes []uint64) (hitBlocks int, stored, removed []uint64, err error) {
	if len(hashes) == 0 {
		return 0, nil, nil, nil
	}
	c.epoch++
	if c.epoch == 0 { // wrapped: clear stale marks so none equals the new epoch
		for i := range c.entries {
			c.entries[i].mark = 0
		}
		c.epoch = 1
	}
	hitBlocks = len(hashes)
	missing, ownUnreferenced := 0, 0
	for i, h := range hashes {
		idx, ok := c.index.get(h)
		if !ok {
			if hitBlocks == len(hashes) {
				hitBlocks = i
			}
			missing++
			continue
		}
		e := &c.entries[idx]
		if e.mark != c.epoch {
			e.mark = c.epoch
			if e.refs == 0 {
				ownUnreferenced++
			}
		}
	}
	// Blocks of this request that are unreferenced now will be referenced
	// below, so they are not available for eviction.
	available := (c.capacity - c.index.count) + (c.lruLen - ownUnreferenced)
	if missing > available {
		return 0, nil, nil, fmt.Errorf("acquire %d blocks (%d missing): %d can be freed of %d: %w",
			len(hashes), missing, available, c.capacity, ErrNoSpace)
	}
	// Reference the resident blocks first so that evicting for the missing
	// ones can never take a block of this same request.
	for _, h := range hashes {
		if idx, ok := c.index.get(h); ok {
			c.ref(idx)
		}
	}
	for _, h := range hashes {
		if idx, ok := c.index.get(h); ok {
			if c.entries[idx].mark != c.epoch { // inserted earlier in this call
				c.ref(idx)
			}
			continue
		}
		if c.index.count >= c.capacity {
			removed = append(removed, c.evictOldest())
		}
		idx := c.newEntry(h)
		c.index.put(h, idx)
		c.entries[idx].refs = 1 // a new entry is referenced, never on the LRU list
		c.referenced++
		stored = append(stored, h)
	}
	return hitBlocks, stored, removed, nil
}

// Release unreferences every block of hashes (as taken by Acquire). Blocks
// stay cached and become most recently used; they are released tail first so
// that, at equal recency, a chain's later blocks are evicted before its
// earlier ones and Match keeps working on the surviving prefix. Hashes that
// are not resident or not referenced are ignored.
func (c *Cache) Release(hashes []uint64) {
	for i := len(hashes) - 1; i >= 0; i-- {
		idx, ok := c.index.get(hashes[i])
		if !ok {
			continue
		}
		e := &c.entries[idx]
		if e.refs == 0 {
			continue
		}
		e.refs--
		if e.refs == 0 {
			c.referenced--
			c.pushFront(idx)
		}
	}
}

// Remove evicts the unreferenced resident blocks among hashes (a block a
// running request holds stays) and returns the hashes it removed, for KV
// events (nil when none). The edge's shadow of an engine's cache uses it
// when the engine reports less cache than the shadow predicted.
func (c *Cache) Remove(hashes []uint64) (removed []uint64) {
	for _, h := range hashes {
		idx, ok := c.index.get(h)
		if !ok || c.entries[idx].refs != 0 {
			continue
		}
		c.unlink(idx)
		c.index.remove(h)
		c.free = append(c.free, idx)
		c.evictions++
		removed = append(removed, h)
	}
	return removed
}

func (c *Cache) ref(idx int32) {
	e := &c.entries[idx]
	if e.refs == 0 {
		c.unlink(idx)
		c.referenced++
	}
	e.refs++
}

func (c *Cache) newEntry(h uint64) int32 {
	var idx int32
	if n := len(c.free); n > 0 {
		idx = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		c.entries = append(c.entries, entry{})
		idx = int32(len(c.entries) - 1)
	}
	// mark is left unequal to the epoch: Acquire tells blocks inserted in
	// this call from those referenced in its first pass by the mark.
	c.entries[idx] = entry{hash: h, prev: none, next: none, mark: c.epoch - 1}
	return idx
}

// evictOldest removes the LRU tail (the caller checked there is one).
func (c *Cache) evictOldest() uint64 {
	idx := c.tail
	c.unlink(idx)
	h := c.entries[idx].hash
	c.index.remove(h)
	c.free = append(c.free, idx)
	c.evictions++
	return h
}

func (c *Cache) pushFront(idx int32) {
	e := &c.entries[idx]
	e.prev, e.next = none, c.head
	if c.head != none {
		c.entries[c.head].prev = idx
	} else {
		c.tail = idx
	}
	c.head = idx
	c.lruLen++
}

// unlink takes an unreferenced entry off the LRU list.
func (c *Cache) unlink(idx int32) {
	e := &c.entries[idx]
	if e.prev != none {
		c.entries[e.prev].next = e.next
	} else {
		c.head = e.next
	}
	if e.next != none {
		c.entries[e.next].prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = none, none
	c.lruLen--
}
