package routing

import (
	"errors"
	"fmt"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/kvindex"
	"github.com/tether-project/tether/routing/overload"
	"github.com/tether-project/tether/routing/rendezvous"
	"github.com/tether-project/tether/routing/workset"
)

// action says what the decision does with a request.
type action uint8

const (
	// actionSticky: serve on the key's bound instance; nothing to record
	// (the edge batches a Touch).
	actionSticky action = iota + 1
	// actionBind: a new key was placed; serve on Instance and propose
	// route.BindEvent.
	actionBind
	// actionServe: serve on Instance and record nothing (an unkeyed
	// request, or a router that does not bind).
	actionServe
	// actionOverflow: the bound instance cannot take the request; serve
	// on Instance and propose route.OverflowEvent.
	actionOverflow
	// actionShed: every candidate is over its hard limit; answer 429 with
	// Retry-After.
	actionShed
)

func (a action) String() string {
	switch a {
	case actionSticky:
		return "sticky"
	case actionBind:
		return "bind"
	case actionServe:
		return "serve"
	case actionOverflow:
		return "overflow"
	case actionShed:
		return "shed"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// Decision policy names (fsm.Decision.Policy).
const (
	PolicyLeastLoaded = "least_loaded"        // load only (no prefix cached anywhere, or no index)
	PolicyKVAware     = "kv_aware"            // cache credit against load
	PolicyRoundRobin  = "round_robin"         // the edge's counter
	PolicyDegraded    = "degraded_rendezvous" // older edges, while the log could not commit: rendezvous over the last agreed instances
	PolicyShed        = "shed"                // nothing placed
)

// ErrNoInstances: no healthy, non-draining instance in the fleet (the edge
// answers 503).
var ErrNoInstances = errors.New("no healthy instance")

// BindingCounter reads live binding counts per instance from the replicated
// state (the fewest-bindings tie-break).
type BindingCounter interface {
	BindingCount(f fsm.Fleet, instance string) int
}

// PrefixMatcher reports how many leading blocks of a prompt each instance
// holds (Match), whether one instance holds one block on one rank (any
// rank: -1), with whether that answer rests on a trusted baseline (Holds),
// and whether any instance but one holds a block (HeldByOther);
// *kvindex.Index implements it.
type PrefixMatcher interface {
	Match(blocks []uint64, now time.Time, dst []kvindex.Match) []kvindex.Match
	Holds(instance string, rank int, block uint64, now time.Time) (held, synced bool)
	HeldByOther(instance string, block uint64, now time.Time) bool
}

// Inputs are the state a decision reads. Views is required; the rest may be
// nil (no bindings known, no KV index, no overload history).
type Inputs struct {
	Views    *Views
	Bindings BindingCounter
	Prefix   PrefixMatcher
	Overload overload.History
	// Work is what this edge routed lately: the working set of each
	// instance (nil: unknown, no eviction cost).
	Work *workset.Set
}

// Request is one request as routing sees it.
type Request struct {
	Fleet          fsm.Fleet
	Key            string // routing key on Fleet ("" = unkeyed); Identity.Key(Fleet)
	ConversationID string
	RequestID      string
	Edge           string // deciding edge's node id, for the log
	Priority       Priority
	PromptTokens   int      // prompt length; caps cache credit (0: unknown)
	Blocks         []uint64 // the prompt's chained block hashes (internal/prefix)
	Spread         uint64   // unkeyed tie-break (SpreadFor(RequestID))
	RoundRobin     uint64   // the edge's counter, for RouterRoundRobin
	Now            time.Time
	// Adapter is the request's LoRA adapter ("" the base model): an
	// instance that must load it costs Weights.LoRALoad (routing/lora.go).
	Adapter string
	// Hard: a miss is an error (state that lives in one engine process),
	// so the key's placement must be committed before it is served
	// (the decision waits for it; placement ignores it).
	Hard bool

	// bound, set by the cache-lost check only, replaces the bound
	// instance's cache credit (its best rank's) with its binding's rank's.
	bound *boundCredit
	// placing: a new key's placement (the live-binding cost applies).
	placing bool
}

// workKey names the request's conversation in the working sets: its own
// id (a sub-agent's, not its root's), else its routing key, per fleet; ""
// for an unkeyed request.
func (req *Request) workKey() string {
	return workKey(req.Fleet, req.ConversationID, req.Key)
}

func workKey(f fsm.Fleet, conversation, key string) string {
	if conversation == "" {
		conversation = key
	}
	if conversation == "" {
		return ""
	}
	return f.String() + "/" + conversation
}

// boundCredit is the cache a bound key can use on its instance: the
// leading blocks its rank holds.
type boundCredit struct {
	instance string
	rank     int
	blocks   int
}

// route is the rules' answer for one request: where it goes, and what
// the decision records.
type route struct {
	Action   action
	Instance string // where to send the request (empty for actionShed)
	URL      string
	// Rank is the ADP rank believed to hold the cached prefix (-1:
	// unknown or predicted only). Informational: the worker places ranks.
	Rank int
	// CachedTokens: prompt tokens the chosen instance is believed to hold.
	CachedTokens int
	// From is the bound instance, for actionOverflow.
	From string
	// Reason: for actionOverflow, why the request left its instance; for
	// actionSticky, non-zero when the bound instance is strained but no
	// better instance exists (the request stays).
	Reason fsm.OverflowReason
	// Rebind: the overflow moves the binding (the strain outlasted
	// rebind_after), so every edge follows.
	Rebind     bool
	RetryAfter time.Duration // for actionShed, a whole number of seconds
	// Decision explains a placement for the log (empty for sticky).
	Decision fsm.Decision
}

// BindEvent is the event recording an actionBind route.
func (rt route) BindEvent(req Request) fsm.Bind {
	return fsm.Bind{Fleet: req.Fleet, Key: req.Key, ConversationID: req.ConversationID, Instance: rt.Instance, Decision: rt.Decision}
}

// OverflowEvent is the event recording an actionOverflow route.
func (rt route) OverflowEvent(req Request) fsm.Overflow {
	return fsm.Overflow{Fleet: req.Fleet, Key: req.Key, From: rt.From, To: rt.Instance, Reason: rt.Reason, Rebind: rt.Rebind, Decision: rt.Decision}
}

// Router is one fleet's routing rules: its configuration, and the rules of
// staying or moving (stay.go) and placing (place.go) that the decision
// applies under it. It holds no state besides its configuration; safe for
// concurrent use.
type Router struct {
	cfg Config
}

// NewRouter validates cfg and returns a Router.
func NewRouter(cfg Config) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Router{cfg: cfg}, nil
}

// Config returns the router's configuration.
func (r *Router) Config() Config { return r.cfg }

// SpreadFor derives the tie-break value of an unkeyed request from something
// unique to it (its request id), so unkeyed requests spread too.
func SpreadFor(requestID string) uint64 { return rendezvous.KeyHash(requestID) }
