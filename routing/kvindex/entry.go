package kvindex

import "math/bits"

// slot numbers one holder of blocks: an (instance, rank) pair, or an
// instance's "predicted" pseudo-rank. uint16 keeps entries small; the index
// refuses to allocate more than maxSlots holders.
type slot = uint16

const maxSlots = 1 << 16

// smallHolders is how many holders an entry lists inline before it switches
// to a bitset over slots. Most blocks are held by one or two ranks (a
// conversation's own history); shared system prompts and tool definitions are
// held by many, and for those a bitset AND beats a list walk.
const smallHolders = 6

// entry is what the index knows about one block hash.
type entry struct {
	n     uint8              // holders listed in small (when dense == nil)
	small [smallHolders]slot // holder slots, unordered
	dense []uint64           // holder bitset over slots, once more than smallHolders hold the block
	preds []prediction       // instances predicted to hold the block, with expiry
}

// prediction marks a block as (probably) present on an instance until
// expires (unix nanoseconds), before the worker's stored event confirms it.
type prediction struct {
	slot    slot
	expires int64
}

func (e *entry) empty() bool {
	if len(e.preds) > 0 {
		return false
	}
	if e.dense == nil {
		return e.n == 0
	}
	for _, w := range e.dense {
		if w != 0 {
			return false
		}
	}
	return true
}

// add records s as a holder; it reports whether s was not a holder before.
func (e *entry) add(s slot) bool {
	if e.dense != nil {
		w, b := int(s)/64, uint(s)%64
		if w >= len(e.dense) {
			grown := make([]uint64, w+1)
			copy(grown, e.dense)
			e.dense = grown
		}
		if e.dense[w]&(1<<b) != 0 {
			return false
		}
		e.dense[w] |= 1 << b
		return true
	}
	for i := 0; i < int(e.n); i++ {
		if e.small[i] == s {
			return false
		}
	}
	if int(e.n) < smallHolders {
		e.small[e.n] = s
		e.n++
		return true
	}
	// Switch to a bitset sized for the largest holder.
	maxSlot := s
	for i := 0; i < int(e.n); i++ {
		maxSlot = max(maxSlot, e.small[i])
	}
	e.dense = make([]uint64, int(maxSlot)/64+1)
	for i := 0; i < int(e.n); i++ {
		e.dense[e.small[i]/64] |= 1 << (e.small[i] % 64)
	}
	e.dense[s/64] |= 1 << (s % 64)
	e.n = 0
	return true
}

// remove drops s as a holder; it reports whether s was a holder.
func (e *entry) remove(s slot) bool {
	if e.dense != nil {
		w, b := int(s)/64, uint(s)%64
		if w >= len(e.dense) || e.dense[w]&(1<<b) == 0 {
			return false
		}
		e.dense[w] &^= 1 << b
		return true
	}
	for i := 0; i < int(e.n); i++ {
		if e.small[i] == s {
			e.n--
			e.small[i] = e.small[e.n]
			return true
		}
	}
	return false
}

// removeSet drops every holder and prediction whose slot is in set; it
// reports how many stored holders it removed.
func (e *entry) removeSet(set []uint64) int {
	removed := 0
	if e.dense != nil {
		for w := range e.dense {
			if w < len(set) {
				removed += bits.OnesCount64(e.dense[w] & set[w])
				e.dense[w] &^= set[w]
			}
		}
	} else {
		for i := 0; i < int(e.n); {
			if inSet(set, e.small[i]) {
				e.n--
				e.small[i] = e.small[e.n]
				removed++
				continue
			}
			i++
		}
	}
	kept := e.preds[:0]
	for _, p := range e.preds {
		if !inSet(set, p.slot) {
			kept = append(kept, p)
		}
	}
	clear(e.preds[len(kept):])
	e.preds = kept
	if len(e.preds) == 0 {
		e.preds = nil
	}
	return removed
}

// predict marks s as predicted until expires (the later expiry wins).
func (e *entry) predict(s slot, expires int64) {
	for i := range e.preds {
		if e.preds[i].slot == s {
			e.preds[i].expires = max(e.preds[i].expires, expires)
			return
		}
	}
	e.preds = append(e.preds, prediction{slot: s, expires: expires})
}

// unpredict drops s's prediction if it expired at or before now (a later
// prediction of the same block keeps it).
func (e *entry) unpredict(s slot, now int64) {
	for i := range e.preds {
		if e.preds[i].slot == s {
			if e.preds[i].expires <= now {
				last := len(e.preds) - 1
				e.preds[i] = e.preds[last]
				e.preds = e.preds[:last]
				if len(e.preds) == 0 {
					e.preds = nil
				}
			}
			return
		}
	}
}

// holdersInto ORs e's holders (and its predictions live at now) that are
// also in alive into out. out must be as long as alive.
func (e *entry) holdersInto(out, alive []uint64, now int64) {
	if e.dense != nil {
		n := min(len(e.dense), len(alive))
		for w := 0; w < n; w++ {
			out[w] |= e.dense[w] & alive[w]
		}
	} else {
		for i := 0; i < int(e.n); i++ {
			s := e.small[i]
			if int(s)/64 < len(alive) && alive[s/64]&(1<<(s%64)) != 0 {
				out[s/64] |= 1 << (s % 64)
			}
		}
	}
	for _, p := range e.preds {
		s := p.slot
		if p.expires > now && int(s)/64 < len(alive) && alive[s/64]&(1<<(s%64)) != 0 {
			out[s/64] |= 1 << (s % 64)
		}
	}
}

func inSet(set []uint64, s slot) bool {
	return int(s)/64 < len(set) && set[s/64]&(1<<(s%64)) != 0
}
