package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/cluster/faultnet"
	"github.com/tether-project/tether/cluster/transport"
	"github.com/tether-project/tether/fsm"
)

func TestKillLeaderMidLoadLosesNoAckedBinding(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, func(i int, c *Config) { c.ProposeTimeout = 2 * time.Second })
	old := tc.leader(5 * time.Second)

	var (
		mu     sync.Mutex
		acked  = map[string]string{}
		total  atomic.Int64
		stop   = make(chan struct{})
		wg     sync.WaitGroup
		seq    atomic.Int64
		failed atomic.Int64
	)
	for _, n := range tc.running() {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					k := fmt.Sprintf("key-%d", seq.Add(1))
					inst := fmt.Sprintf("w%d", len(k)%5)
					res, err := n.Propose(context.Background(), bindEv(k, inst))
					if errors.Is(err, ErrClosed) {
						return // this node was killed
					}
					if err != nil {
						failed.Add(1)
						continue
					}
					mu.Lock()
					acked[k] = res.Binding.Instance
					mu.Unlock()
					total.Add(1)
				}
			}()
		}
	}
	waitFor(t, 20*time.Second, "load before the kill", func() bool { return total.Load() >= 150 })
	tc.stop(tc.index(old), true)
	before := total.Load()
	newLeader := tc.leader(10 * time.Second)
	if newLeader == old {
		t.Fatal("killed leader still reported as leader")
	}
	waitFor(t, 20*time.Second, "proposals resuming under the new leader", func() bool { return total.Load() >= before+150 })
	close(stop)
	wg.Wait()

	tc.sync(10 * time.Second)
	mu.Lock()
	defer mu.Unlock()
	for _, n := range tc.running() {
		st := n.State()
		for k, inst := range acked {
			b, ok := st.Lookup(fsm.FleetContext, k)
			if !ok || b.Instance != inst {
				t.Fatalf("node %s lost acknowledged binding %s→%s (found %v %q)", n.ID(), k, inst, ok, b.Instance)
			}
		}
	}
	t.Logf("%d acknowledged binds survived the leader kill (%d proposals failed during the election)", len(acked), failed.Load())
}

func TestRestartCatchesUpThroughSnapshotAndLog(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, func(i int, c *Config) {
		c.SnapshotThreshold = 40
		c.SnapshotInterval = 20 * time.Millisecond
		c.TrailingLogs = 10
		// Restarting in-process re-registers the node's metrics.
		c.Registerer = prometheus.NewRegistry()
	})
	ctx := context.Background()
	// Separate proposals (one small entry each, mostly) from 8 goroutines,
	// so the log grows by many entries quickly.
	propose := func(from, to int) {
		t.Helper()
		l := tc.leader(5 * time.Second)
		var wg sync.WaitGroup
		errc := make(chan error, 8)
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := from + w; i < to; i += 8 {
					if _, err := l.Propose(ctx, bindEv(fmt.Sprintf("r-%d", i), "w1")); err != nil {
						errc <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Fatal(err)
		}
	}
	propose(0, 50)

	// Graceful stop; the cluster compacts its log past what the node has,
	// so on restart it must install a snapshot.
	down := tc.index(tc.follower())
	tc.stop(down, false)
	propose(50, 250)
	l := tc.leader(5 * time.Second)
	if err := l.Snapshot(ctx); err != nil && !strings.Contains(err.Error(), "nothing new") {
		t.Fatal(err)
	}
	n := tc.restart(down)
	tc.sync(20 * time.Second)
	assertSameState(t, tc)
	if rs, err := n.Archive().Restores(); err != nil || len(rs) == 0 {
		t.Fatalf("restarted node installed a snapshot but its archive notes no restore: %v, %v", rs, err)
	}

	// Abrupt stop; catch up from the log (or a snapshot, whichever raft picks).
	down = tc.index(tc.follower())
	tc.stop(down, true)
	propose(250, 300)
	tc.restart(down)
	tc.sync(20 * time.Second)
	assertSameState(t, tc)
	if got := tc.node(down).State().Len(); got != 300 {
		t.Fatalf("restarted node holds %d bindings, want 300", got)
	}
}

func assertSameState(t *testing.T, tc *testCluster) {
	t.Helper()
	var ref Status
	for i, n := range tc.running() {
		s := n.Status()
		if i == 0 {
			ref = s
			continue
		}
		if s.StateIndex != ref.StateIndex || s.StateHash != ref.StateHash {
			t.Fatalf("node %s: index %d hash %s; node %s: index %d hash %s", s.ID, s.StateIndex, s.StateHash, ref.ID, ref.StateIndex, ref.StateHash)
		}
	}
}

// rawEntry builds a log entry holding one event of type typ (unknown to
// this build) with a small versioned payload.
func rawEntry(typ byte) []byte {
	b := []byte{1} // envelope version
	b = binary.AppendUvarint(b, 1)
	id := newProposalIDs(1)[0]
	b = append(b, id[:]...)
	ev := []byte{typ, 1, 'x', 'y'}
	b = binary.AppendUvarint(b, uint64(len(ev)))
	return append(b, ev...)
}

func TestUnknownOptionalEventSkippedEverywhere(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, nil)
	ctx := context.Background()
	if _, err := tc.leader(5*time.Second).Propose(ctx, bindEv("before", "w1")); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.leader(5*time.Second).proposeRaw(ctx, rawEntry(0xC1)); err != nil {
		t.Fatal(err)
	}
	// The log goes on.
	if _, err := tc.follower().Propose(ctx, bindEv("after", "w1")); err != nil {
		t.Fatal(err)
	}
	tc.sync(5 * time.Second)
	for _, n := range tc.running() {
		if n.machineForTest().Skipped() != 1 {
			t.Fatalf("node %s skipped %d events, want 1", n.ID(), n.machineForTest().Skipped())
		}
		if n.FatalError() != nil {
			t.Fatalf("node %s halted on an optional event: %v", n.ID(), n.FatalError())
		}
		if n.Status().Skipped != 1 {
			t.Fatalf("node %s Status().Skipped = %d", n.ID(), n.Status().Skipped)
		}
	}
	assertSameState(t, tc)
}

func TestUnknownRequiredEventHaltsAllNodes(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, nil)
	ctx := context.Background()
	if _, err := tc.follower().Propose(ctx, bindEv("before", "w1")); err != nil {
		t.Fatal(err)
	}
	l := tc.leader(5 * time.Second)
	if _, err := l.proposeRaw(ctx, rawEntry(0x41)); err != nil {
		t.Fatal(err)
	}
	for _, n := range tc.running() {
		select {
		case err := <-n.Fatal():
			if !errors.Is(err, ErrHalted) || !strings.Contains(err.Error(), "0x41") || !strings.Contains(err.Error(), "upgrade") {
				t.Fatalf("node %s: fatal error %q does not name the type and the upgrade", n.ID(), err)
			}
			var unknown *fsm.UnknownEventError
			if !errors.As(err, &unknown) || unknown.Type != 0x41 {
				t.Fatalf("node %s: fatal error is not an *fsm.UnknownEventError for 0x41: %v", n.ID(), err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("node %s did not halt", n.ID())
		}
		if _, err := n.Propose(ctx, bindEv("after", "w1")); !errors.Is(err, ErrHalted) {
			t.Fatalf("node %s: propose after halt: %v, want ErrHalted", n.ID(), err)
		}
		// The state stopped before the bad entry.
		if _, ok := n.State().Lookup(fsm.FleetContext, "before"); !ok {
			t.Fatalf("node %s lost the binding applied before the halt", n.ID())
		}
	}
}

func TestForwardingRejectsWrongKey(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, nil)
	target := tc.node(0)

	// A raw client with the wrong key is refused and disconnected.
	conn, err := net.Dial("tcp", target.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte{transport.StreamForward}); err != nil {
		t.Fatal(err)
	}
	rw := bufio.NewReadWriter(bufio.NewReader(conn), bufio.NewWriter(conn))
	err = transport.ClientHandshake(rw, transport.StreamForward, []byte("the-wrong-key-0123456789"), "intruder")
	if !errors.Is(err, transport.ErrAuth) || !strings.Contains(err.Error(), "wrong internal key") {
		t.Fatalf("handshake with a wrong key: %v", err)
	}
	if _, err := rw.ReadByte(); err == nil {
		t.Fatal("connection still open after a refused handshake")
	}

	// A correct key works, and a malformed request gets an error answer
	// rather than a crash.
	good := transport.NewClient("tester", testKey, func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			_, err = c.Write([]byte{transport.StreamForward})
		}
		return c, err
	})
	defer good.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := good.Call(ctx, target.Addr(), transport.OpPropose, []byte{0xff, 0xff, 0xff}); err == nil || !strings.Contains(err.Error(), "bad request") {
		t.Fatalf("malformed propose: %v, want a bad request error", err)
	}
	if _, err := good.Call(ctx, target.Addr(), 99, nil); err == nil || !strings.Contains(err.Error(), "unknown operation") {
		t.Fatalf("unknown op: %v", err)
	}
	s, err := tc.node(1).PeerStatus(ctx, target.Addr())
	if err != nil || s.ID != target.ID() {
		t.Fatalf("PeerStatus: %+v, %v", s, err)
	}

	// A join with the wrong key is refused: Open fails, naming the reason.
	err = tryJoin(t, "mallory", target.Addr(), 10*time.Second, func(c *Config) { c.AuthKey = []byte("the-wrong-key-0123456789") })
	if err == nil || !errors.Is(err, transport.ErrAuth) {
		t.Fatalf("join with a wrong key: %v, want a refused handshake", err)
	}
	for _, n := range tc.running() {
		for _, p := range n.Status().Peers {
			if p.ID == "mallory" {
				t.Fatal("a node with the wrong key became a member")
			}
		}
	}
}

func TestJoinAndRemove(t *testing.T) {
	t.Parallel()
	// Room for a fourth voter: a voter-suffrage node joins as a voter only
	// while the cluster has fewer than Autopilot.Voters.
	tc := newTestCluster(t, 3, func(_ int, c *Config) { c.Autopilot.Voters = 4 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 20 {
		if _, err := tc.node(i%3).Propose(ctx, bindEv(fmt.Sprintf("j-%d", i), "w1")); err != nil {
			t.Fatal(err)
		}
	}
	// Join through a follower: it forwards the request to the leader.
	via := tc.follower().Addr()
	joined := tc.join("n3", func(c *Config) { c.Join, c.Autopilot = []string{via}, AutopilotConfig{Voters: 4} })
	tc.sync(10 * time.Second)
	assertSameState(t, tc)
	voters := 0
	for _, p := range joined.Status().Peers {
		if p.Voter {
			voters++
		}
	}
	if voters != 4 {
		t.Fatalf("after join: %d voters, want 4", voters)
	}
	if _, err := joined.Propose(ctx, bindEv("from-new-node", "w2")); err != nil {
		t.Fatal(err)
	}

	// Remove it, asking a follower (forwarded to the leader).
	var asker *Node
	for _, n := range tc.running() {
		if n != joined && !n.IsLeader() {
			asker = n
			break
		}
	}
	if err := asker.RemoveServer(ctx, "n3"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-joined.Fatal():
		if !errors.Is(err, ErrRemoved) {
			t.Fatalf("removed node reports %v", err)
		}
	case <-ctx.Done():
		t.Fatal("removed node never learned of its removal")
	}
	tc.stop(3, false)
	_, err := tc.g.Start(3) // on its data dir again
	if err == nil || !errors.Is(err, ErrRemoved) || !strings.Contains(err.Error(), "was removed from the cluster at index") || !strings.Contains(err.Error(), "wipe DataDir") {
		t.Fatalf("reopening a removed node: %v", err)
	}
	// The rest go on.
	if _, err := tc.node(0).Propose(ctx, bindEv("after-removal", "w1")); err != nil {
		t.Fatal(err)
	}
}

func TestLeaderChangesAndTransfer(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, nil)
	old := tc.leader(5 * time.Second)
	select {
	case v := <-old.LeaderChanges():
		if !v {
			t.Fatal("leader's first LeaderChanges value is false")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no LeaderChanges signal on the leader")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	target := tc.follower()
	// Ask from the other follower: forwarded to the leader.
	var asker *Node
	for _, n := range tc.running() {
		if n != old && n != target {
			asker = n
		}
	}
	if err := asker.TransferLeadership(ctx, target.ID()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the transfer target to become a ready leader", target.IsLeader)
	select {
	case v := <-target.LeaderChanges():
		if !v {
			t.Fatal("new leader signalled false")
		}
	case <-ctx.Done():
		t.Fatal("new leader never signalled")
	}
	waitFor(t, 5*time.Second, "the old leader to signal false", func() bool {
		select {
		case v := <-old.LeaderChanges():
			return !v
		default:
			return false
		}
	})
	waitFor(t, 5*time.Second, "the asker to learn the new leader", func() bool {
		id, addr := asker.Leader()
		return id == target.ID() && addr == target.Addr()
	})

	// A graceful Close of the leader hands leadership to another voter; the
	// remaining two carry on.
	tc.stop(tc.index(target), false)
	next := tc.leader(10 * time.Second)
	if next == target {
		t.Fatal("closed node still leads")
	}
	if _, err := asker.Propose(ctx, bindEv("after-leader-close", "w1")); err != nil {
		t.Fatal(err)
	}
}

func TestWriteSnapshotMatchesState(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, nil)
	ctx := context.Background()
	evs := make([]fsm.Event, 30)
	for i := range evs {
		evs[i] = bindEv(fmt.Sprintf("s-%d", i), "w1")
	}
	if _, err := tc.follower().ProposeBatch(ctx, evs); err != nil {
		t.Fatal(err)
	}
	tc.sync(5 * time.Second)
	var buf bytes.Buffer
	meta, err := tc.follower().WriteSnapshot(ctx, &buf)
	if err != nil {
		t.Fatal(err)
	}
	st, err := fsm.ReadSnapshot(&buf)
	if err != nil {
		t.Fatal(err)
	}
	h := st.Hash()
	if fmt.Sprintf("%x", h) != meta.Hash || st.Index() != meta.Index || st.Len() != 30 || meta.Term == 0 || meta.Size == 0 {
		t.Fatalf("snapshot meta %+v does not describe the written state (index %d, %d bindings)", meta, st.Index(), st.Len())
	}
	// Restore is leader-only and validates its input before raft sees it.
	if err := tc.follower().Restore(ctx, bytes.NewReader(nil)); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("restore on a follower: %v", err)
	}
	if err := tc.leader(5*time.Second).Restore(ctx, strings.NewReader("not a snapshot")); err == nil || !strings.Contains(err.Error(), "invalid snapshot") {
		t.Fatalf("restore of garbage: %v", err)
	}
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tt := range []struct {
		key string
		cfg Config
	}{
		{"node_id", Config{Settings: Settings{DataDir: dir, BindAddr: "127.0.0.1:0"}, AuthKey: testKey}},
		{"data_dir", Config{Settings: Settings{NodeID: "a", BindAddr: "127.0.0.1:0"}, AuthKey: testKey}},
		{"bind_addr", Config{Settings: Settings{NodeID: "a", DataDir: dir}, AuthKey: testKey}},
		{"auth_key", Config{Settings: Settings{NodeID: "a", DataDir: dir, BindAddr: "127.0.0.1:0"}}},
		{"auth_key", Config{Settings: Settings{NodeID: "a", DataDir: dir, BindAddr: "127.0.0.1:0"}, AuthKey: []byte("short")}},
		{"peers", Config{Settings: Settings{NodeID: "a", DataDir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true, Peers: []Peer{{ID: "b", Addr: "x:1"}}}, AuthKey: testKey}},
		{"raft.leader_lease_timeout", Config{Settings: Settings{NodeID: "a", DataDir: dir, BindAddr: "127.0.0.1:0", Raft: RaftTiming{HeartbeatTimeout: time.Second, LeaderLeaseTimeout: 2 * time.Second}}, AuthKey: testKey}},
		{"compat_feature_level", Config{Settings: Settings{NodeID: "a", DataDir: dir, BindAddr: "127.0.0.1:0", FeatureLevel: fsm.FeatureLevelMax + 1}, AuthKey: testKey}},
		{"advertise_addr", Config{Settings: Settings{NodeID: "a", DataDir: dir, BindAddr: "0.0.0.0:0"}, AuthKey: testKey}},
		{"advertise_addr", Config{Settings: Settings{NodeID: "a", DataDir: dir, BindAddr: "127.0.0.1:0", AdvertiseAddr: "0.0.0.0:7400"}, AuthKey: testKey}},
		{"raft.max_append_entries", Config{Settings: Settings{NodeID: "a", DataDir: dir, BindAddr: "127.0.0.1:0", Raft: RaftTiming{MaxAppendEntries: 2000}}, AuthKey: testKey}},
	} {
		_, err := Open(context.Background(), tt.cfg)
		if err == nil || !strings.Contains(err.Error(), "cluster: config "+tt.key+": ") {
			t.Errorf("config missing/bad %s: error %v does not name it", tt.key, err)
		}
	}
}

func TestRemovedWhileDownLearnsOnRestart(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	down := tc.index(tc.follower())
	id := tc.node(down).ID()
	tc.stop(down, false)
	if err := tc.leader(5*time.Second).RemoveServer(ctx, id); err != nil {
		t.Fatal(err)
	}
	n := tc.restart(down)
	select {
	case err := <-n.Fatal():
		if !errors.Is(err, ErrRemoved) {
			t.Fatalf("restarted removed node reports %v", err)
		}
	case <-ctx.Done():
		t.Fatal("a node removed while down did not learn it on restart")
	}
	tc.stop(down, false)
	cfg := tc.cfgs[down]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = ln
	if _, err := Open(ctx, cfg); !errors.Is(err, ErrRemoved) {
		t.Fatalf("reopening: %v, want ErrRemoved", err)
	}
}

// The archive is written just after apply; a node that dies with records
// still queued gets them back on restart, because raft replays every entry
// after the last snapshot and a snapshot is only persisted once the archive
// holds it.
func TestArchiveCompleteAfterKill(t *testing.T) {
	t.Parallel()
	// No snapshot is taken, so none can be installed: the archive must then
	// hold every entry, and a restore is a failure, not a skip.
	tc := newTestCluster(t, 3, func(_ int, c *Config) {
		c.SnapshotThreshold, c.TrailingLogs, c.SnapshotInterval = 1<<30, 1<<30, time.Hour
	})
	victim := tc.index(tc.follower())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				if _, err := tc.node(victim).Propose(ctx, bindEv(fmt.Sprintf("a-%d-%d", w, i), "w1")); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// Killed right after its own proposals returned: the archiver's linger
	// makes unwritten records likely.
	applied := tc.node(victim).State().Index()
	tc.stop(victim, true)
	ro, err := archive.Open(filepath.Join(tc.cfgs[victim].DataDir, archiveFile), archive.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	last, _ := ro.LastIndex()
	ro.Close()
	t.Logf("at the kill: applied index %d, archive last index %d", applied, last)
	n := tc.restart(victim)
	tc.sync(20 * time.Second)
	if err := n.WaitArchived(ctx, n.State().Index()); err != nil {
		t.Fatal(err)
	}
	if rs, _ := n.Archive().Restores(); len(rs) != 0 {
		t.Fatalf("the node installed a snapshot (%v) although no member may take one", rs)
	}
	m := replayArchive(t, n.Archive())
	if m.State().Hash() != n.State().Hash() || m.State().Len() != 80 {
		t.Fatalf("archive replay: %d bindings, hash match %v; want the live state (80 bindings)", m.State().Len(), m.State().Hash() == n.State().Hash())
	}
}

// A node removed while nothing the others send reaches it never gets the
// leader's notice (op 6) nor the configuration without itself: it would
// campaign forever, refused by pre-vote. Once it has had no leader for a
// while it asks the members (its own requests get through), learns it was
// removed, records the tombstone and halts.
func TestRemovedWhileCutOffLearnsIt(t *testing.T) {
	t.Parallel()
	fnet := faultnet.New(1)
	tc := newTestCluster(t, 3, func(i int, c *Config) {
		fnet.Register(c.NodeID, c.BindAddr)
		c.Dial = fnet.Dialer(c.NodeID)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leader := tc.leader(10 * time.Second)
	victim := tc.follower()
	// Every connection the others open to the victim is reset on its
	// first write: Raft (the leader's last replication of the removal
	// included) and the removal notice fail at once.
	for _, n := range tc.running() {
		if n != victim {
			fnet.SetResetRate(n.ID(), victim.ID(), 1)
		}
	}
	if err := leader.RemoveServer(ctx, victim.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-victim.Fatal():
		if !errors.Is(err, ErrRemoved) {
			t.Fatalf("removed node reports %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("a node removed while cut off did not learn it (state %s)", victim.Status().RaftState)
	}
	if _, err := os.Stat(filepath.Join(tc.cfgs[tc.index(victim)].DataDir, tombstoneFile)); err != nil {
		t.Fatalf("no tombstone: %v", err)
	}
	if _, err := leader.Propose(ctx, bindEv("after-removal", "w1")); err != nil {
		t.Fatalf("the remaining members stopped serving: %v", err)
	}
}

// ValidateConfig only reads: defaults are WithDefaults' (1 s heartbeat,
// election and propose timeout; last contact twice the heartbeat), and a
// config with them validates as it is.
func TestValidateConfigDoesNotChangeTheConfig(t *testing.T) {
	t.Parallel()
	c := Config{Settings: Settings{NodeID: "a", DataDir: "d", BindAddr: "127.0.0.1:0"}, AuthKey: testKey}
	if err := ValidateConfig(c); err == nil {
		t.Fatal("a config without its defaults (zero Raft timing) validated")
	}
	d := c.WithDefaults()
	if err := ValidateConfig(d); err != nil {
		t.Fatal(err)
	}
	// The shipped timing: a 1 s heartbeat, the election and the lease
	// following it, the last-contact threshold twice it.
	if d.ProposeTimeout != d.Raft.ElectionTimeout || d.Raft.HeartbeatTimeout != time.Second || d.Raft.ElectionTimeout != time.Second ||
		d.Autopilot.LastContactThreshold != 2*time.Second {
		t.Fatalf("defaults: %+v", d.Settings)
	}
	errs := ConfigErrors(ValidateConfig(Config{}.WithDefaults()))
	keys := map[string]bool{}
	for _, e := range errs {
		keys[e.Key] = true
	}
	if !keys["node_id"] || !keys["data_dir"] || !keys["bind_addr"] || !keys["auth_key"] || len(errs) != 4 {
		t.Fatalf("errors of an empty config: %v", errs)
	}
}
