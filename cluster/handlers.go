package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tether-project/tether/cluster/transport"
	"github.com/tether-project/tether/fsm"
)

// forwardHandler is the node's side of the forwarding server
// (transport.Handler): the transport authenticated the peer and decoded the
// request; these act on it. A separate type, not Node's own methods, so
// that Node's API keeps its Propose and Status.
type forwardHandler struct{ n *Node }

var _ transport.Handler = forwardHandler{}

// starting refuses requests until Open has created n.raft: the transport
// serves forwarding before that. started (stored after NewRaft) orders the
// read of n.raft after its write.
func (h forwardHandler) starting() error {
	if !h.n.started.Load() {
		return fmt.Errorf("%w: node %s is starting", ErrUnavailable, h.n.id)
	}
	return nil
}

func (h forwardHandler) ChangeMembership(ctx context.Context, op transport.Op, id, addr string, forwarded bool) error {
	if err := h.starting(); err != nil {
		return err
	}
	return h.n.membershipChange(ctx, op, id, addr, forwarded)
}

func (h forwardHandler) Status(context.Context) ([]byte, error) {
	if err := h.starting(); err != nil {
		return nil, err
	}
	return json.Marshal(h.n.Status())
}

func (h forwardHandler) Removed(_ context.Context, peerID, id string, index uint64) error {
	if err := h.starting(); err != nil {
		return err
	}
	n := h.n
	if id != n.id {
		return transport.BadRequest("removed notice for %q reached node %q", id, n.id)
	}
	n.log.Warn("cluster: the leader reports this node was removed", "from", peerID, "index", index)
	n.onRemoved(index)
	return nil
}

// Propose is the leader side of a forwarded batch: queue to the batcher
// (in chunks of MaxBatch), answer with the entry index and the results.
func (h forwardHandler) Propose(ctx context.Context, props []fsm.Proposal) (uint64, []fsm.Result, error) {
	if err := h.starting(); err != nil {
		return 0, nil, err
	}
	n := h.n
	if err := n.usable(); err != nil {
		return 0, nil, err
	}
	if n.raft.State() != raft.Leader {
		la, lid := n.raft.LeaderWithID()
		return 0, nil, &NotLeaderError{LeaderID: string(lid), LeaderAddr: string(la)}
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
			return 0, nil, fmt.Errorf("%w: queue to the batcher: %w", ErrUnavailable, ctx.Err())
		}
		var o outcome
		select {
		case o = <-p.done:
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
		}
		if o.err != nil {
			return 0, nil, o.err
		}
		results = append(results, o.results...)
		index = max(index, o.index)
	}
	return index, results, nil
}
