package observe

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/fsm"
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
type opsCollector struct{ src Source }

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
	if free, size, ok := diskSpace(c.src.DataDir()); ok {
		ch <- prometheus.MustNewConstMetric(descDiskFree, prometheus.GaugeValue, free)
		ch <- prometheus.MustNewConstMetric(descDiskSize, prometheus.GaugeValue, size)
	}
	n := c.src.Node()
	if n == nil {
		return
	}
	st := n.Status()
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

	s := n.State()
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

// RoutedMetrics are the per-instance request counters autoscalers rate():
// requests routed and the prefill they bring (prompt tokens the edge did not
// believe cached there), by fleet, instance and whether the request came from
// a sub-agent.
type RoutedMetrics struct {
	Requests *prometheus.CounterVec
	Prefill  *prometheus.CounterVec
}

func newRoutedMetrics() RoutedMetrics {
	return RoutedMetrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_routed_requests_total",
			Help: "Requests placed on an instance by this edge, by fleet, instance and kind (conversation, subagent).",
		}, []string{"fleet", "instance", "kind"}),
		Prefill: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_prefill_tokens_total",
			Help: "Demand estimate: prompt tokens placed on an instance that the edge did not believe cached there (prefill offered), by fleet and instance.",
		}, []string{"fleet", "instance"}),
	}
}

// ObserveRoute records the time since start of placing one hop on fleet f.
func (m *Metrics) ObserveRoute(f fsm.Fleet, start time.Time) {
	m.RouteSeconds.WithLabelValues(f.String()).Observe(time.Since(start).Seconds())
}
