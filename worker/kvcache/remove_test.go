package kvcache

import (
	"slices"
	"testing"
)

func TestRemoveEvictsUnreferencedBlocksOnly(t *testing.T) {
	c := New(8)
	a, b := chain(1, 4), chain(2, 2)
	if _, _, _, err := c.Acquire(a); err != nil {
		t.Fatal(err)
	}
	c.Release(a)
	if _, _, _, err := c.Acquire(b); err != nil { // b stays referenced
		t.Fatal(err)
	}
	got := c.Remove([]uint64{a[2], a[3], b[1], 777})
	if !slices.Equal(got, []uint64{a[2], a[3]}) {
		t.Fatalf("Remove = %v, want a's tail only (b[1] is referenced, 777 unknown)", got)
	}
	if n := c.Match(a); n != 2 {
		t.Fatalf("Match(a) after removing its tail = %d, want 2", n)
	}
	if c.Used() != 4 || c.Evictions() != 2 || !c.Contains(b[1]) {
		t.Fatalf("used %d evictions %d contains b[1] %v", c.Used(), c.Evictions(), c.Contains(b[1]))
	}
	// The freed entries are reused and the LRU list stays consistent:
	// filling the cache evicts a's remaining (older) blocks, not b's.
	d := chain(3, 6)
	if _, _, removed, err := c.Acquire(d); err != nil || !slices.Equal(removed, []uint64{a[1], a[0]}) {
		t.Fatalf("Acquire after Remove: removed %v, err %v; want a[1], a[0]", removed, err)
	}
}
