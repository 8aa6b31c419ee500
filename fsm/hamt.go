package fsm

import (
	"math/bits"
	"slices"
	"strings"
)

// mapValue is what a pmap stores: immutable records that carry their own key.
type mapValue interface {
	mapKey() (tag uint8, key string)
}

// pmap is a persistent hash array mapped trie keyed by (tag, key) with the
// fixed hashKey. Published maps are never modified; an update copies the
// path from the root to the changed slot (at most 13 nodes, typically 4-5 at
// a million entries). Nodes created by the transaction identified by owner
// are modified in place, so a batch of updates copies each path once.
//
// Each level consumes 5 bits of the hash (32-way nodes, bitmap-compressed);
// after 13 levels the 64 bits are spent and full-hash collisions share a
// collision node whose slots are sorted by key, so iteration stays
// deterministic.
type pmap[V mapValue] struct {
	root *hnode[V]
	n    int
}

type hnode[V mapValue] struct {
	owner  uint64
	bitmap uint32 // unused in collision nodes
	slots  []hslot[V]
}

type hslot[V mapValue] struct {
	hash  uint64
	child *hnode[V] // non-nil: a subtree; nil: a leaf holding val
	val   V
}

const (
	hamtBits       = 5
	hamtMask       = 1<<hamtBits - 1
	hamtCollisions = 65 // a node at this shift or deeper is a collision node
)

// keyHashMask narrows the trie hash; tests set it low to force deep paths
// and full-hash collisions. It is all ones in every build.
var keyHashMask = ^uint64(0)

func trieHash(tag uint8, key string) uint64 { return hashKey(tag, key) & keyHashMask }

func (m *pmap[V]) len() int { return m.n }

func (m *pmap[V]) get(tag uint8, key string) (V, bool) {
	return m.getHashed(trieHash(tag, key), tag, key)
}

func (m *pmap[V]) getHashed(h uint64, tag uint8, key string) (V, bool) {
	n := m.root
	for shift := uint(0); n != nil; shift += hamtBits {
		if shift >= hamtCollisions {
			for i := range n.slots {
				if t, k := n.slots[i].val.mapKey(); t == tag && k == key {
					return n.slots[i].val, true
				}
			}
			break
		}
		bit := uint32(1) << ((h >> shift) & hamtMask)
		if n.bitmap&bit == 0 {
			break
		}
		s := &n.slots[bits.OnesCount32(n.bitmap&(bit-1))]
		if s.child != nil {
			n = s.child
			continue
		}
		if s.hash == h {
			if t, k := s.val.mapKey(); t == tag && k == key {
				return s.val, true
			}
		}
		break
	}
	var zero V
	return zero, false
}

// set inserts or replaces v under its own key, returning the value replaced.
func (m *pmap[V]) set(owner uint64, v V) (old V, replaced bool) {
	tag, key := v.mapKey()
	h := trieHash(tag, key)
	if m.root == nil {
		m.root = &hnode[V]{owner: owner}
	}
	m.root, old, replaced = m.root.set(owner, 0, h, tag, key, v)
	if !replaced {
		m.n++
	}
	return old, replaced
}

func (n *hnode[V]) editable(owner uint64) *hnode[V] {
	if n.owner == owner {
		return n
	}
	return &hnode[V]{owner: owner, bitmap: n.bitmap, slots: slices.Clone(n.slots)}
}

func (n *hnode[V]) set(owner uint64, shift uint, h uint64, tag uint8, key string, v V) (*hnode[V], V, bool) {
	var zero V
	if shift >= hamtCollisions {
		for i := range n.slots {
			t, k := n.slots[i].val.mapKey()
			if t == tag && k == key {
				e := n.editable(owner)
				old := e.slots[i].val
				e.slots[i].val = v
				return e, old, true
			}
		}
		e := n.editable(owner)
		at, _ := slices.BinarySearchFunc(e.slots, v, compareSlotKey[V])
		e.slots = slices.Insert(e.slots, at, hslot[V]{hash: h, val: v})
		return e, zero, false
	}
	bit := uint32(1) << ((h >> shift) & hamtMask)
	pos := bits.OnesCount32(n.bitmap & (bit - 1))
	if n.bitmap&bit == 0 {
		e := n.editable(owner)
		e.bitmap |= bit
		e.slots = slices.Insert(e.slots, pos, hslot[V]{hash: h, val: v})
		return e, zero, false
	}
	s := n.slots[pos]
	if s.child != nil {
		child, old, replaced := s.child.set(owner, shift+hamtBits, h, tag, key, v)
		if child == s.child {
			return n, old, replaced
		}
		e := n.editable(owner)
		e.slots[pos].child = child
		return e, old, replaced
	}
	if s.hash == h {
		if t, k := s.val.mapKey(); t == tag && k == key {
			e := n.editable(owner)
			e.slots[pos].val = v
			return e, s.val, true
		}
	}
	e := n.editable(owner)
	e.slots[pos] = hslot[V]{child: mergeSlots(owner, shift+hamtBits, s, hslot[V]{hash: h, val: v})}
	return e, zero, false
}

func compareSlotKey[V mapValue](s hslot[V], v V) int {
	st, sk := s.val.mapKey()
	vt, vk := v.mapKey()
	if st != vt {
		return int(st) - int(vt)
	}
	return strings.Compare(sk, vk)
}

// mergeSlots builds the subtree holding two leaves whose hashes agree on the
// bits consumed above shift.
func mergeSlots[V mapValue](owner uint64, shift uint, a, b hslot[V]) *hnode[V] {
	if shift >= hamtCollisions {
		n := &hnode[V]{owner: owner, slots: []hslot[V]{a, b}}
		if compareSlotKey(a, b.val) > 0 {
			n.slots[0], n.slots[1] = b, a
		}
		return n
	}
	ia, ib := (a.hash>>shift)&hamtMask, (b.hash>>shift)&hamtMask
	if ia == ib {
		return &hnode[V]{owner: owner, bitmap: 1 << ia, slots: []hslot[V]{{child: mergeSlots(owner, shift+hamtBits, a, b)}}}
	}
	n := &hnode[V]{owner: owner, bitmap: 1<<ia | 1<<ib, slots: []hslot[V]{a, b}}
	if ia > ib {
		n.slots[0], n.slots[1] = b, a
	}
	return n
}

// delete removes the value under (tag, key), returning it.
func (m *pmap[V]) delete(owner uint64, tag uint8, key string) (V, bool) {
	var zero V
	if m.root == nil {
		return zero, false
	}
	root, old, found := m.root.delete(owner, 0, trieHash(tag, key), tag, key)
	if !found {
		return zero, false
	}
	m.n--
	if root == nil || len(root.slots) == 0 {
		m.root = nil
	} else {
		m.root = root
	}
	return old, true
}

// delete returns the node without the key (nil when it became empty).
// A subtree left with a single leaf is collapsed into its parent's slot, so
// the trie keeps one shape for one content.
func (n *hnode[V]) delete(owner uint64, shift uint, h uint64, tag uint8, key string) (*hnode[V], V, bool) {
	var zero V
	if shift >= hamtCollisions {
		for i := range n.slots {
			if t, k := n.slots[i].val.mapKey(); t == tag && k == key {
				old := n.slots[i].val
				if len(n.slots) == 1 {
					return nil, old, true
				}
				e := n.editable(owner)
				e.slots = slices.Delete(e.slots, i, i+1)
				return e, old, true
			}
		}
		return n, zero, false
	}
	bit := uint32(1) << ((h >> shift) & hamtMask)
	if n.bitmap&bit == 0 {
		return n, zero, false
	}
	pos := bits.OnesCount32(n.bitmap & (bit - 1))
	s := n.slots[pos]
	if s.child != nil {
		child, old, found := s.child.delete(owner, shift+hamtBits, h, tag, key)
		if !found {
			return n, zero, false
		}
		e := n.editable(owner)
		switch {
		case child == nil:
			e.bitmap &^= bit
			e.slots = slices.Delete(e.slots, pos, pos+1)
		case len(child.slots) == 1 && child.slots[0].child == nil:
			e.slots[pos] = child.slots[0]
		default:
			e.slots[pos].child = child
		}
		if len(e.slots) == 0 {
			return nil, old, true
		}
		return e, old, true
	}
	if s.hash != h {
		return n, zero, false
	}
	if t, k := s.val.mapKey(); t != tag || k != key {
		return n, zero, false
	}
	if len(n.slots) == 1 {
		return nil, s.val, true
	}
	e := n.editable(owner)
	e.bitmap &^= bit
	e.slots = slices.Delete(e.slots, pos, pos+1)
	return e, s.val, true
}

// each visits every value in trie order (by hash, then key) until fn
// returns false. The order is the same on every machine and build.
func (m *pmap[V]) each(fn func(V) bool) bool {
	if m.root == nil {
		return true
	}
	return m.root.each(fn)
}

func (n *hnode[V]) each(fn func(V) bool) bool {
	for i := range n.slots {
		s := &n.slots[i]
		if s.child != nil {
			if !s.child.each(fn) {
				return false
			}
		} else if !fn(s.val) {
			return false
		}
	}
	return true
}
