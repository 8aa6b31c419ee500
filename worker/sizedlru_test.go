package worker

import (
	"slices"
	"testing"
)

// The bounded LRU under the response and conversation stores: entries and
// bytes bounded, least recently used out first, never the last one; grow
// does not evict; each walks most recent first.
func TestSizedLRU(t *testing.T) {
	var out []string
	l := newSizedLRU(3, 100, func(id string, v int, size int64) { out = append(out, id) })
	l.put("a", 1, 10)
	l.put("b", 2, 10)
	l.put("c", 3, 10)
	l.get("a") // a is now the most recent
	l.put("d", 4, 10)
	if !slices.Equal(out, []string{"b"}) || l.len() != 3 || l.size() != 30 {
		t.Fatalf("entry bound: evicted %v, %d entries, %d bytes", out, l.len(), l.size())
	}
	l.resize("a", 80) // 80 + c 10 + d 10 = 100: within
	if len(out) != 1 {
		t.Fatalf("evicted %v within the byte bound", out)
	}
	l.grow("a", 50) // over, but grow does not evict
	if len(out) != 1 || l.size() != 150 {
		t.Fatalf("grow evicted %v (%d bytes)", out, l.size())
	}
	l.put("e", 5, 1) // e d a c, 151 bytes: c, then a (the least recent) go
	if !slices.Equal(out, []string{"b", "c", "a"}) || l.len() != 2 {
		t.Fatalf("byte bound: evicted %v, %d left", out, l.len())
	}
	l.put("huge", 6, 1000) // d and e go; huge stays although over the bound
	if v, ok := l.get("huge"); !ok || v != 6 || l.len() != 1 {
		t.Fatalf("the last entry must stay: %v %v, %d entries", v, ok, l.len())
	}
	l.put("f", 7, 1)
	var order []int
	l.each(func(v int) bool { order = append(order, v); return true })
	if !slices.Equal(order, []int{7}) {
		t.Fatalf("each: %v", order)
	}
	if _, ok := l.remove("f"); !ok || l.len() != 0 || l.size() != 0 {
		t.Fatalf("remove: %d entries, %d bytes", l.len(), l.size())
	}
}
