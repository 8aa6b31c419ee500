package cluster

import (
	"errors"

	"github.com/tether-project/tether/cluster/transport"
)

// The node's errors. Those the forwarding protocol carries between nodes are
// defined in cluster/transport (a response code maps back to the same
// sentinel on the caller's node) and re-exported here unchanged: the same
// values and types, so errors.Is/As work with either name.
var (
	// ErrUnavailable: no leader, or no quorum, within the proposal deadline.
	// The edge falls back to degraded routing on it. The proposal may still
	// commit later (it was possibly appended); its id makes a retry safe.
	ErrUnavailable = transport.ErrUnavailable
	// ErrNotLeader: the operation needs the leader and this node is not it.
	ErrNotLeader = transport.ErrNotLeader
	// ErrClosed: the node is closed or closing.
	ErrClosed = transport.ErrClosed
	// ErrHalted: the node stopped applying the log (see Node.Fatal).
	ErrHalted = transport.ErrHalted
	// ErrBadRequest: a request the cluster cannot act on as asked (an
	// add-voter of a node that does not answer, for one).
	ErrBadRequest = transport.ErrBadRequest
	// ErrRemoved: the node was removed from the cluster.
	ErrRemoved = errors.New("cluster: node removed from the cluster")
	// ErrNotApplied: the proposals committed (their results, from the
	// leader's apply, are valid and returned beside the error) but this
	// node had not applied them by the deadline, so its state does not show
	// them yet. Wrapped together with ErrUnavailable for callers that only
	// know that one.
	ErrNotApplied = errors.New("cluster: committed, not yet applied on this node")
)

// NotLeaderError carries the leader this node knows of, if any.
type NotLeaderError = transport.NotLeaderError

// RemoteError is a failure reported by another node over the forwarding
// protocol.
type RemoteError = transport.RemoteError
