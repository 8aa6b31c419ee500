package proposals

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/fsm"
)

// A follower forwards its Bind to the leader; a leader shutting down
// answers "closed", the node retries (same id) until its propose timeout,
// and when no new leader took over by then the error it returns wraps
// ErrUnavailable and the leader's remote ErrClosed. That is the log being
// unable to commit right now, not this edge stopping: the edge served the
// request on the proposal, so the proposal must stay with the recorder
// until it commits. Taking errors.Is(err, ErrClosed) for "this node is
// closed" dropped it (placements.send, recorder.requeue) and the served
// placement was never recorded. Only this node's own ErrClosed drops.
func TestRemoteLeaderClosingDoesNotDropOwnProposals(t *testing.T) {
	remote := &cluster.RemoteError{Addr: "127.0.0.1:7001", Msg: "cluster: node closed", Cause: cluster.ErrClosed}
	// As cluster's proposeChunk reports a deadline passed after retryable failures.
	leaderClosing := fmt.Errorf("cluster: propose %d events: %w (within %s): %w", 1, cluster.ErrUnavailable, time.Second, remote)
	if !errors.Is(leaderClosing, cluster.ErrClosed) {
		t.Fatal("the scenario needs the error chain to carry the remote ErrClosed")
	}
	if closedHere(leaderClosing) {
		t.Fatalf("%v: taken for this node closing", leaderClosing)
	}
	for _, err := range []error{cluster.ErrClosed, fmt.Errorf("cluster: propose: %w", cluster.ErrClosed)} {
		if !closedHere(err) {
			t.Fatalf("%v: this node's own close not recognised", err)
		}
	}

	m, err := observe.New(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{metrics: m, log: slog.New(slog.DiscardHandler)}
	r := newRecorder(e)
	dropped := ""
	bind := recorded{id: cluster.NewProposalID(), untilCommitted: true,
		ev: fsm.Bind{Fleet: fsm.FleetContext, Key: "conv-1", Instance: "ctx-1", Decision: fsm.Decision{Edge: "edge-2", RequestID: "edge-2-9"}},
		done: func(res *fsm.Result, reason string) {
			if res == nil {
				dropped = reason
			}
		}}
	r.requeue([]recorded{bind}, leaderClosing)
	if dropped != "" || r.Queued() != 1 {
		t.Fatalf("after the leader answered closed: dropped %q, %d queued; want the Bind kept for the next leader", dropped, r.Queued())
	}
	r.queue = nil
	r.requeue([]recorded{bind}, cluster.ErrClosed)
	if dropped != "closed" || r.Queued() != 0 {
		t.Fatalf("after this node closed: dropped %q, %d queued; want it dropped as closed", dropped, r.Queued())
	}
}
