package cluster

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/test/clustertest"
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

// testCluster is a set of nodes on loopback TCP with bbolt files in temp
// dirs (test/clustertest), each opened from its config.
type testCluster struct {
	t    testing.TB
	g    *clustertest.Group[*Node]
	mu   sync.Mutex
	cfgs []Config // index = member number
}

// newTestCluster bootstraps n nodes; tweak may adjust every node's config.
func newTestCluster(t testing.TB, n int, tweak func(i int, c *Config)) *testCluster {
	t.Helper()
	tc := &testCluster{t: t, g: clustertest.New[*Node](t, clustertest.Options{N: n})}
	ms := tc.g.Members()
	peers := make([]Peer, n)
	for i, m := range ms {
		peers[i] = Peer{ID: m.ID, Addr: m.Addr}
	}
	for i, m := range ms {
		cfg := tc.config(m)
		cfg.BindAddr, cfg.Bootstrap, cfg.Peers = m.Addr, true, peers
		if tweak != nil {
			tweak(i, &cfg)
		}
		tc.cfgs = append(tc.cfgs, cfg)
	}
	tc.g.StartAll(tc.open)
	tc.leader(10 * time.Second)
	return tc
}

// config is member m's configuration before the cluster's own settings.
func (tc *testCluster) config(m clustertest.Member) Config {
	return Config{
		Settings: Settings{NodeID: m.ID, DataDir: m.DataDir, ProposeTimeout: 5 * time.Second, Raft: testTiming},
		AuthKey:  testKey,
		Logger:   testLogger(tc.t),
		Version:  "test",
	}
}

// open opens member i from its config on ln.
func (tc *testCluster) open(i int, ln net.Listener) (*Node, error) {
	tc.mu.Lock()
	cfg := tc.cfgs[i]
	tc.mu.Unlock()
	cfg.Listener = ln
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return Open(ctx, cfg)
}

// join opens one more node, id, whose config settings adjusts (its Join,
// Suffrage, Autopilot), and makes it a member of the test cluster.
func (tc *testCluster) join(id string, settings func(c *Config)) *Node {
	tc.t.Helper()
	i, m := tc.g.Add(id)
	cfg := tc.config(m)
	settings(&cfg)
	tc.mu.Lock()
	tc.cfgs = append(tc.cfgs, cfg)
	tc.mu.Unlock()
	n, err := tc.g.Start(i)
	if err != nil {
		tc.t.Fatalf("join %s: %v", id, err)
	}
	return n
}

func (tc *testCluster) node(i int) *Node { return tc.g.Node(i) }

func (tc *testCluster) running() []*Node { return tc.g.Running() }

// leader waits for a ready leader among the running nodes.
func (tc *testCluster) leader(timeout time.Duration) *Node {
	tc.t.Helper()
	return tc.node(tc.g.WaitLeader(timeout))
}

func (tc *testCluster) index(n *Node) int { return tc.g.Index(n) }

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
	stop := tc.g.Close
	if kill {
		stop = tc.g.Kill
	}
	if err := stop(i); err != nil {
		tc.t.Fatal(err)
	}
}

// restart reopens node i on its data dir and address.
func (tc *testCluster) restart(i int) *Node {
	tc.t.Helper()
	n, err := tc.g.Start(i)
	if err != nil {
		tc.t.Fatal(err)
	}
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

// tryJoin opens a would-be member, id, that joins through target with its
// config adjusted by tweak, within timeout, and returns Open's error; a
// node that opened is closed again (the callers expect a refusal).
func tryJoin(t testing.TB, id, target string, timeout time.Duration, tweak func(c *Config)) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cfg := Config{
		Settings: Settings{NodeID: id, DataDir: filepath.Join(t.TempDir(), id), Join: []string{target}, Raft: testTiming},
		Listener: ln,
		AuthKey:  testKey,
		Logger:   testLogger(t),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	n, err := Open(ctx, cfg)
	if err == nil {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_ = n.Close(cctx)
	}
	return err
}

// waitFor polls cond until it holds or the deadline passes.
var waitFor = waitfor.True

func bindEv(key, instance string) fsm.Bind {
	return fsm.Bind{Fleet: fsm.FleetContext, Key: key, ConversationID: key, Instance: instance}
}
