package ops

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/ops/audit"
)

// Archive retention trims the oldest events while the node snapshots and
// compacts its Raft log: a replay of the data dir then starts from the
// newest snapshot, replays the remaining archive after it, reproduces the
// node's state hash and says which range was trimmed.
func TestReplayAfterArchiveRetention(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, err := cluster.Open(ctx, cluster.Config{
		Settings:          cluster.Settings{NodeID: "edge-1", DataDir: dir, Bootstrap: true, Peers: []cluster.Peer{{ID: "edge-1", Addr: addr}}, ProposeTimeout: 2 * time.Second, Raft: cluster.RaftTiming{HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, LeaderLeaseTimeout: 50 * time.Millisecond}, Archive: cluster.ArchiveOptions{MaxEvents: 150}},
		Listener:          ln,
		AuthKey:           []byte(internalKey),
		SnapshotThreshold: 40,
		SnapshotInterval:  20 * time.Millisecond,
		TrailingLogs:      5,
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			node.Close(context.Background())
		}
	}()
	waitFor(t, 10*time.Second, "leadership", func() string {
		if !node.IsLeader() {
			return "not leader"
		}
		return ""
	})
	propose := func(evs ...fsm.Event) {
		t.Helper()
		if _, err := node.ProposeBatch(ctx, evs); err != nil {
			t.Fatal(err)
		}
	}
	propose(fsm.InstanceState{Instance: "ctx-1", Fleet: fsm.FleetContext, URL: "http://ctx-1", Status: fsm.InstanceUp},
		fsm.InstanceState{Instance: "ctx-2", Fleet: fsm.FleetContext, URL: "http://ctx-2", Status: fsm.InstanceUp})
	snapshotsDir := filepath.Join(dir, "snapshots", "snapshots")
	for i := 0; ; i++ {
		key := fmt.Sprintf("conv-%d", i%120)
		propose(fsm.Bind{Fleet: fsm.FleetContext, Key: key, ConversationID: key, Instance: []string{"ctx-1", "ctx-2"}[i%2],
			Decision: fsm.Decision{Edge: "edge-1", Policy: "kv_aware"}},
			fsm.Touch{Keys: []fsm.FleetKey{{Fleet: fsm.FleetContext, Key: fmt.Sprintf("conv-%d", (i+7)%120)}}})
		_, trimmedTo, err := node.Archive().Trimmed()
		if err != nil {
			t.Fatal(err)
		}
		snaps, _ := os.ReadDir(snapshotsDir)
		if i >= 200 && trimmedTo > 50 && len(snaps) > 0 {
			break
		}
		if i > 3000 {
			t.Fatalf("after %d proposals: archive trimmed to %d, %d snapshots", i, trimmedTo, len(snaps))
		}
	}
	// A node going down evicts its bindings: an effect the replay must
	// reproduce from the archive after the snapshot.
	propose(fsm.InstanceState{Instance: "ctx-2", Fleet: fsm.FleetContext, Status: fsm.InstanceDown})
	want := node.State()
	if err := node.WaitArchived(ctx, want.Index()); err != nil {
		t.Fatal(err)
	}
	if err := node.Close(ctx); err != nil {
		t.Fatal(err)
	}
	closed = true

	copyDst := filepath.Join(t.TempDir(), "copy")
	copyDir(t, dir, copyDst)
	d, err := audit.Open(copyDst, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	b, err := d.Bounds()
	if err != nil {
		t.Fatal(err)
	}
	if b.TrimmedTo == 0 || b.RaftFirst <= 1 {
		t.Fatalf("the scenario needs a trimmed archive and a compacted raft log: %+v", b)
	}
	res, err := d.Replay(context.Background(), audit.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Index != want.Index() || res.Hash != want.Hash() {
		t.Fatalf("replay: index %d hash %x; the node: index %d hash %x", res.Index, res.Hash, want.Index(), want.Hash())
	}
	if res.Start.Snapshot == nil || res.Start.Snapshot.Index < b.TrimmedTo && res.FromRaftLog == 0 {
		t.Fatalf("replay started from %s with %d raft.db entries; the archive is trimmed to %d", res.Start, res.FromRaftLog, b.TrimmedTo)
	}
	notes := strings.Join(res.Notes, "\n")
	if want := fmt.Sprintf("trimmed indexes %d..%d", b.TrimmedFrom, b.TrimmedTo); !strings.Contains(notes, want) {
		t.Fatalf("notes lack %q:\n%s", want, notes)
	}
	if res.MismatchCount != 0 {
		t.Fatalf("outcome mismatches: %v", res.Mismatches)
	}
	if got := audit.Summarize(res.State).Evictions["instance_removed"]; got == 0 {
		t.Fatal("the replay lost ctx-2's evictions")
	}
	t.Logf("trimmed %d..%d; replayed from %s: %d archive entries, %d raft.db entries", b.TrimmedFrom, b.TrimmedTo, res.Start, res.FromArchive, res.FromRaftLog)
}
