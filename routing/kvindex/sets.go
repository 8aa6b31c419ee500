package kvindex

import (
	"encoding/binary"
	"slices"
)

// slot numbers one holder of blocks: an (instance, rank) pair, or an
// instance's "predicted" pseudo-rank.
type slot = uint16

const maxSlots = 1 << 16

// setID names an interned holder set; 0 is the empty set (a block nobody
// holds is simply absent from the index).
type setID = uint32

// holderSet is one distinct combination of holders. Blocks are mapped to
// interned sets (hash-consing): a conversation's hundreds of blocks share one
// set, so the block map's value is 4 bytes, the sets themselves stay hot in
// cache, and a walk over consecutive blocks with the same set skips the
// intersection entirely.
type holderSet struct {
	bits  []uint64     // stored holders, a bitset over slots (no trailing zero words)
	preds []prediction // predicted holders, sorted by slot
	refs  int          // blocks mapped to this set
	key   string       // intern key (canonical encoding of bits and preds)
}

// prediction marks a block as (probably) present on an instance until
// expires (unix nanoseconds), before the worker's stored event confirms it.
type prediction struct {
	slot    slot
	expires int64
}

func (s *holderSet) has(sl slot) bool {
	return int(sl)/64 < len(s.bits) && s.bits[sl/64]&(1<<(sl%64)) != 0
}

// liveInto ORs into out the holders of s (stored, and predicted ones live at
// now) that are also in alive. out must be as long as alive.
func (s *holderSet) liveInto(out, alive []uint64, now int64) {
	n := min(len(s.bits), len(alive))
	for w := 0; w < n; w++ {
		out[w] |= s.bits[w] & alive[w]
	}
	for _, p := range s.preds {
		sl := p.slot
		if p.expires > now && int(sl)/64 < len(alive) && alive[sl/64]&(1<<(sl%64)) != 0 {
			out[sl/64] |= 1 << (sl % 64)
		}
	}
}

// setOp is one change applied to a block's holder set.
type setOp struct {
	kind    uint8
	slot    slot
	time    int64    // opPredict: expiry; opUnpredict: now
	removed []uint64 // opPurge: slots to drop (stored and predicted)
}

const (
	opAdd       = 1 // add slot as a stored holder
	opRemove    = 2 // drop slot as a stored holder
	opPredict   = 3 // predict slot until time (a later expiry wins)
	opUnpredict = 4 // drop slot's prediction if it expired at or before time
	opPurge     = 5 // drop every slot in removed
)

// sets is the interning table plus the per-operation memo that makes bulk
// updates cheap: consecutive blocks usually share a set, so "set A + op →
// set B" is computed once per run, not once per block.
type sets struct {
	all      []holderSet
	free     []setID
	interned map[string]setID
	keyBuf   []byte
	bitsBuf  []uint64
	predBuf  []prediction
	memo     map[setID]setID // valid for one operation (see begin)
	dead     []setID         // sets whose refs reached 0 during the operation
}

func newSets() sets {
	return sets{
		all:      make([]holderSet, 1), // id 0: the empty set
		interned: make(map[string]setID),
		memo:     make(map[setID]setID),
	}
}

func (ss *sets) get(id setID) *holderSet { return &ss.all[id] }

// newOp starts one set operation: memoized transitions are valid for one op.
func (ss *sets) newOp() {
	if len(ss.memo) > 4096 {
		ss.memo = make(map[setID]setID) // clear is O(capacity); start small again
		return
	}
	clear(ss.memo)
}

// end frees sets that lost their last block during a write. Freeing is
// deferred to the end of the write so a memoized id is never reused within
// it.
func (ss *sets) end() {
	for _, id := range ss.dead {
		s := &ss.all[id]
		if s.refs != 0 || s.key == "" {
			continue
		}
		delete(ss.interned, s.key)
		*s = holderSet{}
		ss.free = append(ss.free, id)
	}
	ss.dead = ss.dead[:0]
}

// apply returns the set id for "from with op applied" (memoized per op).
func (ss *sets) apply(from setID, op *setOp) setID {
	if to, ok := ss.memo[from]; ok {
		return to
	}
	src := &ss.all[from]
	b := append(ss.bitsBuf[:0], src.bits...)
	p := append(ss.predBuf[:0], src.preds...)
	switch op.kind {
	case opAdd:
		for len(b) <= int(op.slot)/64 {
			b = append(b, 0)
		}
		b[op.slot/64] |= 1 << (op.slot % 64)
	case opRemove:
		if int(op.slot)/64 < len(b) {
			b[op.slot/64] &^= 1 << (op.slot % 64)
		}
	case opPredict:
		i, found := slices.BinarySearchFunc(p, op.slot, func(x prediction, s slot) int { return int(x.slot) - int(s) })
		if found {
			p[i].expires = max(p[i].expires, op.time)
		} else {
			p = slices.Insert(p, i, prediction{slot: op.slot, expires: op.time})
		}
	case opUnpredict:
		i, found := slices.BinarySearchFunc(p, op.slot, func(x prediction, s slot) int { return int(x.slot) - int(s) })
		if found && p[i].expires <= op.time {
			p = slices.Delete(p, i, i+1)
		}
	case opPurge:
		for w := range b {
			if w < len(op.removed) {
				b[w] &^= op.removed[w]
			}
		}
		p = slices.DeleteFunc(p, func(x prediction) bool { return inSet(op.removed, x.slot) })
	}
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	ss.bitsBuf, ss.predBuf = b, p
	to := ss.intern(b, p)
	ss.memo[from] = to
	return to
}

// intern returns the id of the set with exactly these holders, creating it
// if needed. b has no trailing zero words; p is sorted by slot.
func (ss *sets) intern(b []uint64, p []prediction) setID {
	if len(b) == 0 && len(p) == 0 {
		return 0
	}
	k := ss.keyBuf[:0]
	k = binary.AppendUvarint(k, uint64(len(b)))
	for _, w := range b {
		k = binary.LittleEndian.AppendUint64(k, w)
	}
	for _, x := range p {
		k = binary.LittleEndian.AppendUint16(k, x.slot)
		k = binary.LittleEndian.AppendUint64(k, uint64(x.expires))
	}
	ss.keyBuf = k
	if id, ok := ss.interned[string(k)]; ok {
		return id
	}
	var id setID
	if n := len(ss.free); n > 0 {
		id = ss.free[n-1]
		ss.free = ss.free[:n-1]
	} else {
		id = setID(len(ss.all))
		ss.all = append(ss.all, holderSet{})
	}
	s := holderSet{key: string(k)}
	if len(b) > 0 {
		s.bits = slices.Clone(b)
	}
	if len(p) > 0 {
		s.preds = slices.Clone(p)
	}
	ss.all[id] = s
	ss.interned[s.key] = id
	// A fresh set has no block yet; if the caller ends up not using it,
	// end() frees it.
	ss.dead = append(ss.dead, id)
	return id
}

// retarget moves one block's reference from one set to another.
func (ss *sets) retarget(from, to setID) {
	if from == to {
		return
	}
	if to != 0 {
		ss.all[to].refs++
	}
	if from != 0 {
		s := &ss.all[from]
		s.refs--
		if s.refs == 0 {
			ss.dead = append(ss.dead, from)
		}
	}
}

func inSet(set []uint64, s slot) bool {
	return int(s)/64 < len(set) && set[s/64]&(1<<(s%64)) != 0
}
