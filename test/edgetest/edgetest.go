// Package edgetest runs whole edges as the members of a test/clustertest
// group, for the tests outside the edge package that start several edges
// in one process (the edge package's own tests have the same adapter, as
// they cannot import this package).
package edgetest

import (
	"context"
	"log/slog"
	"net"
	"testing"
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

// Place gives c member m's place in its group: its node id, data directory
// and Raft address, and, with voters, the group they bootstrap (an edge
// without voters joins no group by itself).
func Place(c *edge.Config, m clustertest.Member, voters []clustertest.Member) {
	s := &c.Cluster.Settings
	s.NodeID, s.DataDir, s.BindAddr = m.ID, m.DataDir, m.Addr
	s.Bootstrap, s.Peers = len(voters) > 0, Peers(voters)
}

// GroupOptions shape a group of edges that bootstrap one Raft group.
type GroupOptions struct {
	clustertest.Options
	// Config is member i's configuration; StartGroup places it in the
	// group (Place) and validates it.
	Config func(i int, m clustertest.Member) edge.Config
	// Deps are member i's dependencies, each time it starts (nil: a
	// logger that discards).
	Deps func(i int, m clustertest.Member) edge.Deps
	// StartTimeout bounds each edge's start (0: 30 s).
	StartTimeout time.Duration
	// LeaderTimeout bounds the wait for a ready leader (0: 20 s).
	LeaderTimeout time.Duration
}

// StartGroup starts o.N edges, every one a bootstrap voter of one Raft
// group, concurrently, and waits for a ready leader. The group stops them
// when the test ends.
func StartGroup(t testing.TB, o GroupOptions) *clustertest.Group[Member] {
	t.Helper()
	if o.StartTimeout <= 0 {
		o.StartTimeout = 30 * time.Second
	}
	if o.LeaderTimeout <= 0 {
		o.LeaderTimeout = 20 * time.Second
	}
	g := clustertest.New[Member](t, o.Options)
	ms := g.Members()
	cfgs := make([]edge.Config, len(ms))
	for i, m := range ms {
		cfgs[i] = o.Config(i, m)
		Place(&cfgs[i], m, ms)
		if err := cfgs[i].Validate(); err != nil {
			t.Fatalf("edgetest: edge %s: %v", m.ID, err)
		}
	}
	g.StartAll(func(i int, ln net.Listener) (Member, error) {
		deps := edge.Deps{Logger: slog.New(slog.DiscardHandler)}
		if o.Deps != nil {
			deps = o.Deps(i, ms[i])
		}
		return Start(cfgs[i], deps, ln, o.StartTimeout)
	})
	g.WaitLeader(o.LeaderTimeout)
	return g
}
