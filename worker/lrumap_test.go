package worker

import (
	"slices"
	"testing"
)

func TestLRUMapBounds(t *testing.T) {
	m := newLRUMap[string](3, 100)
	var dropped []string
	drop := func(v string, _ int64) { dropped = append(dropped, v) }
	for _, k := range []string{"a", "b", "c"} {
		m.put(k, k, 10)
		m.evict(1, drop)
	}
	m.get("a") // a is now the most recently used
	m.put("d", "d", 10)
	m.evict(1, drop)
	if !slices.Equal(dropped, []string{"b"}) || m.len() != 3 || m.bytes != 30 {
		t.Fatalf("over the entry bound: dropped %v, %d entries, %d bytes; want b dropped, 3 entries, 30 bytes", dropped, m.len(), m.bytes)
	}
	m.resize("c", 95)
	m.evict(1, drop)
	if !slices.Equal(dropped, []string{"b", "c"}) || m.len() != 2 || m.bytes != 20 {
		t.Fatalf("over the byte bound: dropped %v, %d left, %d bytes; want c, the least recently used, dropped", dropped, m.len(), m.bytes)
	}
	m.put("e", "e", 500)
	m.evict(1, drop)
	if got := m.len(); got != 1 || m.bytes != 500 || !slices.Equal(dropped, []string{"b", "c", "a", "d"}) {
		t.Fatalf("the last entry over the byte bound: %d entries, %d bytes, dropped %v; want it kept alone", got, m.bytes, dropped)
	}
	var order []string
	m.put("f", "f", 0)
	m.each(func(v string) bool { order = append(order, v); return true })
	if !slices.Equal(order, []string{"f", "e"}) {
		t.Fatalf("each: %v, want the most recently used first", order)
	}
	m.remove("e")
	if _, ok := m.remove("f"); !ok || m.len() != 0 || m.bytes != 0 {
		t.Fatalf("remove: %d entries, %d bytes left", m.len(), m.bytes)
	}
}
