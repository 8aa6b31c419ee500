// Package kvindex is the edge's index of which KV blocks each worker instance
// (and attention-DP rank) holds, keyed by internal/prefix chained block hashes.
// It answers one question fast: for a prompt's block hashes, how many leading
// blocks does each instance already hold?
//
// It is fed by the workers' sequence-numbered KV event batches (stored and
// removed blocks per rank), by full dumps that replace an instance's contents
// after a gap, and by predictions: right after the edge places a request, the
// request's prefix counts as present on the chosen instance for a short TTL,
// so a burst of requests sharing that prefix lands together before the
// worker's stored event arrives.
//
// The index does no I/O and reads no clock: time is a parameter. It is safe
// for concurrent use (one writer at a time, many concurrent matches).
package kvindex

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"time"
)

// MaxRanks bounds a rank number (same bound as the telemetry codec).
const MaxRanks = 1024

// DefaultPredictTTL is how long a placed request's prefix counts as present
// on its instance without a stored event. It should cover the worker's
// telemetry interval plus a typical prefill.
const DefaultPredictTTL = 5 * time.Second

// Errors returned by the index. Each is wrapped with the instance and field.
var (
	// ErrInvalid: a batch or dump that cannot be applied (bad rank, zero
	// hash, empty instance id). A known instance becomes stale.
	ErrInvalid = errors.New("invalid kv index input")
	// ErrTooManyHolders: more than 65,536 (instance, rank) holders.
	ErrTooManyHolders = errors.New("kv index holder slots exhausted")
)

// Config configures an Index.
type Config struct {
	// PredictTTL: lifetime of a prediction. 0 means DefaultPredictTTL;
	// negative disables predictions.
	PredictTTL time.Duration
}

// RankEvent is one change to one rank's cache: Removed is applied before
// Stored. Offloaded: the change is to the rank's offloaded tier (blocks
// the engine copied out of GPU memory, to CPU memory or disk, and loads
// back before reuse), which the index keeps apart from its GPU blocks.
type RankEvent struct {
	Rank      int
	Removed   []uint64
	Stored    []uint64
	Offloaded bool
}

// Batch is one sequence-numbered batch of KV events from one worker boot.
// Seq increases by exactly one per batch within a boot; a new Boot means the
// worker restarted with empty caches.
type Batch struct {
	Instance string
	Boot     uint64
	Seq      uint64
	Events   []RankEvent
	// Approximate: the batch comes from a model of the instance's cache
	// (the edge's shadow of an engine that publishes no KV events), not
	// from the instance. The instance stays approximate until a batch or
	// dump from the instance itself replaces the baseline, and Holds
	// never reports it synced: its "no" is no evidence of eviction.
	Approximate bool
}

// Outcome says what Apply did with a batch.
type Outcome uint8

const (
	// Applied: the batch was the next in sequence (or Seq 1 of a new
	// boot) and is now reflected in the index.
	Applied Outcome = iota + 1
	// Duplicate: the batch's sequence was already applied; ignored.
	Duplicate
	// Gap: a batch is missing; the instance's stored blocks were dropped
	// and it is stale until ReplaceInstance installs a full dump.
	Gap
	// NeedsDump: the instance is stale (a gap, or first seen mid-stream);
	// the batch was ignored. Request a dump.
	NeedsDump
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Gap:
		return "gap"
	case NeedsDump:
		return "needs_dump"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Match is how much of a prompt one instance holds.
type Match struct {
	Instance string
	// Blocks is the number of leading prompt blocks held contiguously by
	// one rank (or predicted on the instance).
	Blocks int
	// Rank holds them; -1 when the match comes from a prediction only.
	Rank int
	// Offloaded is the number of leading prompt blocks one rank holds in
	// its offloaded tier (0 when none); OffloadedRank is that rank (0
	// when none).
	// Blocks a rank holds both ways count in Blocks; placement credits
	// the blocks beyond Blocks at a lower weight.
	Offloaded     int
	OffloadedRank int
}

// Stats describes the index's size.
type Stats struct {
	Blocks       int   // distinct block hashes known
	HolderBlocks int64 // stored (block, rank) pairs
	Instances    int
	Stale        int // instances without a trusted baseline
	Predictions  int // pending prediction records
	Sets         int // distinct interned holder sets
}

type owner struct {
	inst      *instance // nil: free slot
	rank      int       // -1: the instance's predicted pseudo-rank
	offloaded bool      // the rank's offloaded tier
}

type instance struct {
	id    string
	idx   int     // position in Index.insts
	ranks []int32 // rank → slot+1 (0: none yet)
	// offRanks: rank → the slot+1 of its offloaded tier (0: none yet).
	offRanks []int32
	pred     int32 // predicted slot+1 (0: none yet)
	synced   bool  // a baseline (Seq 1 of a boot, or a dump) and no gap since
	boot     uint64
	seq      uint64
	holders  int64 // stored (block, rank) pairs
	// perRank[r]: stored blocks of rank r; offPerRank[r]: of its
	// offloaded tier.
	perRank    []int64
	offPerRank []int64
	// approx: the stored blocks come from Approximate batches.
	approx bool
}

// InstanceKV is what the index knows about one instance (admin API).
type InstanceKV struct {
	// Synced: a trusted baseline and no gap since (approximate or not).
	Synced bool
	// Approximate: the stored blocks come from Approximate batches.
	Approximate bool
	// Boot and Seq: the last applied batch (or dump) position.
	Boot, Seq uint64
	// RankBlocks[r]: blocks the index holds for rank r;
	// OffloadedRankBlocks[r]: for its offloaded tier.
	RankBlocks          []int64
	OffloadedRankBlocks []int64
}

type predRecord struct {
	slot    slot
	expires int64
	blocks  []uint64
}

// Index is the KV block index. The zero value is not usable; call New.
type Index struct {
	ttl time.Duration

	mu           sync.RWMutex
	blocks       map[uint64]setID // block hash → its holders
	sets         sets
	byID         map[string]*instance
	insts        []*instance
	owners       []owner
	free         []slot
	words        int // bitset words covering every allocated slot
	holderBlocks int64
	preds        []predRecord // FIFO by insertion; expiries are non-decreasing when time is
	predHead     int

	scratch sync.Pool
}

// New returns an empty index.
func New(cfg Config) *Index {
	ttl := cfg.PredictTTL
	if ttl == 0 {
		ttl = DefaultPredictTTL
	}
	return &Index{
		ttl:    ttl,
		blocks: make(map[uint64]setID),
		sets:   newSets(),
		byID:   make(map[string]*instance),
	}
}

// Apply applies one KV event batch. It never panics; an invalid batch
// returns an error wrapping ErrInvalid and leaves a known instance stale.
func (ix *Index) Apply(b Batch) (Outcome, error) {
	if b.Instance == "" {
		return 0, fmt.Errorf("kvindex: apply batch seq %d: empty instance id: %w", b.Seq, ErrInvalid)
	}
	verr := validateBatch(b)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	defer ix.sets.end()
	in := ix.instanceLocked(b.Instance)
	if verr != nil {
		ix.goStaleLocked(in)
		return 0, fmt.Errorf("kvindex: apply batch %s seq %d: %w", b.Instance, b.Seq, verr)
	}
	switch {
	case in.synced && b.Boot == in.boot:
		if b.Seq <= in.seq {
			return Duplicate, nil
		}
		if b.Seq != in.seq+1 {
			ix.goStaleLocked(in)
			return Gap, nil
		}
	case b.Seq == 1:
		// Seq 1 of a boot: the worker's caches started empty, so this is
		// a complete baseline (a restart drops what the old boot held).
		ix.clearStoredLocked(in)
		in.synced, in.boot, in.seq = true, b.Boot, 0
		in.approx = b.Approximate
	default:
		if in.boot != b.Boot {
			// A restart we joined mid-stream: the old contents are gone
			// and the new ones unknown.
			ix.clearStoredLocked(in)
			in.boot = b.Boot
			in.synced = false
			in.approx = b.Approximate
		}
		return NeedsDump, nil
	}
	for _, ev := range b.Events {
		s, err := ix.rankSlotLocked(in, ev.Rank, ev.Offloaded)
		if err != nil {
			ix.goStaleLocked(in)
			return 0, fmt.Errorf("kvindex: apply batch %s seq %d: %w", b.Instance, b.Seq, err)
		}
		ix.updateLocked(in, ev.Removed, setOp{kind: opRemove, slot: s})
		ix.updateLocked(in, ev.Stored, setOp{kind: opAdd, slot: s})
	}
	in.seq = b.Seq
	return Applied, nil
}

// ReplaceInstance installs a full dump of an instance's cache: ranks[r] lists
// the blocks rank r holds. It reflects every batch of boot up to seq, so the
// instance is synced again and batches continue from seq+1. A dump no newer
// than what a synced instance already reflects is ignored.
func (ix *Index) ReplaceInstance(instanceID string, boot, seq uint64, ranks [][]uint64) error {
	if instanceID == "" {
		return fmt.Errorf("kvindex: replace instance: empty instance id: %w", ErrInvalid)
	}
	if len(ranks) > MaxRanks {
		return fmt.Errorf("kvindex: replace instance %s: %d ranks (max %d): %w", instanceID, len(ranks), MaxRanks, ErrInvalid)
	}
	for r, blocks := range ranks {
		for i, h := range blocks {
			if h == 0 {
				return fmt.Errorf("kvindex: replace instance %s: ranks[%d][%d]: zero hash: %w", instanceID, r, i, ErrInvalid)
			}
		}
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	defer ix.sets.end()
	in := ix.instanceLocked(instanceID)
	if in.synced && in.boot == boot && seq <= in.seq {
		return nil
	}
	ix.clearStoredLocked(in)
	for r, blocks := range ranks {
		if len(blocks) == 0 {
			continue
		}
		s, err := ix.rankSlotLocked(in, r, false)
		if err != nil {
			ix.goStaleLocked(in)
			return fmt.Errorf("kvindex: replace instance %s: %w", instanceID, err)
		}
		ix.updateLocked(in, blocks, setOp{kind: opAdd, slot: s})
	}
	in.synced, in.boot, in.seq = true, boot, seq
	in.approx = false
	return nil
}

// RemoveInstance forgets an instance: its stored blocks, its predictions and
// its holder slots.
func (ix *Index) RemoveInstance(instanceID string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	defer ix.sets.end()
	in, ok := ix.byID[instanceID]
	if !ok {
		return
	}
	set := make([]uint64, ix.words)
	var slots []slot
	for _, p := range append(slices.Clip(in.ranks), in.offRanks...) {
		if p != 0 {
			slots = append(slots, slot(p-1))
		}
	}
	if in.pred != 0 {
		slots = append(slots, slot(in.pred-1))
	}
	for _, s := range slots {
		set[s/64] |= 1 << (s % 64)
	}
	ix.purgeLocked(set)
	for _, s := range slots {
		ix.owners[s] = owner{}
		ix.free = append(ix.free, s)
	}
	ix.holderBlocks -= in.holders
	delete(ix.byID, instanceID)
	last := ix.insts[len(ix.insts)-1]
	ix.insts[in.idx], last.idx = last, in.idx
	ix.insts[len(ix.insts)-1] = nil
	ix.insts = ix.insts[:len(ix.insts)-1]
}

// Predict marks blocks as present on instanceID until now+PredictTTL. It
// also drops predictions that expired by now.
func (ix *Index) Predict(instanceID string, blocks []uint64, now time.Time) {
	if ix.ttl < 0 || instanceID == "" || len(blocks) == 0 {
		return
	}
	nowN := now.UnixNano()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	defer ix.sets.end()
	ix.expireLocked(nowN)
	in := ix.instanceLocked(instanceID)
	if in.pred == 0 {
		s, err := ix.allocSlotLocked(in, -1, false)
		if err != nil {
			return // no room for a prediction: placement works without it
		}
		in.pred = int32(s) + 1
	}
	s := slot(in.pred - 1)
	expires := nowN + int64(ix.ttl)
	kept := make([]uint64, 0, len(blocks))
	for _, h := range blocks {
		if h != 0 {
			kept = append(kept, h)
		}
	}
	ix.updateLocked(nil, kept, setOp{kind: opPredict, slot: s, time: expires})
	ix.preds = append(ix.preds, predRecord{slot: s, expires: expires, blocks: kept})
}

// Expire drops predictions that expired at or before now and returns how
// many prediction records it dropped. Matching ignores expired predictions
// either way; Expire only frees their memory.
func (ix *Index) Expire(now time.Time) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	defer ix.sets.end()
	return ix.expireLocked(now.UnixNano())
}

// Stale reports whether the index has no trusted baseline for instanceID
// (unknown, joined mid-stream, or a gap since): its stored blocks are not
// used until a dump arrives. Predictions still apply.
func (ix *Index) Stale(instanceID string) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	in, ok := ix.byID[instanceID]
	return !ok || !in.synced
}

// Instance reports what the index knows about instanceID (ok false when
// the index never saw it).
func (ix *Index) Instance(instanceID string) (kv InstanceKV, ok bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	in, ok := ix.byID[instanceID]
	if !ok {
		return InstanceKV{}, false
	}
	return InstanceKV{Synced: in.synced, Approximate: in.approx, Boot: in.boot, Seq: in.seq,
		RankBlocks: slices.Clone(in.perRank), OffloadedRankBlocks: slices.Clone(in.offPerRank)}, true
}

// Stats returns the index's size.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := Stats{
		Blocks:       len(ix.blocks),
		HolderBlocks: ix.holderBlocks,
		Instances:    len(ix.byID),
		Predictions:  len(ix.preds) - ix.predHead,
		Sets:         len(ix.sets.all) - 1 - len(ix.sets.free),
	}
	for _, in := range ix.byID {
		if !in.synced {
			st.Stale++
		}
	}
	return st
}

// scratchSpace is per-Match working memory, pooled so a match allocates
// nothing in steady state.
type scratchSpace struct {
	alive, next, first []uint64
	matched            []int32 // per slot: leading blocks held
	pos                []int32 // per instance: its index in dst plus one (0: none yet)
}

func (ix *Index) getScratch(words, instances int) *scratchSpace {
	sc, _ := ix.scratch.Get().(*scratchSpace)
	if sc == nil {
		sc = &scratchSpace{}
	}
	if cap(sc.alive) < words {
		sc.alive = make([]uint64, words)
		sc.next = make([]uint64, words)
		sc.first = make([]uint64, words)
	}
	sc.alive, sc.next, sc.first = sc.alive[:words], sc.next[:words], sc.first[:words]
	if cap(sc.matched) < words*64 {
		sc.matched = make([]int32, words*64)
	}
	sc.matched = sc.matched[:words*64]
	if cap(sc.pos) < instances {
		sc.pos = make([]int32, instances)
	}
	sc.pos = sc.pos[:instances]
	return sc
}

// Match appends to dst[:0], for every instance holding at least the first
// block of blocks, how many leading blocks it holds (best rank, or its live
// prediction at now). It walks the prompt once, narrowing the set of holders
// still matching and stopping when none remain; consecutive blocks mapped to
// the same holder set cost one map lookup each. When nobody holds the first
// block it returns at once (the all-cold fast path). The order of the result
// is unspecified.
func (ix *Index) Match(blocks []uint64, now time.Time, dst []Match) []Match {
	dst = dst[:0]
	if len(blocks) == 0 {
		return dst
	}
	nowN := now.UnixNano()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	id, ok := ix.blocks[blocks[0]]
	if !ok {
		return dst
	}
	sc := ix.getScratch(ix.words, len(ix.insts))
	defer ix.scratch.Put(sc)
	alive, next, first := sc.alive, sc.next, sc.first
	for w := range alive {
		alive[w] = ^uint64(0)
		next[w] = 0
	}
	ix.sets.get(id).liveInto(next, alive, nowN)
	alive, next = next, alive
	copy(first, alive)
	if allZero(alive) {
		return dst
	}
	matched := sc.matched
	depth := 1
	prev := id
	for ; depth < len(blocks); depth++ {
		id, ok := ix.blocks[blocks[depth]]
		if !ok {
			break
		}
		if id == prev {
			// alive ⊆ the previous block's holders, so intersecting
			// with the same set again changes nothing.
			continue
		}
		prev = id
		clear(next)
		ix.sets.get(id).liveInto(next, alive, nowN)
		any := false
		for w, a := range alive {
			dropped := a &^ next[w]
			for dropped != 0 {
				b := bits.TrailingZeros64(dropped)
				matched[w*64+b] = int32(depth)
				dropped &= dropped - 1
			}
			if next[w] != 0 {
				any = true
			}
		}
		alive, next = next, alive
		if !any {
			break
		}
	}
	for w, a := range alive {
		for a != 0 {
			b := bits.TrailingZeros64(a)
			matched[w*64+b] = int32(depth)
			a &= a - 1
		}
	}
	return ix.foldMatches(dst, sc, first, matched)
}

// foldMatches folds the matched depth of every slot that held the first
// block into dst, one entry per instance: an instance's best holder wins (a
// real rank over a prediction on ties, then the lower rank), its GPU and
// prediction slots into Blocks, its offloaded tiers into Offloaded. It
// leaves the scratch positions zeroed.
func (ix *Index) foldMatches(dst []Match, sc *scratchSpace, first []uint64, matched []int32) []Match {
	pos := sc.pos
	for w, f := range first {
		for f != 0 {
			b := bits.TrailingZeros64(f)
			f &= f - 1
			s := w*64 + b
			o := ix.owners[s]
			if o.inst == nil {
				continue
			}
			n := int(matched[s])
			p := pos[o.inst.idx]
			if p == 0 {
				dst = append(dst, Match{Instance: o.inst.id, Rank: -1})
				p = int32(len(dst))
				pos[o.inst.idx] = p
			}
			cur := &dst[p-1]
			switch {
			case o.offloaded:
				if n > cur.Offloaded || (n == cur.Offloaded && o.rank < cur.OffloadedRank) {
					cur.Offloaded, cur.OffloadedRank = n, o.rank
				}
			case n > cur.Blocks || (n == cur.Blocks && betterRank(o.rank, cur.Rank)):
				cur.Blocks, cur.Rank = n, o.rank
			}
		}
	}
	for w, f := range first { // leave the scratch zeroed
		for f != 0 {
			b := bits.TrailingZeros64(f)
			f &= f - 1
			if o := ix.owners[w*64+b]; o.inst != nil {
				pos[o.inst.idx] = 0
			}
		}
	}
	return dst
}

// Holds reports whether instanceID holds block on rank (any rank when rank
// is negative), or as a prediction live at now, and whether the index has a
// trusted baseline for the instance (an unsynced instance's answer reflects
// its predictions only, so a "no" is no evidence of eviction). A prediction
// counts on every rank: it records a prompt routed to the instance, which
// the worker placed on the rank the key is bound to. One map lookup:
// routing asks it on the sticky path (the cache-lost check).
func (ix *Index) Holds(instanceID string, rank int, block uint64, now time.Time) (held, synced bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	in, ok := ix.byID[instanceID]
	if !ok {
		return false, false
	}
	// A shadow's contents are a model: its "no" proves nothing.
	synced = in.synced && !in.approx
	id, ok := ix.blocks[block]
	if !ok {
		return false, synced
	}
	set := ix.sets.get(id)
	for r, s := range in.ranks {
		if s > 0 && (rank < 0 || r == rank) && set.has(slot(s-1)) {
			return true, synced
		}
	}
	if in.pred > 0 {
		nowN := now.UnixNano()
		for _, p := range set.preds {
			if p.slot == slot(in.pred-1) && p.expires > nowN {
				return true, synced
			}
		}
	}
	return false, synced
}

// HeldByOther reports whether an instance other than instanceID holds
// block: on any rank or tier, or as a prediction live at now. One map
// lookup and a walk of the block's holders: routing asks it on the sticky
// path before a Match, since no instance holds a prompt's first n blocks
// contiguously without holding its n-th.
func (ix *Index) HeldByOther(instanceID string, block uint64, now time.Time) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	id, ok := ix.blocks[block]
	if !ok {
		return false
	}
	set := ix.sets.get(id)
	for w, word := range set.bits {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			word &= word - 1
			if o := ix.owners[w*64+b]; o.inst != nil && o.inst.id != instanceID {
				return true
			}
		}
	}
	nowN := now.UnixNano()
	for _, p := range set.preds {
		if o := ix.owners[p.slot]; p.expires > nowN && o.inst != nil && o.inst.id != instanceID {
			return true
		}
	}
	return false
}

func betterRank(a, b int) bool {
	if (a < 0) != (b < 0) {
		return a >= 0
	}
	return a < b
}

func allZero(ws []uint64) bool {
	for _, w := range ws {
		if w != 0 {
			return false
		}
	}
	return true
}

func validateBatch(b Batch) error {
	for i, ev := range b.Events {
		if ev.Rank < 0 || ev.Rank >= MaxRanks {
			return fmt.Errorf("events[%d].rank %d (want 0..%d): %w", i, ev.Rank, MaxRanks-1, ErrInvalid)
		}
		for _, h := range ev.Removed {
			if h == 0 {
				return fmt.Errorf("events[%d].removed: zero hash: %w", i, ErrInvalid)
			}
		}
		for _, h := range ev.Stored {
			if h == 0 {
				return fmt.Errorf("events[%d].stored: zero hash: %w", i, ErrInvalid)
			}
		}
	}
	return nil
}

func (ix *Index) instanceLocked(id string) *instance {
	in, ok := ix.byID[id]
	if !ok {
		in = &instance{id: id, idx: len(ix.insts)}
		ix.byID[id] = in
		ix.insts = append(ix.insts, in)
	}
	return in
}

func (ix *Index) allocSlotLocked(in *instance, rank int, offloaded bool) (slot, error) {
	var s slot
	if n := len(ix.free); n > 0 {
		s = ix.free[n-1]
		ix.free = ix.free[:n-1]
	} else {
		if len(ix.owners) >= maxSlots {
			return 0, fmt.Errorf("instance %s rank %d: %w", in.id, rank, ErrTooManyHolders)
		}
		s = slot(len(ix.owners))
		ix.owners = append(ix.owners, owner{})
		ix.words = (len(ix.owners) + 63) / 64
	}
	ix.owners[s] = owner{inst: in, rank: rank, offloaded: offloaded}
	return s, nil
}

// rankSlotLocked is the slot of a rank's GPU blocks, or of its offloaded
// tier, allocated on first use.
func (ix *Index) rankSlotLocked(in *instance, rank int, offloaded bool) (slot, error) {
	if rank < 0 || rank >= MaxRanks {
		return 0, fmt.Errorf("instance %s: rank %d (want 0..%d): %w", in.id, rank, MaxRanks-1, ErrInvalid)
	}
	slots, counts := &in.ranks, &in.perRank
	if offloaded {
		slots, counts = &in.offRanks, &in.offPerRank
	}
	if rank < len(*slots) && (*slots)[rank] != 0 {
		return slot((*slots)[rank] - 1), nil
	}
	s, err := ix.allocSlotLocked(in, rank, offloaded)
	if err != nil {
		return 0, err
	}
	for len(*slots) <= rank {
		*slots = append(*slots, 0)
		*counts = append(*counts, 0)
	}
	(*slots)[rank] = int32(s) + 1
	return s, nil
}

// rankCount is the stored-block count of the slot's owner.
func rankCount(in *instance, o owner) *int64 {
	if o.offloaded {
		return &in.offPerRank[o.rank]
	}
	return &in.perRank[o.rank]
}

// updateLocked applies one set operation to each block. For stored-holder
// operations it keeps the instance's and the index's holder counts.
func (ix *Index) updateLocked(in *instance, blocks []uint64, op setOp) {
	ix.sets.newOp()
	for _, h := range blocks {
		from := ix.blocks[h]
		if op.kind == opUnpredict && from == 0 {
			continue
		}
		had := op.kind == opAdd || op.kind == opRemove
		if had {
			had = ix.sets.get(from).has(op.slot)
		}
		to := ix.sets.apply(from, &op)
		if to == from {
			continue
		}
		switch {
		case op.kind == opAdd && !had:
			in.holders++
			*rankCount(in, ix.owners[op.slot])++
			ix.holderBlocks++
		case op.kind == opRemove && had:
			in.holders--
			*rankCount(in, ix.owners[op.slot])--
			ix.holderBlocks--
		}
		ix.sets.retarget(from, to)
		if to == 0 {
			delete(ix.blocks, h)
		} else {
			ix.blocks[h] = to
		}
	}
}

// goStaleLocked drops an instance's stored blocks and marks it stale.
func (ix *Index) goStaleLocked(in *instance) {
	ix.clearStoredLocked(in)
	in.synced = false
}

// clearStoredLocked drops every stored block of the instance's ranks (its
// predictions stay). It scans the whole block map, which is acceptable
// because it happens only on a restart, a gap or a dump.
func (ix *Index) clearStoredLocked(in *instance) {
	if in.holders == 0 {
		return
	}
	set := make([]uint64, ix.words)
	for _, p := range append(slices.Clip(in.ranks), in.offRanks...) {
		if p != 0 {
			s := slot(p - 1)
			set[s/64] |= 1 << (s % 64)
		}
	}
	ix.purgeLocked(set)
	ix.holderBlocks -= in.holders
	in.holders = 0
	clear(in.perRank)
	clear(in.offPerRank)
}

func (ix *Index) purgeLocked(set []uint64) {
	ix.sets.newOp()
	op := setOp{kind: opPurge, removed: set}
	for h, from := range ix.blocks {
		to := ix.sets.apply(from, &op)
		if to == from {
			continue
		}
		ix.sets.retarget(from, to)
		if to == 0 {
			delete(ix.blocks, h)
		} else {
			ix.blocks[h] = to
		}
	}
}

func (ix *Index) expireLocked(now int64) int {
	n := 0
	for ix.predHead < len(ix.preds) && ix.preds[ix.predHead].expires <= now {
		p := &ix.preds[ix.predHead]
		ix.updateLocked(nil, p.blocks, setOp{kind: opUnpredict, slot: p.slot, time: now})
		*p = predRecord{}
		ix.predHead++
		n++
	}
	// Compact the queue once its dead head dominates.
	if ix.predHead > 64 && ix.predHead*2 > len(ix.preds) {
		live := copy(ix.preds, ix.preds[ix.predHead:])
		clear(ix.preds[live:])
		ix.preds = ix.preds[:live]
		ix.predHead = 0
	}
	return n
}
