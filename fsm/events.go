// Package fsm is tether's deterministic core: the affinity-log events, their
// binary codec, the immutable state every edge applies them to, snapshots and
// the state hash. It does no I/O, reads no clock and uses no randomness: time
// comes from the log entry, choices arrive inside the events. That is what
// makes replay and audit exact.
package fsm

import "fmt"

// Fleet names a worker fleet of a disaggregated deployment.
type Fleet uint8

const (
	FleetContext    Fleet = 1
	FleetGeneration Fleet = 2
)

func (f Fleet) String() string {
	switch f {
	case FleetContext:
		return "context"
	case FleetGeneration:
		return "generation"
	}
	return fmt.Sprintf("fleet(%d)", uint8(f))
}

// Valid reports whether f is a known fleet.
func (f Fleet) Valid() bool { return f == FleetContext || f == FleetGeneration }

// ParseFleet parses "context" or "generation".
func ParseFleet(s string) (Fleet, error) {
	switch s {
	case "context", "ctx":
		return FleetContext, nil
	case "generation", "gen":
		return FleetGeneration, nil
	}
	return 0, fmt.Errorf("unknown fleet %q (want context or generation)", s)
}

// EventType is the first byte of every encoded event. The high bit is the
// Consul-style "ignore if unknown" flag: a node that does not know an event
// type with the bit set skips it (and counts it); a node that does not know a
// type without the bit halts rather than let its state drift.
type EventType uint8

// FlagIgnoreUnknown marks an event type as optional (see EventType).
const FlagIgnoreUnknown EventType = 0x80

// Known event types. Numbers are part of the log format: never reuse one.
const (
	TypeBind            EventType = 1
	TypeTouch           EventType = 2
	TypeEvict           EventType = 3
	TypeOverflow        EventType = 4
	TypeInstanceState   EventType = 5
	TypeClusterFeatures EventType = 6
	TypeLink            EventType = 7
	TypeNodeInfo        EventType = 8
	TypeSettings        EventType = 9
	// TypeRankObserved is introduced at feature level 2 (required).
	TypeRankObserved EventType = 11
	// TypeInstanceDrain is introduced at feature level 3 (required).
	TypeInstanceDrain EventType = 13
	// TypeAnnotation is informational (audit only, no effect on state).
	TypeAnnotation EventType = FlagIgnoreUnknown | 10
	// TypeEvidence is informational like Annotation (audit only, no effect
	// on state): a build that does not know it skips it.
	TypeEvidence EventType = FlagIgnoreUnknown | 12
	// TypeCacheAnswers is informational (audit only, no effect on state):
	// engines' answers about their prefix caches beside the index's claims.
	TypeCacheAnswers EventType = FlagIgnoreUnknown | 14
)

// Optional reports whether the ignore-if-unknown bit is set.
func (t EventType) Optional() bool { return t&FlagIgnoreUnknown != 0 }

func (t EventType) String() string {
	if k := byType[t]; k != nil {
		return k.name
	}
	return fmt.Sprintf("EventType(0x%02x)", uint8(t))
}

// Level is the feature level that introduced t (0 for a type this build
// does not know). A machine capped below it treats t as unknown.
func (t EventType) Level() uint32 {
	if k := byType[t]; k != nil {
		return k.level
	}
	return 0
}

// Feature levels. A node advertises the highest level it understands
// (NodeInfo); the cluster's committed level (ClusterFeatures) only rises when
// every voter supports it, and events, fields or apply rules introduced at a
// level take effect only once that level is committed. The table is in
// DESIGN.md.
const (
	// FeatureLevelBase: Bind, Touch, Evict, Overflow, InstanceState,
	// ClusterFeatures, Link, NodeInfo, Settings, Annotation; a placement's
	// epoch is its entry's log index.
	FeatureLevelBase uint32 = 1
	// FeatureLevelRanks adds the RankObserved event (required) and
	// Binding.Rank, and, from the entry that commits the level on, unique
	// epochs: index<<16 | (position in the entry + 1) (see MakeEpoch).
	FeatureLevelRanks uint32 = 2
	// FeatureLevelDrain adds the InstanceDrain event (required), the
	// operator's drain mark on instance records (Instance.Drained),
	// snapshot format 3 and the overflow reason drained.
	FeatureLevelDrain uint32 = 3
	// FeatureLevelMax is the highest level this build understands.
	FeatureLevelMax = FeatureLevelDrain
)

// Event is one affinity-log event.
type Event interface {
	Type() EventType
}

// Candidate is one scored option of a placement decision, kept in the log so
// audit can explain why a key landed where it did.
type Candidate struct {
	Instance     string
	Score        float64 // higher is better; policy-specific units
	CachedTokens uint32  // prompt tokens the instance was believed to hold
	LoadTokens   uint32  // queued/active prompt tokens the instance reported
}

// Decision is the context of a placement: who decided, by which policy, for
// which request, and the top candidates (best first, at most MaxCandidates).
type Decision struct {
	Edge       string
	Policy     string
	RequestID  string
	Candidates []Candidate
}

// MaxCandidates bounds Decision.Candidates in the log.
const MaxCandidates = 4

// Bind binds (Fleet, Key) to Instance. On an already-bound key it is a no-op
// that returns the existing binding: the first committed binding wins. A bind
// to an instance the state knows as down or removed is rejected.
type Bind struct {
	Fleet          Fleet
	Key            string // routing key (a conversation id, or a parent's root key)
	ConversationID string // the requesting conversation's own id
	Instance       string
	Decision       Decision
}

// FleetKey names one binding.
type FleetKey struct {
	Fleet Fleet
	Key   string
}

// Touch records last use of many keys at the entry's log time. Unknown keys
// are ignored. Links lists child conversation ids whose parent links were used.
type Touch struct {
	Keys  []FleetKey
	Links []string
}

// EvictReason says why a binding left the state.
type EvictReason uint8

const (
	EvictTTL             EvictReason = 1
	EvictCapacity        EvictReason = 2
	EvictKVEvicted       EvictReason = 3
	EvictInstanceRemoved EvictReason = 4
	EvictAdmin           EvictReason = 5
)

func (r EvictReason) String() string {
	switch r {
	case EvictTTL:
		return "ttl"
	case EvictCapacity:
		return "capacity"
	case EvictKVEvicted:
		return "kv_evicted"
	case EvictInstanceRemoved:
		return "instance_removed"
	case EvictAdmin:
		return "admin"
	}
	return fmt.Sprintf("evict_reason(%d)", uint8(r))
}

// Evict removes a binding. It is conditional so that a stale proposal cannot
// remove a binding that changed meanwhile: when Epoch != 0 the binding's epoch
// must equal it; when IdleBefore != 0 the binding's LastUsed must be < it
// (unix nanoseconds, log time). A condition that does not hold makes the event
// a no-op. Evicting a context-fleet key also drops the parent links rooted at it.
type Evict struct {
	Fleet      Fleet
	Key        string
	Reason     EvictReason
	Epoch      uint64
	IdleBefore int64
	Detail     string
}

// OverflowReason says why a request left its bound instance.
type OverflowReason uint8

const (
	OverflowSaturated   OverflowReason = 1
	OverflowUnhealthy   OverflowReason = 2
	OverflowCircuitOpen OverflowReason = 3
	// OverflowCacheLost: the bound instance no longer holds most of the
	// key's prompt (its KV blocks were evicted), so staying buys nothing
	// and the key is placed again. Emitted from feature level 2
	// (FeatureLevelRanks); older nodes apply it as an unnamed reason.
	OverflowCacheLost OverflowReason = 4
	// OverflowDrained: an operator drained the bound instance (an
	// InstanceDrain event), so the key moves on its next turn. Arises only
	// from feature level 3 (FeatureLevelDrain), where drains exist.
	OverflowDrained OverflowReason = 5
)

func (r OverflowReason) String() string {
	switch r {
	case OverflowSaturated:
		return "saturated"
	case OverflowUnhealthy:
		return "unhealthy"
	case OverflowCircuitOpen:
		return "circuit_open"
	case OverflowCacheLost:
		return "cache_lost"
	case OverflowDrained:
		return "drained"
	}
	return fmt.Sprintf("overflow_reason(%d)", uint8(r))
}

// Overflow records that a request for (Fleet, Key) bound to From was served
// by To. With Rebind the binding moves to To (new epoch) so every edge
// follows; it applies only while the binding is still on From.
type Overflow struct {
	Fleet    Fleet
	Key      string
	From     string
	To       string
	Reason   OverflowReason
	Rebind   bool
	Decision Decision
}

// InstanceStatus is a worker instance's lifecycle state in the log.
type InstanceStatus uint8

const (
	InstanceUp InstanceStatus = 1
	// InstanceDraining: the worker reported it is shutting down: it keeps
	// its bindings and takes no new keys. An operator's drain is a separate
	// mark (InstanceDrain, Instance.Drained), not this status.
	InstanceDraining InstanceStatus = 2
	InstanceDown     InstanceStatus = 3 // bindings evicted (instance_removed)
	InstanceRemoved  InstanceStatus = 4 // bindings evicted, record deleted
)

func (s InstanceStatus) String() string {
	switch s {
	case InstanceUp:
		return "up"
	case InstanceDraining:
		return "draining"
	case InstanceDown:
		return "down"
	case InstanceRemoved:
		return "removed"
	}
	return fmt.Sprintf("instance_status(%d)", uint8(s))
}

// InstanceState sets a worker instance's status. Down and Removed evict
// every binding on the instance as an effect of apply.
type InstanceState struct {
	Instance     string
	Fleet        Fleet
	URL          string
	Status       InstanceStatus
	Version      string
	FeatureLevel uint32
	Ranks        uint32
}

// InstanceDrain records an operator's drain of a worker instance (Drain
// true: `tether operator instance drain`) or its end (false). A drained
// instance takes no new keys, and each key bound to it moves to another
// instance on its next turn (an Overflow with reason drained); its
// bindings are not evicted by the drain. The mark is kept on the
// instance's record apart from its status, which the leader derives from
// telemetry: an InstanceState keeps it, and it lasts until an InstanceDrain
// ends it or the record is removed (InstanceRemoved). An instance the log
// has no record of is rejected. Source says who asked (audit only).
// Introduced at feature level 3: the edge proposes it only once the
// committed cluster level is at least 3.
type InstanceDrain struct {
	Instance string
	Drain    bool
	Source   string
}

// ClusterFeatures commits the cluster-wide feature level. It never lowers it.
type ClusterFeatures struct {
	Level uint32
}

// Link records that sub-agent conversation Child named Parent in its parent
// header; Root is the routing key it resolves to (Parent itself, or Parent's
// own root when Parent is a sub-agent) and Depth its nesting depth (1 for a
// direct child of a root). The first link for a child wins.
type Link struct {
	Child  string
	Parent string
	Root   string
	Depth  uint8
}

// NodeInfo is an edge advertising its version and the highest feature level
// it understands; the leader raises ClusterFeatures from these.
type NodeInfo struct {
	NodeID          string
	Version         string
	MaxFeatureLevel uint32
}

// Settings carries replicated configuration that apply depends on, so every
// node applies with the same values. Zero fields keep the current value.
type Settings struct {
	MaxBindings uint64
}

// DefaultMaxBindings applies until a Settings event says otherwise.
const DefaultMaxBindings = 1_000_000

// RankObserved records the attention-DP rank the worker reported for the
// placement (Fleet, Key, Epoch), so audit can explain the whole placement:
// instance and rank. It applies only while the binding still has that epoch
// (else StatusConditionFailed); it does not count as a use of the binding.
// Introduced at feature level 2: the edge emits it only once the committed
// cluster level is at least 2.
type RankObserved struct {
	Fleet Fleet
	Key   string
	Epoch uint64
	Rank  uint32
}

// Evidence is what the deciding edge saw when it placed (Fleet, Key): the
// rule that decided and, per candidate considered (at most MaxCandidates,
// the chosen one first), its cached prompt blocks, its load and its state.
// It follows the Bind or Overflow of the same request (RequestID); like
// Annotation it is optional and changes no state, so audit can explain a
// placement after the fact while replicas and older builds ignore it.
type Evidence struct {
	Fleet      Fleet
	Key        string
	RequestID  string
	Rule       string // e.g. kv_aware, least_loaded, overflow:saturated, degraded_rendezvous
	Candidates []EvidenceCandidate
}

// EvidenceCandidate is one instance a placement considered.
type EvidenceCandidate struct {
	Instance       string
	CachedBlocks   uint32 // prompt blocks the edge believed cached there
	LoadTokens     uint32 // queued and active prompt tokens it reported
	QueuedRequests uint32
	Flags          EvidenceFlags
}

// EvidenceFlags describe a candidate's state at the decision.
type EvidenceFlags uint8

const (
	EvidenceChosen      EvidenceFlags = 1 << iota // the placement went here
	EvidenceBound                                 // the key's binding before the decision
	EvidenceBreakerOpen                           // its cache circuit breaker was open
	EvidenceUnhealthy                             // not healthy (excluded)
	EvidenceDraining                              // draining (takes no new keys)
)

// Names lists the flags set, as audit and the admin API print them:
// chosen, bound, breaker_open, unhealthy, draining.
func (f EvidenceFlags) Names() []string {
	out := []string{}
	for i, name := range [...]string{"chosen", "bound", "breaker_open", "unhealthy", "draining"} {
		if f&(1<<i) != 0 {
			out = append(out, name)
		}
	}
	return out
}

// Annotation is an optional, informational event (for example an operator
// note or a degraded-mode summary). It changes no state; it exists in the
// archive for audit.
type Annotation struct {
	Source string
	Text   string
}

func (Bind) Type() EventType            { return TypeBind }
func (Touch) Type() EventType           { return TypeTouch }
func (Evict) Type() EventType           { return TypeEvict }
func (Overflow) Type() EventType        { return TypeOverflow }
func (InstanceState) Type() EventType   { return TypeInstanceState }
func (ClusterFeatures) Type() EventType { return TypeClusterFeatures }
func (Link) Type() EventType            { return TypeLink }
func (NodeInfo) Type() EventType        { return TypeNodeInfo }
func (Settings) Type() EventType        { return TypeSettings }
func (Annotation) Type() EventType      { return TypeAnnotation }
func (Evidence) Type() EventType        { return TypeEvidence }
func (RankObserved) Type() EventType    { return TypeRankObserved }
func (InstanceDrain) Type() EventType   { return TypeInstanceDrain }
