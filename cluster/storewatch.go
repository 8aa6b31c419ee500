package cluster

import (
	"sync"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// storeWatch is raft.db as Raft writes it (log and stable store), noting
// whether each write succeeded. A follower whose disk is full or failing
// cannot append what its leader sends: raft answers the leader "failed"
// and tries again, the node's state stops advancing, and nothing else in
// the node says so. StorageError does.
type storeWatch struct {
	*raftboltdb.BoltStore
	now    func() time.Time
	errors prometheus.Counter // nil without a registerer

	mu           sync.Mutex
	failingSince time.Time // first failed write since the last success (zero: the last write succeeded)
	lastErr      error
}

func newStoreWatch(s *raftboltdb.BoltStore, reg prometheus.Registerer, nodeID string) *storeWatch {
	w := &storeWatch{BoltStore: s, now: time.Now}
	if reg != nil {
		c := prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "tether_cluster_storage_write_errors_total",
			Help:        "Writes to raft.db (log entries, term and vote) that failed: a full or failing disk.",
			ConstLabels: prometheus.Labels{"node": nodeID},
		})
		if err := reg.Register(c); err == nil {
			w.errors = c
		}
	}
	return w
}

func (w *storeWatch) note(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		w.failingSince, w.lastErr = time.Time{}, nil
		return
	}
	if w.failingSince.IsZero() {
		w.failingSince = w.now()
	}
	w.lastErr = err
	if w.errors != nil {
		w.errors.Inc()
	}
}

// failing returns the last write error and when the current run of
// failures began; nil when the last write succeeded.
func (w *storeWatch) failing() (error, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr, w.failingSince
}

func (w *storeWatch) StoreLog(l *raft.Log) error {
	err := w.BoltStore.StoreLog(l)
	w.note(err)
	return err
}

func (w *storeWatch) StoreLogs(logs []*raft.Log) error {
	err := w.BoltStore.StoreLogs(logs)
	w.note(err)
	return err
}

func (w *storeWatch) DeleteRange(lo, hi uint64) error {
	err := w.BoltStore.DeleteRange(lo, hi)
	w.note(err)
	return err
}

func (w *storeWatch) Set(k, v []byte) error {
	err := w.BoltStore.Set(k, v)
	w.note(err)
	return err
}

func (w *storeWatch) SetUint64(k []byte, v uint64) error {
	err := w.BoltStore.SetUint64(k, v)
	w.note(err)
	return err
}

// StorageError is the error of this node's last write to raft.db and when
// its writes began failing, or nil when the last write succeeded. A
// follower that cannot write falls behind its leader while everything
// else looks healthy; the edge turns a persistent failure into "not
// ready".
func (n *Node) StorageError() (error, time.Time) {
	if n.storeWatch == nil {
		return nil, time.Time{}
	}
	return n.storeWatch.failing()
}
