package fsm

import (
	"math/bits"
	"slices"
)

// lruTree orders bindings by recency. Every Bind, Touch or moving Overflow
// gives the binding the next value of a state-wide sequence number, and
// LastUsed is set to the state time, which never goes backwards. So sequence
// order is LastUsed order, with ties at one log time broken by apply order,
// and recency order needs no comparison of times or keys at all: the tree is
// a persistent 32-way radix trie over the sequence number. New entries go to
// the right edge (one shared path per batch), the least recently used binding
// is the leftmost leaf, and removals copy one root-to-leaf path.
type lruTree struct {
	root   *lnode
	height uint // levels above the leaves; the root covers 32^(height+1) sequence numbers
}

type lnode struct {
	owner  uint64
	bitmap uint32
	kids   []*lnode      // inner nodes
	recs   []*bindingRec // leaves (height 0)
}

func (n *lnode) editable(owner uint64) *lnode {
	if n.owner == owner {
		return n
	}
	return &lnode{owner: owner, bitmap: n.bitmap, kids: slices.Clone(n.kids), recs: slices.Clone(n.recs)}
}

func lruSpan(height uint) uint64 {
	if (height+1)*hamtBits >= 64 {
		return 0 // covers the whole uint64 range
	}
	return 1 << ((height + 1) * hamtBits)
}

func (t *lruTree) insert(owner uint64, seq uint64, rec *bindingRec) {
	for span := lruSpan(t.height); span != 0 && seq >= span; span = lruSpan(t.height) {
		if t.root != nil {
			t.root = &lnode{owner: owner, bitmap: 1, kids: []*lnode{t.root}}
		}
		t.height++
	}
	if t.root == nil {
		t.root = &lnode{owner: owner}
	}
	t.root = t.root.insert(owner, t.height, seq, rec)
}

func (n *lnode) insert(owner uint64, height uint, seq uint64, rec *bindingRec) *lnode {
	e := n.editable(owner)
	idx := (seq >> (height * hamtBits)) & hamtMask
	bit := uint32(1) << idx
	pos := bits.OnesCount32(e.bitmap & (bit - 1))
	if height == 0 {
		if e.bitmap&bit != 0 {
			e.recs[pos] = rec
		} else {
			e.bitmap |= bit
			e.recs = slices.Insert(e.recs, pos, rec)
		}
		return e
	}
	if e.bitmap&bit != 0 {
		e.kids[pos] = e.kids[pos].insert(owner, height-1, seq, rec)
	} else {
		e.bitmap |= bit
		e.kids = slices.Insert(e.kids, pos, (&lnode{owner: owner}).insert(owner, height-1, seq, rec))
	}
	return e
}

func (t *lruTree) delete(owner uint64, seq uint64) {
	if t.root == nil {
		return
	}
	if span := lruSpan(t.height); span != 0 && seq >= span {
		return
	}
	t.root = t.root.delete(owner, t.height, seq)
}

// delete returns nil when the node became empty.
func (n *lnode) delete(owner uint64, height uint, seq uint64) *lnode {
	idx := (seq >> (height * hamtBits)) & hamtMask
	bit := uint32(1) << idx
	if n.bitmap&bit == 0 {
		return n
	}
	pos := bits.OnesCount32(n.bitmap & (bit - 1))
	if n.bitmap == bit {
		if height == 0 {
			return nil
		}
		if kid := n.kids[0].delete(owner, height-1, seq); kid == nil {
			return nil
		} else if kid == n.kids[0] {
			return n
		} else {
			e := n.editable(owner)
			e.kids[0] = kid
			return e
		}
	}
	if height == 0 {
		e := n.editable(owner)
		e.bitmap &^= bit
		e.recs = slices.Delete(e.recs, pos, pos+1)
		return e
	}
	kid := n.kids[pos].delete(owner, height-1, seq)
	if kid == n.kids[pos] {
		return n
	}
	e := n.editable(owner)
	if kid == nil {
		e.bitmap &^= bit
		e.kids = slices.Delete(e.kids, pos, pos+1)
	} else {
		e.kids[pos] = kid
	}
	return e
}

// oldest returns the least recently used binding.
func (t *lruTree) oldest() (*bindingRec, bool) {
	n := t.root
	if n == nil {
		return nil, false
	}
	for len(n.kids) > 0 {
		n = n.kids[0]
	}
	if len(n.recs) == 0 {
		return nil, false
	}
	return n.recs[0], true
}

// each visits bindings from least to most recently used until fn returns false.
func (t *lruTree) each(fn func(*bindingRec) bool) bool {
	if t.root == nil {
		return true
	}
	return t.root.each(fn)
}

func (n *lnode) each(fn func(*bindingRec) bool) bool {
	for _, k := range n.kids {
		if !k.each(fn) {
			return false
		}
	}
	for _, r := range n.recs {
		if !fn(r) {
			return false
		}
	}
	return true
}
