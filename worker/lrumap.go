package worker

import "container/list"

// lruMap is what the worker's stores keep (stored responses,
// conversations, the ranks of relayed response ids): values by key,
// bounded in entries and in bytes, least recently used evicted first. It
// does not lock: its owner does.
type lruMap[V any] struct {
	maxEntries int
	maxBytes   int64 // 0: no byte bound
	bytes      int64
	order      *list.List // of *lruEntry[V], most recently used at the front
	byKey      map[string]*list.Element
}

type lruEntry[V any] struct {
	key  string
	val  V
	size int64
}

func newLRUMap[V any](maxEntries int, maxBytes int64) *lruMap[V] {
	return &lruMap[V]{maxEntries: maxEntries, maxBytes: maxBytes, order: list.New(), byKey: map[string]*list.Element{}}
}

// get returns key's value and marks it used.
func (m *lruMap[V]) get(key string) (V, bool) {
	el, ok := m.byKey[key]
	if !ok {
		var zero V
		return zero, false
	}
	m.order.MoveToFront(el)
	return el.Value.(*lruEntry[V]).val, true
}

// put stores val under key, size bytes, as the most recently used (it
// replaces what key held). evict then applies the bounds.
func (m *lruMap[V]) put(key string, val V, size int64) {
	if el, ok := m.byKey[key]; ok {
		e := el.Value.(*lruEntry[V])
		m.bytes += size - e.size
		e.val, e.size = val, size
		m.order.MoveToFront(el)
		return
	}
	m.byKey[key] = m.order.PushFront(&lruEntry[V]{key: key, val: val, size: size})
	m.bytes += size
}

// resize records that key's value is now size bytes.
func (m *lruMap[V]) resize(key string, size int64) {
	if el, ok := m.byKey[key]; ok {
		e := el.Value.(*lruEntry[V])
		m.bytes += size - e.size
		e.size = size
	}
}

// remove drops key and returns what it held.
func (m *lruMap[V]) remove(key string) (V, bool) {
	el, ok := m.byKey[key]
	if !ok {
		var zero V
		return zero, false
	}
	e := el.Value.(*lruEntry[V])
	m.order.Remove(el)
	delete(m.byKey, key)
	m.bytes -= e.size
	return e.val, true
}

// evict drops the least recently used values while the map is over a
// bound, keeping at least keep of them (a store keeps its last entry even
// over the byte bound), and tells dropped about each.
func (m *lruMap[V]) evict(keep int, dropped func(val V, size int64)) {
	for m.order.Len() > keep && (m.order.Len() > m.maxEntries || (m.maxBytes > 0 && m.bytes > m.maxBytes)) {
		e := m.order.Back().Value.(*lruEntry[V])
		m.remove(e.key)
		if dropped != nil {
			dropped(e.val, e.size)
		}
	}
}

// each calls f on the values, most recently used first, until f returns
// false.
func (m *lruMap[V]) each(f func(V) bool) {
	for el := m.order.Front(); el != nil; el = el.Next() {
		if !f(el.Value.(*lruEntry[V]).val) {
			return
		}
	}
}

// len is the number of values held.
func (m *lruMap[V]) len() int { return m.order.Len() }
