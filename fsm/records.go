package fsm

// Records held by the state, and the results of applying proposals. These
// types are the contract between fsm and its users (cluster, routing, edge,
// ops); the machinery that maintains them lives in the other files.

// Binding is a routing key's placement on one fleet.
type Binding struct {
	Fleet          Fleet
	Key            string
	ConversationID string // the conversation whose request created the binding
	Instance       string
	// Epoch names the placement: the event that set Instance (the Bind, or
	// a rebinding Overflow). Once the cluster committed feature level 2 it
	// is MakeEpoch(entry index, position of the proposal in the entry),
	// unique per placement even when one entry binds, evicts and binds a
	// key again; before that (level 1) it was the entry's log index.
	// (Fleet, Key, Epoch) names one placement for life. State.EpochIndex
	// gives back the log index for either kind.
	Epoch    uint64
	BoundAt  int64 // unix nanoseconds, log time
	LastUsed int64 // unix nanoseconds, log time of the last Bind/Touch/Overflow
	Decision Decision
	// Rank is the attention-DP rank the worker reported for this placement
	// (a RankObserved event); HasRank says whether one was reported (0 is a
	// valid rank). A rebind clears it.
	Rank    uint32
	HasRank bool
}

// MaxEntryProposals bounds the proposals of one log entry (EncodeEntry and
// DecodeEntry enforce it): a unique epoch keeps the proposal's position in
// the low 16 bits.
const MaxEntryProposals = 1<<16 - 1

// epochPositionBits is the width of the position part of a unique epoch.
const epochPositionBits = 16

// MakeEpoch is the unique epoch (feature level 2) of a placement made by
// the proposal at position (0-based) of the entry at index:
// index<<16 | (position+1). It is never 0 and never equals an index-style
// epoch issued before the level was committed (see State.EpochIndex).
func MakeEpoch(index uint64, position int) uint64 {
	return index<<epochPositionBits | uint64(position+1)&MaxEntryProposals
}

// EpochIndex is the log index of a unique (feature level 2) epoch made by
// MakeEpoch. For an epoch that may predate level 2 use State.EpochIndex.
func EpochIndex(epoch uint64) uint64 { return epoch >> epochPositionBits }

// Instance is a worker instance as the log knows it.
type Instance struct {
	ID           string
	Fleet        Fleet
	URL          string
	Status       InstanceStatus
	Version      string
	FeatureLevel uint32
	Ranks        uint32
	Since        int64 // log time of the last status change
	// Drained: an operator drained the instance (InstanceDrain): it takes
	// no new keys and its bound keys move on their next turn, whatever its
	// Status. DrainedSince is the log time of that drain (0 when not
	// drained). Both are feature level 3.
	Drained      bool
	DrainedSince int64
}

// TakesNewKeys reports whether placement may put a new key on the instance
// as far as the log says: up, and not drained by an operator.
func (in *Instance) TakesNewKeys() bool { return in.Status == InstanceUp && !in.Drained }

// ParentLink is a recorded sub-agent relation (see the Link event).
type ParentLink struct {
	Child     string
	Parent    string
	Root      string
	Depth     uint8
	CreatedAt int64
	LastUsed  int64
}

// Edge is an edge as advertised by its NodeInfo events.
type Edge struct {
	ID              string
	Version         string
	MaxFeatureLevel uint32
	Since           int64
}

// ProposalID makes a proposal idempotent: a proposal whose id was applied
// recently is not applied again (a retry after a lost leadership, say).
// "Recently" is the last 65,537 to 131,072 proposals with non-zero ids,
// whatever their outcome; the all-zero id opts out of deduplication.
type ProposalID [16]byte

// Proposal is one event with its idempotency id; a log entry carries a batch.
type Proposal struct {
	ID    ProposalID
	Event Event
}

// Status is the outcome of one proposal.
type Status uint8

const (
	// StatusApplied: the event changed the state (or was a valid no-op,
	// such as a Touch of keys no longer bound).
	StatusApplied Status = 1
	// StatusDuplicate: the proposal id was applied before; nothing changed.
	StatusDuplicate Status = 2
	// StatusRejected: the event was well-formed but refused (Reason says
	// why), e.g. a Bind to an instance that is down.
	StatusRejected Status = 3
	// StatusConditionFailed: a conditional event (Evict with Epoch or
	// IdleBefore, Overflow with Rebind) did not hold; nothing changed.
	StatusConditionFailed Status = 4
	// StatusSkipped: an unknown optional event, skipped and counted.
	StatusSkipped Status = 5
	// StatusSuperseded: a Bind of a key already bound lost to the binding
	// in force (first committed wins): nothing changed, and the result
	// carries that binding (Found). From feature level 2; a level-1 log,
	// and archives written before this status, answer such Binds applied.
	StatusSuperseded Status = 6
)

func (s Status) String() string {
	switch s {
	case StatusApplied:
		return "applied"
	case StatusDuplicate:
		return "duplicate"
	case StatusRejected:
		return "rejected"
	case StatusConditionFailed:
		return "condition_failed"
	case StatusSkipped:
		return "skipped"
	case StatusSuperseded:
		return "superseded"
	}
	return "status(?)"
}

// Evicted is one binding removed as an effect of apply (an Evict event, a
// capacity eviction, or an instance going down).
type Evicted struct {
	Fleet    Fleet
	Key      string
	Instance string
	Epoch    uint64
	Reason   EvictReason
}

// Result is the outcome of applying one proposal.
type Result struct {
	Status Status
	Reason string // for StatusRejected
	// Binding is the binding in force for the event's key after apply
	// (Bind: the winner, new or existing; Overflow with Rebind: the moved
	// binding). Found is false when there is none.
	Binding Binding
	Found   bool
	Created bool // Bind created a new binding (this proposal won)
	// Evicted lists bindings this proposal removed, in order.
	Evicted []Evicted
}
