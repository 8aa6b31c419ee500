package cluster

import (
	"sync"

	gometrics "github.com/hashicorp/go-metrics/compat"
	"github.com/prometheus/client_golang/prometheus"
)

// Raft's own timings. hashicorp/raft reports through go-metrics, a
// process-wide sink; raftSink keeps the few samples that say what the
// transport delivers to Raft's timers, as Prometheus series:
//
//   - tether_cluster_raft_heartbeat_seconds: the leader's heartbeat RPC to
//     a follower, sent to answered (raft.replication.heartbeat);
//   - tether_cluster_raft_leader_contact_age_seconds: at each lease check,
//     how long ago the leader last heard each voter (raft.leader.lastContact):
//     beyond raft.leader_lease_timeout the voter counts as lost, and a
//     leader that lost a quorum steps down;
//   - tether_cluster_raft_transitions_total{kind}: heartbeat_timeout (a
//     follower that heard no leader starts an election), leader_lease_timeout
//     (a leader stepped down) (raft.transition.*).
//
// They are what the Raft timing defaults are derived from (cluster/DESIGN.md
// "Raft timing"). go-metrics being process-wide, the first node opened with
// a Registerer exports them, for every node of the process (one per edge
// process; tether dev's three edges share them).

var raftSinkOnce sync.Once

func exportRaftMetrics(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	raftSinkOnce.Do(func() {
		buckets := []float64{.001, .0025, .005, .01, .025, .05, .075, .1, .15, .2, .3, .4, .5, .75, 1, 1.5, 2, 3, 5}
		s := &raftSink{
			heartbeat: prometheus.NewHistogram(prometheus.HistogramOpts{
				Name:    "tether_cluster_raft_heartbeat_seconds",
				Help:    "Raft heartbeat round trips from the leader to a follower (sent to answered), as the transport delivers them.",
				Buckets: buckets,
			}),
			contact: prometheus.NewHistogram(prometheus.HistogramOpts{
				Name:    "tether_cluster_raft_leader_contact_age_seconds",
				Help:    "At each leader lease check, how long ago the leader last heard each voter (beyond the lease the voter counts as lost).",
				Buckets: buckets,
			}),
			transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "tether_cluster_raft_transitions_total",
				Help: "Raft state transitions by cause: heartbeat_timeout (a follower started an election), leader_lease_timeout (a leader stepped down), and the others raft reports.",
			}, []string{"kind"}),
		}
		for _, c := range []prometheus.Collector{s.heartbeat, s.contact, s.transitions} {
			if err := reg.Register(c); err != nil {
				return
			}
		}
		cfg := gometrics.DefaultConfig("")
		cfg.EnableHostname, cfg.EnableRuntimeMetrics, cfg.EnableServiceLabel = false, false, false
		_, _ = gometrics.NewGlobal(cfg, s)
	})
}

type raftSink struct {
	heartbeat   prometheus.Histogram
	contact     prometheus.Histogram
	transitions *prometheus.CounterVec
}

func is(key []string, want ...string) bool {
	if len(key) < len(want) {
		return false
	}
	for i, w := range want {
		if key[i] != w {
			return false
		}
	}
	return true
}

func (s *raftSink) AddSample(key []string, val float32) { s.AddSampleWithLabels(key, val, nil) }

func (s *raftSink) AddSampleWithLabels(key []string, val float32, _ []gometrics.Label) {
	switch {
	case len(key) == 3 && is(key, "raft", "replication", "heartbeat"):
		s.heartbeat.Observe(float64(val) / 1000)
	case len(key) == 3 && is(key, "raft", "leader", "lastContact"):
		s.contact.Observe(float64(val) / 1000)
	}
}

func (s *raftSink) IncrCounter(key []string, val float32) { s.IncrCounterWithLabels(key, val, nil) }

func (s *raftSink) IncrCounterWithLabels(key []string, val float32, _ []gometrics.Label) {
	if len(key) == 3 && is(key, "raft", "transition") {
		s.transitions.WithLabelValues(key[2]).Add(float64(val))
	}
}

func (s *raftSink) SetGauge([]string, float32)                              {}
func (s *raftSink) SetGaugeWithLabels([]string, float32, []gometrics.Label) {}
func (s *raftSink) EmitKey([]string, float32)                               {}
