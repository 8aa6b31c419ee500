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
	// Epoch is the log index of the event that set Instance (the Bind, or a
	// rebinding Overflow). (Fleet, Key, Epoch) names one placement for life.
	Epoch    uint64
	BoundAt  int64 // unix nanoseconds, log time
	LastUsed int64 // unix nanoseconds, log time of the last Bind/Touch/Overflow
	Decision Decision
}

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
}

// ParentLink is a recorded sub-agent relation (see the Link event).
type ParentLink struct {
	Child     string
	Parent    string
	Root      string
	Depth     uint8
	CreatedAt int64
	LastUsed  int64
}

// Node is an edge as advertised by its NodeInfo events.
type Node struct {
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
	// StatusApplied: the event changed the state (or was a valid no-op
	// such as a Bind on a bound key; see Result.Created).
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
