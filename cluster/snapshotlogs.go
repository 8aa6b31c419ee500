package cluster

import (
	"errors"

	"github.com/hashicorp/raft"
)

// snapshotTermLogs is raft's log store with one answer added: the entry at
// the index the newest snapshot ends at, when the log no longer holds it,
// is reported with the snapshot's term (a no-op entry with no data).
//
// Why: hashicorp/raft v1.7.3's follower checks an AppendEntries' previous
// entry by reading it from the log unless it is the follower's last entry;
// it does not consult the snapshot as the Raft paper does (lastIncludedTerm).
// A follower that installed a snapshot at S and then stored S+1 holds log
// {S+1..}; when the leader probes at S (its next index after sending that
// snapshot), the read fails, the leader walks back, finds its own log
// compacted and sends snapshot S again, forever. The cluster test that
// kills a node right after it caught up hit this about once in 30 runs
// (applied index stuck, "failed to get previous log: previous-index=60
// last-index=61" on every round).
//
// The answer is true: a snapshot covers only committed entries, so the
// entry at its last index has its term. It is given only for the newest
// snapshot and only below the log's first index, so it never fills a hole
// inside the log, and a leader never ships it as an entry: to send entry S
// it must first read S-1, which is neither in the log nor the newest
// snapshot's last index, so it sends the snapshot instead.
type snapshotTermLogs struct {
	raft.LogStore
	snaps raft.SnapshotStore
}

func (s snapshotTermLogs) GetLog(index uint64, l *raft.Log) error {
	err := s.LogStore.GetLog(index, l)
	if !errors.Is(err, raft.ErrLogNotFound) {
		return err
	}
	first, ferr := s.FirstIndex()
	if ferr != nil || index >= first {
		return err
	}
	metas, lerr := s.snaps.List()
	if lerr != nil || len(metas) == 0 || metas[0].Index != index {
		return err
	}
	*l = raft.Log{Index: index, Term: metas[0].Term, Type: raft.LogNoop}
	return nil
}
