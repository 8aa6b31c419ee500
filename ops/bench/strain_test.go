package bench

import (
	"container/heap"
	"context"
	"testing"
)

// An edge's overload transition reaches the other edges ShareLatency later
// as their own observation; an observation that changes nothing, a heard
// one, and any without Share.Overload is not told.
func TestStrainTransitionsAreRelayed(t *testing.T) {
	for _, share := range []bool{true, false} {
		cfg := testConfig()
		cfg.Policy, cfg.Edges = PolicyTether, 2
		cfg.Share.Overload = share
		s, err := newSimulator(context.Background(), sharedPrefixAgents(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		id := s.instances[0].id
		s.observeStrain(s.edges[0], 0, true)
		s.observeStrain(s.edges[0], 0, true) // no transition
		if !share {
			if s.queue.Len() != 0 {
				t.Fatalf("without Share.Overload %d events queued", s.queue.Len())
			}
			continue
		}
		if s.queue.Len() != 1 {
			t.Fatalf("%d events queued for one transition to one other edge, want 1", s.queue.Len())
		}
		ev := heap.Pop(&s.queue).(*event)
		if ev.kind != evStrainHear || ev.edge != 1 || ev.inst != 0 || !ev.overloaded || ev.at != cfg.ShareLatency {
			t.Fatalf("relayed %+v, want edge 1 hearing instance 0 overloaded at %v", ev, cfg.ShareLatency)
		}
		if _, ok := s.edges[1].overload.OverloadedSince(id); ok {
			t.Fatal("edge 1 strained before it heard")
		}
		s.now = ev.at
		s.hearStrain(ev.edge, ev.inst, ev.overloaded)
		if since, ok := s.edges[1].overload.OverloadedSince(id); !ok || !since.Equal(epoch.Add(ev.at)) {
			t.Fatalf("edge 1 strained since %v (%v), want %v", since, ok, epoch.Add(ev.at))
		}
		if s.queue.Len() != 0 {
			t.Fatal("a heard transition was told again")
		}
	}
}
