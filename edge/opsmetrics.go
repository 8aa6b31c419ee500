package edge

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
)

// ActiveWindow is how recently (log time) a binding or parent link must have
// been used to count as active in tether_edge_active_conversations and
// tether_edge_active_subagents. Bindings record their last use through touch
// batches (touch_interval), so the figure is exact to that interval.
const ActiveWindow = 5 * time.Minute

// opsCollector reports, at scrape time, what autoscalers and the log's
// dashboards need that no request-path counter holds: the active
// conversations and sub-agents per instance (from the replicated state, the
// same on every edge), this node's Raft term, commit and apply lag, the
// cluster's servers by suffrage, and the data directory's free space.
type opsCollector struct{ e *Edge }

var (
	descActiveConv = prometheus.NewDesc("tether_edge_active_conversations",
		"Conversations bound to the instance and used within the last 5 minutes of log time (replicated state: every edge reports the same figure; sub-agents sharing their parent's binding are not counted here).",
		[]string{"fleet", "instance"}, nil)
	descActiveSub = prometheus.NewDesc("tether_edge_active_subagents",
		"Sub-agent conversations placed on the instance (their own binding, or their root's) and used within the last 5 minutes of log time.",
		[]string{"fleet", "instance"}, nil)
	descBound = prometheus.NewDesc("tether_edge_instance_bindings",
		"Live bindings of the fleet on the instance (replicated state).",
		[]string{"fleet", "instance"}, nil)
	descDraining = prometheus.NewDesc("tether_edge_instance_draining",
		"1 while the replicated state records the instance draining: its worker is shutting down, or an operator drained it (no new conversations; a drained instance's bound ones move on their next turns).",
		[]string{"fleet", "instance"}, nil)
	descTerm = prometheus.NewDesc("tether_edge_raft_term",
		"This node's current Raft term (it rises by one or more at every election).", nil, nil)
	descCommitIndex = prometheus.NewDesc("tether_edge_raft_commit_index",
		"The highest Raft log index this node knows committed.", nil, nil)
	descApplyLag = prometheus.NewDesc("tether_edge_raft_apply_lag_entries",
		"Committed Raft entries this node's state machine has not applied yet.", nil, nil)
	descServers = prometheus.NewDesc("tether_edge_raft_servers",
		"Servers in the Raft configuration this node holds, by suffrage (voter, nonvoter).", []string{"suffrage"}, nil)
	descVoter = prometheus.NewDesc("tether_edge_raft_voter",
		"1 while this node votes in the configuration it holds.", nil, nil)
	descDiskFree = prometheus.NewDesc("tether_edge_data_dir_free_bytes",
		"Bytes available to the edge on the file system of its data directory (Raft log, snapshots, archive).", nil, nil)
	descDiskSize = prometheus.NewDesc("tether_edge_data_dir_capacity_bytes",
		"Size in bytes of the file system holding the edge's data directory.", nil, nil)
)

func (c *opsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descActiveConv, descActiveSub, descBound, descDraining, descTerm, descCommitIndex,
		descApplyLag, descServers, descVoter, descDiskFree, descDiskSize} {
		ch <- d
	}
}

func (c *opsCollector) Collect(ch chan<- prometheus.Metric) {
	e := c.e
	if free, size, ok := diskSpace(e.cfg.Cluster.DataDir); ok {
		ch <- prometheus.MustNewConstMetric(descDiskFree, prometheus.GaugeValue, free)
		ch <- prometheus.MustNewConstMetric(descDiskSize, prometheus.GaugeValue, size)
	}
	if e.node == nil {
		return
	}
	st := e.node.Status()
	ch <- prometheus.MustNewConstMetric(descTerm, prometheus.GaugeValue, float64(st.Term))
	ch <- prometheus.MustNewConstMetric(descCommitIndex, prometheus.GaugeValue, float64(st.CommitIndex))
	lag := 0.0
	if st.CommitIndex > st.AppliedIndex {
		lag = float64(st.CommitIndex - st.AppliedIndex)
	}
	ch <- prometheus.MustNewConstMetric(descApplyLag, prometheus.GaugeValue, lag)
	voters, nonvoters := 0, 0
	for _, p := range st.Peers {
		if p.Voter {
			voters++
		} else {
			nonvoters++
		}
	}
	ch <- prometheus.MustNewConstMetric(descServers, prometheus.GaugeValue, float64(voters), "voter")
	ch <- prometheus.MustNewConstMetric(descServers, prometheus.GaugeValue, float64(nonvoters), "nonvoter")
	ch <- prometheus.MustNewConstMetric(descVoter, prometheus.GaugeValue, b2f(st.Voter))

	s := e.node.State()
	for _, a := range activity(s, s.Time()-int64(ActiveWindow)) {
		ch <- prometheus.MustNewConstMetric(descActiveConv, prometheus.GaugeValue, float64(a.conversations), a.fleet.String(), a.instance)
		ch <- prometheus.MustNewConstMetric(descActiveSub, prometheus.GaugeValue, float64(a.subagents), a.fleet.String(), a.instance)
		ch <- prometheus.MustNewConstMetric(descBound, prometheus.GaugeValue, float64(s.BindingCount(a.fleet, a.instance)), a.fleet.String(), a.instance)
		ch <- prometheus.MustNewConstMetric(descDraining, prometheus.GaugeValue, b2f(a.draining), a.fleet.String(), a.instance)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// instanceActivity is one instance's active conversations and sub-agents.
type instanceActivity struct {
	fleet         fsm.Fleet
	instance      string
	conversations int
	subagents     int
	draining      bool
}

// activity counts, per instance the state knows (every one, so idle
// instances read 0 rather than absent), the bindings and sub-agent links used
// at or after since (log time). A binding whose key is a sub-agent's own
// conversation counts as a sub-agent; a root binding counts as a
// conversation, and its linked children without a binding of their own in
// that fleet count as sub-agents on the same instance.
func activity(s *fsm.State, since int64) []instanceActivity {
	var out []instanceActivity
	at := map[fsm.FleetKey]int{}
	for _, in := range s.Instances() {
		if !in.Fleet.Valid() || in.Status == fsm.InstanceRemoved {
			continue
		}
		at[fsm.FleetKey{Fleet: in.Fleet, Key: in.ID}] = len(out)
		out = append(out, instanceActivity{fleet: in.Fleet, instance: in.ID, draining: in.Status == fsm.InstanceDraining || in.Drained})
	}
	s.ForEachBinding(func(b fsm.Binding) bool {
		i, ok := at[fsm.FleetKey{Fleet: b.Fleet, Key: b.Instance}]
		if !ok {
			return true
		}
		if _, sub := s.Link(b.Key); sub {
			if b.LastUsed >= since {
				out[i].subagents++
			}
			return true
		}
		if b.LastUsed >= since {
			out[i].conversations++
		}
		for _, child := range s.Children(b.Key) {
			if _, own := s.Lookup(b.Fleet, child); own {
				continue
			}
			if l, ok := s.Link(child); ok && l.LastUsed >= since {
				out[i].subagents++
			}
		}
		return true
	})
	return out
}

// routedMetrics are the per-instance request counters autoscalers rate():
// requests routed and the prefill they bring (prompt tokens the edge did not
// believe cached there), by fleet, instance and whether the request came from
// a sub-agent.
type routedMetrics struct {
	requests *prometheus.CounterVec
	prefill  *prometheus.CounterVec
}

func newRoutedMetrics() routedMetrics {
	return routedMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_routed_requests_total",
			Help: "Requests placed on an instance by this edge, by fleet, instance and kind (conversation, subagent).",
		}, []string{"fleet", "instance", "kind"}),
		prefill: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_prefill_tokens_total",
			Help: "Demand estimate: prompt tokens placed on an instance that the edge did not believe cached there (prefill offered), by fleet and instance.",
		}, []string{"fleet", "instance"}),
	}
}

// observeRouted counts a placed hop of rq on fleet f.
func (e *Edge) observeRouted(rq *request, f fsm.Fleet, h *hop) {
	kind := "conversation"
	if rq.id.SubAgent() {
		kind = "subagent"
	}
	e.metrics.routed.requests.WithLabelValues(f.String(), h.Instance, kind).Inc()
	if prefill := rq.prompts[f].tokens - h.Cached; prefill > 0 {
		e.metrics.routed.prefill.WithLabelValues(f.String(), h.Instance).Add(float64(prefill))
	}
}

// observeRoute records the time since start of placing one hop on fleet f.
func (m *metrics) observeRoute(f fsm.Fleet, start time.Time) {
	m.routeSeconds.WithLabelValues(f.String()).Observe(time.Since(start).Seconds())
}

// recordEvidence records, in the background (the recorder's bounded queue:
// never on the request's path), what the edge saw when it placed h: the rule
// and each candidate the decision kept (at most fsm.MaxCandidates, the
// chosen one first) with its cached blocks, load and state. Only placements
// that the log records (new binds, overflows, degraded binds) get evidence;
// sticky turns are touches and cost nothing more.
func (e *Edge) recordEvidence(rq *request, f fsm.Fleet, h *hop) {
	var rule, bound string
	switch {
	case h.Policy == routing.PolicyPending:
		return // served on an earlier request's placement: no new decision
	case h.Outcome == outcomeNewBind || h.Outcome == outcomeDegraded:
		rule = h.Policy
	case h.Outcome == outcomeOverflow:
		// The instance the key left (a rebind's binding is already the
		// new one).
		rule, bound = "overflow:"+h.Reason.String(), h.From
	default:
		return
	}
	// The views the decision read (cached by views(); read here without
	// rebuilding them, which would feed the overload tracker again).
	var views []routing.InstanceView
	if c := rq.m.viewsCache.Load(); c != nil {
		views = c.views.Fleet(f)
	}
	ev := evidenceOf(f, h.Key, rq.requestID, rule, h.Instance, bound, h.Binding.Decision.Candidates,
		views, rq.m.tokenizers[f].blockSize)
	if e.placements.holdEvidence(ev) {
		return // proposed once the placement's Bind is answered
	}
	e.recorder.add(ev, nil)
}

// evidenceOf builds a placement's Evidence from the decision's candidates
// and the instance views the decision was made from: chosen first, then the
// key's binding it left (bound, for an overflow), then the other candidates.
func evidenceOf(f fsm.Fleet, key, requestID, rule, chosen, bound string, cands []fsm.Candidate, views []routing.InstanceView, blockSize int) fsm.Evidence {
	ev := fsm.Evidence{Fleet: f, Key: key, RequestID: requestID, Rule: rule}
	add := func(c fsm.Candidate) {
		ec := fsm.EvidenceCandidate{Instance: c.Instance, LoadTokens: c.LoadTokens}
		if blockSize > 0 {
			ec.CachedBlocks = c.CachedTokens / uint32(blockSize)
		}
		if c.Instance == chosen {
			ec.Flags |= fsm.EvidenceChosen
		}
		if c.Instance == bound {
			ec.Flags |= fsm.EvidenceBound
		}
		for i := range views {
			v := &views[i]
			if v.ID != c.Instance {
				continue
			}
			ec.QueuedRequests = uint32(max(0, v.QueuedRequests))
			if v.CacheDegraded {
				ec.Flags |= fsm.EvidenceBreakerOpen
			}
			if !v.Healthy {
				ec.Flags |= fsm.EvidenceUnhealthy
			}
			if v.Draining {
				ec.Flags |= fsm.EvidenceDraining
			}
		}
		ev.Candidates = append(ev.Candidates, ec)
	}
	first := func(id string) {
		if id == "" {
			return
		}
		for _, c := range cands {
			if c.Instance == id {
				add(c)
				return
			}
		}
		add(fsm.Candidate{Instance: id})
	}
	first(chosen)
	if bound != chosen {
		first(bound)
	}
	for _, c := range cands {
		if c.Instance != chosen && c.Instance != bound && len(ev.Candidates) < fsm.MaxCandidates {
			add(c)
		}
	}
	return ev
}

// BackgroundPending is how many background events (overflows, links, rank
// observations, evidence), used keys and links of the touch batch, and own
// placements' Binds this edge has not yet seen through the log: queued or
// being proposed. Tests wait for 0 before they take a quiet log's index.
func (e *Edge) BackgroundPending() int {
	return e.recorder.pending() + e.touches.pending() + e.placements.inFlight()
}
