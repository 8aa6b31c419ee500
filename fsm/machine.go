package fsm

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
)

// Entry is one committed log entry as the machine applies it.
type Entry struct {
	Index uint64
	Time  int64 // unix nanoseconds: the leader's AppendedAt
	Data  []byte
}

// Machine applies log entries to the replicated state. Apply, ApplyBatch and
// Restore are for a single writer (Raft's apply goroutine; a mutex makes
// accidental concurrent writers safe, not fast). State, Skipped and Halted
// are for any number of concurrent readers and never block.
type Machine struct {
	mu      sync.Mutex // serialises writers
	state   atomic.Pointer[State]
	skipped atomic.Uint64
	halted  atomic.Pointer[haltReason]

	// level is the highest feature level this machine applies (Options).
	level uint32

	// Writer-only state, never seen by readers.
	id      uint64 // owner id for the idempotency window's arrays
	dedup   dedupIndex
	intern  map[string]string
	scratch []byte
}

type haltReason struct{ err error }

// internLimit bounds the writer's string intern table (instance, edge and
// policy names); past it the table starts over, which only costs memory
// sharing, never correctness.
const internLimit = 1 << 16

// Options configure a Machine.
type Options struct {
	// MaxFeatureLevel caps the feature level this machine applies (0 means
	// FeatureLevelMax). Event types introduced above it are treated exactly
	// as unknown ones (a required one halts with the upgrade message, an
	// optional one is skipped), and a ClusterFeatures event committing a
	// level above it halts. A build capped at N behaves as the release that
	// understood level N, which is how a mixed-version cluster is tested
	// without two binaries.
	MaxFeatureLevel uint32
}

// NewMachine returns a machine at the empty state (index 0) that applies
// every feature level this build understands.
func NewMachine() *Machine { return NewMachineWithOptions(Options{}) }

// NewMachineWithOptions returns a machine at the empty state (index 0).
// A MaxFeatureLevel above FeatureLevelMax is lowered to it.
func NewMachineWithOptions(o Options) *Machine {
	level := o.MaxFeatureLevel
	if level == 0 || level > FeatureLevelMax {
		level = FeatureLevelMax
	}
	m := &Machine{id: newOwner(), level: level, intern: make(map[string]string)}
	m.state.Store(emptyState())
	return m
}

// MaxFeatureLevel is the highest feature level this machine applies.
func (m *Machine) MaxFeatureLevel() uint32 { return m.level }

// State returns the current state; it is never nil.
func (m *Machine) State() *State { return m.state.Load() }

// Skipped counts unknown optional events this node skipped. It is
// node-local (an upgraded node applies them) and not part of the hash.
func (m *Machine) Skipped() uint64 { return m.skipped.Load() }

// Halted returns the error that stopped the machine (an unknown required
// event or a corrupt entry), or nil while it is running.
func (m *Machine) Halted() error {
	if h := m.halted.Load(); h != nil {
		return h.err
	}
	return nil
}

// Restore replaces the state with a snapshot read from r. A machine that
// halted is running again afterwards: the snapshot replaces everything the
// failed entry would have changed (if the log still holds the entry past the
// snapshot, applying it halts again).
func (m *Machine) Restore(r io.Reader) error {
	s, err := ReadSnapshot(r)
	if err != nil {
		return fmt.Errorf("fsm: restore: %w", err)
	}
	if s.featureLevel > m.level {
		return fmt.Errorf("fsm: restore: the snapshot's state is at cluster feature level %d; this node understands feature level %d: "+
			"upgrade it to a tether release that supports level %d", s.featureLevel, m.level, s.featureLevel)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.state.Store(s)
	m.halted.Store(nil)
	return nil
}

// Apply applies one log entry and returns one result per proposal in it.
func (m *Machine) Apply(e Entry) ([]Result, error) {
	rs, err := m.ApplyBatch([]Entry{e})
	if err != nil {
		return nil, err
	}
	return rs[0], nil
}

// ApplyBatch applies entries in order and publishes the new state once, at
// the end. If an entry fails, the entries before it stay applied (and are
// published, their results returned) and the error says why; an unknown
// required event or a corrupt entry also halts the machine, so every later
// call returns the same error without touching the state.
func (m *Machine) ApplyBatch(es []Entry) ([][]Result, error) {
	rs, _, err := m.applyBatch(es, false)
	return rs, err
}

// ApplyBatchHashed is ApplyBatch that also returns the state hash after
// each applied entry (hashes[i] is the hash of the state at es[i].Index),
// for callers that answer "what was the hash at exactly index N" without
// keeping every intermediate state. A hash costs one SHA-256 over ~250
// bytes (see State.Hash).
func (m *Machine) ApplyBatchHashed(es []Entry) ([][]Result, [][32]byte, error) {
	return m.applyBatch(es, true)
}

func (m *Machine) applyBatch(es []Entry, withHashes bool) ([][]Result, [][32]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.Halted(); err != nil {
		return nil, nil, err
	}
	tx := m.begin()
	out := make([][]Result, 0, len(es))
	var hashes [][32]byte
	if withHashes {
		hashes = make([][32]byte, 0, len(es))
	}
	var err error
	for _, e := range es {
		var rs []Result
		rs, err = tx.applyEntry(e)
		if err != nil {
			break
		}
		out = append(out, rs)
		if withHashes {
			// The transaction's working state is complete for this entry.
			hashes = append(hashes, tx.s.Hash())
		}
	}
	if len(out) > 0 {
		m.commit(tx)
	}
	if err != nil {
		var unknown *UnknownEventError
		var corrupt *DecodeError
		var level *FeatureLevelError
		if errors.As(err, &unknown) || errors.As(err, &corrupt) || errors.As(err, &level) {
			m.halted.Store(&haltReason{err: err})
		}
		return out, hashes, err
	}
	return out, hashes, nil
}

// txn is one write transaction: a private copy of the State header whose
// tries are updated path-copying, in place where a node is already owned.
type txn struct {
	m       *Machine
	s       *State
	owner   uint64
	skipped uint64
	// pos is the position in its entry of the proposal being applied.
	pos int
	// ownInstances/ownNodes: s.instances/s.nodes are private to this txn.
	ownInstances, ownNodes bool
}

func (m *Machine) begin() *txn {
	cur := *m.state.Load()
	if !m.dedup.syncedWith(&cur.dedup) {
		m.dedup.rebuild(&cur.dedup)
	}
	return &txn{m: m, s: &cur, owner: newOwner()}
}

func (m *Machine) commit(tx *txn) {
	m.state.Store(tx.s)
	m.skipped.Add(tx.skipped)
}

func (tx *txn) applyEntry(e Entry) ([]Result, error) {
	s := tx.s
	if e.Index <= s.index {
		return nil, fmt.Errorf("fsm: entry index %d is not after the applied index %d", e.Index, s.index)
	}
	props, err := DecodeEntry(e.Data)
	if err != nil {
		var de *DecodeError
		if errors.As(err, &de) {
			de.Index = e.Index
			return nil, de
		}
		return nil, fmt.Errorf("fsm: decode log entry %d: %w", e.Index, err)
	}
	// Refuse the whole entry before changing anything if it holds a
	// required event this node cannot apply: unknown to this build, or
	// introduced above the machine's level, or a cluster level above it.
	level := tx.m.level
	for i := range props {
		p := &props[i]
		if p.Event != nil && p.Type.Level() > level {
			p.Event = nil // above this node's level: as if unknown
		}
		if p.Event == nil && !p.Type.Optional() {
			return nil, &UnknownEventError{Type: p.Type, Index: e.Index, NodeLevel: level}
		}
		if cf, ok := p.Event.(ClusterFeatures); ok && cf.Level > level {
			return nil, &FeatureLevelError{Index: e.Index, Level: cf.Level, NodeLevel: level}
		}
	}
	s.index = e.Index
	if e.Time > s.time {
		s.time = e.Time
	}
	results := make([]Result, len(props))
	for i := range props {
		tx.pos = i
		results[i] = tx.applyProposal(&props[i])
	}
	return results, nil
}

// epoch is the epoch of a placement made by the proposal being applied:
// unique (MakeEpoch) once feature level 2 is committed, the entry's index
// before (level 1 builds did that, and replay must reproduce them).
func (tx *txn) epoch() uint64 {
	if tx.s.featureLevel >= FeatureLevelRanks {
		return MakeEpoch(tx.s.index, tx.pos)
	}
	return tx.s.index
}

func (tx *txn) applyProposal(p *RawProposal) Result {
	s := tx.s
	dedup := p.ID != (ProposalID{})
	if dedup {
		if tx.m.dedup.contains(p.ID) {
			s.counters.scalars[cDuplicates]++
			res := Result{Status: StatusDuplicate}
			if b, ok := p.Event.(Bind); ok {
				res.Binding, res.Found = s.Lookup(b.Fleet, b.Key)
			}
			return res
		}
	}
	var res Result
	if p.Event == nil {
		tx.skipped++
		res = Result{Status: StatusSkipped}
	} else {
		res = tx.applyEvent(p.Event)
	}
	switch res.Status {
	case StatusRejected:
		s.counters.scalars[cRejected]++
	case StatusConditionFailed:
		s.counters.scalars[cConditionFailed]++
	}
	if dedup {
		tx.m.dedup.add(&s.dedup, tx.m.id, p.ID)
	}
	for uint64(s.bindings.len()) > s.maxBindings {
		rec, ok := s.lru.oldest()
		if !ok {
			break
		}
		res.Evicted = append(res.Evicted, tx.removeBinding(rec, EvictCapacity))
	}
	return res
}

func (tx *txn) applyEvent(ev Event) Result {
	if k := byType[ev.Type()]; k != nil {
		return k.apply(tx, ev)
	}
	// DecodeEntry only produces the types of the table.
	return rejected("event type %v has no apply rule", ev.Type())
}

func (tx *txn) clusterFeatures(e ClusterFeatures) Result {
	if e.Level > tx.s.featureLevel {
		if e.Level >= FeatureLevelRanks && tx.s.featureLevel < FeatureLevelRanks {
			tx.s.uniqueEpochsFrom = tx.s.index
		}
		tx.s.featureLevel = e.Level
	}
	return Result{Status: StatusApplied}
}

func (tx *txn) settings(e Settings) Result {
	if e.MaxBindings != 0 {
		tx.s.maxBindings = e.MaxBindings
	}
	return Result{Status: StatusApplied}
}

// annotation changes no state: the event exists for audit.
func (tx *txn) annotation(Annotation) Result { return Result{Status: StatusApplied} }

// evidence changes no state: the event exists for audit.
func (tx *txn) evidence(Evidence) Result { return Result{Status: StatusApplied} }

func rejected(format string, args ...any) Result {
	return Result{Status: StatusRejected, Reason: fmt.Sprintf(format, args...)}
}

func conditionFailed(format string, args ...any) Result {
	return Result{Status: StatusConditionFailed, Reason: fmt.Sprintf(format, args...)}
}

// internString returns a shared copy of a string that repeats across many
// records (instance ids, edge ids, policy names).
func (tx *txn) internString(v string) string {
	if v == "" {
		return ""
	}
	in := tx.m.intern
	if s, ok := in[v]; ok {
		return s
	}
	if len(in) >= internLimit {
		clear(in)
	}
	in[v] = v
	return v
}

func (tx *txn) internDecision(d Decision) Decision {
	d.Edge = tx.internString(d.Edge)
	d.Policy = tx.internString(d.Policy)
	for i := range d.Candidates {
		d.Candidates[i].Instance = tx.internString(d.Candidates[i].Instance)
	}
	return d
}

// putBinding stores rec (new or replacing old) in the map, recency order,
// per-instance counts and digest. rec.seq is assigned here.
func (tx *txn) putBinding(rec, old *bindingRec) {
	s := tx.s
	rec.seq = s.nextSeq
	s.nextSeq++
	s.bindings.set(tx.owner, rec)
	sameInstance := old != nil && old.Instance == rec.Instance
	if old != nil {
		s.lru.delete(tx.owner, old.seq)
		tx.digestSub(old)
		if !sameInstance {
			tx.addCount(old.Fleet, old.Instance, -1)
		}
	}
	s.lru.insert(tx.owner, rec.seq, rec)
	tx.digestAdd(rec)
	if !sameInstance {
		tx.addCount(rec.Fleet, rec.Instance, 1)
	}
	if rec.HasRank {
		s.ranked++
	}
	if old != nil && old.HasRank {
		s.ranked--
	}
}

func (tx *txn) digestAdd(rec *bindingRec) {
	var d [32]byte
	d, tx.m.scratch = bindingDigest(tx.m.scratch, &rec.Binding)
	tx.s.digest.add(&d)
}

func (tx *txn) digestSub(rec *bindingRec) {
	var d [32]byte
	d, tx.m.scratch = bindingDigest(tx.m.scratch, &rec.Binding)
	tx.s.digest.sub(&d)
}

func (tx *txn) addCount(f Fleet, instance string, delta int) {
	s := tx.s
	c, ok := s.counts.get(uint8(f), instance)
	n := delta
	if ok {
		n += c.n
	}
	if n <= 0 {
		if ok {
			s.counts.delete(tx.owner, uint8(f), instance)
		}
		return
	}
	s.counts.set(tx.owner, &countRec{fleet: f, instance: instance, n: n})
}

// removeBinding deletes rec and, for a context-fleet key, the parent links
// rooted at it (a link to a root that is gone would pin nothing).
func (tx *txn) removeBinding(rec *bindingRec, reason EvictReason) Evicted {
	s := tx.s
	s.bindings.delete(tx.owner, uint8(rec.Fleet), rec.Key)
	s.lru.delete(tx.owner, rec.seq)
	tx.digestSub(rec)
	tx.addCount(rec.Fleet, rec.Instance, -1)
	if rec.HasRank {
		s.ranked--
	}
	s.counters.evictions[reason]++
	if rec.Fleet == FleetContext {
		tx.dropLinksRootedAt(rec.Key)
	}
	return Evicted{Fleet: rec.Fleet, Key: rec.Key, Instance: rec.Instance, Epoch: rec.Epoch, Reason: reason}
}

func (tx *txn) bind(e Bind) Result {
	s := tx.s
	switch {
	case !e.Fleet.Valid():
		return rejected("bind: unknown fleet %d", uint8(e.Fleet))
	case e.Key == "":
		return rejected("bind: empty routing key")
	case e.Instance == "":
		return rejected("bind: empty instance")
	}
	if rec, ok := s.bindings.get(uint8(e.Fleet), e.Key); ok {
		// First committed binding wins; LastUsed is not advanced (a Bind
		// that lost is a no-op; use is recorded by Touch). From level 2 it
		// is answered (and archived) as superseded; a level-1 log answers
		// as the level-1 release did.
		s.counters.scalars[cBindsExisting]++
		status := StatusApplied
		if s.featureLevel >= FeatureLevelRanks {
			status = StatusSuperseded
		}
		return Result{Status: status, Binding: rec.Binding, Found: true}
	}
	if i, ok := findInstance(s.instances, e.Instance); ok && s.instances[i].Status == InstanceDown {
		return rejected("bind: instance %q is down", e.Instance)
	}
	rec := newBindingRec(&Binding{
		Fleet:          e.Fleet,
		Key:            e.Key,
		ConversationID: e.ConversationID,
		Instance:       tx.internString(e.Instance),
		Epoch:          tx.epoch(),
		BoundAt:        s.time,
		LastUsed:       s.time,
		Decision:       tx.internDecision(e.Decision),
	})
	tx.putBinding(rec, nil)
	s.counters.scalars[cBindsCreated]++
	return Result{Status: StatusApplied, Binding: rec.Binding, Found: true, Created: true}
}

func (tx *txn) touch(e Touch) Result {
	s := tx.s
	for _, k := range e.Keys {
		old, ok := s.bindings.get(uint8(k.Fleet), k.Key)
		if !ok || old.LastUsed == s.time {
			continue
		}
		b := old.Binding
		b.LastUsed = s.time
		tx.putBinding(newBindingRec(&b), old)
		s.counters.scalars[cTouched]++
	}
	for _, child := range e.Links {
		old, ok := s.links.get(0, child)
		if !ok || old.LastUsed == s.time {
			continue
		}
		rec := &linkRec{ParentLink: old.ParentLink}
		rec.LastUsed = s.time
		tx.replaceLink(rec, old)
	}
	return Result{Status: StatusApplied}
}

func (tx *txn) evict(e Evict) Result {
	s := tx.s
	switch {
	case !e.Fleet.Valid():
		return rejected("evict: unknown fleet %d", uint8(e.Fleet))
	case e.Key == "":
		return rejected("evict: empty routing key")
	case e.Reason == 0:
		return rejected("evict: reason 0 is not a reason")
	}
	rec, ok := s.bindings.get(uint8(e.Fleet), e.Key)
	if !ok {
		return conditionFailed("evict: %v key %q is not bound", e.Fleet, e.Key)
	}
	if e.Epoch != 0 && rec.Epoch != e.Epoch {
		res := conditionFailed("evict: %v key %q has epoch %d, not %d", e.Fleet, e.Key, rec.Epoch, e.Epoch)
		res.Binding, res.Found = rec.Binding, true
		return res
	}
	if e.IdleBefore != 0 && rec.LastUsed >= e.IdleBefore {
		res := conditionFailed("evict: %v key %q was used at %d, not before %d", e.Fleet, e.Key, rec.LastUsed, e.IdleBefore)
		res.Binding, res.Found = rec.Binding, true
		return res
	}
	return Result{Status: StatusApplied, Evicted: []Evicted{tx.removeBinding(rec, e.Reason)}}
}

func (tx *txn) overflow(e Overflow) Result {
	s := tx.s
	switch {
	case !e.Fleet.Valid():
		return rejected("overflow: unknown fleet %d", uint8(e.Fleet))
	case e.Key == "":
		return rejected("overflow: empty routing key")
	case e.Reason == 0:
		return rejected("overflow: reason 0 is not a reason")
	case e.Rebind && (e.From == "" || e.To == ""):
		return rejected("overflow: a rebind needs both From and To")
	case e.Rebind && e.From == e.To:
		return rejected("overflow: rebind from %q to itself", e.From)
	}
	// Counted whether or not the binding moves: the request did leave its
	// bound instance.
	s.counters.overflows[e.Reason]++
	old, found := s.bindings.get(uint8(e.Fleet), e.Key)
	if !e.Rebind {
		if !found {
			return Result{Status: StatusApplied}
		}
		if old.LastUsed == s.time {
			return Result{Status: StatusApplied, Binding: old.Binding, Found: true}
		}
		b := old.Binding
		b.LastUsed = s.time
		rec := newBindingRec(&b)
		tx.putBinding(rec, old)
		return Result{Status: StatusApplied, Binding: rec.Binding, Found: true}
	}
	if i, ok := findInstance(s.instances, e.To); ok && s.instances[i].Status == InstanceDown {
		res := rejected("overflow: rebind target instance %q is down", e.To)
		if found {
			res.Binding, res.Found = old.Binding, true
		}
		return res
	}
	if !found {
		return conditionFailed("overflow: %v key %q is not bound", e.Fleet, e.Key)
	}
	if old.Instance != e.From {
		res := conditionFailed("overflow: %v key %q is bound to %q, not %q", e.Fleet, e.Key, old.Instance, e.From)
		res.Binding, res.Found = old.Binding, true
		return res
	}
	b := old.Binding
	b.Instance = tx.internString(e.To)
	b.Epoch = tx.epoch()
	b.BoundAt = s.time
	b.LastUsed = s.time
	b.Decision = tx.internDecision(e.Decision)
	b.Rank, b.HasRank = 0, false // a new placement: its rank is not known yet
	rec := newBindingRec(&b)
	tx.putBinding(rec, old)
	s.counters.scalars[cRebinds]++
	return Result{Status: StatusApplied, Binding: rec.Binding, Found: true}
}

// rankObserved records the rank of a placement that still holds. It is not
// a use: LastUsed and the recency order stay as they are.
func (tx *txn) rankObserved(e RankObserved) Result {
	s := tx.s
	switch {
	case !e.Fleet.Valid():
		return rejected("rank observed: unknown fleet %d", uint8(e.Fleet))
	case e.Key == "":
		return rejected("rank observed: empty routing key")
	case e.Epoch == 0:
		return rejected("rank observed: epoch 0 names no placement")
	}
	old, ok := s.bindings.get(uint8(e.Fleet), e.Key)
	if !ok {
		return conditionFailed("rank observed: %v key %q is not bound", e.Fleet, e.Key)
	}
	if old.Epoch != e.Epoch {
		res := conditionFailed("rank observed: %v key %q has epoch %d, not %d", e.Fleet, e.Key, old.Epoch, e.Epoch)
		res.Binding, res.Found = old.Binding, true
		return res
	}
	if old.HasRank && old.Rank == e.Rank {
		return Result{Status: StatusApplied, Binding: old.Binding, Found: true}
	}
	if !old.HasRank {
		s.ranked++
	}
	b := old.Binding
	b.Rank, b.HasRank = e.Rank, true
	rec := newBindingRec(&b)
	rec.seq = old.seq
	s.bindings.set(tx.owner, rec)
	s.lru.insert(tx.owner, rec.seq, rec) // same sequence number: replaces the leaf
	tx.digestSub(old)
	tx.digestAdd(rec)
	return Result{Status: StatusApplied, Binding: rec.Binding, Found: true}
}

func (tx *txn) instanceState(e InstanceState) Result {
	s := tx.s
	switch {
	case e.Instance == "":
		return rejected("instance state: empty instance id")
	case e.Status < InstanceUp || e.Status > InstanceRemoved:
		return rejected("instance state: unknown status %d", uint8(e.Status))
	case e.Status != InstanceRemoved && !e.Fleet.Valid():
		return rejected("instance state: unknown fleet %d for %q", uint8(e.Fleet), e.Instance)
	}
	tx.ownInstanceList()
	i, exists := findInstance(s.instances, e.Instance)
	if exists {
		d, scratch := instanceDigest(tx.m.scratch, &s.instances[i])
		tx.m.scratch = scratch
		s.digest.sub(&d)
	}
	if e.Status == InstanceRemoved {
		if exists {
			s.instances = append(s.instances[:i], s.instances[i+1:]...)
		}
	} else {
		rec := Instance{
			ID: tx.internString(e.Instance), Fleet: e.Fleet, URL: e.URL, Status: e.Status,
			Version: e.Version, FeatureLevel: e.FeatureLevel, Ranks: e.Ranks, Since: s.time,
		}
		if exists {
			old := &s.instances[i]
			if old.Status == e.Status {
				rec.Since = old.Since
			}
			// The operator's drain is not the telemetry's to undo.
			rec.Drained, rec.DrainedSince = old.Drained, old.DrainedSince
			s.instances[i] = rec
		} else {
			s.instances = append(s.instances, Instance{})
			copy(s.instances[i+1:], s.instances[i:])
			s.instances[i] = rec
		}
		d, scratch := instanceDigest(tx.m.scratch, &rec)
		tx.m.scratch = scratch
		s.digest.add(&d)
	}
	res := Result{Status: StatusApplied}
	if e.Status == InstanceDown || e.Status == InstanceRemoved {
		res.Evicted = tx.evictInstance(e.Instance)
	}
	return res
}

// instanceDrain sets or clears the operator's drain mark on an instance
// record. It evicts nothing: the drained instance's keys move on their
// next turns. Draining a drained instance (or undraining one that is not)
// changes nothing, DrainedSince included.
func (tx *txn) instanceDrain(e InstanceDrain) Result {
	s := tx.s
	if e.Instance == "" {
		return rejected("instance drain: empty instance id")
	}
	i, exists := findInstance(s.instances, e.Instance)
	if !exists {
		return rejected("instance drain: the log has no record of instance %q", e.Instance)
	}
	if s.instances[i].Drained == e.Drain {
		return Result{Status: StatusApplied}
	}
	tx.ownInstanceList()
	d, scratch := instanceDigest(tx.m.scratch, &s.instances[i])
	s.digest.sub(&d)
	rec := s.instances[i]
	rec.Drained, rec.DrainedSince = e.Drain, 0
	if e.Drain {
		rec.DrainedSince = s.time
	}
	s.instances[i] = rec
	d, scratch = instanceDigest(scratch, &rec)
	tx.m.scratch = scratch
	s.digest.add(&d)
	return Result{Status: StatusApplied}
}

// evictInstance removes every binding on the instance, least recently used
// first. It scans the recency order (the instance's binding counts say when
// to stop): an instance going down is rare, and a full scan of a million
// bindings takes tens of milliseconds, which a per-instance key index
// maintained on every bind would cost far more than over time.
func (tx *txn) evictInstance(instance string) []Evicted {
	s := tx.s
	want := tx.s.BindingCount(FleetContext, instance) + tx.s.BindingCount(FleetGeneration, instance)
	if want == 0 {
		return nil
	}
	victims := make([]*bindingRec, 0, want)
	s.lru.each(func(r *bindingRec) bool {
		if r.Instance == instance {
			victims = append(victims, r)
		}
		return len(victims) < want
	})
	out := make([]Evicted, 0, len(victims))
	for _, r := range victims {
		out = append(out, tx.removeBinding(r, EvictInstanceRemoved))
	}
	return out
}

func (tx *txn) ownInstanceList() {
	if !tx.ownInstances {
		tx.s.instances = append(make([]Instance, 0, len(tx.s.instances)+1), tx.s.instances...)
		tx.ownInstances = true
	}
}

func (tx *txn) nodeInfo(e NodeInfo) Result {
	s := tx.s
	if e.NodeID == "" {
		return rejected("node info: empty node id")
	}
	if !tx.ownNodes {
		s.nodes = append(make([]Edge, 0, len(s.nodes)+1), s.nodes...)
		tx.ownNodes = true
	}
	rec := Edge{ID: e.NodeID, Version: e.Version, MaxFeatureLevel: e.MaxFeatureLevel, Since: s.time}
	i, exists := findNode(s.nodes, e.NodeID)
	if exists {
		old := s.nodes[i]
		if old.Version == rec.Version && old.MaxFeatureLevel == rec.MaxFeatureLevel {
			return Result{Status: StatusApplied}
		}
		d, scratch := nodeDigest(tx.m.scratch, &old)
		tx.m.scratch = scratch
		s.digest.sub(&d)
		s.nodes[i] = rec
	} else {
		s.nodes = append(s.nodes, Edge{})
		copy(s.nodes[i+1:], s.nodes[i:])
		s.nodes[i] = rec
	}
	d, scratch := nodeDigest(tx.m.scratch, &rec)
	tx.m.scratch = scratch
	s.digest.add(&d)
	return Result{Status: StatusApplied}
}

func (tx *txn) link(e Link) Result {
	s := tx.s
	switch {
	case e.Child == "":
		return rejected("link: empty child")
	case e.Parent == "":
		return rejected("link: empty parent")
	case e.Root == "":
		return rejected("link: empty root")
	case e.Child == e.Root || e.Child == e.Parent:
		return rejected("link: %q cannot be its own parent or root (cycle)", e.Child)
	}
	if _, ok := s.links.get(0, e.Child); ok {
		return Result{Status: StatusApplied} // the first link for a child wins
	}
	// Keep the link graph one level deep from every root, which rules out
	// cycles: a root is never itself a child, and a child never a root.
	if l, ok := s.links.get(0, e.Root); ok {
		return rejected("link: root %q is itself a sub-agent of %q", e.Root, l.Root)
	}
	if _, ok := s.roots.get(0, e.Child); ok {
		return rejected("link: child %q is already the root of other sub-agents", e.Child)
	}
	rec := &linkRec{ParentLink{Child: e.Child, Parent: e.Parent, Root: e.Root, Depth: e.Depth, CreatedAt: s.time, LastUsed: s.time}}
	tx.replaceLink(rec, nil)
	root, _ := s.roots.get(0, e.Root)
	nr := &rootRec{root: e.Root}
	if root != nil {
		nr.root = root.root
		nr.children = make([]string, 0, len(root.children)+1)
		nr.children = append(nr.children, root.children...)
	}
	at, _ := slices.BinarySearch(nr.children, e.Child)
	nr.children = slices.Insert(nr.children, at, e.Child)
	s.roots.set(tx.owner, nr)
	s.counters.scalars[cLinksCreated]++
	return Result{Status: StatusApplied}
}

func (tx *txn) replaceLink(rec, old *linkRec) {
	s := tx.s
	if old != nil {
		d, scratch := linkDigest(tx.m.scratch, &old.ParentLink)
		tx.m.scratch = scratch
		s.digest.sub(&d)
	}
	s.links.set(tx.owner, rec)
	d, scratch := linkDigest(tx.m.scratch, &rec.ParentLink)
	tx.m.scratch = scratch
	s.digest.add(&d)
}

func (tx *txn) dropLinksRootedAt(root string) {
	s := tx.s
	r, ok := s.roots.delete(tx.owner, 0, root)
	if !ok {
		return
	}
	for _, child := range r.children {
		if old, ok := s.links.delete(tx.owner, 0, child); ok {
			d, scratch := linkDigest(tx.m.scratch, &old.ParentLink)
			tx.m.scratch = scratch
			s.digest.sub(&d)
		}
	}
}
