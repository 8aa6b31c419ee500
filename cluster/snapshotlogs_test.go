package cluster

import (
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// discardFSM is a state machine with nothing in it: the test below is
// about raft's log check, not the affinity state.
type discardFSM struct{}

func (discardFSM) Apply(*raft.Log) any                 { return nil }
func (discardFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("not used") }
func (discardFSM) Restore(rc io.ReadCloser) error {
	_, err := io.Copy(io.Discard, rc)
	return errors.Join(err, rc.Close())
}

// followerAfterSnapshotInstall lays out the disk of a follower that
// installed a snapshot ending at index 60 (term 2) and then stored entry 61:
// the log holds 61 only.
func followerAfterSnapshotInstall(t *testing.T, conf raft.Configuration, trans raft.Transport) (raft.LogStore, raft.StableStore, *raft.FileSnapshotStore) {
	t.Helper()
	dir := t.TempDir()
	store, err := openRaftStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	snaps, err := raft.NewFileSnapshotStore(dir, 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := snaps.Create(1, 60, 2, conf, 1, trans)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Write([]byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if err := store.StoreLog(&raft.Log{Index: 61, Term: 2, Type: raft.LogCommand, Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := store.SetUint64([]byte("CurrentTerm"), 2); err != nil {
		t.Fatal(err)
	}
	return store, store, snaps
}

// A leader that just sent snapshot 60 probes at index 60. With raft's own
// check the follower fails to read entry 60 and rejects, which sends the
// leader back to the same snapshot forever; with snapshotTermLogs it
// accepts and catches up.
func TestFollowerAcceptsProbeAtItsSnapshotIndex(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shim   bool
		accept bool
	}{{"raft's log store", false, false}, {"snapshotTermLogs", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			leaderAddr, leaderTrans := raft.NewInmemTransport("leader")
			followerAddr, followerTrans := raft.NewInmemTransport("follower")
			leaderTrans.Connect(followerAddr, followerTrans)
			followerTrans.Connect(leaderAddr, leaderTrans)
			conf := raft.Configuration{Servers: []raft.Server{
				{Suffrage: raft.Voter, ID: "leader", Address: leaderAddr},
				{Suffrage: raft.Voter, ID: "follower", Address: followerAddr},
			}}
			logs, stable, snaps := followerAfterSnapshotInstall(t, conf, followerTrans)
			if tc.shim {
				logs = snapshotTermLogs{LogStore: logs, snaps: snaps}
			}
			rc := raft.DefaultConfig()
			rc.LocalID = "follower"
			rc.HeartbeatTimeout = time.Hour // stay a follower for the probe
			rc.ElectionTimeout = time.Hour
			rc.LeaderLeaseTimeout = time.Hour
			rc.LogOutput = io.Discard
			r, err := raft.NewRaft(rc, discardFSM{}, logs, stable, snaps, followerTrans)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Shutdown().Error() })

			req := raft.AppendEntriesRequest{
				RPCHeader:    raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("leader"), Addr: []byte(leaderAddr)},
				Term:         2,
				PrevLogEntry: 60, PrevLogTerm: 2,
				Entries:           []*raft.Log{{Index: 61, Term: 2, Type: raft.LogCommand, Data: []byte("x")}, {Index: 62, Term: 2, Type: raft.LogNoop}},
				LeaderCommitIndex: 62,
			}
			var resp raft.AppendEntriesResponse
			if err := leaderTrans.AppendEntries("follower", followerAddr, &req, &resp); err != nil {
				t.Fatal(err)
			}
			if resp.Success != tc.accept {
				t.Fatalf("AppendEntries after index 60: success %v, want %v (follower's last log %d); if raft's own store now accepts, raft checks the snapshot itself and snapshotTermLogs can go", resp.Success, tc.accept, resp.LastLog)
			}
			if tc.accept && r.LastIndex() != 62 {
				t.Fatalf("follower's last index %d after accepting entries up to 62", r.LastIndex())
			}
		})
	}
}

func TestSnapshotTermLogsAnswersOnlyTheNewestSnapshotBelowTheLog(t *testing.T) {
	_, trans := raft.NewInmemTransport("follower")
	logs, _, snaps := followerAfterSnapshotInstall(t, raft.Configuration{}, trans)
	shim := snapshotTermLogs{LogStore: logs, snaps: snaps}
	var l raft.Log
	if err := shim.GetLog(60, &l); err != nil || l.Term != 2 || l.Type != raft.LogNoop || l.Data != nil {
		t.Fatalf("entry at the snapshot's index: %+v, %v", l, err)
	}
	if err := shim.GetLog(61, &l); err != nil || l.Type != raft.LogCommand {
		t.Fatalf("entry in the log: %+v, %v", l, err)
	}
	for _, idx := range []uint64{59, 62} {
		if err := shim.GetLog(idx, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("entry %d: %v, want ErrLogNotFound", idx, err)
		}
	}
	// A newer snapshot takes over; the older one's index is no longer answered.
	sink, err := snaps.Create(1, 70, 3, raft.Configuration{}, 1, trans)
	if err != nil {
		t.Fatal(err)
	}
	sink.Write([]byte("state"))
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if err := shim.GetLog(60, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("entry 60 once snapshot 70 exists: %v, want ErrLogNotFound", err)
	}
}
