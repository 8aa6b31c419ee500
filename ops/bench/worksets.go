package bench

import "github.com/tether-project/tether/routing"

// Every edge remembers what it routed lately (routing's working sets: each
// conversation's instance and prompt length), which placement charges for
// the working sets a prompt would evict. A shipped edge tells the others
// each route's entry with its dispatch (edge/dispatch dispatches.go) and
// notes theirs (routing Decider.HearRoute), so with several edges each
// weighs every edge's routes, as one edge does. With Share.WorkingSets the
// simulated edges of a shared log do the same, ShareLatency later.

// tellWork queues the working-set entry w of edge e's route to instIdx for
// the other edges.
func (s *simulator) tellWork(e *simEdge, instIdx int, w routing.Work) {
	if !s.cfg.Share.WorkingSets || !s.cfg.Policy.usesSharedLog() || s.cfg.Policy == PolicyTetherOwnWorkingSets || w.Key == "" {
		return
	}
	for _, o := range s.edges {
		if o != e {
			s.push(&event{at: s.now + s.cfg.ShareLatency, kind: evWorkHear, edge: o.num, inst: instIdx, work: w})
		}
	}
}

// hearWork notes another edge's route in edge's working sets.
func (s *simulator) hearWork(edge, instIdx int, w routing.Work) {
	s.edges[edge].dec.HearRoute(s.router, w, s.instances[instIdx].id, epoch.Add(s.now))
}
