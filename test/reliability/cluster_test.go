package reliability

import (
	"context"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/cluster/faultnet"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/test/clustertest"
	"github.com/tether-project/tether/test/waitfor"
)

var authKey = []byte("reliability-suite-internal-key-0123")

// timing tolerates a loaded 2-core machine under the race detector while
// still electing within a few hundred milliseconds.
var timing = cluster.RaftTiming{
	HeartbeatTimeout:   200 * time.Millisecond,
	ElectionTimeout:    200 * time.Millisecond,
	LeaderLeaseTimeout: 100 * time.Millisecond,
	CommitTimeout:      2 * time.Millisecond,
}

func logger() *slog.Logger {
	if os.Getenv("RELIABILITY_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// faultCluster is a bootstrapped cluster (test/clustertest) whose every
// node listens and dials through one faultnet.Network.
type faultCluster struct {
	t    testing.TB
	net  *faultnet.Network
	ids  []string
	cfgs []cluster.Config
	g    *clustertest.Group[*cluster.Node]
}

func newFaultCluster(t testing.TB, size int, seed int64, tweak func(*cluster.Config)) *faultCluster {
	t.Helper()
	fc := &faultCluster{t: t, net: faultnet.New(seed)}
	fc.g = clustertest.New[*cluster.Node](t, clustertest.Options{N: size, Listen: fc.listen, ParallelClose: true})
	t.Cleanup(fc.net.Heal) // before the nodes close (cleanups run last first)
	ms := fc.g.Members()
	peers := make([]cluster.Peer, size)
	for i, m := range ms {
		peers[i] = cluster.Peer{ID: m.ID, Addr: m.Addr}
	}
	for _, m := range ms {
		fc.ids = append(fc.ids, m.ID)
		cfg := cluster.Config{
			Settings: cluster.Settings{NodeID: m.ID, DataDir: m.DataDir, BindAddr: m.Addr, Bootstrap: true, Peers: peers, ProposeTimeout: time.Second, Raft: timing},
			Dial:     fc.net.Dialer(m.ID),
			AuthKey:  authKey,
			Logger:   logger().With("node", m.ID),
			Version:  "reliability",
		}
		if tweak != nil {
			tweak(&cfg)
		}
		fc.cfgs = append(fc.cfgs, cfg)
	}
	fc.g.StartAll(func(i int, ln net.Listener) (*cluster.Node, error) {
		cfg := fc.cfgs[i]
		cfg.Listener = ln
		return cluster.Open(context.Background(), cfg)
	})
	return fc
}

// listen opens node id's port on the fault network.
func (fc *faultCluster) listen(id, addr string) (net.Listener, error) {
	if addr == "" {
		return fc.net.Listen(id)
	}
	return fc.net.ListenAt(id, addr)
}

// closeAll heals the network and closes every running node.
func (fc *faultCluster) closeAll() {
	fc.net.Heal()
	fc.g.CloseAll()
}

func (fc *faultCluster) node(i int) *cluster.Node { return fc.g.Node(i) }

// leaderIndex is the member number of a ready leader, or -1.
func (fc *faultCluster) leaderIndex() int { return fc.g.LeaderIndex() }

// waitLeader waits for a ready leader among running nodes.
func (fc *faultCluster) waitLeader(timeout time.Duration) int {
	fc.t.Helper()
	return fc.g.WaitLeader(timeout)
}

// kill stops node i abruptly (connections drop, no leadership transfer).
func (fc *faultCluster) kill(i int) {
	if err := fc.g.Kill(i); err != nil {
		fc.t.Error(err)
	}
}

// restart reopens node i on its data dir and address.
func (fc *faultCluster) restart(i int) error {
	_, err := fc.g.Start(i)
	return err
}

// converge heals the network, restarts stopped nodes, commits a marker and
// waits until every node applied it; it returns the nodes' state hashes at
// that point (all must be equal: they are taken at the same index).
func (fc *faultCluster) converge(timeout time.Duration) map[string]string {
	fc.t.Helper()
	fc.net.Heal()
	for i := range fc.ids {
		if err := fc.restart(i); err != nil {
			fc.t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var idx uint64
	waitFor(fc.t, timeout, "a committed convergence marker", func() bool {
		l := fc.leaderIndex()
		if l < 0 {
			return false
		}
		n := fc.node(l)
		if _, err := n.Propose(ctx, fsm.Annotation{Source: "reliability", Text: "converge"}); err != nil {
			return false
		}
		idx = n.State().Index()
		return true
	})
	// Proposals that timed out during the faults may still commit after
	// the marker (their ids make that safe), so compare the nodes whenever
	// they stand at the same index: equal index must mean equal hash.
	var hashes map[string]string
	waitFor(fc.t, timeout, "all nodes at one index past the marker", func() bool {
		hashes = map[string]string{}
		var at uint64
		for i := range fc.ids {
			st := fc.node(i).Status()
			if st.StateIndex < idx || (at != 0 && st.StateIndex != at) {
				return false
			}
			at = st.StateIndex
			hashes[st.ID] = st.StateHash
		}
		return true
	})
	return hashes
}

// waitFor polls cond until it holds or the deadline passes.
var waitFor = waitfor.True
