package proposals

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/fsm"
)

// Recorder proposes the events a request does not wait for (overflows,
// parent links, rank observations, evidence) and retries the Binds of this
// edge's own placements whose first attempt failed (placements.go),
// batching what queued up into entries and retrying while the log cannot
// commit.
//
// Every event gets its proposal id when it is queued and keeps it for every
// attempt: a proposal that timed out may still commit, and its retry must
// then be the fsm's duplicate (fsm/dedup.go), not a second application.
type Recorder struct {
	e    *env
	kick chan struct{}

	mu       sync.Mutex
	queue    []recorded
	links    map[string]bool         // Queued links, by child
	ranks    map[fsm.FleetKey]uint32 // Queued rank observations, by key
	inflight int                     // events of the batch flush is proposing
	answers  answers                 // engines' answers for the next CacheAnswers (answers.go)
}

type recorded struct {
	id       fsm.ProposalID
	ev       fsm.Event
	attempts int
	// untilCommitted: retried without an attempt limit (a placement's
	// Bind: the key follows this edge's proposal until the log answers).
	untilCommitted bool
	// done forgets the event's bookkeeping, with its result once it
	// committed, or nil and the reason when it was dropped; called with
	// r.mu held.
	done func(res *fsm.Result, dropped string)
}

// maxRecorderQueue bounds the events waiting for the log; beyond it the
// oldest are dropped (an overflow is informational, a link is re-proposed
// by the child's next request, a placement's Bind is forgotten and its key
// placed anew by its next request)
// and counted in tether_edge_recorder_dropped_total{reason="queue_full"}.
const maxRecorderQueue = 65536

// maxFlushEvents bounds one attempt: a batch that must commit within the
// Flush deadline stays a few log entries, whatever the backlog.
const maxFlushEvents = 1024

// maxRecordAttempts bounds retries of events other than placements' Binds.
const maxRecordAttempts = 50

func newRecorder(e *env) *Recorder {
	return &Recorder{e: e, kick: make(chan struct{}, 1), links: map[string]bool{}, ranks: map[fsm.FleetKey]uint32{}}
}

func (r *Recorder) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Add queues an event; done, if set, is called with its result once it
// committed.
func (r *Recorder) Add(ev fsm.Event, _ func(fsm.Result)) {
	x := recorded{ev: ev}
	r.mu.Lock()
	if l, ok := ev.(fsm.Link); ok {
		if r.links[l.Child] {
			r.mu.Unlock()
			return
		}
		r.links[l.Child] = true
		x.done = func(res *fsm.Result, _ string) {
			delete(r.links, l.Child)
			if res != nil && res.Status == fsm.StatusRejected {
				r.e.log.Info("parent link rejected", "child", l.Child, "parent", l.Parent, "reason", res.Reason)
			}
		}
	}
	r.pushLocked(x)
	r.mu.Unlock()
	r.poke()
}

// pushLocked queues x under a fresh proposal id, dropping the oldest event
// when the queue is full.
func (r *Recorder) pushLocked(x recorded) {
	x.id = cluster.NewProposalID()
	r.pushIDLocked(x)
}

// pushIDLocked queues x under its own proposal id.
func (r *Recorder) pushIDLocked(x recorded) {
	if len(r.queue) >= maxRecorderQueue {
		r.dropLocked(r.queue[0], "queue_full")
		r.queue[0] = recorded{}
		r.queue = r.queue[1:]
	}
	r.queue = append(r.queue, x)
}

func (r *Recorder) Queued() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}

// QueuedRanks is the rank observations waiting for the log.
func (r *Recorder) QueuedRanks() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ranks)
}

// Pending is queued plus the events of a batch being proposed now.
func (r *Recorder) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue) + r.inflight
}

func (r *Recorder) dropLocked(x recorded, reason string) {
	r.e.metrics.RecorderDropped.WithLabelValues(x.ev.Type().String(), reason).Inc()
	if x.done != nil {
		x.done(nil, reason)
	}
}

// AddRank queues a rank observation unless the same one is queued (a busy
// conversation reports its rank on every turn; one event records it).
func (r *Recorder) AddRank(ev fsm.RankObserved) {
	k := fsm.FleetKey{Fleet: ev.Fleet, Key: ev.Key}
	r.mu.Lock()
	if rank, queued := r.ranks[k]; queued && rank == ev.Rank {
		r.mu.Unlock()
		return
	}
	r.ranks[k] = ev.Rank
	r.pushLocked(recorded{ev: ev, done: func(*fsm.Result, string) {
		if r.ranks[k] == ev.Rank { // not replaced by a newer observation
			delete(r.ranks, k)
		}
	}})
	r.mu.Unlock()
	r.poke()
}

// addBind queues a placement's Bind under the proposal id of its first
// attempt, retried until it commits (placements.go learns its answer).
func (r *Recorder) addBind(id fsm.ProposalID, b fsm.Bind) {
	r.mu.Lock()
	r.pushIDLocked(recorded{id: id, ev: b, untilCommitted: true, done: func(res *fsm.Result, dropped string) {
		// (Lock order: the recorder's, then the placements'.)
		if res == nil {
			r.e.placements.drop(id, b, dropped)
			return
		}
		// The answer to an earlier attempt that committed after its
		// deadline comes back as a duplicate with the binding in force.
		r.e.placements.settle(id, b, *res)
	}})
	r.mu.Unlock()
	r.poke()
}

// Run proposes queued events as they arrive until ctx is done; after a
// failure it backs off.
func (r *Recorder) Run(ctx context.Context) {
	backoff := time.Duration(0)
	for {
		var wait <-chan time.Time
		if backoff > 0 {
			wait = time.After(backoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
			if backoff > 0 {
				continue // wait out the backoff; the queue keeps
			}
		case <-wait:
		}
		fctx, cancel := context.WithTimeout(ctx, max(r.e.cfg.ProposeTimeout*4, 200*time.Millisecond))
		ok := r.Flush(fctx)
		cancel()
		if ok {
			backoff = 0
			if r.Queued() > 0 {
				r.poke() // the rest of a backlog larger than one flush
			}
		} else {
			backoff = min(max(2*backoff, 100*time.Millisecond), time.Second)
		}
	}
}

// Flush proposes up to maxFlushEvents of the oldest queued events. It
// reports false when the log could not commit; the events then stay queued,
// in order, with their proposal ids.
func (r *Recorder) Flush(ctx context.Context) bool {
	r.mu.Lock()
	n := min(len(r.queue), maxFlushEvents)
	batch := slices.Clone(r.queue[:n])
	clear(r.queue[:n])
	r.queue = r.queue[n:]
	r.inflight += n
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inflight -= n
		r.mu.Unlock()
	}()
	if len(batch) == 0 {
		return true
	}
	props := make([]fsm.Proposal, len(batch))
	for i, x := range batch {
		props[i] = fsm.Proposal{ID: x.id, Event: x.ev}
	}
	start := time.Now()
	results, err := r.e.edge.Node().ProposeIdempotent(ctx, props)
	took := time.Since(start)
	if err != nil && len(results) != len(props) {
		for _, p := range props {
			r.e.proposer.Observe(p.Event.Type(), fsm.Result{}, err, took)
		}
		r.requeue(batch, err)
		return false
	}
	r.mu.Lock()
	for i, x := range batch {
		r.e.proposer.Observe(x.ev.Type(), results[i], nil, took)
		if x.done != nil {
			x.done(&results[i], "")
		}
	}
	r.mu.Unlock()
	return true
}

// requeue puts a failed batch back at the head of the queue, same ids,
// except what has been tried too often or cannot be tried any more.
func (r *Recorder) requeue(batch []recorded, err error) {
	closed := closedHere(err)
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := make([]recorded, 0, len(batch)+len(r.queue))
	for _, x := range batch {
		x.attempts++
		switch {
		case closed:
			r.dropLocked(x, "closed")
		case !x.untilCommitted && x.attempts >= maxRecordAttempts:
			r.dropLocked(x, "attempts")
		default:
			keep = append(keep, x)
		}
	}
	keep = append(keep, r.queue...)
	for len(keep) > maxRecorderQueue {
		r.dropLocked(keep[0], "queue_full")
		keep = keep[1:]
	}
	r.queue = keep
}
