package worker

import "container/list"

// sizedLRU holds values by id, bounded in entries and in bytes (each
// value's size as its store counts it), the least recently used evicted
// first; never the last one (a single value over the byte bound stays).
// It does no locking: its store's lock guards it. The response store and
// the conversation store are two.
type sizedLRU[V any] struct {
	maxEntries int
	maxBytes   int64
	bytes      int64
	order      *list.List // of *lruEntry[V], most recent at the front
	byID       map[string]*list.Element
	// evicted is told of each value evicted for the bounds (after it left).
	evicted func(id string, v V, size int64)
}

type lruEntry[V any] struct {
	id   string
	v    V
	size int64
}

func newSizedLRU[V any](maxEntries int, maxBytes int64, evicted func(id string, v V, size int64)) *sizedLRU[V] {
	return &sizedLRU[V]{maxEntries: maxEntries, maxBytes: maxBytes, order: list.New(), byID: map[string]*list.Element{}, evicted: evicted}
}

// put stores (or replaces) id's value of size bytes, most recently used,
// and evicts beyond the bounds.
func (l *sizedLRU[V]) put(id string, v V, size int64) {
	l.remove(id)
	l.byID[id] = l.order.PushFront(&lruEntry[V]{id: id, v: v, size: size})
	l.bytes += size
	l.evict()
}

// get returns id's value and marks it used.
func (l *sizedLRU[V]) get(id string) (V, bool) {
	el, ok := l.byID[id]
	if !ok {
		var zero V
		return zero, false
	}
	l.order.MoveToFront(el)
	return el.Value.(*lruEntry[V]).v, true
}

// resize sets id's size and evicts beyond the bounds.
func (l *sizedLRU[V]) resize(id string, size int64) {
	el, ok := l.byID[id]
	if !ok {
		return
	}
	e := el.Value.(*lruEntry[V])
	l.bytes += size - e.size
	e.size = size
	l.evict()
}

// grow adds delta bytes to id's size without evicting (a background
// response's stream while it runs).
func (l *sizedLRU[V]) grow(id string, delta int64) {
	if el, ok := l.byID[id]; ok {
		el.Value.(*lruEntry[V]).size += delta
		l.bytes += delta
	}
}

// remove takes id's value out; ok false when it is not held.
func (l *sizedLRU[V]) remove(id string) (V, bool) {
	el, ok := l.byID[id]
	if !ok {
		var zero V
		return zero, false
	}
	e := el.Value.(*lruEntry[V])
	l.order.Remove(el)
	delete(l.byID, id)
	l.bytes -= e.size
	return e.v, true
}

func (l *sizedLRU[V]) evict() {
	for l.order.Len() > 1 && (l.order.Len() > l.maxEntries || l.bytes > l.maxBytes) {
		e := l.order.Back().Value.(*lruEntry[V])
		l.remove(e.id)
		if l.evicted != nil {
			l.evicted(e.id, e.v, e.size)
		}
	}
}

// each calls f on the values, most recently used first, until it returns
// false.
func (l *sizedLRU[V]) each(f func(V) bool) {
	for el := l.order.Front(); el != nil; el = el.Next() {
		if !f(el.Value.(*lruEntry[V]).v) {
			return
		}
	}
}

// len and size are the values and bytes held.
func (l *sizedLRU[V]) len() int    { return l.order.Len() }
func (l *sizedLRU[V]) size() int64 { return l.bytes }
