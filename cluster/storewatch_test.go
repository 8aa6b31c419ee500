package cluster

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// storeWatch reports a run of failed raft.db writes from its first failure
// until a write succeeds again.
func TestStoreWatchReportsFailingWrites(t *testing.T) {
	store, err := openRaftStore(filepath.Join(t.TempDir(), "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	w := newStoreWatch(store, reg, "n0")
	clock := time.Unix(100, 0)
	w.now = func() time.Time { return clock }
	if err := w.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if err, _ := w.failing(); err != nil {
		t.Fatalf("after a good write: %v", err)
	}
	// A closed database fails every write, as a full disk does.
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.StoreLogs([]*raft.Log{{Index: 2, Term: 1, Type: raft.LogCommand}}); err == nil {
		t.Fatal("a write to a closed raft.db succeeded")
	}
	first := clock
	clock = clock.Add(3 * time.Second)
	if err := w.SetUint64([]byte("CurrentTerm"), 2); err == nil {
		t.Fatal("a write to a closed raft.db succeeded")
	}
	err, since := w.failing()
	if err == nil || !since.Equal(first) {
		t.Fatalf("failing %v since %s, want an error since %s", err, since, first)
	}
	w.note(nil)
	if err, _ := w.failing(); err != nil {
		t.Fatalf("after a success: %v", err)
	}
	mfs, _ := reg.Gather()
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "tether_cluster_storage_write_errors_total" {
			n = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if n != 2 {
		t.Errorf("write errors counted %v, want 2", n)
	}
	w.note(errors.New("again"))
	if err, since := w.failing(); err == nil || !since.Equal(clock) {
		t.Errorf("a new run of failures starts at %s, got %s (%v)", clock, since, err)
	}
}
