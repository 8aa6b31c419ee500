package proposals

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/fsm"
)

// Proposer proposes events through the edge's node: every proposal the edge
// makes is counted in tether_edge_proposals_total (and a commit's time in
// tether_edge_affinity_commit_seconds), and it remembers when the log last
// could not commit (Down).
type Proposer struct {
	edge    Edge
	metrics *observe.Metrics
	now     func() time.Time
	// unavailable is the unix nanos of the last ErrUnavailable (Down).
	unavailable atomic.Int64
}

// Propose commits one event through the log and records its latency and
// result.
func (e *Proposer) Propose(ctx context.Context, ev fsm.Event) (fsm.Result, error) {
	start := time.Now()
	res, err := e.edge.Node().Propose(ctx, ev)
	e.Observe(ev.Type(), res, err, time.Since(start))
	return res, err
}

// Observe records the result of one proposed event (of a batch) that took
// took to answer.
func (e *Proposer) Observe(t fsm.EventType, res fsm.Result, err error, took time.Duration) {
	result := res.Status.String()
	switch {
	case errors.Is(err, cluster.ErrNotApplied):
		// Committed (res is the leader's result); this replica lags. Not
		// a log that cannot commit: no degraded mode.
	case errors.Is(err, cluster.ErrUnavailable):
		result = "unavailable"
		e.unavailable.Store(e.now().UnixNano())
	case err != nil:
		result = "error"
	default:
		e.commitObserve(took)
	}
	e.metrics.Proposals.WithLabelValues(t.String(), result).Inc()
}

func (e *Proposer) commitObserve(d time.Duration) { e.metrics.CommitSeconds.Observe(d.Seconds()) }

// Down reports whether the log is known to be unable to commit right now:
// a recent proposal failed for lack of quorum and no leader is known.
// Requests then go straight to degraded placement instead of waiting out
// propose_timeout each.
func (e *Proposer) Down() bool {
	last := e.unavailable.Load()
	if last == 0 || e.now().UnixNano()-last > int64(5*time.Second) {
		return false
	}
	leader, _ := e.edge.Node().Leader()
	return leader == ""
}
