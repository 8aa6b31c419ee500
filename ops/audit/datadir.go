// Package audit reads a COPY of an edge's data directory offline — the bbolt
// event archive (cluster/archive), the Raft log (raft.db) and the file
// snapshots — and answers questions about the affinity log without touching
// a live node: replay the log into a throwaway fsm.Machine (state hash,
// summary), explain one routing key's history, verify a replay against a
// live edge, and export events as NDJSON. Nomad's offline FSM helper is the
// model: open everything read-only, rebuild the state from the durable
// record, compare. See DESIGN.md.
package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/cluster/boltfile"
	"github.com/tether-project/tether/fsm"
)

// File names inside an edge data directory (cluster.Config.DataDir).
const (
	ArchiveFile  = "archive.db"
	RaftLogFile  = "raft.db"
	SnapshotsDir = "snapshots"
)

// snapshotStorePath is where hashicorp/raft's FileSnapshotStore keeps its
// snapshots when the node gives it DataDir/snapshots as its base: the store
// adds a "snapshots" directory of its own.
func snapshotStorePath(dataDir string) string {
	return filepath.Join(dataDir, SnapshotsDir, "snapshots")
}

// DefaultLockTimeout bounds waiting for a bbolt file lock. A live node holds
// its files exclusively; audit never waits long for one.
const DefaultLockTimeout = time.Second

// Options configure Open.
type Options struct {
	// LockTimeout bounds waiting for each file's lock (default 1s).
	LockTimeout time.Duration
	// NoRaftLog skips raft.db even when present (the archive and snapshots
	// are then the only sources).
	NoRaftLog bool
}

// ErrLocked is returned (wrapped) when a file of the data directory is
// locked by a running node.
var ErrLocked = errors.New("locked by a running node: copy the data directory first and audit the copy")

// DataDir is an edge data directory opened read-only for audit.
type DataDir struct {
	dir       string
	archive   *archive.Archive
	raftLog   *raftboltdb.BoltStore // nil when absent or skipped
	snapshots []Snapshot            // oldest first
}

// Open opens dir read-only: archive.db (required), raft.db (optional) and
// the snapshot store's metadata. It never blocks a live node: bbolt files
// are opened with a shared lock and a short timeout, and a locked file is an
// error that says to copy the directory first.
func Open(dir string, opts Options) (*DataDir, error) {
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = DefaultLockTimeout
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("audit: data dir: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("audit: data dir %s is not a directory", dir)
	}
	archivePath := filepath.Join(dir, ArchiveFile)
	if _, err := os.Stat(archivePath); err != nil {
		return nil, fmt.Errorf("audit: %s has no %s (is it an edge's cluster.data_dir?): %w", dir, ArchiveFile, err)
	}
	d := &DataDir{dir: dir}
	d.archive, err = archive.Open(archivePath, archive.Options{ReadOnly: true, Timeout: opts.LockTimeout})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("audit: %s is %w (waited %s)", archivePath, ErrLocked, opts.LockTimeout)
		}
		return nil, fmt.Errorf("audit: %w", err)
	}
	raftPath := filepath.Join(dir, RaftLogFile)
	if _, statErr := os.Stat(raftPath); statErr == nil && !opts.NoRaftLog {
		d.raftLog, err = openRaftLog(raftPath, opts.LockTimeout)
		if err != nil {
			d.archive.Close()
			return nil, err
		}
	}
	d.snapshots, err = listSnapshots(snapshotStorePath(dir))
	if err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// openRaftLog opens raft.db read-only (raft-boltdb creates no buckets
// then), behind boltfile's check and panic recovery.
func openRaftLog(path string, timeout time.Duration) (*raftboltdb.BoltStore, error) {
	s, err := boltfile.Open(path, func(openFile boltfile.OpenFileFunc) (*raftboltdb.BoltStore, error) {
		return raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bolt.Options{ReadOnly: true, Timeout: timeout, OpenFile: openFile}})
	})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("audit: %s is %w (waited %s)", path, ErrLocked, timeout)
		}
		return nil, fmt.Errorf("audit: open %s: %w", path, err)
	}
	return s, nil
}

// Close closes the files. Idempotent.
func (d *DataDir) Close() error {
	var errs []error
	if d.archive != nil {
		errs = append(errs, d.archive.Close())
	}
	if d.raftLog != nil {
		if err := d.raftLog.Close(); err != nil {
			errs = append(errs, fmt.Errorf("audit: close %s: %w", RaftLogFile, err))
		}
		d.raftLog = nil
	}
	return errors.Join(errs...)
}

// Dir is the data directory.
func (d *DataDir) Dir() string { return d.dir }

// Archive is the read-only archive.
func (d *DataDir) Archive() *archive.Archive { return d.archive }

// Snapshots are the snapshot store's snapshots, oldest first.
func (d *DataDir) Snapshots() []Snapshot { return append([]Snapshot(nil), d.snapshots...) }

// Bounds describes what the data directory holds.
type Bounds struct {
	ArchiveFirst, ArchiveLast uint64 // stored record indexes (0 when empty)
	ArchiveEvents             uint64 // events (proposals) held
	// TrimmedFrom..TrimmedTo were removed by retention (both 0 if never).
	TrimmedFrom, TrimmedTo uint64
	// Restores are snapshot state indexes this node restored from after it
	// started (installed from a peer, or an operator restore): the archive
	// may lack entries before them.
	Restores []uint64
	// RaftFirst..RaftLast is raft.db's log (0, 0 when absent or empty).
	RaftFirst, RaftLast uint64
	Snapshots           []Snapshot
}

// Bounds reads the archive's and the Raft log's extent.
func (d *DataDir) Bounds() (Bounds, error) {
	var b Bounds
	var err error
	if b.ArchiveFirst, err = d.archive.FirstIndex(); err != nil {
		return b, err
	}
	if b.ArchiveLast, err = d.archive.LastIndex(); err != nil {
		return b, err
	}
	if b.ArchiveEvents, err = d.archive.Events(); err != nil {
		return b, err
	}
	if b.TrimmedFrom, b.TrimmedTo, err = d.archive.Trimmed(); err != nil {
		return b, err
	}
	if b.Restores, err = d.archive.Restores(); err != nil {
		return b, err
	}
	if d.raftLog != nil {
		if b.RaftFirst, err = d.raftLog.FirstIndex(); err != nil {
			return b, fmt.Errorf("audit: %s first index: %w", RaftLogFile, err)
		}
		if b.RaftLast, err = d.raftLog.LastIndex(); err != nil {
			return b, fmt.Errorf("audit: %s last index: %w", RaftLogFile, err)
		}
	}
	b.Snapshots = d.Snapshots()
	return b, nil
}

// raftEntries calls fn with the command entries of raft.db in [from, to]
// (which must be within its log), in order.
func (d *DataDir) raftEntries(from, to uint64, fn func(fsm.Entry) error) error {
	if d.raftLog == nil {
		return fmt.Errorf("audit: no %s to read entries %d..%d from", RaftLogFile, from, to)
	}
	var l raft.Log
	for i := from; i <= to && i != 0; i++ {
		if err := d.raftLog.GetLog(i, &l); err != nil {
			return fmt.Errorf("audit: %s entry %d: %w", RaftLogFile, i, err)
		}
		if l.Type != raft.LogCommand {
			continue
		}
		var t int64
		if !l.AppendedAt.IsZero() {
			t = l.AppendedAt.UnixNano()
		}
		if err := fn(fsm.Entry{Index: l.Index, Time: t, Data: append([]byte(nil), l.Data...)}); err != nil {
			return err
		}
	}
	return nil
}
