package bench

// Each edge keeps its own overload history (routing/overload: since when an
// instance has been unable to take its bound keys), fed by the views it
// builds, so with N edges each sees about an Nth of the observations. With
// Share.Overload an edge tells the others each transition of its history
// (an instance's strain starting or ending), as the edges do beside their
// dispatches, and they apply it as their own observation ShareLatency
// later; a heard transition is not told again.

// observeStrain records edge e's verdict on instance i and, when it is a
// transition and the edges share their histories, queues it for the others.
func (s *simulator) observeStrain(e *simEdge, i int, overloaded bool) {
	if !e.overload.Observe(s.instances[i].id, overloaded, epoch.Add(s.now)) {
		return
	}
	if !s.cfg.Share.Overload || !s.cfg.Policy.usesSharedLog() || s.cfg.Policy == PolicyTetherOwnOverload {
		return
	}
	for _, o := range s.edges {
		if o != e {
			s.push(&event{at: s.now + s.cfg.ShareLatency, kind: evStrainHear, edge: o.num, inst: i, overloaded: overloaded})
		}
	}
}

// hearStrain applies another edge's transition to edge's history.
func (s *simulator) hearStrain(edge, i int, overloaded bool) {
	s.edges[edge].overload.Observe(s.instances[i].id, overloaded, epoch.Add(s.now))
}
