// Package edgetest runs whole edges as the members of a test/clustertest
// group, for the tests outside the edge package that start several edges
// in one process (the edge package's own tests have the same adapter, as
// they cannot import this package).
package edgetest

import (
	"context"
	"net"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/test/clustertest"
)

// Member is an edge as a clustertest member.
type Member struct{ *edge.Edge }

// IsLeader reports whether the edge's node is a ready leader.
func (m Member) IsLeader() bool { return m.Node().IsLeader() }

// Kill stops the edge abruptly.
func (m Member) Kill() error {
	m.Edge.Kill()
	return nil
}

// Peers are the members as the bootstrap peers of a cluster section.
func Peers(ms []clustertest.Member) []cluster.Peer {
	out := make([]cluster.Peer, len(ms))
	for i, m := range ms {
		out[i] = cluster.Peer{ID: m.ID, Addr: m.Addr}
	}
	return out
}

// Start runs an edge from cfg with ln as its Raft port (deps.ClusterListener)
// and waits at most timeout for it to start; an edge that does not start is
// closed again, and so are its listeners.
func Start(cfg edge.Config, deps edge.Deps, ln net.Listener, timeout time.Duration) (Member, error) {
	deps.ClusterListener = ln
	e, err := edge.New(cfg, deps)
	if err != nil {
		ln.Close()
		if deps.HTTPListener != nil {
			deps.HTTPListener.Close()
		}
		return Member{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_ = e.Close(cctx)
		return Member{}, err
	}
	return Member{e}, nil
}

// Edges are the group's running edges, by member number.
func Edges(g *clustertest.Group[Member]) []*edge.Edge {
	var out []*edge.Edge
	for _, m := range g.Running() {
		out = append(out, m.Edge)
	}
	return out
}
