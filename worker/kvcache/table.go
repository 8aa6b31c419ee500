package kvcache

// hashTable maps a block hash to its entry index. It is an open-addressing
// table with linear probing and backward-shift deletion: a prefix match walks
// up to thousands of hashes per request, and this layout (one 16-byte slot per
// probe, no pointers) is about four times faster than a Go map for that walk
// and never allocates except when it grows.
type hashTable struct {
	slots []slot
	shift uint // 64 - log2(len(slots))
	count int
}

// slot.ref is entry index + 1, so the zero slot is empty and any uint64
// (including 0) can be a key.
type slot struct {
	key uint64
	ref int32
}

const minTableSlots = 64

func newHashTable(expected int) hashTable {
	n := minTableSlots
	for n < 2*expected && n < 1<<30 {
		n <<= 1
	}
	return hashTable{slots: make([]slot, n), shift: 64 - log2(n)}
}

func log2(n int) uint {
	var l uint
	for 1<<l < n {
		l++
	}
	return l
}

// home is the slot a key would occupy without collisions. Fibonacci hashing
// takes the high bits, so small sequential ids (as in trace files) spread too.
func (t *hashTable) home(key uint64) uint64 {
	return (key * 0x9e3779b97f4a7c15) >> t.shift
}

func (t *hashTable) get(key uint64) (int32, bool) {
	mask := uint64(len(t.slots) - 1)
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.ref == 0 {
			return 0, false
		}
		if s.key == key {
			return s.ref - 1, true
		}
	}
}

// put inserts key, which must not be present.
func (t *hashTable) put(key uint64, idx int32) {
	if 2*(t.count+1) > len(t.slots) {
		t.grow()
	}
	t.insert(key, idx)
	t.count++
}

func (t *hashTable) insert(key uint64, idx int32) {
	mask := uint64(len(t.slots) - 1)
	i := t.home(key)
	for t.slots[i].ref != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = slot{key: key, ref: idx + 1}
}

func (t *hashTable) grow() {
	old := t.slots
	t.slots = make([]slot, 2*len(old))
	t.shift--
	for _, s := range old {
		if s.ref != 0 {
			t.insert(s.key, s.ref-1)
		}
	}
}

// remove deletes key if present, shifting later members of its probe run
// back so lookups never need tombstones.
func (t *hashTable) remove(key uint64) {
	mask := uint64(len(t.slots) - 1)
	i := t.home(key)
	for {
		s := t.slots[i]
		if s.ref == 0 {
			return
		}
		if s.key == key {
			break
		}
		i = (i + 1) & mask
	}
	t.count--
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := t.slots[j]
		if s.ref == 0 {
			break
		}
		h := t.home(s.key)
		// s may move into the hole at i only if its home is not in the
		// cyclic range (i, j]: otherwise a lookup would start past i.
		var inRange bool
		if i <= j {
			inRange = h > i && h <= j
		} else {
			inRange = h > i || h <= j
		}
		if !inRange {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = slot{}
}
