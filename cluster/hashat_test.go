package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// HashAt answers "the state hash at exactly index N" after the node moved
// past N: the same on every node, and the hash a replay of the log up to N
// gives; forgotten or never-applied indexes say so.
func TestHashAtExactIndex(t *testing.T) {
	t.Parallel()
	const history = 16
	tc := newTestCluster(t, 3, func(i int, c *Config) { c.HashHistory = history })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var indexes []uint64
	for i := range 40 {
		n := tc.running()[i%3]
		if _, err := n.Propose(ctx, bindEv(fmt.Sprintf("h-%d", i), "w1")); err != nil {
			t.Fatal(err)
		}
		indexes = append(indexes, n.State().Index())
	}
	last := tc.sync(10 * time.Second)
	ref := tc.node(0)
	if h, ok := ref.HashAt(last); !ok || h != ref.State().Hash() {
		t.Fatalf("HashAt(current index %d): ok %v, or not the current state's hash", last, ok)
	}
	oldest, newest := ref.hashHistory()
	if newest != last || oldest == 0 || oldest > newest {
		t.Fatalf("history %d..%d, want ..%d", oldest, newest, last)
	}
	// Every node agrees on every remembered index.
	remembered := 0
	for _, idx := range indexes {
		h0, ok := ref.HashAt(idx)
		if !ok {
			if idx >= oldest {
				t.Fatalf("index %d inside the history %d..%d but not found", idx, oldest, newest)
			}
			continue
		}
		remembered++
		for _, n := range tc.running()[1:] {
			if h, ok := n.HashAt(idx); !ok || h != h0 {
				t.Fatalf("node %s at index %d: ok %v, hash differs from %s's", n.ID(), idx, ok, ref.ID())
			}
		}
	}
	if remembered == 0 || remembered > history {
		t.Fatalf("%d of %d indexes remembered with a history of %d", remembered, len(indexes), history)
	}
	if _, ok := ref.HashAt(indexes[0]); ok {
		t.Fatalf("index %d still remembered beyond a history of %d", indexes[0], history)
	}
	if _, ok := ref.HashAt(last + 1); ok {
		t.Fatal("a hash for an index not applied yet")
	}
	// A replay of the archive up to a remembered index gives the same hash.
	probe := newest - 3
	for {
		if _, ok := ref.HashAt(probe); ok {
			break
		}
		probe-- // a configuration entry: not a state index
	}
	if err := ref.WaitArchived(ctx, last); err != nil {
		t.Fatal(err)
	}
	m := fsm.NewMachine()
	if err := ref.Archive().Range(0, probe, func(r archive.Record) error {
		_, err := m.Apply(fsm.Entry{Index: r.Index, Time: r.Time, Data: r.Data})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if h, _ := ref.HashAt(probe); m.State().Index() != probe || m.State().Hash() != h {
		t.Fatalf("replay to %d (at %d) disagrees with HashAt", probe, m.State().Index())
	}
}

func TestRecentHashes(t *testing.T) {
	r := newRecentHashes(3)
	h := func(i uint64) [32]byte { return [32]byte{byte(i)} }
	for _, i := range []uint64{2, 3, 5, 9} {
		r.add(i, h(i))
	}
	for _, c := range []struct {
		index uint64
		ok    bool
	}{{2, false}, {3, true}, {4, false}, {5, true}, {9, true}, {10, false}} {
		got, ok := r.lookup(c.index)
		if ok != c.ok || ok && got != h(c.index) {
			t.Errorf("lookup(%d) = %x, %v; want ok %v", c.index, got[:1], ok, c.ok)
		}
	}
	if o, n := r.span(); o != 3 || n != 9 {
		t.Fatalf("span %d..%d", o, n)
	}
	r.add(4, h(4)) // an older state (restore): start over
	if o, n := r.span(); o != 4 || n != 4 {
		t.Fatalf("after an older index: span %d..%d", o, n)
	}
}
