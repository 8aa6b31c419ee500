package cluster

import (
	"sort"
	"sync"
)

// recentHashes (a ring buffer, not a hash ring) keeps the state hash after each of the most recently applied
// command entries, so a node can answer "what was the state hash at exactly
// index N" after it moved past N (tether audit verify compares a copied
// archive's replay with a live edge that kept applying). The fsm hash is
// O(1) to compute, so recording it per entry costs one SHA-256 of ~250
// bytes; the ring bounds memory at 40 bytes per entry.
type recentHashes struct {
	mu    sync.RWMutex
	slots []hashAt
	start int // position of the oldest entry
	n     int // entries held
}

type hashAt struct {
	index uint64
	hash  [32]byte
}

func newRecentHashes(size int) *recentHashes { return &recentHashes{slots: make([]hashAt, size)} }

// add records the hash of the state at index. Indexes must increase; an
// index at or below the newest one (a restore to an older state) starts the
// ring over.
func (r *recentHashes) add(index uint64, hash [32]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n > 0 && index <= r.at(r.n-1).index {
		r.start, r.n = 0, 0
	}
	if r.n < len(r.slots) {
		r.slots[(r.start+r.n)%len(r.slots)] = hashAt{index, hash}
		r.n++
		return
	}
	r.slots[r.start] = hashAt{index, hash}
	r.start = (r.start + 1) % len(r.slots)
}

// reset forgets everything (the state was replaced from a snapshot).
func (r *recentHashes) reset() {
	r.mu.Lock()
	r.start, r.n = 0, 0
	r.mu.Unlock()
}

func (r *recentHashes) at(i int) hashAt { return r.slots[(r.start+i)%len(r.slots)] }

// lookup returns the hash recorded for exactly index.
func (r *recentHashes) lookup(index uint64) ([32]byte, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	i := sort.Search(r.n, func(i int) bool { return r.at(i).index >= index })
	if i == r.n || r.at(i).index != index {
		return [32]byte{}, false
	}
	return r.at(i).hash, true
}

// span is the oldest and newest index held (0, 0 when empty).
func (r *recentHashes) span() (oldest, newest uint64) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.n == 0 {
		return 0, 0
	}
	return r.at(0).index, r.at(r.n - 1).index
}
