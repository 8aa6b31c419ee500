package enginekv

import (
	"github.com/tether-project/tether/routing/prefix"
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
	Offloaded       uint64 // events about a non-GPU tier
	Skipped         uint64 // events of pools not tracked (sliding-window, linear attention)
	Malformed       uint64 // token count not block_size × blocks
	Overflow        uint64 // stored blocks dropped at the MaxBlocks bound
}

// Mapper translates one engine rank's block events into tether block keys
// (routing/prefix chained hashes over token ids). It remembers each cached
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
type Mapper struct {
	blockSize int
	maxBlocks int
	keys      map[poolHash]uint64 // engine block → tether key, for blocks cached now
	refs      map[uint64]int      // tether key → engine blocks mapped to it
	kinds     map[int]string      // group → its kv_cache_spec_kind, once stated
	window    int                 // the largest window_size seen (the announced pool)
	stats     MapperStats
}

// poolHash is an engine block: its pool (group or window) and hash.
type poolHash struct {
	pool int
	hash Hash
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
	return &Mapper{blockSize: blockSize, maxBlocks: maxBlocks, keys: map[poolHash]uint64{}, refs: map[uint64]int{}, kinds: map[int]string{}}
}

// Len is the number of engine blocks tracked.
func (m *Mapper) Len() int { return len(m.keys) }

// Stats returns the counters.
func (m *Mapper) Stats() MapperStats { return m.stats }

// Key returns the tether key of a cached engine block of pool 0 (KV cache
// group 0, or the announced window).
func (m *Mapper) Key(h Hash) (uint64, bool) {
	k, ok := m.keys[poolHash{m.window, h}]
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

// Apply translates ev. stored and removed are tether keys that became
// present or absent (two engine blocks with equal keys count once: a key
// is removed when the last of them is).
func (m *Mapper) Apply(ev Event) (stored, removed []uint64) {
	if ev.Kind == Cleared {
		return nil, m.Clear()
	}
	ok, retracted := m.announced(ev)
	removed = retracted
	pool := m.poolOf(ev)
	switch {
	case !ok:
		m.stats.Skipped++
		return nil, removed
	case ev.Offloaded:
		m.stats.Offloaded++
		return nil, removed
	case ev.Kind == Removed:
		for _, h := range ev.Hashes {
			if k, ok := m.drop(poolHash{pool, h}); ok {
				removed = append(removed, k)
			}
		}
		m.stats.Removed += uint64(len(removed))
		return nil, removed
	case ev.Kind != Stored:
		return nil, removed
	}
	n := uint64(len(ev.Hashes))
	switch {
	case ev.Foreign:
		m.stats.Foreign += n
		return nil, removed
	case ev.BlockSize != m.blockSize:
		m.stats.SizeMismatch += n
		return nil, removed
	case len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize:
		m.stats.Malformed += n
		return nil, removed
	}
	prev := prefix.AdapterSeed(ev.LoRAName) // a chain's start under its adapter
	if ev.HasParent {
		k, ok := m.keys[poolHash{pool, ev.Parent}]
		if !ok {
			m.stats.Orphans += n
			return nil, removed
		}
		prev = k
	}
	for i, h := range ev.Hashes {
		ph := poolHash{pool, h}
		key := prefix.ChainHash(prev, ev.Tokens[i*ev.BlockSize:(i+1)*ev.BlockSize])
		prev = key
		if old, ok := m.keys[ph]; ok {
			if old == key {
				continue // re-announced (replay overlap): nothing changes
			}
			if k, gone := m.drop(ph); gone {
				removed = append(removed, k)
			}
		}
		if len(m.keys) >= m.maxBlocks {
			m.stats.Overflow += n - uint64(i)
			break
		}
		m.keys[ph] = key
		m.refs[key]++
		if m.refs[key] == 1 {
			stored = append(stored, key)
		}
	}
	m.stats.Stored += uint64(len(stored))
	m.stats.Removed += uint64(len(removed))
	return stored, removed
}

// clearPool forgets one pool's blocks and returns the keys no other pool
// holds.
func (m *Mapper) clearPool(pool int) []uint64 {
	var out []uint64
	for ph := range m.keys {
		if ph.pool == pool {
			if k, gone := m.drop(ph); gone {
				out = append(out, k)
			}
		}
	}
	return out
}

// drop forgets engine block h; it returns h's tether key and true when no
// other engine block maps to that key any more.
func (m *Mapper) drop(h poolHash) (uint64, bool) {
	k, ok := m.keys[h]
	if !ok {
		return 0, false
	}
	delete(m.keys, h)
	if m.refs[k] <= 1 {
		delete(m.refs, k)
		return k, true
	}
	m.refs[k]--
	return 0, false
}

// Clear forgets every block and returns their tether keys (the engine reset
// its cache, restarted, or events were lost beyond recovery). What it
// learned of the pools (group kinds, the full-attention window) stays: it
// describes the model, not the cache.
func (m *Mapper) Clear() []uint64 {
	out := make([]uint64, 0, len(m.refs))
	for k := range m.refs {
		out = append(out, k)
	}
	m.keys = map[poolHash]uint64{}
	m.refs = map[uint64]int{}
	m.stats.Removed += uint64(len(out))
	return out
}

// Keys lists the tether keys announced now (each once).
func (m *Mapper) Keys() []uint64 {
	out := make([]uint64, 0, len(m.refs))
	for k := range m.refs {
		out = append(out, k)
	}
	return out
}
