package routing

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/overload"
	"github.com/tether-project/tether/routing/workset"
)

// Outcomes (the edge's metric label and span attribute).
const (
	OutcomeSticky   = "sticky"
	OutcomeNewBind  = "new_bind"
	OutcomeOverflow = "overflow"
	// OutcomeDegraded: a new key placed by this edge's own decision while
	// it cannot know the committed placement (the log cannot commit, or
	// its state is not known current), or a key served on this edge's own
	// Bind proposal whose fate it could not learn in time.
	OutcomeDegraded = "degraded"
	OutcomeShed     = "shed"
	OutcomeUnbound  = "unbound"
	// OutcomeRefused: hard affinity the log could not confirm (503, retry).
	OutcomeRefused = "refused"
)

// Why a decision was degraded (Hop.Degraded; the edge's metric label).
const (
	// DegradedLogDown: no leader, and a proposal just failed for it.
	DegradedLogDown = "log_down"
	// DegradedStateNotCurrent: this edge's replica was not known current
	// (not caught up since start, no leader contact within the window, or
	// lagging the leader beyond it).
	DegradedStateNotCurrent = "state_not_current"
	// DegradedCommitTimeout: commit_first, and the Bind's fate was not
	// known by the propose timeout.
	DegradedCommitTimeout = "commit_timeout"
	// DegradedOverflowUnrecorded: an overflow could not be committed and
	// the key stayed on a bound instance this edge's views call unhealthy.
	DegradedOverflowUnrecorded = "overflow_unrecorded"
)

// DegradedCauses lists every Degraded* cause.
var DegradedCauses = []string{DegradedLogDown, DegradedStateNotCurrent, DegradedCommitTimeout,
	DegradedOverflowUnrecorded}

// PolicyPending is the policy of a request served on this edge's own Bind
// proposal before its replica applied the log's answer.
const PolicyPending = "pending"

// PolicyFollowed is the policy of a new key placed where another edge's
// placement, heard before the log committed it, put it.
const PolicyFollowed = "followed"

// PolicySubAgentOwn is the policy of a sub-agent placed under its own
// conversation id after its parent's instance lost its context (escape).
const PolicySubAgentOwn = "subagent_own"

// ErrUnavailable is what Log.Propose wraps when the log cannot commit now
// (no quorum, no leader, or the proposal timed out).
var ErrUnavailable = errors.New("affinity log unavailable")

// ErrCommitted is what Log.Propose wraps when the event committed (its
// result is valid and returned) but this edge's replica has not applied it
// yet: the decision uses the result, which the log holds for every edge,
// instead of treating the log as unable to commit.
var ErrCommitted = errors.New("affinity log committed the event; this replica has not applied it yet")

// Log is the affinity log as one edge sees it: its replica's state and a
// proposal that returns once the event committed.
type Log interface {
	// State is this edge's replica (what it has applied).
	State() *fsm.State
	// Propose commits ev and returns its result. An error wrapping
	// ErrUnavailable means the log cannot commit right now; one wrapping
	// ErrCommitted comes with a valid result.
	Propose(ctx context.Context, ev fsm.Event) (fsm.Result, error)
	// Down reports that the log is known unable to commit (a proposal
	// would only wait for its timeout).
	Down(now time.Time) bool
}

// Placements are this edge's own Bind proposals, from the moment the
// decision makes one until this edge's replica has applied the log's
// answer to it. The edge proposes each with one proposal id and retries it
// (same id) while the log cannot commit; a Bind that loses to another
// edge's is answered with the binding in force.
type Placements interface {
	// Propose sends b to the log now and returns at once; now is when the
	// request was placed (the dispatch the agreement lag is measured
	// from). A key with a proposal of this edge in flight is not proposed
	// again.
	Propose(b fsm.Bind, now time.Time)
	// Pending returns this edge's proposal for the key, and the log's
	// answer once it is known.
	Pending(f fsm.Fleet, key string) (Pending, bool)
	// Await waits until the key's proposal is settled, at most the
	// caller's propose timeout (or ctx), and returns it as Pending does.
	Await(ctx context.Context, f fsm.Fleet, key string) (Pending, bool)
	// Heard returns another edge's recent placement of the key, heard
	// before this edge's replica has the key's binding (the edges tell
	// each other their new placements as they dispatch them).
	Heard(f fsm.Fleet, key string) (fsm.Bind, bool)
}

// Pending is one of this edge's Bind proposals.
type Pending struct {
	Bind fsm.Bind
	// At is when the request that proposed it was placed.
	At time.Time
	// Settled: the proposal committed and Result is the log's answer: a
	// Bind that created the binding (Created), lost to the binding in
	// force (Found, another Decision), or was rejected.
	Settled bool
	Result  fsm.Result
}

// Recorder records what a request does not wait for, as the edge's
// recorder and touch batcher do: events are committed later, in batches.
type Recorder interface {
	// Record queues ev (a parent link) for the log. Overflows are not
	// recorded here: they are committed through Log.Propose before the
	// request is served (Decider.overflow).
	Record(ev fsm.Event)
	// Touch marks a bound key used (one Touch batch per interval);
	// TouchLink a sub-agent's parent link.
	Touch(k fsm.FleetKey)
	TouchLink(child string)
}

// FleetView is this edge's view of the workers.
type FleetView interface {
	// Views are the routing views at now, with the excluded instances
	// (failed hops) unhealthy. Feeding the edge's overload tracker is the
	// fleet's part.
	Views(now time.Time, exclude []string) *Views
	// UnheardAtStartup reports that this edge has not heard from inst
	// since it started and its startup gate is open (edge/readiness.go).
	UnheardAtStartup(now time.Time, inst string) bool
	// StateCurrent reports whether this edge's replica is known to be
	// current (caught up since start, in contact with a leader, not
	// lagging beyond its bound), and if not, why. A new key placed while
	// it is not is counted degraded; hard affinity is refused.
	StateCurrent(now time.Time) (bool, string)
}

// Index is the edge's KV index: prefix matches, and the prediction that a
// prompt sent somewhere will be cached there.
type Index interface {
	PrefixMatcher
	Predict(instance string, blocks []uint64, now time.Time)
}

// Decider holds one edge's decision inputs. Index and Overload may be nil.
type Decider struct {
	Log        Log
	Recorder   Recorder
	Placements Placements
	Fleet      FleetView
	Index      Index
	Overload   overload.History
	// CommitFirst makes a new key's first request wait for its Bind to
	// commit before it is dispatched (placement.commit_first), instead of
	// dispatching at once beside the proposal. A proposal whose fate is
	// not known by the propose timeout is then served where it proposed,
	// counted degraded. Hard affinity always waits.
	CommitFirst bool

	// work is what this edge routed lately (routing/workset), the working
	// set of each instance: created on the first decision, with the
	// router's working_set_window.
	workOnce sync.Once
	work     *workset.Set
}

// workSet returns the decider's working sets.
func (d *Decider) workSet(router *Router) *workset.Set {
	d.workOnce.Do(func() { d.work = workset.New(workset.Config{Window: router.cfg.WorkingSetWindow}) })
	return d.work
}

// HearRoute notes another edge's route in this edge's working sets: the
// Work it told (Hop.Work) reached instance at now. Every edge then weighs
// what every edge sent to an instance lately, not only its own routes, and
// edges decide as one edge would. A note without key, instance or blocks
// is ignored.
func (d *Decider) HearRoute(router *Router, w Work, instance string, now time.Time) {
	if w.Key == "" || w.Blocks <= 0 {
		return
	}
	d.workSet(router).Note(w.Key, instance, w.Blocks, now)
}

// WorkingSet is instance's working set as this edge knows it at now: the
// conversations it and the edges it heard sent there within the window.
func (d *Decider) WorkingSet(router *Router, instance string, now time.Time) workset.Load {
	return d.workSet(router).Load(instance, now)
}

// Work is a route's entry in the edges' working sets: the conversation
// (fleet and conversation id, or the routing key) and its prompt's length
// in KV blocks.
type Work struct {
	Key    string
	Blocks int
}

// Hop is where one fleet's part of a request goes.
type Hop struct {
	Fleet    fsm.Fleet
	Key      string
	Instance string
	URL      string
	Rank     int // believed rank (-1 unknown); the worker's answer wins
	Cached   int // prompt tokens believed cached on the instance
	// Predicted is what the KV index held of the prompt on Instance when
	// the decision was made, before this request's own prediction (prompt
	// tokens): the claim the engine's answer grades. HasPrediction is
	// false when the fleet's router does not read the index.
	Predicted     int
	HasPrediction bool
	// Work is what the decision noted in this edge's working sets, for
	// the other edges (Decider.HearRoute); empty for a request of no
	// conversation or known blocks.
	Work    Work
	Outcome string
	// Degraded says why, when Outcome is OutcomeDegraded.
	Degraded string
	Policy   string
	Reason   fsm.OverflowReason
	From     string // the bound instance an overflow left ("" otherwise)
	Bound    bool   // the key is bound (sticky, new bind, overflow, degraded)
	Binding  fsm.Binding
	Excluded []string
	// StateIndex is the index of this edge's replica state the decision
	// read: the checkers judge the hop against the key's placement there.
	StateIndex uint64
	// Speculative: the key's placement is this edge's own Bind proposal,
	// not yet known committed (Binding has epoch 0).
	Speculative bool
	// OwnKey: a sub-agent's request routed by its own conversation id
	// (Key), not its parent's root: the tree's KV budget, first request
	// with the parent or the escape placed it on a binding of its own.
	OwnKey bool
	// RootInstance, with OwnKey: the instance its parent's root is bound
	// to ("" when unbound). On that instance its context is on its
	// parent's rank, where the signed hint keeps it; on another, its own
	// conversation id places it.
	RootInstance string
	// TelemetryLate: no candidate was healthy, and the silent ones (late
	// telemetry, no evidence of failure) were counted healthy for this
	// decision (wake). It says nothing of the log: the decision followed
	// the committed placement as it would have with fresh telemetry, so it
	// is not degraded.
	TelemetryLate bool
}

// OnRootInstance reports whether h goes to the instance its key's root is
// bound to: a hop by the root's key, or a sub-agent's own-id hop back to
// its parent's instance. The signed hint, which puts a sub-agent on its
// parent's rank, applies only there.
func (h *Hop) OnRootInstance() bool { return !h.OwnKey || h.Instance == h.RootInstance }

// FailureKind classifies a request the decision could not place.
type FailureKind uint8

const (
	// FailNoInstances: no healthy instance in the fleet (503).
	FailNoInstances FailureKind = iota + 1
	// FailRouting: the router failed otherwise (503).
	FailRouting
	// FailShed: every instance is over its hard limits (429, RetryAfter).
	FailShed
	// FailLog: recording a placement failed (503).
	FailLog
	// FailRejected: the log refused the placement and has no binding (503).
	FailRejected
	// FailStateUnknown: hard affinity, and the log cannot confirm the
	// key's placement now (503, RetryAfter set by the edge).
	FailStateUnknown
	// FailNoAlternative: a hop failed and no other instance can take it (502).
	FailNoAlternative
	// FailDetourUnrecorded: a bound key's instance failed this request and
	// the log cannot record a detour now (503, RetryAfter set by the
	// edge). Instance is the bound instance.
	FailDetourUnrecorded
)

// Failure is why a request was not placed; the edge renders it.
type Failure struct {
	Kind       FailureKind
	Fleet      fsm.Fleet
	Key        string
	Instance   string
	RetryAfter time.Duration // FailShed
	Err        error
	Detail     string // the log's reason, or why the state is not known current
}

func (f *Failure) Error() string {
	if f.Err != nil {
		return f.Err.Error()
	}
	return f.Detail
}
