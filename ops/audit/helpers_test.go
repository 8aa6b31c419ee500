package audit

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// logBuilder writes a data directory the way a node does: every entry is
// applied to a real fsm.Machine (its results become the archived outcomes)
// and kept for the archive (archive.Append) and the Raft log (raft-boltdb);
// snapshots go through hashicorp/raft's own FileSnapshotStore.
type logBuilder struct {
	t       testing.TB
	dir     string
	m       *fsm.Machine
	index   uint64
	time    time.Time
	records []archive.Record
	logs    []*raft.Log
	nextID  uint64
}

func newLogBuilder(t testing.TB) *logBuilder {
	t.Helper()
	return &logBuilder{t: t, dir: t.TempDir(), m: fsm.NewMachine(), time: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}
}

// config appends a Raft configuration entry (no fsm entry): indexes of the
// archive have gaps where the log holds those, as on a real node.
func (lb *logBuilder) config() {
	lb.index++
	lb.logs = append(lb.logs, &raft.Log{Index: lb.index, Term: 1, Type: raft.LogConfiguration, Data: []byte{0}, AppendedAt: lb.time})
}

// entry appends one command entry holding evs (with fresh proposal ids),
// applies it and returns its index and results.
func (lb *logBuilder) entry(evs ...fsm.Event) (uint64, []fsm.Result) {
	lb.t.Helper()
	props := make([]fsm.Proposal, len(evs))
	for i, ev := range evs {
		lb.nextID++
		var id fsm.ProposalID
		copy(id[:], fmt.Sprintf("p%015d", lb.nextID))
		props[i] = fsm.Proposal{ID: id, Event: ev}
	}
	data, err := fsm.EncodeEntry(props)
	if err != nil {
		lb.t.Fatal(err)
	}
	return lb.raw(data)
}

func (lb *logBuilder) raw(data []byte) (uint64, []fsm.Result) {
	lb.t.Helper()
	lb.index++
	lb.time = lb.time.Add(time.Second)
	e := fsm.Entry{Index: lb.index, Time: lb.time.UnixNano(), Data: data}
	rs, err := lb.m.Apply(e)
	if err != nil {
		lb.t.Fatalf("apply entry %d: %v", lb.index, err)
	}
	lb.records = append(lb.records, archive.Record{Index: e.Index, Time: e.Time, Data: data, Outcomes: archive.OutcomesFromResults(rs)})
	lb.logs = append(lb.logs, &raft.Log{Index: lb.index, Term: 1, Type: raft.LogCommand, Data: data, AppendedAt: lb.time})
	return lb.index, rs
}

// snapshot writes the current state to DataDir/snapshots with raft's store.
func (lb *logBuilder) snapshot() {
	lb.t.Helper()
	store, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(lb.dir, SnapshotsDir), 3, hclog.NewNullLogger())
	if err != nil {
		lb.t.Fatal(err)
	}
	_, trans := raft.NewInmemTransport("edge-1:7400")
	defer trans.Close()
	cfg := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "edge-1", Address: "edge-1:7400"}}}
	sink, err := store.Create(raft.SnapshotVersionMax, lb.index, 1, cfg, 1, trans)
	if err != nil {
		lb.t.Fatal(err)
	}
	if err := lb.m.State().WriteSnapshot(sink); err != nil {
		sink.Cancel()
		lb.t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		lb.t.Fatal(err)
	}
}

// writeArchive appends every record to DataDir/archive.db (retention per
// opts, applied by an explicit Trim).
func (lb *logBuilder) writeArchive(opts archive.Options, from uint64) {
	lb.t.Helper()
	opts.NoSync = true
	a, err := archive.Open(filepath.Join(lb.dir, ArchiveFile), opts)
	if err != nil {
		lb.t.Fatal(err)
	}
	defer a.Close()
	var recs []archive.Record
	for _, r := range lb.records {
		if r.Index >= from {
			recs = append(recs, r)
		}
	}
	for len(recs) > 0 {
		n := min(len(recs), 1000)
		if err := a.Append(recs[:n]); err != nil {
			lb.t.Fatal(err)
		}
		recs = recs[n:]
	}
	if opts.MaxEvents > 0 || opts.MaxAge > 0 {
		if _, err := a.Trim(context.Background()); err != nil {
			lb.t.Fatal(err)
		}
	}
}

// writeRaftLog stores the log entries with index ≥ from in DataDir/raft.db.
func (lb *logBuilder) writeRaftLog(from uint64) {
	lb.t.Helper()
	s, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(lb.dir, RaftLogFile), NoSync: true})
	if err != nil {
		lb.t.Fatal(err)
	}
	defer s.Close()
	var logs []*raft.Log
	for _, l := range lb.logs {
		if l.Index >= from {
			logs = append(logs, l)
		}
	}
	if err := s.StoreLogs(logs); err != nil {
		lb.t.Fatal(err)
	}
}

func (lb *logBuilder) open() *DataDir {
	lb.t.Helper()
	d, err := Open(lb.dir, Options{})
	if err != nil {
		lb.t.Fatal(err)
	}
	lb.t.Cleanup(func() { d.Close() })
	return d
}

func decision(edge string, cands ...string) fsm.Decision {
	d := fsm.Decision{Edge: edge, Policy: "kv_aware", RequestID: edge + "-req"}
	for i, c := range cands {
		d.Candidates = append(d.Candidates, fsm.Candidate{Instance: c, Score: float64(10 - i), CachedTokens: uint32(100 * (len(cands) - i)), LoadTokens: uint32(7 * i)})
	}
	return d
}

// workload appends a small agentic history: instances, parents and
// sub-agents, touches, an overflow with rebind, a TTL eviction and an
// instance going down.
func (lb *logBuilder) workload(conversations int) {
	lb.entry(fsm.NodeInfo{NodeID: "edge-1", Version: "v1", MaxFeatureLevel: 1}, fsm.ClusterFeatures{Level: 1})
	lb.config()
	lb.entry(
		fsm.InstanceState{Instance: "ctx-1", Fleet: fsm.FleetContext, URL: "http://ctx-1", Status: fsm.InstanceUp, Version: "v1", FeatureLevel: 1, Ranks: 4},
		fsm.InstanceState{Instance: "ctx-2", Fleet: fsm.FleetContext, URL: "http://ctx-2", Status: fsm.InstanceUp, Version: "v1", FeatureLevel: 1, Ranks: 4},
		fsm.InstanceState{Instance: "gen-1", Fleet: fsm.FleetGeneration, URL: "http://gen-1", Status: fsm.InstanceUp, Version: "v1", FeatureLevel: 1, Ranks: 4},
	)
	for i := range conversations {
		key := fmt.Sprintf("conv-%d", i)
		inst := []string{"ctx-1", "ctx-2"}[i%2]
		lb.entry(
			fsm.Bind{Fleet: fsm.FleetContext, Key: key, ConversationID: key, Instance: inst, Decision: decision("edge-1", inst, "ctx-x")},
			fsm.Bind{Fleet: fsm.FleetGeneration, Key: key, ConversationID: key, Instance: "gen-1", Decision: decision("edge-2", "gen-1")},
		)
		if i%3 == 0 {
			lb.entry(fsm.Touch{Keys: []fsm.FleetKey{{Fleet: fsm.FleetContext, Key: key}}})
		}
	}
}
