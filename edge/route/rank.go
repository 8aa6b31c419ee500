package route

import "github.com/tether-project/tether/fsm"

// RecordRank records, off the request path, rank as the data-parallel rank
// of the binding hop h followed (RankObserved), once the cluster runs
// feature level 2 and only for a hop that went to the binding's own
// instance: so the log holds the whole placement, instance and rank, and
// every edge keeps using that rank. replace: the rank a worker reported
// (x-tether-adp-rank), recorded when the log says another; otherwise the
// rank the edge chose for an engine, recorded only while the log has none
// (even if data_parallel_size or the hash inputs change later).
func (e *Router) RecordRank(h *Hop, rank uint32, replace bool) {
	if h == nil || !h.Bound || h.Instance != h.Binding.Instance ||
		(h.Outcome != outcomeSticky && h.Outcome != outcomeNewBind && h.Outcome != outcomeDegraded) {
		return
	}
	if e.featureLevel() < fsm.FeatureLevelRanks {
		return
	}
	st := e.edge.Node().State()
	if st.FeatureLevel() < fsm.FeatureLevelRanks {
		return // an older edge may still be a voter: it could not apply the event
	}
	if h.Binding.Epoch == 0 {
		// Served on this edge's own proposal: recorded once the log
		// answers it with this placement (placements.settle).
		if ev, now := e.placements.NoteRank(h.Fleet, h.Key, h.Instance, rank); now {
			e.recorder.AddRank(ev)
		}
		return
	}
	b, ok := st.Lookup(h.Fleet, h.Key)
	if !ok || b.Epoch != h.Binding.Epoch || b.Instance != h.Instance || (b.HasRank && (!replace || b.Rank == rank)) {
		return
	}
	e.recorder.AddRank(fsm.RankObserved{Fleet: h.Fleet, Key: h.Key, Epoch: b.Epoch, Rank: rank})
}

// featureLevel is the highest fsm feature level this edge advertises and
// uses: cluster.compat_feature_level (its default: this build's maximum).
func (e *Router) featureLevel() uint32 { return e.cfg.Cluster.FeatureLevel }
