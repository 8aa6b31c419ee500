package enginekv

// Hybrid models: what a prefix hit needs from every KV cache group.
//
// vLLM's hybrid KV cache manager (vllm/v1/core/kv_cache_coordinator.py
// HybridKVCacheCoordinator.find_longest_cache_hit, and
// single_type_kv_cache_manager.py) accepts a prefix of L blocks only when
// every group hits it: a full-attention group needs all L blocks; a
// sliding-window group the blocks of the window ending at L (it searches
// from the end for ceil((window-1)/block_size) contiguous cached blocks); a
// mamba group the state at L (kept for every block in "all" mode, for the
// last block of a request otherwise); the coordinator shrinks L until all
// agree. SGLang's hybrid radix caches (SWA, mamba) likewise need the
// component's state at the match's end, and publish each component's
// pages (--enable-kv-events-component-types).
//
// The edge's KV index credits the leading blocks of a prompt that a rank
// holds, so the Mapper announces a full-attention block only while it
// leads to a block where a hit can end: a block held by the full-attention
// pool and by every sliding-window, chunked-local and mamba pool the model
// has (an end). A prompt that runs through an end is credited up to it, as
// the engine would hit it. What the events cannot give the index:
//
//   - an end inside the chain: a prompt that leaves a cached chain between
//     two ends is credited up to where it leaves, the engine only up to the
//     end before (the index has no notion of where a hit may end);
//   - the window: an end needs the sliding-window pool to hold the window's
//     blocks before it, not only its own; the Mapper checks the end's block
//     (vLLM frees out-of-window blocks oldest first, so a held end has its
//     window unless eviction cut into it). SGLang's component events do not
//     carry the window size at all.

// gatingKinds are the pools a prefix hit needs beside the full-attention
// ones (vLLM kv_cache_spec_kind; SGLang components map to them).
var gatingKinds = map[string]bool{"sliding_window": true, "chunked_local_attention": true, "mamba": true}

// chainNode is a full-attention GPU block in its chain.
type chainNode struct {
	parent     poolHash
	hasParent  bool
	marked     bool // announced: an end, or leading to one
	markedKids int  // children announced
}

// isEnd reports whether a hit may end at block ph: every gating pool holds
// its hash.
func (m *Mapper) isEnd(ph poolHash) bool {
	for _, held := range m.gates {
		if _, ok := held[ph.hash]; !ok {
			return false
		}
	}
	return true
}

// settle re-evaluates node ph and its ancestors after a change that may
// flip whether they are announced, appending the keys that became present
// or absent.
func (m *Mapper) settle(ph poolHash, stored, removed []uint64) ([]uint64, []uint64) {
	for {
		n, ok := m.nodes[ph]
		if !ok {
			return stored, removed
		}
		want := n.markedKids > 0 || m.isEnd(ph)
		if want == n.marked {
			return stored, removed
		}
		n.marked = want
		key := m.keys[ph]
		tk := tierKey{false, key}
		if want {
			if m.refs[tk]++; m.refs[tk] == 1 {
				stored = append(stored, key)
			}
		} else if m.refs[tk] <= 1 {
			delete(m.refs, tk)
			removed = append(removed, key)
		} else {
			m.refs[tk]--
		}
		if !n.hasParent {
			return stored, removed
		}
		p, ok := m.nodes[n.parent]
		if !ok {
			return stored, removed
		}
		if want {
			p.markedKids++
		} else {
			p.markedKids--
		}
		ph = n.parent
	}
}

// gate applies an event of a gating pool (GPU tier) to what it holds,
// announcing or withdrawing the full-attention blocks whose hashes it
// names. A pool seen for the first time holds nothing yet: every block is
// re-evaluated.
func (m *Mapper) gate(ev Event) Change {
	var c Change
	held, known := m.gates[ev.Group]
	if !known {
		held = map[Hash]struct{}{}
		m.gates[ev.Group] = held
	}
	for _, h := range ev.Hashes {
		if ev.Kind == Stored {
			held[h] = struct{}{}
		} else {
			delete(held, h)
		}
	}
	if !known {
		c.Stored, c.Removed = m.resettle()
		return c
	}
	for _, h := range ev.Hashes {
		for ph := range m.fullPools(h) {
			c.Stored, c.Removed = m.settle(ph, c.Stored, c.Removed)
		}
	}
	return c
}

// fullPools are the GPU blocks of the announced pools with hash h.
func (m *Mapper) fullPools(h Hash) map[poolHash]bool {
	out := map[poolHash]bool{}
	for pool := range m.pools {
		ph := poolHash{pool, "", h}
		if _, ok := m.nodes[ph]; ok {
			out[ph] = true
		}
	}
	return out
}

// resettle re-evaluates every node from scratch and returns the net
// change of the GPU tier's keys.
func (m *Mapper) resettle() (stored, removed []uint64) {
	before := m.markedKeys()
	for ph, n := range m.nodes {
		if n.marked {
			tk := tierKey{false, m.keys[ph]}
			if m.refs[tk]--; m.refs[tk] <= 0 {
				delete(m.refs, tk)
			}
		}
		n.marked, n.markedKids = false, 0
	}
	for ph := range m.nodes {
		m.settle(ph, nil, nil)
	}
	after := m.markedKeys()
	for k := range after {
		if !before[k] {
			stored = append(stored, k)
		}
	}
	for k := range before {
		if !after[k] {
			removed = append(removed, k)
		}
	}
	return stored, removed
}

func (m *Mapper) markedKeys() map[uint64]bool {
	out := map[uint64]bool{}
	for ph, n := range m.nodes {
		if n.marked {
			out[m.keys[ph]] = true
		}
	}
	return out
}

// link adds full-attention GPU block ph (its key already in m.keys) to its
// chain and announces it when it is, or leads to, an end.
func (m *Mapper) link(ph poolHash, parent Hash, hasParent bool, stored, removed []uint64) ([]uint64, []uint64) {
	n := &chainNode{hasParent: hasParent}
	if hasParent {
		n.parent = poolHash{ph.pool, "", parent}
	}
	m.nodes[ph] = n
	m.pools[ph.pool] = true
	return m.settle(ph, stored, removed)
}

// unlink forgets block ph's node, withdrawing its key when it was
// announced (the last block with it) and re-evaluating its ancestors.
func (m *Mapper) unlink(ph poolHash, removed []uint64) []uint64 {
	n, ok := m.nodes[ph]
	if !ok {
		return removed
	}
	delete(m.nodes, ph)
	if !n.marked {
		return removed
	}
	tk := tierKey{false, m.keys[ph]}
	if m.refs[tk] <= 1 {
		delete(m.refs, tk)
		removed = append(removed, m.keys[ph])
	} else {
		m.refs[tk]--
	}
	if p, ok := m.nodes[n.parent]; ok && n.hasParent {
		p.markedKids--
		_, removed = m.settle(n.parent, nil, removed)
	}
	return removed
}
