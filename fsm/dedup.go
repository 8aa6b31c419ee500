package fsm

import "crypto/sha256"

// The idempotency window: the ids of the most recent proposals, in two
// generations of dedupGeneration ids. When the current generation is full,
// the next id starts a new one and the previous generation is forgotten, so
// the window holds between 65,537 and 131,072 ids, a pure function of the log.
//
// Readers never consult the window; only the writer (Apply) and snapshots
// do. So it is stored as append-only arrays shared by every published state
// (a state sees its own prefix [:len]; the writer only writes past the
// longest published prefix, never over it), and membership is answered by a
// writer-private Go map kept in step with the state it was built for. That
// costs one map insert per proposal instead of a persistent-trie path copy.
const dedupGeneration = 65536

type dedupWindow struct {
	cur, prev       *dedupChunk // prev nil until the first rotation
	curLen, prevLen int
	curSum, prevSum lanes // multiset hash of each generation (see Hash)
}

type dedupChunk struct {
	owner uint64 // the machine that may append (0: nobody; copy first)
	ids   [dedupGeneration]ProposalID
}

func dedupDigest(id ProposalID) [32]byte {
	var buf [1 + proposalIDBytes]byte
	buf[0] = recDedup
	copy(buf[1:], id[:])
	return sha256.Sum256(buf[:])
}

// each visits the window's ids, current generation first, in apply order.
func (w *dedupWindow) each(fn func(gen int, id ProposalID)) {
	if w.cur != nil {
		for i := range w.curLen {
			fn(0, w.cur.ids[i])
		}
	}
	if w.prev != nil {
		for i := range w.prevLen {
			fn(1, w.prev.ids[i])
		}
	}
}

// dedupIndex is the writer's membership index for one state's window.
type dedupIndex struct {
	ids map[ProposalID]struct{}
	// The window the map describes; a mismatch means the state was replaced
	// (Restore) and the map must be rebuilt.
	cur, prev       *dedupChunk
	curLen, prevLen int
}

func (x *dedupIndex) syncedWith(w *dedupWindow) bool {
	return x.ids != nil && x.cur == w.cur && x.prev == w.prev && x.curLen == w.curLen && x.prevLen == w.prevLen
}

func (x *dedupIndex) rebuild(w *dedupWindow) {
	x.ids = make(map[ProposalID]struct{}, w.curLen+w.prevLen)
	w.each(func(_ int, id ProposalID) { x.ids[id] = struct{}{} })
	x.mark(w)
}

func (x *dedupIndex) mark(w *dedupWindow) {
	x.cur, x.prev, x.curLen, x.prevLen = w.cur, w.prev, w.curLen, w.prevLen
}

func (x *dedupIndex) contains(id ProposalID) bool {
	_, ok := x.ids[id]
	return ok
}

// add appends id to the window (rotating generations when the current one
// is full) and to the index. machine is the appending machine's id.
func (x *dedupIndex) add(w *dedupWindow, machine uint64, id ProposalID) {
	if w.cur == nil || w.curLen == dedupGeneration {
		if w.prev != nil {
			for i := range w.prevLen {
				delete(x.ids, w.prev.ids[i])
			}
		}
		if w.cur != nil {
			w.prev, w.prevLen, w.prevSum = w.cur, w.curLen, w.curSum
		}
		w.cur, w.curLen, w.curSum = &dedupChunk{owner: machine}, 0, lanes{}
	} else if w.cur.owner != machine {
		// Shared with another machine's lineage (a restored or adopted
		// state): take a private copy before appending.
		c := &dedupChunk{owner: machine}
		copy(c.ids[:w.curLen], w.cur.ids[:w.curLen])
		w.cur = c
	}
	w.cur.ids[w.curLen] = id
	w.curLen++
	d := dedupDigest(id)
	w.curSum.add(&d)
	x.ids[id] = struct{}{}
	x.mark(w)
}
