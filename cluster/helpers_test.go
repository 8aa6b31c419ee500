package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/test/leakcheck"
	"github.com/tether-project/tether/test/waitfor"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

var testKey = []byte("0123456789abcdef-test-internal-key")

// testTiming is fast enough for quick elections yet tolerant of a 2-core
// machine shared by several test binaries under the race detector (load
// averages of 15 seen), where tighter timeouts make leaders flap.
var testTiming = RaftTiming{
	HeartbeatTimeout:   500 * time.Millisecond,
	ElectionTimeout:    500 * time.Millisecond,
	LeaderLeaseTimeout: 500 * time.Millisecond,
	CommitTimeout:      2 * time.Millisecond,
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("CLUSTER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// testCluster is a set of nodes on loopback TCP with bbolt files in temp dirs.
type testCluster struct {
	t     testing.TB
	mu    sync.Mutex
	nodes []*Node // index = member number; nil while stopped
	cfgs  []Config
}

// newTestCluster bootstraps n nodes; tweak may adjust every node's config.
func newTestCluster(t testing.TB, n int, tweak func(i int, c *Config)) *testCluster {
	t.Helper()
	tc := &testCluster{t: t, nodes: make([]*Node, n), cfgs: make([]Config, n)}
	lns := make([]net.Listener, n)
	peers := make([]Peer, n)
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
		peers[i] = Peer{ID: fmt.Sprintf("n%d", i), Addr: ln.Addr().String()}
	}
	base := t.TempDir()
	for i := range n {
		cfg := Config{
			Settings: Settings{NodeID: peers[i].ID, DataDir: filepath.Join(base, peers[i].ID), BindAddr: peers[i].Addr, Bootstrap: true, Peers: peers, ProposeTimeout: 5 * time.Second, Raft: testTiming},
			Listener: lns[i],
			AuthKey:  testKey,
			Logger:   testLogger(t),
			Version:  "test",
		}
		if tweak != nil {
			tweak(i, &cfg)
		}
		tc.cfgs[i] = cfg
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tc.nodes[i], errs[i] = Open(context.Background(), tc.cfgs[i])
		}()
	}
	wg.Wait()
	t.Cleanup(tc.closeAll)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open node %d: %v", i, err)
		}
	}
	tc.leader(10 * time.Second)
	return tc
}

func (tc *testCluster) node(i int) *Node {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.nodes[i]
}

func (tc *testCluster) running() []*Node {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	var out []*Node
	for _, n := range tc.nodes {
		if n != nil {
			out = append(out, n)
		}
	}
	return out
}

func (tc *testCluster) closeAll() {
	for i := range tc.nodes {
		if n := tc.node(i); n != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := n.Close(ctx); err != nil {
				tc.t.Errorf("close node %d: %v", i, err)
			}
			cancel()
			tc.mu.Lock()
			tc.nodes[i] = nil
			tc.mu.Unlock()
		}
	}
}

// leader waits for a ready leader among the running nodes.
func (tc *testCluster) leader(timeout time.Duration) *Node {
	tc.t.Helper()
	var found *Node
	waitFor(tc.t, timeout, "a ready leader", func() bool {
		for _, n := range tc.running() {
			if n.IsLeader() {
				found = n
				return true
			}
		}
		return false
	})
	return found
}

func (tc *testCluster) index(n *Node) int {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	for i, m := range tc.nodes {
		if m == n {
			return i
		}
	}
	return -1
}

// follower returns a running non-leader.
func (tc *testCluster) follower() *Node {
	for _, n := range tc.running() {
		if !n.IsLeader() {
			return n
		}
	}
	tc.t.Fatal("no follower")
	return nil
}

// stop stops node i (Kill or Close) and forgets it.
func (tc *testCluster) stop(i int, kill bool) {
	tc.t.Helper()
	n := tc.node(i)
	var err error
	if kill {
		err = n.Kill()
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = n.Close(ctx)
		cancel()
	}
	if err != nil {
		tc.t.Fatalf("stop node %d: %v", i, err)
	}
	tc.mu.Lock()
	tc.nodes[i] = nil
	tc.mu.Unlock()
}

// restart reopens node i on its data dir and address.
func (tc *testCluster) restart(i int) *Node {
	tc.t.Helper()
	cfg := tc.cfgs[i]
	var ln net.Listener
	// The old port was just released; rebinding it can race with the
	// kernel's cleanup, so retry briefly.
	waitFor(tc.t, 5*time.Second, "rebinding "+cfg.BindAddr, func() bool {
		var err error
		ln, err = net.Listen("tcp", cfg.BindAddr)
		return err == nil
	})
	cfg.Listener = ln
	n, err := Open(context.Background(), cfg)
	if err != nil {
		tc.t.Fatalf("restart node %d: %v", i, err)
	}
	tc.mu.Lock()
	tc.nodes[i] = n
	tc.mu.Unlock()
	return n
}

// sync proposes a no-op marker through the leader and waits until every
// running node applied it, so their states are comparable.
func (tc *testCluster) sync(timeout time.Duration) uint64 {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var idx uint64
	waitFor(tc.t, timeout, "a committed sync marker", func() bool {
		l := tc.leader(timeout)
		if _, err := l.Propose(ctx, fsm.Annotation{Source: "test", Text: "sync"}); err != nil {
			return false
		}
		idx = l.State().Index()
		return true
	})
	for _, n := range tc.running() {
		if err := n.WaitApplied(ctx, idx); err != nil {
			tc.t.Fatalf("node %s: %v", n.ID(), err)
		}
	}
	return idx
}

// waitFor polls cond until it holds or the deadline passes.
var waitFor = waitfor.True

func bindEv(key, instance string) fsm.Bind {
	return fsm.Bind{Fleet: fsm.FleetContext, Key: key, ConversationID: key, Instance: instance}
}
