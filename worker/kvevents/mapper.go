package kvevents

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
	Skipped         uint64 // events of other KV cache groups
	Malformed       uint64 // token count not block_size × blocks
	Overflow        uint64 // stored blocks dropped at the MaxBlocks bound
}

// Mapper translates one engine rank's block events into tether block keys
// (routing/prefix chained hashes over token ids). It remembers each cached
// engine block's tether key so a later event can name a parent or a removal
// by engine hash only. Not safe for concurrent use.
type Mapper struct {
	blockSize int
	maxBlocks int
	keys      map[Hash]uint64 // engine hash → tether key, for blocks cached now
	refs      map[uint64]int  // tether key → engine blocks mapped to it
	stats     MapperStats
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
	return &Mapper{blockSize: blockSize, maxBlocks: maxBlocks, keys: map[Hash]uint64{}, refs: map[uint64]int{}}
}

// Len is the number of engine blocks tracked.
func (m *Mapper) Len() int { return len(m.keys) }

// Stats returns the counters.
func (m *Mapper) Stats() MapperStats { return m.stats }

// Key returns the tether key of a cached engine block.
func (m *Mapper) Key(h Hash) (uint64, bool) {
	k, ok := m.keys[h]
	return k, ok
}

// Apply translates ev. stored and removed are tether keys that became
// present or absent (two engine blocks with equal keys count once: a key
// is removed when the last of them is).
func (m *Mapper) Apply(ev Event) (stored, removed []uint64) {
	switch {
	case ev.Kind == Cleared:
		return nil, m.Clear()
	case ev.Skip:
		m.stats.Skipped++
		return nil, nil
	case ev.Offloaded:
		m.stats.Offloaded++
		return nil, nil
	case ev.Kind == Removed:
		for _, h := range ev.Hashes {
			if k, ok := m.drop(h); ok {
				removed = append(removed, k)
			}
		}
		m.stats.Removed += uint64(len(removed))
		return nil, removed
	case ev.Kind != Stored:
		return nil, nil
	}
	n := uint64(len(ev.Hashes))
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
		k, ok := m.keys[ev.Parent]
		if !ok {
			m.stats.Orphans += n
			return nil, nil
		}
		prev = k
	}
	for i, h := range ev.Hashes {
		key := prefix.ChainHash(prev, ev.Tokens[i*ev.BlockSize:(i+1)*ev.BlockSize])
		prev = key
		if old, ok := m.keys[h]; ok {
			if old == key {
				continue // re-announced (replay overlap): nothing changes
			}
			if k, gone := m.drop(h); gone {
				removed = append(removed, k)
			}
		}
		if len(m.keys) >= m.maxBlocks {
			m.stats.Overflow += n - uint64(i)
			break
		}
		m.keys[h] = key
		m.refs[key]++
		if m.refs[key] == 1 {
			stored = append(stored, key)
		}
	}
	m.stats.Stored += uint64(len(stored))
	m.stats.Removed += uint64(len(removed))
	return stored, removed
}

// drop forgets engine block h; it returns h's tether key and true when no
// other engine block maps to that key any more.
func (m *Mapper) drop(h Hash) (uint64, bool) {
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
// its cache, restarted, or events were lost beyond recovery).
func (m *Mapper) Clear() []uint64 {
	out := make([]uint64, 0, len(m.refs))
	for k := range m.refs {
		out = append(out, k)
	}
	m.keys = map[Hash]uint64{}
	m.refs = map[uint64]int{}
	m.stats.Removed += uint64(len(out))
	return out
}
