package enginekv

import (
	"github.com/tether-project/tether/internal/prefix"
)

// DefaultMaxBlocks bounds the blocks a Mapper tracks for one rank (far
// above any single GPU's KV capacity at 16-token blocks).
const DefaultMaxBlocks = 4 << 20

// MapperStats counts what a Mapper could not translate, by reason.
type MapperStats struct {
	Stored, Removed uint64 // tether keys announced
	Orphans         uint64 // stored blocks whose parent chain is unknown
	SizeMismatch    uint64 // stored blocks of another block size than tether's
	Foreign         uint64 // extra-key blocks (not computable by an edge)
	Offloaded       uint64 // offloaded-tier keys announced (stored)
	Skipped         uint64 // events of pools not tracked (sliding-window, linear attention)
	Malformed       uint64 // token count not block_size × blocks
	Overflow        uint64 // stored blocks dropped at the MaxBlocks bound
}

// Mapper translates one engine rank's block events into tether block keys
// (internal/prefix chained hashes over token ids). It remembers each cached
// engine block's tether key so a later event can name a parent or a removal
// by engine hash only. Not safe for concurrent use.
//
// Hybrid models keep one block pool per KV cache group (vLLM group_idx)
// or attention window (TensorRT-LLM window_size); their hashes are their
// own, so blocks are remembered per pool, and only full-attention pools
// are announced: a sliding-window or linear-attention pool drops blocks
// a prefix hit still finds in the full-attention pool (vLLM: groups whose
// kv_cache_spec_kind is full_attention, mla_attention or
// sink_full_attention, and group 0 while no kind was stated; TensorRT-LLM:
// the largest window seen, the full-attention window of a
// variable-sliding-window model, since a sliding window is shorter).
//
// Offloaded tiers (an event's Medium: vLLM's OffloadingConnector, LMCache)
// are tracked beside the GPU's, per medium, and announced as a tier of
// their own (Change.OffloadedStored/OffloadedRemoved): a key is offloaded
// while any offloaded medium holds it, whatever the GPU holds.
type Mapper struct {
	blockSize int
	maxBlocks int
	keys      map[poolHash]uint64 // engine block → tether key, for blocks cached now
	refs      map[tierKey]int     // tether key of a tier → engine blocks mapped to it
	mediums   []string            // offloaded mediums seen, at most maxMediums
	kinds     map[int]string      // group → its kv_cache_spec_kind, once stated
	window    int                 // the largest window_size seen (the announced pool)
	stats     MapperStats
	// The announced pools' GPU blocks in their chains, and what the
	// gating pools of a hybrid model hold (hybrid.go).
	nodes map[poolHash]*chainNode
	gates map[int]map[Hash]struct{} // gating pool → GPU hashes held
	pools map[int]bool              // announced pools seen
}

// poolHash is an engine block: its pool (group or window), its medium
// ("" the GPU) and hash.
type poolHash struct {
	pool   int
	medium string
	hash   Hash
}

// tierKey is a tether key in the GPU tier or the offloaded one.
type tierKey struct {
	offloaded bool
	key       uint64
}

// maxMediums bounds the offloaded mediums a Mapper tracks (vLLM names two:
// CPU and Disk); events of further mediums are Skipped.
const maxMediums = 8

// Change is what one event changed, in tether keys per tier: in each tier
// Removed applies before Stored.
type Change struct {
	Stored, Removed                   []uint64 // the GPU tier
	OffloadedStored, OffloadedRemoved []uint64 // the offloaded tiers
}

func (c *Change) add(o Change) {
	c.Stored = append(c.Stored, o.Stored...)
	c.Removed = append(c.Removed, o.Removed...)
	c.OffloadedStored = append(c.OffloadedStored, o.OffloadedStored...)
	c.OffloadedRemoved = append(c.OffloadedRemoved, o.OffloadedRemoved...)
}

// empty reports whether c changes nothing.
func (c *Change) empty() bool {
	return len(c.Stored)+len(c.Removed)+len(c.OffloadedStored)+len(c.OffloadedRemoved) == 0
}

// removesAfterStore reports whether applying o after c would remove keys of
// a tier c stores in (so c must be emitted first to keep the order).
func (c *Change) removesAfterStore(o Change) bool {
	return (len(o.Removed) > 0 && len(c.Stored) > 0) || (len(o.OffloadedRemoved) > 0 && len(c.OffloadedStored) > 0)
}

// NewMapper returns a Mapper for blocks of blockSize tokens (tether's
// fleet block size, which must equal the engine's); maxBlocks <= 0 means
// DefaultMaxBlocks.
func NewMapper(blockSize, maxBlocks int) *Mapper {
	if blockSize <= 0 {
		blockSize = prefix.DefaultBlockSize
	}
	if maxBlocks <= 0 {
		maxBlocks = DefaultMaxBlocks
	}
	return &Mapper{blockSize: blockSize, maxBlocks: maxBlocks, keys: map[poolHash]uint64{}, refs: map[tierKey]int{}, kinds: map[int]string{},
		nodes: map[poolHash]*chainNode{}, gates: map[int]map[Hash]struct{}{}, pools: map[int]bool{}}
}

// Len is the number of engine blocks tracked.
func (m *Mapper) Len() int { return len(m.keys) }

// Stats returns the counters.
func (m *Mapper) Stats() MapperStats { return m.stats }

// Key returns the tether key of a cached engine block of pool 0 (KV cache
// group 0, or the announced window).
func (m *Mapper) Key(h Hash) (uint64, bool) {
	k, ok := m.keys[poolHash{pool: m.window, hash: h}]
	return k, ok
}

// fullAttention names vLLM's KVCacheSpecKind values whose pools keep every
// block of a prefix.
var fullAttention = map[string]bool{"full_attention": true, "mla_attention": true, "sink_full_attention": true}

// poolOf is the pool an event is about: the window (TensorRT-LLM) or the
// group (vLLM).
func (m *Mapper) poolOf(ev Event) int {
	if ev.Window > 0 || m.window > 0 {
		return ev.Window
	}
	return ev.Group
}

// announced reports whether the event's pool is tracked, learning the
// group's kind or a larger window first; removed lists the keys a pool
// that stops being announced takes with it.
func (m *Mapper) announced(ev Event) (ok bool, removed []uint64) {
	if ev.Window > 0 || m.window > 0 {
		if ev.Window > m.window {
			if m.window > 0 {
				removed = m.clearPool(m.window)
			}
			m.window = ev.Window
		}
		return ev.Window == m.window, removed
	}
	if ev.Kind == Stored && ev.SpecKind != "" {
		m.kinds[ev.Group] = ev.SpecKind
	}
	kind, stated := m.kinds[ev.Group]
	if !stated {
		return ev.Group == 0, nil
	}
	return fullAttention[kind], nil
}

// Apply translates ev and returns the GPU tier's change: stored and
// removed are tether keys that became present or absent (two engine blocks
// with equal keys count once: a key is removed when the last of them is).
func (m *Mapper) Apply(ev Event) (stored, removed []uint64) {
	c := m.ApplyTiers(ev)
	return c.Stored, c.Removed
}

// ApplyTiers translates ev into the change of each tier.
//
// AllBlocksCleared clears the GPU tier only: vLLM emits it from the GPU
// block pool's reset_prefix_cache (vllm/v1/core/block_pool.py), which
// leaves the offloading connector's blocks in place.
func (m *Mapper) ApplyTiers(ev Event) Change {
	if ev.Kind == Cleared {
		return Change{Removed: m.clearTier(false)}
	}
	ok, retracted := m.announced(ev)
	var c Change
	c.Removed = retracted
	pool := m.poolOf(ev)
	off := ev.Offloaded()
	switch {
	case !ok && !off && m.window == 0 && gatingKinds[m.kinds[ev.Group]] && (ev.Kind == Stored || ev.Kind == Removed):
		// A pool a prefix hit needs beside the full-attention ones.
		m.stats.Skipped++
		g := m.gate(ev)
		c.Stored, c.Removed = g.Stored, append(c.Removed, g.Removed...)
		return c
	case !ok || (off && !m.knowMedium(ev.Medium)):
		m.stats.Skipped++
		return c
	case ev.Kind == Removed:
		var gone []uint64
		for _, h := range ev.Hashes {
			gone = m.drop(poolHash{pool, ev.Medium, h}, gone)
		}
		m.stats.Removed += uint64(len(gone))
		if off {
			c.OffloadedRemoved = gone
		} else {
			c.Removed = append(c.Removed, gone...)
		}
		return c
	case ev.Kind != Stored:
		return c
	}
	stored, removed := m.store(ev, pool)
	if off {
		c.OffloadedStored, c.OffloadedRemoved = stored, removed
		m.stats.Offloaded += uint64(len(stored))
	} else {
		c.Stored, c.Removed = stored, append(c.Removed, removed...)
		m.stats.Stored += uint64(len(stored))
	}
	m.stats.Removed += uint64(len(removed))
	return c
}

// knowMedium reports whether the offloaded medium is tracked, learning it
// while there is room.
func (m *Mapper) knowMedium(medium string) bool {
	for _, md := range m.mediums {
		if md == medium {
			return true
		}
	}
	if len(m.mediums) >= maxMediums {
		return false
	}
	m.mediums = append(m.mediums, medium)
	return true
}

// lookup finds the tether key of engine block h of pool in the event's
// medium, else the GPU's, else another offloaded medium's: an offloaded
// copy keeps the GPU block's hash, and its parent may be in any tier.
func (m *Mapper) lookup(pool int, medium string, h Hash) (uint64, bool) {
	if k, ok := m.keys[poolHash{pool, medium, h}]; ok {
		return k, true
	}
	if k, ok := m.keys[poolHash{pool, "", h}]; ok {
		return k, true
	}
	for _, md := range m.mediums {
		if k, ok := m.keys[poolHash{pool, md, h}]; ok {
			return k, true
		}
	}
	return 0, false
}

// store applies a stored-block event to its medium's blocks.
//
// vLLM's OffloadingConnector announces the blocks it stored in a medium
// without token ids or a parent (take_events in
// vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py:
// BlockStored(block_hashes, parent_block_hash=None, token_ids=[], ...,
// medium=event.medium)); their hashes are the GPU blocks' they were copied
// from, so their keys are looked up, not computed (Orphans when the
// Mapper never saw the block). A GPU store without token ids or a block
// size (a block TensorRT-LLM moved back from its host level) is looked up
// the same way in the offloaded mediums.
func (m *Mapper) store(ev Event, pool int) (stored, removed []uint64) {
	n := uint64(len(ev.Hashes))
	if len(ev.Tokens) == 0 && !ev.HasParent && (ev.Offloaded() || ev.BlockSize == 0) {
		if ev.BlockSize != 0 && ev.BlockSize != m.blockSize {
			m.stats.SizeMismatch += n
			return nil, nil
		}
		for i, h := range ev.Hashes {
			key, ok := m.lookup(pool, ev.Medium, h)
			if !ok {
				m.stats.Orphans++
				continue
			}
			var full bool
			if stored, removed, full = m.put(poolHash{pool, ev.Medium, h}, key, chainLink{}, stored, removed); full {
				m.stats.Overflow += n - uint64(i)
				break
			}
		}
		return stored, removed
	}
	switch {
	case ev.Foreign:
		m.stats.Foreign += n
		return nil, nil
	case ev.BlockSize != m.blockSize:
		m.stats.SizeMismatch += n
		return nil, nil
	case len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize:
		m.stats.Malformed += n
		return nil, nil
	}
	prev := prefix.AdapterSeed(ev.LoRAName) // a chain's start under its adapter
	if ev.HasParent {
		k, ok := m.lookup(pool, ev.Medium, ev.Parent)
		if !ok {
			m.stats.Orphans += n
			return nil, nil
		}
		prev = k
	}
	link := chainLink{parent: ev.Parent, has: ev.HasParent}
	for i, h := range ev.Hashes {
		key := prefix.ChainHash(prev, ev.Tokens[i*ev.BlockSize:(i+1)*ev.BlockSize])
		prev = key
		if i > 0 {
			link = chainLink{parent: ev.Hashes[i-1], has: true}
		}
		var full bool
		if stored, removed, full = m.put(poolHash{pool, ev.Medium, h}, key, link, stored, removed); full {
			m.stats.Overflow += n - uint64(i)
			break
		}
	}
	return stored, removed
}

// chainLink is a stored block's parent in its chain (has false: the chain
// starts with it, or unknown).
type chainLink struct {
	parent Hash
	has    bool
}

// put maps engine block ph to key, appending to stored a key that became
// present in ph's tier and to removed one a remapping took away; full is
// true (and nothing changes) at the MaxBlocks bound. A GPU block joins its
// chain (hybrid.go), announced when a hit may end at it or beyond.
func (m *Mapper) put(ph poolHash, key uint64, link chainLink, stored, removed []uint64) (_, _ []uint64, full bool) {
	if old, ok := m.keys[ph]; ok {
		if old == key {
			return stored, removed, false // re-announced (replay overlap): nothing changes
		}
		removed = m.drop(ph, removed)
	}
	if len(m.keys) >= m.maxBlocks {
		return stored, removed, true
	}
	m.keys[ph] = key
	if ph.medium == "" {
		stored, removed = m.link(ph, link.parent, link.has, stored, removed)
		return stored, removed, false
	}
	tk := tierKey{true, key}
	m.refs[tk]++
	if m.refs[tk] == 1 {
		stored = append(stored, key)
	}
	return stored, removed, false
}

// clearPool forgets one pool's GPU blocks and returns the keys no other
// pool holds.
func (m *Mapper) clearPool(pool int) []uint64 {
	var out []uint64
	for ph := range m.keys {
		if ph.pool == pool && ph.medium == "" {
			out = m.drop(ph, out)
		}
	}
	return out
}

// drop forgets engine block h, appending to removed the tether keys no
// engine block announces any more (h's, and in a hybrid model ancestors
// that led only to it).
func (m *Mapper) drop(h poolHash, removed []uint64) []uint64 {
	k, ok := m.keys[h]
	if !ok {
		return removed
	}
	if h.medium == "" {
		removed = m.unlink(h, removed)
		delete(m.keys, h)
		return removed
	}
	delete(m.keys, h)
	tk := tierKey{true, k}
	if m.refs[tk] <= 1 {
		delete(m.refs, tk)
		return append(removed, k)
	}
	m.refs[tk]--
	return removed
}

// clearTier forgets the blocks of one tier and returns their keys.
func (m *Mapper) clearTier(offloaded bool) []uint64 {
	var out []uint64
	for tk := range m.refs {
		if tk.offloaded == offloaded {
			out = append(out, tk.key)
			delete(m.refs, tk)
		}
	}
	for ph := range m.keys {
		if (ph.medium != "") == offloaded {
			delete(m.keys, ph)
		}
	}
	if !offloaded {
		// The GPU block pool's reset clears every group.
		clear(m.nodes)
		for _, held := range m.gates {
			clear(held)
		}
	}
	m.stats.Removed += uint64(len(out))
	return out
}

// Clear forgets every block of every tier and returns their tether keys
// (the engine restarted, or events were lost beyond recovery). What it
// learned of the pools (group kinds, the full-attention window) stays: it
// describes the model, not the cache.
func (m *Mapper) Clear() Change {
	return Change{Removed: m.clearTier(false), OffloadedRemoved: m.clearTier(true)}
}

// Keys lists the tether keys of the GPU tier announced now (each once).
func (m *Mapper) Keys() []uint64 { return m.tierKeys(false) }

// OffloadedKeys lists the tether keys of the offloaded tiers announced now
// (each once).
func (m *Mapper) OffloadedKeys() []uint64 { return m.tierKeys(true) }

func (m *Mapper) tierKeys(offloaded bool) []uint64 {
	var out []uint64
	for tk := range m.refs {
		if tk.offloaded == offloaded {
			out = append(out, tk.key)
		}
	}
	return out
}
