package bench

import (
	"container/heap"
	"context"
	"testing"

	"github.com/tether-project/tether/routing"
)

// A tether edge's route reaches the other edges' working sets
// ShareLatency later (as shipped); not without Share.WorkingSets, nor
// between independent routers (tether_local), nor an empty entry.
func TestWorkingSetsAreShared(t *testing.T) {
	w := routing.Work{Key: "context/conv-1", Blocks: 40}
	for _, c := range []struct {
		name   string
		policy Policy
		share  bool
		told   bool
	}{
		{"shipped", PolicyTether, true, true},
		{"not shared", PolicyTether, false, false},
		{"independent edges", PolicyTetherLocal, true, false},
		{"the ablation", PolicyTetherOwnWorkingSets, true, false},
	} {
		cfg := testConfig()
		cfg.Policy, cfg.Edges = c.policy, 3
		cfg.Share.WorkingSets = c.share
		s, err := newSimulator(context.Background(), sharedPrefixAgents(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.tellWork(s.edges[0], 1, routing.Work{})
		s.tellWork(s.edges[0], 1, w)
		if !c.told {
			if s.queue.Len() != 0 {
				t.Fatalf("%s: %d events queued", c.name, s.queue.Len())
			}
			continue
		}
		if s.queue.Len() != 2 {
			t.Fatalf("%s: %d events queued, want one for each other edge", c.name, s.queue.Len())
		}
		id := s.instances[1].id
		for s.queue.Len() > 0 {
			ev := heap.Pop(&s.queue).(*event)
			if ev.kind != evWorkHear || ev.edge == 0 || ev.inst != 1 || ev.work != w || ev.at != cfg.ShareLatency {
				t.Fatalf("%s: told %+v, want edges 1 and 2 hearing %+v on instance 1 at %v", c.name, ev, w, cfg.ShareLatency)
			}
			if l := s.edges[ev.edge].dec.WorkingSet(s.router, id, epoch.Add(ev.at)); l.Keys != 0 {
				t.Fatalf("%s: edge %d's working set %+v before it heard", c.name, ev.edge, l)
			}
			s.now = ev.at
			s.hearWork(ev.edge, ev.inst, ev.work)
			if l := s.edges[ev.edge].dec.WorkingSet(s.router, id, epoch.Add(ev.at)); l.Keys != 1 || l.Blocks != 40 {
				t.Fatalf("%s: edge %d's working set of %s after hearing: %+v, want one key of 40 blocks", c.name, ev.edge, id, l)
			}
		}
	}
}
