package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tether-project/tether/fsm"
)

// handleForward serves one authenticated forwarding request.
func (n *Node) handleForward(ctx context.Context, peerID string, op byte, payload []byte) ([]byte, error) {
	// The mux serves forwarding before Open has created n.raft; started
	// (stored after NewRaft) orders the read of n.raft after its write.
	if !n.started.Load() {
		return nil, fmt.Errorf("%w: node %s is starting", ErrUnavailable, n.id)
	}
	switch op {
	case opPropose:
		return n.handlePropose(ctx, payload)
	case opAddVoter, opRemove, opTransfer, opJoinVoter, opJoinNonvoter:
		id, addr, forwarded, err := decodeMembership(payload)
		if err != nil {
			return nil, badRequest("%s: %v", opName(op), err)
		}
		return nil, n.membershipChange(ctx, op, id, addr, forwarded)
	case opStatus:
		return json.Marshal(n.Status())
	case opRemoved:
		id, index, err := decodeRemovedNotice(payload)
		if err != nil {
			return nil, badRequest("removed notice: %v", err)
		}
		if id != n.id {
			return nil, badRequest("removed notice for %q reached node %q", id, n.id)
		}
		n.log.Warn("cluster: the leader reports this node was removed", "from", peerID, "index", index)
		n.onRemoved(index)
		return nil, nil
	}
	return nil, badRequest("unknown operation %d", op)
}

// handlePropose is the leader side of a forwarded batch: decode, queue to
// the batcher, answer with the entry index and the results. Events this
// leader cannot decode (say, from a newer follower) are answered as
// rejected without being proposed; the rest of the frame goes ahead.
func (n *Node) handlePropose(ctx context.Context, payload []byte) ([]byte, error) {
	if err := n.usable(); err != nil {
		return nil, err
	}
	req, err := decodeProposeRequest(payload)
	if err != nil {
		return nil, badRequest("propose: %v", err)
	}
	props, rejected, count := req.props, req.rejected, req.count
	if n.raft.State() != raft.Leader {
		la, lid := n.raft.LeaderWithID()
		return nil, &NotLeaderError{LeaderID: string(lid), LeaderAddr: string(la)}
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(n.cfg.ProposeTimeout)
	}

	var (
		results []fsm.Result
		index   uint64
	)
	for len(props) > 0 {
		chunk := props[:min(len(props), n.cfg.MaxBatch)]
		props = props[len(chunk):]
		p := &pending{props: chunk, deadline: deadline, done: make(chan outcome, 1), queued: time.Now(), forwarded: true}
		select {
		case n.batcher.in <- p:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: queue to the batcher: %w", ErrUnavailable, ctx.Err())
		}
		var o outcome
		select {
		case o = <-p.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
		}
		if o.err != nil {
			return nil, o.err
		}
		results = append(results, o.results...)
		index = max(index, o.index)
	}
	if len(rejected) > 0 {
		all := make([]fsm.Result, 0, int(count))
		next := 0
		for i := 0; i < int(count); i++ {
			if reason, bad := rejected[i]; bad {
				all = append(all, fsm.Result{Status: fsm.StatusRejected, Reason: reason})
				continue
			}
			all = append(all, results[next])
			next++
		}
		results = all
	}
	return encodeProposeResponse(index, results), nil
}
