package fsm

import (
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
	"slices"
	"strings"
	"unsafe"
)

// State is the replicated affinity state at one log index. A published State
// is immutable: any number of goroutines may read it while the machine
// applies later entries into new States that share all unchanged structure.
// The zero State is not useful; states come from a Machine or ReadSnapshot.
type State struct {
	index uint64
	time  int64

	bindings pmap[*bindingRec] // (fleet, key) -> binding
	lru      lruTree           // recency order of the same records
	nextSeq  uint64            // next recency sequence number (node-local: not hashed, not in snapshots)
	ranked   int               // bindings with a rank (derived: picks the snapshot format)
	counts   pmap[*countRec]   // (fleet, instance) -> live bindings on it
	links    pmap[*linkRec]    // child -> parent link
	roots    pmap[*rootRec]    // root -> its children, sorted

	instances []Instance // sorted by ID; copied on write
	nodes     []Edge     // sorted by ID; copied on write

	featureLevel uint32
	// uniqueEpochsFrom is the index of the entry that committed feature
	// level 2 (0 before): epochs issued after it are MakeEpoch's, epochs at
	// or below it are log indexes (see EpochIndex).
	uniqueEpochsFrom uint64
	maxBindings      uint64
	counters         counterState

	dedup dedupWindow // the idempotency window (dedup.go)

	// digest is the multiset hash of every binding, link, instance and node
	// record: the lane-wise sum of their SHA-256 digests, kept up to date by
	// adding a record's digest when it appears and subtracting it when it goes.
	digest lanes
}

func emptyState() *State { return &State{maxBindings: DefaultMaxBindings, nextSeq: 1} }

// bindingRec is a binding as the state stores it. A key of up to
// inlineKeyBytes (a UUID is 36) is copied into the record itself and Key
// points there, so the lookup that compares keys reads one object, not two:
// on a machine where every cache miss is a page walk that halves its cost.
type bindingRec struct {
	inlineKey [inlineKeyBytes]byte // first, so the key shares a cache line with Fleet and Key
	Binding
	seq uint64 // recency sequence number, see lruTree
}

const inlineKeyBytes = 40

// newBindingRec makes the record for b (b's strings are shared, except that
// a short key is copied inline).
func newBindingRec(b *Binding) *bindingRec {
	r := &bindingRec{Binding: *b}
	if n := len(b.Key); n > 0 && n <= inlineKeyBytes {
		copy(r.inlineKey[:], b.Key)
		sameConv := b.ConversationID == b.Key
		r.Key = unsafe.String(&r.inlineKey[0], n)
		if sameConv {
			r.ConversationID = r.Key
		}
	}
	return r
}

func (r *bindingRec) mapKey() (uint8, string) { return uint8(r.Fleet), r.Key }

type linkRec struct{ ParentLink }

func (r *linkRec) mapKey() (uint8, string) { return 0, r.Child }

type rootRec struct {
	root     string
	children []string // sorted
}

func (r *rootRec) mapKey() (uint8, string) { return 0, r.root }

type countRec struct {
	fleet    Fleet
	instance string
	n        int
}

func (r *countRec) mapKey() (uint8, string) { return uint8(r.fleet), r.instance }

// Counters are cumulative, replicated apply statistics (part of the state
// hash and of snapshots).
type Counters struct {
	BindsCreated    uint64                    // Binds that created a binding
	BindsExisting   uint64                    // Binds on an already bound key (the first binding won)
	Rebinds         uint64                    // Overflows that moved a binding
	Touched         uint64                    // bindings whose LastUsed a Touch advanced
	LinksCreated    uint64                    // parent links recorded
	Rejected        uint64                    // proposals with StatusRejected
	ConditionFailed uint64                    // proposals with StatusConditionFailed
	Duplicates      uint64                    // proposals with StatusDuplicate
	Evictions       map[EvictReason]uint64    // bindings removed, by reason
	Overflows       map[OverflowReason]uint64 // overflows recorded, by reason (rebinding or not)
}

// counterState is Counters' fixed-size, copy-by-value form inside State.
type counterState struct {
	scalars   [8]uint64 // in Counters' field order
	evictions [256]uint64
	overflows [256]uint64
}

const (
	cBindsCreated = iota
	cBindsExisting
	cRebinds
	cTouched
	cLinksCreated
	cRejected
	cConditionFailed
	cDuplicates
)

type lanes [4]uint64

func (l *lanes) add(d *[32]byte) {
	for i := range l {
		l[i] += binary.LittleEndian.Uint64(d[8*i:])
	}
}

func (l *lanes) sub(d *[32]byte) {
	for i := range l {
		l[i] -= binary.LittleEndian.Uint64(d[8*i:])
	}
}

// Record digests: SHA-256 of a record tag byte and the record's canonical
// encoding. The tag keeps a binding from ever colliding with a link, etc.
const (
	recBinding  = 'B'
	recLink     = 'L'
	recInstance = 'I'
	recNode     = 'N'
	recDedup    = 'D'
)

func bindingDigest(scratch []byte, b *Binding) ([32]byte, []byte) {
	scratch = appendBinding(append(scratch[:0], recBinding), b)
	if b.HasRank {
		// Only when known, so a state without ranks hashes as level-1
		// builds hash it.
		scratch = appendUvarint(append(scratch, 'r'), uint64(b.Rank))
	}
	return sha256.Sum256(scratch), scratch
}

func appendLink(b []byte, l *ParentLink) []byte {
	b = appendString(b, l.Child)
	b = appendString(b, l.Parent)
	b = appendString(b, l.Root)
	b = append(b, l.Depth)
	b = appendVarint(b, l.CreatedAt)
	return appendVarint(b, l.LastUsed)
}

func linkDigest(scratch []byte, l *ParentLink) ([32]byte, []byte) {
	scratch = appendLink(append(scratch[:0], recLink), l)
	return sha256.Sum256(scratch), scratch
}

func appendInstance(b []byte, in *Instance) []byte {
	b = appendString(b, in.ID)
	b = append(b, uint8(in.Fleet))
	b = appendString(b, in.URL)
	b = append(b, uint8(in.Status))
	b = appendString(b, in.Version)
	b = appendUvarint(b, uint64(in.FeatureLevel))
	b = appendUvarint(b, uint64(in.Ranks))
	return appendVarint(b, in.Since)
}

func instanceDigest(scratch []byte, in *Instance) ([32]byte, []byte) {
	scratch = appendInstance(append(scratch[:0], recInstance), in)
	if in.Drained {
		// Only when drained, so a state without drains hashes as level-2
		// builds hash it.
		scratch = appendVarint(append(scratch, 'd'), in.DrainedSince)
	}
	return sha256.Sum256(scratch), scratch
}

func appendNode(b []byte, n *Edge) []byte {
	b = appendString(b, n.ID)
	b = appendString(b, n.Version)
	b = appendUvarint(b, uint64(n.MaxFeatureLevel))
	return appendVarint(b, n.Since)
}

func nodeDigest(scratch []byte, n *Edge) ([32]byte, []byte) {
	scratch = appendNode(append(scratch[:0], recNode), n)
	return sha256.Sum256(scratch), scratch
}

// Index is the log index of the last applied entry (0 for the empty state).
func (s *State) Index() uint64 { return s.index }

// Time is the log time of the last applied entry: the maximum of every
// applied entry's time, so it never goes backwards.
func (s *State) Time() int64 { return s.time }

// Lookup returns the binding of (f, key). It is the hot path of every
// request: no allocation, no lock. The returned Binding shares its strings
// and Decision.Candidates with the state; callers must not modify the slice.
func (s *State) Lookup(f Fleet, key string) (Binding, bool) {
	if rec := lookupBinding(&s.bindings, f, key); rec != nil {
		return rec.Binding, true
	}
	return Binding{}, false
}

// lookupBinding is pmap.getHashed written out for binding records, so the
// key comparison reads the record's fields directly instead of calling
// mapKey through the generic dictionary (an indirect call per lookup).
func lookupBinding(m *pmap[*bindingRec], f Fleet, key string) *bindingRec {
	h := trieHash(uint8(f), key)
	node, bitmap := m.root, m.rootBits
	for shift := uint(0); node != nil; shift += hamtBits {
		if shift >= hamtCollisions {
			for i := 1; i < len(node); i++ {
				if r := node[i].val; r.Fleet == f && r.Key == key {
					return r
				}
			}
			return nil
		}
		bit := uint32(1) << ((h >> shift) & hamtMask)
		if bitmap&bit == 0 {
			return nil
		}
		sl := &node[1+bits.OnesCount32(bitmap&(bit-1))]
		if sl.kids != nil {
			node, bitmap = sl.child(shift), uint32(sl.hash)
			continue
		}
		if r := sl.val; sl.hash == h && r.Fleet == f && r.Key == key {
			return r
		}
		return nil
	}
	return nil
}

// Len is the number of live bindings over all fleets.
func (s *State) Len() int { return s.bindings.len() }

// BindingCount is the number of live bindings of fleet f on instance.
func (s *State) BindingCount(f Fleet, instance string) int {
	if c, ok := s.counts.get(uint8(f), instance); ok {
		return c.n
	}
	return 0
}

// Link returns the parent link recorded for a sub-agent conversation.
func (s *State) Link(child string) (ParentLink, bool) {
	if l, ok := s.links.get(0, child); ok {
		return l.ParentLink, true
	}
	return ParentLink{}, false
}

// Children lists the sub-agent conversations linked to root, sorted.
func (s *State) Children(root string) []string {
	if r, ok := s.roots.get(0, root); ok {
		return slices.Clone(r.children)
	}
	return nil
}

// LinkCount is the number of recorded parent links.
func (s *State) LinkCount() int { return s.links.len() }

// Instance returns the instance record with the given id.
func (s *State) Instance(id string) (Instance, bool) {
	if i, ok := findInstance(s.instances, id); ok {
		return s.instances[i], true
	}
	return Instance{}, false
}

func findInstance(list []Instance, id string) (int, bool) {
	return slices.BinarySearchFunc(list, id, func(in Instance, id string) int { return strings.Compare(in.ID, id) })
}

func findNode(list []Edge, id string) (int, bool) {
	return slices.BinarySearchFunc(list, id, func(n Edge, id string) int { return strings.Compare(n.ID, id) })
}

// Instances lists every instance record, sorted by ID (a copy).
func (s *State) Instances() []Instance { return slices.Clone(s.instances) }

// Edges lists every edge that advertised itself, sorted by ID (a copy).
func (s *State) Edges() []Edge { return slices.Clone(s.nodes) }

// FeatureLevel is the committed cluster feature level (0 before any
// ClusterFeatures event).
func (s *State) FeatureLevel() uint32 { return s.featureLevel }

// EpochIndex is the log index of the entry that made the placement with
// this epoch, for any epoch this state or an earlier state of its log
// issued: epochs issued before feature level 2 was committed are log
// indexes, later ones are MakeEpoch's. For an epoch issued by a later state
// of the same log it returns an index above this state's, so for the state
// at index N, EpochIndex(e) > N says exactly "placed after N".
func (s *State) EpochIndex(epoch uint64) uint64 {
	if s.uniqueEpochsFrom != 0 && epoch > s.uniqueEpochsFrom {
		return EpochIndex(epoch)
	}
	return epoch
}

// MaxBindings is the capacity beyond which the least recently used bindings
// are evicted.
func (s *State) MaxBindings() uint64 { return s.maxBindings }

// IdleBindings returns up to limit bindings with LastUsed < before, least
// recently used first (a TTL sweeper proposes their eviction). A limit of 0
// or less returns nothing.
func (s *State) IdleBindings(before int64, limit int) []Binding {
	if limit <= 0 {
		return nil
	}
	var out []Binding
	s.lru.each(func(r *bindingRec) bool {
		if r.LastUsed >= before {
			return false
		}
		out = append(out, r.Binding)
		return len(out) < limit
	})
	return out
}

// ForEachBinding calls fn for every binding, least recently used first (the
// order is a function of the log, the same on every replica), until fn
// returns false.
func (s *State) ForEachBinding(fn func(Binding) bool) {
	s.lru.each(func(r *bindingRec) bool { return fn(r.Binding) })
}

// Counters returns the cumulative apply statistics.
func (s *State) Counters() Counters {
	c := &s.counters
	out := Counters{
		BindsCreated:    c.scalars[cBindsCreated],
		BindsExisting:   c.scalars[cBindsExisting],
		Rebinds:         c.scalars[cRebinds],
		Touched:         c.scalars[cTouched],
		LinksCreated:    c.scalars[cLinksCreated],
		Rejected:        c.scalars[cRejected],
		ConditionFailed: c.scalars[cConditionFailed],
		Duplicates:      c.scalars[cDuplicates],
		Evictions:       map[EvictReason]uint64{},
		Overflows:       map[OverflowReason]uint64{},
	}
	for r, n := range c.evictions {
		if n != 0 {
			out.Evictions[EvictReason(r)] = n
		}
	}
	for r, n := range c.overflows {
		if n != 0 {
			out.Overflows[OverflowReason(r)] = n
		}
	}
	return out
}

// hashDomain separates this hash from any other SHA-256 use; bump its
// version if what the hash covers changes.
const hashDomain = "tether/fsm state hash v1\x00"

// Hash is a digest of the whole replicated state: bindings, links,
// instances, nodes, the idempotency window, counters, settings, feature
// level, the log index and the log time. Two replicas that applied the same
// log to the same index agree on it, and replaying the archive reproduces
// it. It costs one SHA-256 over about 200 bytes however large the state,
// because the record part is maintained incrementally (see DESIGN.md).
// Node-local facts (Skipped, recency sequence numbers) are not included.
func (s *State) Hash() [32]byte {
	b := make([]byte, 0, 512)
	b = append(b, hashDomain...)
	b = binary.LittleEndian.AppendUint64(b, s.index)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.time))
	b = binary.LittleEndian.AppendUint32(b, s.featureLevel)
	b = binary.LittleEndian.AppendUint64(b, s.maxBindings)
	if s.uniqueEpochsFrom != 0 {
		// Only from level 2 on, so a level-1 state hashes as level-1
		// builds hash it.
		b = append(b, 'u')
		b = binary.LittleEndian.AppendUint64(b, s.uniqueEpochsFrom)
	}
	for _, n := range []int{s.bindings.len(), s.links.len(), len(s.instances), len(s.nodes), s.dedup.curLen, s.dedup.prevLen} {
		b = binary.LittleEndian.AppendUint64(b, uint64(n))
	}
	for _, l := range []*lanes{&s.digest, &s.dedup.curSum, &s.dedup.prevSum} {
		for _, v := range l {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
	}
	for _, v := range s.counters.scalars {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	for r, n := range s.counters.evictions {
		if n != 0 {
			b = append(b, 'e', byte(r))
			b = binary.LittleEndian.AppendUint64(b, n)
		}
	}
	for r, n := range s.counters.overflows {
		if n != 0 {
			b = append(b, 'o', byte(r))
			b = binary.LittleEndian.AppendUint64(b, n)
		}
	}
	return sha256.Sum256(b)
}
