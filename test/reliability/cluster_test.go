package reliability

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/cluster/faultnet"
	"github.com/tether-project/tether/fsm"
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

// faultCluster is a bootstrapped cluster whose every node listens and dials
// through one faultnet.Network.
type faultCluster struct {
	t    testing.TB
	net  *faultnet.Network
	ids  []string
	cfgs []cluster.Config

	mu    sync.Mutex
	nodes []*cluster.Node // nil while a node is down
}

func newFaultCluster(t testing.TB, size int, seed int64, tweak func(*cluster.Config)) *faultCluster {
	t.Helper()
	fc := &faultCluster{t: t, net: faultnet.New(seed), nodes: make([]*cluster.Node, size)}
	base := t.TempDir()
	peers := make([]cluster.Peer, size)
	for i := range size {
		id := fmt.Sprintf("n%d", i)
		ln, err := fc.net.Listen(id)
		if err != nil {
			t.Fatal(err)
		}
		fc.ids = append(fc.ids, id)
		peers[i] = cluster.Peer{ID: id, Addr: ln.Addr().String()}
		fc.cfgs = append(fc.cfgs, cluster.Config{
			Settings: cluster.Settings{NodeID: id, DataDir: filepath.Join(base, id), BindAddr: peers[i].Addr, Bootstrap: true, ProposeTimeout: time.Second, Raft: timing},
			Listener: ln,
			Dial:     fc.net.Dialer(id),
			AuthKey:  authKey,
			Logger:   logger().With("node", id),
			Version:  "reliability",
		})
	}
	for i := range fc.cfgs {
		fc.cfgs[i].Peers = peers
		if tweak != nil {
			tweak(&fc.cfgs[i])
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, size)
	for i := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fc.nodes[i], errs[i] = cluster.Open(context.Background(), fc.cfgs[i])
		}()
	}
	wg.Wait()
	t.Cleanup(fc.closeAll)
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("open cluster: %v", err)
	}
	return fc
}

func (fc *faultCluster) node(i int) *cluster.Node {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.nodes[i]
}

func (fc *faultCluster) closeAll() {
	fc.net.Heal()
	var wg sync.WaitGroup
	for i := range fc.nodes {
		if n := fc.node(i); n != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := n.Close(ctx); err != nil {
					fc.t.Errorf("close %s: %v", n.ID(), err)
				}
			}()
		}
	}
	wg.Wait()
	fc.mu.Lock()
	clear(fc.nodes)
	fc.mu.Unlock()
}

// leaderIndex is the member number of a ready leader, or -1.
func (fc *faultCluster) leaderIndex() int {
	for i := range fc.nodes {
		if n := fc.node(i); n != nil && n.IsLeader() {
			return i
		}
	}
	return -1
}

// waitLeader waits for a ready leader among running nodes.
func (fc *faultCluster) waitLeader(timeout time.Duration) int {
	fc.t.Helper()
	idx := -1
	waitFor(fc.t, timeout, "a ready leader", func() bool {
		idx = fc.leaderIndex()
		return idx >= 0
	})
	return idx
}

// kill stops node i abruptly (connections drop, no leadership transfer).
func (fc *faultCluster) kill(i int) {
	fc.mu.Lock()
	n := fc.nodes[i]
	fc.nodes[i] = nil
	fc.mu.Unlock()
	if n == nil {
		return
	}
	if err := n.Kill(); err != nil {
		fc.t.Errorf("kill %s: %v", n.ID(), err)
	}
}

// restart reopens node i on its data dir and address.
func (fc *faultCluster) restart(i int) error {
	if fc.node(i) != nil {
		return nil
	}
	cfg := fc.cfgs[i]
	deadline := time.Now().Add(10 * time.Second)
	for {
		ln, err := fc.net.ListenAt(cfg.NodeID, cfg.BindAddr)
		if err == nil {
			cfg.Listener = ln
			break
		}
		// The killed node's port is released asynchronously by the kernel.
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
	n, err := cluster.Open(context.Background(), cfg)
	if err != nil {
		return fmt.Errorf("restart %s: %w", cfg.NodeID, err)
	}
	fc.mu.Lock()
	fc.nodes[i] = n
	fc.mu.Unlock()
	return nil
}

// converge heals the network, restarts stopped nodes, commits a marker and
// waits until every node applied it; it returns the nodes' state hashes at
// that point (all must be equal: they are taken at the same index).
func (fc *faultCluster) converge(timeout time.Duration) map[string]string {
	fc.t.Helper()
	fc.net.Heal()
	for i := range fc.nodes {
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
		for i := range fc.nodes {
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
