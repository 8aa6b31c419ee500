package leader_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/leader"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
	"github.com/tether-project/tether/test/waitfor"
)

// testEdge is a one-node cluster and a fleet view that sees no workers,
// on a clock the test moves forward.
type testEdge struct {
	node   *cluster.Node
	fleet  *fleetview.View
	offset atomic.Int64 // added to the wall clock

	mu    sync.Mutex
	acted map[string]int
}

func (e *testEdge) Node() *cluster.Node    { return e.node }
func (e *testEdge) Fleet() *fleetview.View { return e.fleet }
func (e *testEdge) Now() time.Time         { return time.Now().Add(time.Duration(e.offset.Load())) }
func (e *testEdge) Propose(ctx context.Context, ev fsm.Event) (fsm.Result, error) {
	return e.node.Propose(ctx, ev)
}
func (e *testEdge) ObserveProposal(fsm.EventType, fsm.Result, error, time.Duration) {}
func (e *testEdge) ConversationKey(_, conv string) (string, bool)                   { return conv, true }

func (e *testEdge) actions(kind string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.acted[kind]
}

const maxBindings = 1234

// startDuties runs the duties of a new one-node cluster holding instance
// ctx-1 and a binding of conversation key on it, until the test ends.
func startDuties(t *testing.T, key string, cfg leader.Config) (*testEdge, *leader.Duties) {
	t.Helper()
	return startDutiesHearing(t, key, cfg, nil)
}

// startDutiesHearing is startDuties with a fleet view hearing telemetry
// on nc (nil: none), on the test's clock.
func startDutiesHearing(t *testing.T, key string, cfg leader.Config, nc *nats.Conn) (*testEdge, *leader.Duties) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	node, err := cluster.Open(ctx, cluster.Config{
		Settings: cluster.Settings{NodeID: "edge-1", DataDir: t.TempDir(), Bootstrap: true,
			Peers: []cluster.Peer{{ID: "edge-1", Addr: ln.Addr().String()}}, ProposeTimeout: 5 * time.Second,
			Raft: cluster.RaftTiming{HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, LeaderLeaseTimeout: 50 * time.Millisecond}},
		Listener: ln,
		AuthKey:  []byte("leader-test-internal-key"),
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	e := &testEdge{node: node, acted: map[string]int{}}
	fleet, err := fleetview.New(fleetview.Config{Conn: nc, Now: e.Now})
	if err != nil {
		t.Fatal(err)
	}
	e.fleet = fleet
	if nc != nil {
		if err := fleet.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cfg.NodeID, cfg.Interval, cfg.SweepBatch, cfg.MaxBindings = "edge-1", 10*time.Millisecond, 16, maxBindings
	cfg.Acted = func(kind string, n int) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.acted[kind] += n
	}
	d := leader.New(e, cfg)
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
		fleet.Close()
		node.Close(context.Background())
	})
	waitFor(t, "leadership", node.IsLeader)
	if _, err := node.ProposeBatch(ctx, []fsm.Event{
		fsm.InstanceState{Instance: "ctx-1", Fleet: fsm.FleetContext, URL: "http://ctx-1", Status: fsm.InstanceUp},
		fsm.Bind{Fleet: fsm.FleetContext, Key: key, ConversationID: key, Instance: "ctx-1", Decision: fsm.Decision{Edge: "edge-1", Policy: "least_loaded"}},
	}); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		d.Run(ctx)
	}()
	return e, d
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitfor.True(t, 20*time.Second, what, cond)
}

func bound(e *testEdge, key string) bool {
	_, ok := e.node.State().Lookup(fsm.FleetContext, key)
	return ok
}

// The leader commits the configured max_bindings, sweeps a binding idle
// past session_ttl, and declares an instance it has not heard from for
// down_after of its tenure down; a fresh binding and a new tenure's
// instances are left alone.
func TestDutiesSettleSweepAndDeclareDown(t *testing.T) {
	e, _ := startDuties(t, "conv-1", leader.Config{SessionTTL: time.Hour, DownAfter: 90 * time.Minute})
	waitFor(t, "max_bindings committed", func() bool { return e.node.State().MaxBindings() == maxBindings })
	if !bound(e, "conv-1") {
		t.Fatal("a binding idle for less than session_ttl was evicted")
	}
	if rec, _ := e.node.State().Instance("ctx-1"); rec.Status != fsm.InstanceUp {
		t.Fatalf("ctx-1 is %v at the start of the tenure, want up", rec.Status)
	}
	e.offset.Store(int64(61 * time.Minute))
	waitFor(t, "the idle binding swept, and the action counted", func() bool { return !bound(e, "conv-1") && e.actions("ttl_evict") >= 1 })
	if n := e.actions("ttl_evict"); n != 1 {
		t.Errorf("ttl_evict actions = %d, want 1", n)
	}
	e.offset.Store(int64(2 * time.Hour))
	// Acted is called once the proposal returns, after the state applied it.
	waitFor(t, "ctx-1 declared down, and the action counted", func() bool {
		rec, _ := e.node.State().Instance("ctx-1")
		return rec.Status == fsm.InstanceDown && e.actions("instance_state") >= 1
	})
	if e.actions("settings") != 1 || e.actions("instance_state") != 1 {
		t.Errorf("actions: settings %d, instance_state %d; want 1 each", e.actions("settings"), e.actions("instance_state"))
	}
}

// A worker's eviction of a conversation evicts its binding when the
// binding is on that worker, and not when it is on another.
func TestQueuedEvictionsEvictTheBindingOnThatInstance(t *testing.T) {
	e, d := startDuties(t, "conv-2", leader.Config{SessionTTL: time.Hour, DownAfter: time.Hour})
	// The first round has run: the tenure's loop is past dropping the
	// evictions queued before it.
	waitFor(t, "the first round", func() bool { return e.actions("settings") == 1 })
	d.QueueEvictions("ctx-9", fsm.FleetContext, []telemetry.Eviction{{ConversationID: "conv-2"}})
	d.QueueEvictions("ctx-1", fsm.FleetContext, []telemetry.Eviction{{ConversationID: "conv-2"}})
	waitFor(t, "the binding evicted", func() bool { return !bound(e, "conv-2") })
	// Counted once answered: a proposal whose answer came after its
	// timeout (a busy host) applied uncounted, so at most one.
	if n := e.actions("kv_evict"); n > 1 {
		t.Errorf("kv_evict actions = %d, want at most 1 (the eviction on ctx-9 does not apply)", n)
	}
}

// Silence that every instance the view knows shares is this edge's (its
// link, or the process stalled), not the workers': the leader declares
// none of them down. Once another instance is heard again, the one still
// silent past down_after is declared down.
func TestSharedSilenceDeclaresNoInstanceDown(t *testing.T) {
	ns := natstest.Start(t, nil)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	e, _ := startDutiesHearing(t, "conv-1", leader.Config{SessionTTL: 24 * time.Hour, DownAfter: time.Minute}, nc)
	publish := func(id string, seq uint64) {
		b, err := telemetry.EncodeLoad(telemetry.LoadReport{Instance: id, Fleet: telemetry.FleetContext, URL: "http://" + id,
			Model: "m", Version: "v", FeatureLevel: 1, BootID: 1, Seq: seq, IntervalMilli: 100, BlockSize: 4,
			Ranks: []telemetry.RankLoad{{Rank: 0, KVBlocksTotal: 10}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(telemetry.LoadSubject(telemetry.FleetContext, id), b); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	publish("ctx-1", 1)
	publish("ctx-2", 1)
	waitFor(t, "both instances up in the log", func() bool {
		a, _ := e.node.State().Instance("ctx-1")
		b, _ := e.node.State().Instance("ctx-2")
		return a.Status == fsm.InstanceUp && b.Status == fsm.InstanceUp && a.URL == "http://ctx-1"
	})
	e.offset.Store(int64(2 * time.Minute)) // every instance silent for twice down_after
	time.Sleep(200 * time.Millisecond)     // duty rounds every 10 ms (schedule, not a wait for a result)
	for _, id := range []string{"ctx-1", "ctx-2"} {
		if rec, _ := e.node.State().Instance(id); rec.Status != fsm.InstanceUp {
			t.Fatalf("%s is %v after a silence every instance shares", id, rec.Status)
		}
	}
	if !bound(e, "conv-1") {
		t.Fatal("a shared silence evicted a binding")
	}
	publish("ctx-2", 2)
	waitFor(t, "ctx-1, still silent while ctx-2 is heard, declared down", func() bool {
		rec, _ := e.node.State().Instance("ctx-1")
		return rec.Status == fsm.InstanceDown
	})
	if b, _ := e.node.State().Instance("ctx-2"); b.Status != fsm.InstanceUp {
		t.Fatalf("ctx-2 is %v", b.Status)
	}
}
