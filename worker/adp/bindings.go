package adp

// bindingLRU maps a routing key (a conversation id, or a parent's id for
// sub-agents) to its rank, evicting the least recently used key beyond a
// bound. Nodes live in a slice linked by index, so steady-state placements
// do not allocate.
type bindingLRU struct {
	index      map[string]int32
	nodes      []bindingNode
	free       []int32
	head, tail int32 // head most recently used
}

type bindingNode struct {
	key        string
	rank       int
	prev, next int32
}

const noNode = -1

func newBindingLRU(sizeHint int) bindingLRU {
	return bindingLRU{index: make(map[string]int32, sizeHint), head: noNode, tail: noNode}
}

func (b *bindingLRU) len() int { return len(b.index) }

func (b *bindingLRU) peek(key string) (int, bool) {
	i, ok := b.index[key]
	if !ok {
		return 0, false
	}
	return b.nodes[i].rank, true
}

// touch returns key's rank and makes it the most recently used.
func (b *bindingLRU) touch(key string) (int, bool) {
	i, ok := b.index[key]
	if !ok {
		return 0, false
	}
	if b.head != i {
		b.unlink(i)
		b.pushFront(i)
	}
	return b.nodes[i].rank, true
}

// add binds a new key (not present) and, if that exceeds limit, evicts the
// least recently used key and returns it.
func (b *bindingLRU) add(key string, rank, limit int) (evictedKey string, evictedRank int, evicted bool) {
	if len(b.index) >= limit && b.tail != noNode {
		t := b.tail
		evictedKey, evictedRank, evicted = b.nodes[t].key, b.nodes[t].rank, true
		b.unlink(t)
		delete(b.index, evictedKey)
		b.nodes[t] = bindingNode{}
		b.free = append(b.free, t)
	}
	var i int32
	if n := len(b.free); n > 0 {
		i = b.free[n-1]
		b.free = b.free[:n-1]
	} else {
		b.nodes = append(b.nodes, bindingNode{})
		i = int32(len(b.nodes) - 1)
	}
	b.nodes[i] = bindingNode{key: key, rank: rank}
	b.index[key] = i
	b.pushFront(i)
	return evictedKey, evictedRank, evicted
}

func (b *bindingLRU) pushFront(i int32) {
	n := &b.nodes[i]
	n.prev, n.next = noNode, b.head
	if b.head != noNode {
		b.nodes[b.head].prev = i
	} else {
		b.tail = i
	}
	b.head = i
}

func (b *bindingLRU) unlink(i int32) {
	n := &b.nodes[i]
	if n.prev != noNode {
		b.nodes[n.prev].next = n.next
	} else {
		b.head = n.next
	}
	if n.next != noNode {
		b.nodes[n.next].prev = n.prev
	} else {
		b.tail = n.prev
	}
	n.prev, n.next = noNode, noNode
}
