package cluster

import (
	"context"
	"fmt"

	"github.com/hashicorp/raft"

	"github.com/tether-project/tether/fsm"
)

// Test hooks on Node, kept out of the production type (as hashicorp/raft
// keeps its own in testing.go): a caller of the package cannot reach the
// state machine past Raft or append entries the encoder would not write.

// machineForTest is the node's state machine (read-only use: Skipped, Halted).
func (n *Node) machineForTest() *fsm.Machine { return n.machine }

// hashHistory is the range of state indexes HashAt can answer now
// (oldest, newest; 0, 0 before anything was applied).
func (n *Node) hashHistory() (oldest, newest uint64) { return n.fsm.hashes.span() }

// proposeRaw appends data as a command entry as is (leader only), to put
// entries in the log that this build's encoder would not write (unknown
// event types, corrupt envelopes).
func (n *Node) proposeRaw(ctx context.Context, data []byte) (uint64, error) {
	if n.raft.State() != raft.Leader {
		return 0, ErrNotLeader
	}
	f := n.raft.Apply(data, 0)
	if err := waitFuture(ctx, f); err != nil {
		return 0, fmt.Errorf("cluster: propose raw entry: %w", err)
	}
	return f.Index(), nil
}
