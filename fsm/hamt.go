package fsm

import (
	"math/bits"
	"slices"
	"strings"
	"unsafe"
)

// mapValue is what a pmap stores: immutable records that carry their own key.
type mapValue interface {
	mapKey() (tag uint8, key string)
}

// pmap is a persistent hash array mapped trie keyed by (tag, key) with the
// fixed hashKey. Published maps are never modified; an update copies the
// path from the root to the changed slot (typically 4-5 nodes at a million
// entries). Nodes created by the transaction identified by owner are
// modified in place, so a batch of updates copies each shared node once.
//
// Each level consumes 5 bits of the hash (32-way nodes, bitmap-compressed);
// after 13 levels the 64 bits are spent and full-hash collisions share a
// collision node whose slots are sorted by key, so iteration stays
// deterministic.
//
// Layout, chosen for the lookup hot path and for cheap path copies: a node
// is a single array whose element 0 is a header (its hash field holds the
// owning transaction) and whose elements 1..n are the slots. A branch slot
// holds a pointer to the child's first element and, in its hash field, the
// child's bitmap (a collision child: its slot count), from which the child's
// length follows. So one level costs one memory access (the slot), not two
// (a node header, then its slot array), and a slot is 24 bytes.
type pmap[V mapValue] struct {
	root     []hslot[V] // nil when empty
	rootBits uint32
	n        int
}

type hslot[V mapValue] struct {
	hash uint64    // leaf: the key's hash; branch: the child's bitmap (collision child: slot count); header: the owner
	kids *hslot[V] // branch: the child node's header; nil for a leaf
	val  V
}

// child returns the node a branch slot at shift points to (the child is at
// shift+hamtBits).
func (s *hslot[V]) child(shift uint) []hslot[V] {
	n := int(s.hash)
	if shift+hamtBits < hamtCollisions {
		n = bits.OnesCount32(uint32(s.hash))
	}
	return unsafe.Slice(s.kids, 1+n)
}

// branch makes the slot at shift pointing to child (at shift+hamtBits).
func branch[V mapValue](shift uint, child []hslot[V], childBits uint32) hslot[V] {
	h := uint64(childBits)
	if shift+hamtBits >= hamtCollisions {
		h = uint64(len(child) - 1)
	}
	return hslot[V]{hash: h, kids: &child[0]}
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
	node, bitmap := m.root, m.rootBits
	for shift := uint(0); node != nil; shift += hamtBits {
		if shift >= hamtCollisions {
			for i := 1; i < len(node); i++ {
				if t, k := node[i].val.mapKey(); t == tag && k == key {
					return node[i].val, true
				}
			}
			break
		}
		bit := uint32(1) << ((h >> shift) & hamtMask)
		if bitmap&bit == 0 {
			break
		}
		s := &node[1+bits.OnesCount32(bitmap&(bit-1))]
		if s.kids != nil {
			node, bitmap = s.child(shift), uint32(s.hash)
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

// editable returns node itself when owner created it, else a private copy
// with room for one more slot.
func editable[V mapValue](node []hslot[V], owner uint64) []hslot[V] {
	if node[0].hash == owner {
		return node
	}
	c := make([]hslot[V], len(node), len(node)+1)
	copy(c, node)
	c[0].hash = owner
	return c
}

func newNode[V mapValue](owner uint64, slots ...hslot[V]) []hslot[V] {
	n := make([]hslot[V], 1, 1+len(slots))
	n[0].hash = owner
	return append(n, slots...)
}

// set inserts or replaces v under its own key, returning the value replaced.
func (m *pmap[V]) set(owner uint64, v V) (old V, replaced bool) {
	tag, key := v.mapKey()
	h := trieHash(tag, key)
	if m.root == nil {
		m.root = newNode[V](owner)
	}
	m.root, m.rootBits, old, replaced = setIn(m.root, m.rootBits, owner, 0, h, tag, key, v)
	if !replaced {
		m.n++
	}
	return old, replaced
}

func setIn[V mapValue](node []hslot[V], bitmap uint32, owner uint64, shift uint, h uint64, tag uint8, key string, v V) ([]hslot[V], uint32, V, bool) {
	var zero V
	if shift >= hamtCollisions {
		for i := 1; i < len(node); i++ {
			if t, k := node[i].val.mapKey(); t == tag && k == key {
				e := editable(node, owner)
				old := e[i].val
				e[i].val = v
				return e, bitmap, old, true
			}
		}
		e := editable(node, owner)
		at, _ := slices.BinarySearchFunc(e[1:], v, compareSlotKey[V])
		e = slices.Insert(e, 1+at, hslot[V]{hash: h, val: v})
		return e, bitmap, zero, false
	}
	bit := uint32(1) << ((h >> shift) & hamtMask)
	pos := 1 + bits.OnesCount32(bitmap&(bit-1))
	if bitmap&bit == 0 {
		e := editable(node, owner)
		e = slices.Insert(e, pos, hslot[V]{hash: h, val: v})
		return e, bitmap | bit, zero, false
	}
	s := node[pos]
	if s.kids != nil {
		kids, kidBits, old, replaced := setIn(s.child(shift), uint32(s.hash), owner, shift+hamtBits, h, tag, key, v)
		e := editable(node, owner)
		e[pos] = branch(shift, kids, kidBits)
		return e, bitmap, old, replaced
	}
	if s.hash == h {
		if t, k := s.val.mapKey(); t == tag && k == key {
			e := editable(node, owner)
			e[pos].val = v
			return e, bitmap, s.val, true
		}
	}
	kids, kidBits := mergeLeaves(owner, shift+hamtBits, s, hslot[V]{hash: h, val: v})
	e := editable(node, owner)
	e[pos] = branch(shift, kids, kidBits)
	return e, bitmap, zero, false
}

func compareSlotKey[V mapValue](s hslot[V], v V) int {
	st, sk := s.val.mapKey()
	vt, vk := v.mapKey()
	if st != vt {
		return int(st) - int(vt)
	}
	return strings.Compare(sk, vk)
}

// mergeLeaves builds the subtree holding two leaves whose hashes agree on
// the bits consumed above shift.
func mergeLeaves[V mapValue](owner uint64, shift uint, a, b hslot[V]) ([]hslot[V], uint32) {
	if shift >= hamtCollisions {
		if compareSlotKey(a, b.val) > 0 {
			a, b = b, a
		}
		return newNode(owner, a, b), 0
	}
	ia, ib := (a.hash>>shift)&hamtMask, (b.hash>>shift)&hamtMask
	if ia == ib {
		kids, kidBits := mergeLeaves(owner, shift+hamtBits, a, b)
		return newNode(owner, branch(shift, kids, kidBits)), 1 << ia
	}
	if ia > ib {
		a, b = b, a
	}
	return newNode(owner, a, b), 1<<ia | 1<<ib
}

// delete removes the value under (tag, key), returning it.
func (m *pmap[V]) delete(owner uint64, tag uint8, key string) (V, bool) {
	var zero V
	if m.root == nil {
		return zero, false
	}
	root, rootBits, old, found := deleteIn(m.root, m.rootBits, owner, 0, trieHash(tag, key), tag, key)
	if !found {
		return zero, false
	}
	m.n--
	if m.n == 0 {
		root, rootBits = nil, 0
	}
	m.root, m.rootBits = root, rootBits
	return old, true
}

// deleteIn returns the node without the key (nil when it became empty).
// A subtree left with a single leaf is collapsed into its parent's slot, so
// the trie keeps one shape for one content.
func deleteIn[V mapValue](node []hslot[V], bitmap uint32, owner uint64, shift uint, h uint64, tag uint8, key string) ([]hslot[V], uint32, V, bool) {
	var zero V
	if shift >= hamtCollisions {
		for i := 1; i < len(node); i++ {
			if t, k := node[i].val.mapKey(); t == tag && k == key {
				old := node[i].val
				if len(node) == 2 {
					return nil, 0, old, true
				}
				e := editable(node, owner)
				e = slices.Delete(e, i, i+1)
				return e, bitmap, old, true
			}
		}
		return node, bitmap, zero, false
	}
	bit := uint32(1) << ((h >> shift) & hamtMask)
	if bitmap&bit == 0 {
		return node, bitmap, zero, false
	}
	pos := 1 + bits.OnesCount32(bitmap&(bit-1))
	s := node[pos]
	if s.kids != nil {
		kids, kidBits, old, found := deleteIn(s.child(shift), uint32(s.hash), owner, shift+hamtBits, h, tag, key)
		if !found {
			return node, bitmap, zero, false
		}
		switch {
		case kids == nil:
			if len(node) == 2 {
				return nil, 0, old, true
			}
			e := editable(node, owner)
			return slices.Delete(e, pos, pos+1), bitmap &^ bit, old, true
		case len(kids) == 2 && kids[1].kids == nil:
			e := editable(node, owner)
			e[pos] = kids[1] // pull the lone leaf up
			return e, bitmap, old, true
		default:
			e := editable(node, owner)
			e[pos] = branch(shift, kids, kidBits)
			return e, bitmap, old, true
		}
	}
	if s.hash != h {
		return node, bitmap, zero, false
	}
	if t, k := s.val.mapKey(); t != tag || k != key {
		return node, bitmap, zero, false
	}
	if len(node) == 2 {
		return nil, 0, s.val, true
	}
	e := editable(node, owner)
	return slices.Delete(e, pos, pos+1), bitmap &^ bit, s.val, true
}

// each visits every value in trie order (by hash, then key) until fn
// returns false. The order is the same on every machine and build.
func (m *pmap[V]) each(fn func(V) bool) bool {
	return eachIn(m.root, 0, fn)
}

func eachIn[V mapValue](node []hslot[V], shift uint, fn func(V) bool) bool {
	for i := 1; i < len(node); i++ {
		s := &node[i]
		if s.kids != nil {
			if !eachIn(s.child(shift), shift+hamtBits, fn) {
				return false
			}
		} else if !fn(s.val) {
			return false
		}
	}
	return true
}

// trieOrder maps a hash to a number whose order is the trie's iteration
// order: the 5-bit chunks the levels consume, most significant first.
func trieOrder(h uint64) uint64 {
	var k uint64
	for shift := uint(0); shift < 60; shift += hamtBits {
		k = k<<hamtBits | (h>>shift)&hamtMask
	}
	return k<<4 | h>>60
}

// buildPmap builds a map from values with distinct keys in one pass (used
// by ReadSnapshot): sort by trie order, then allocate every node once at its
// final size. It reports the first repeated key, if any.
func buildPmap[V mapValue](owner uint64, vals []V) (pmap[V], string, bool) {
	if len(vals) == 0 {
		return pmap[V]{}, "", true
	}
	type item struct {
		order uint64
		slot  hslot[V]
	}
	items := make([]item, len(vals))
	for i, v := range vals {
		tag, key := v.mapKey()
		h := trieHash(tag, key)
		items[i] = item{order: trieOrder(h), slot: hslot[V]{hash: h, val: v}}
	}
	slices.SortFunc(items, func(a, b item) int {
		if a.order != b.order {
			if a.order < b.order {
				return -1
			}
			return 1
		}
		return compareSlotKey(a.slot, b.slot.val)
	})
	slots := make([]hslot[V], len(items))
	for i := range items {
		slots[i] = items[i].slot
		if i > 0 && items[i].order == items[i-1].order && compareSlotKey(items[i-1].slot, items[i].slot.val) == 0 {
			_, key := items[i].slot.val.mapKey()
			return pmap[V]{}, key, false
		}
	}
	root, bitmap := buildNode(owner, 0, slots)
	return pmap[V]{root: root, rootBits: bitmap, n: len(slots)}, "", true
}

// buildNode builds the node holding sorted leaves that agree on the bits
// below shift.
func buildNode[V mapValue](owner uint64, shift uint, leaves []hslot[V]) ([]hslot[V], uint32) {
	if shift >= hamtCollisions {
		return newNode(owner, leaves...), 0
	}
	node := make([]hslot[V], 1, 1+min(len(leaves), 32))
	node[0].hash = owner
	var bitmap uint32
	for i := 0; i < len(leaves); {
		chunk := (leaves[i].hash >> shift) & hamtMask
		j := i + 1
		for j < len(leaves) && (leaves[j].hash>>shift)&hamtMask == chunk {
			j++
		}
		bitmap |= 1 << chunk
		if j == i+1 {
			node = append(node, leaves[i])
		} else {
			kids, kidBits := buildNode(owner, shift+hamtBits, leaves[i:j])
			node = append(node, branch(shift, kids, kidBits))
		}
		i = j
	}
	return node, bitmap
}
