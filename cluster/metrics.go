package cluster

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/fsm"
)

// metrics are the node's tether_cluster_* series. A nil *metrics (no
// Registerer configured) records nothing.
type metrics struct {
	reg          prometheus.Registerer
	commit       prometheus.Histogram
	stage        *prometheus.HistogramVec
	proposals    *prometheus.CounterVec
	batchSize    prometheus.Histogram
	forwarded    prometheus.Counter
	isLeader     prometheus.Gauge
	appliedIndex prometheus.Gauge
	applyLag     prometheus.Histogram
	authFailures prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, nodeID string) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	labels := prometheus.Labels{"node": nodeID}
	m := &metrics{
		reg: reg,
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "tether_cluster_commit_seconds",
			Help:        "Time from Propose to the proposal applied on this node (successful proposals).",
			ConstLabels: labels,
			Buckets:     []float64{.0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25, .5, 1},
		}),
		stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tether_cluster_propose_stage_seconds",
			Help: "Where a proposal's time goes, by stage: queue (waiting for the leader's batcher or this follower's forwarder to take it), " +
				"commit (leader: from handing the entry to Raft to its results on the leader's FSM: disk writes, replication, apply), " +
				"forward (follower: round trip of a forwarded frame, including the leader's queue and commit), " +
				"follower_apply (follower: from the leader's answer to this node's FSM applying the entry).",
			ConstLabels: labels,
			Buckets:     []float64{.0001, .00025, .0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25, .5, 1},
		}, []string{"stage"}),
		proposals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "tether_cluster_proposals_total",
			Help:        "Proposals by outcome (fsm status, or unavailable/closed/halted/error).",
			ConstLabels: labels,
		}, []string{"outcome"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "tether_cluster_batch_size",
			Help:        "Proposals per Raft log entry (leader group commit).",
			ConstLabels: labels,
			Buckets:     prometheus.ExponentialBuckets(1, 2, 11),
		}),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "tether_cluster_forwarded_total",
			Help:        "Proposals this node forwarded to the leader.",
			ConstLabels: labels,
		}),
		isLeader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "tether_cluster_is_leader",
			Help:        "1 while this node is the ready leader (barrier done).",
			ConstLabels: labels,
		}),
		appliedIndex: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "tether_cluster_applied_index",
			Help:        "Last Raft log index applied by this node's state machine.",
			ConstLabels: labels,
		}),
		applyLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tether_cluster_apply_lag_seconds",
			Help: "Time from the leader appending a command entry to this node applying it (the leader's clock against this node's; " +
				"entries replayed more than a minute after they were appended are not counted). Across the edges, its largest value " +
				"for an entry is how long the cluster took to agree on it after the leader had it.",
			ConstLabels: labels,
			Buckets:     []float64{.0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "tether_cluster_auth_failures_total",
			Help:        "Inter-node connections (forwarding and Raft) refused: a wrong internal key, or a TLS certificate that does not name the node the peer claims to be.",
			ConstLabels: labels,
		}),
	}
	for i, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			for _, done := range m.collectors()[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("cluster: register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.commit, m.stage, m.proposals, m.batchSize, m.forwarded, m.isLeader, m.appliedIndex, m.applyLag, m.authFailures}
}

// unregister removes the node's series (a node reopened in the same
// process registers them again).
func (m *metrics) unregister() {
	if m == nil {
		return
	}
	for _, c := range m.collectors() {
		m.reg.Unregister(c)
	}
}

func (m *metrics) observeResults(rs []fsm.Result, seconds float64) {
	if m == nil {
		return
	}
	m.commit.Observe(seconds)
	for _, r := range rs {
		m.proposals.WithLabelValues(r.Status.String()).Inc()
	}
}

// maxApplyLag: entries applied later than this after their append are a
// replay (a restart, a snapshot catch-up), not replication lag.
const maxApplyLag = time.Minute

// observeApplied records how long after its append an entry was applied.
func (m *metrics) observeApplied(appended, now time.Time) {
	if m == nil || appended.IsZero() {
		return
	}
	if lag := now.Sub(appended); lag >= 0 && lag <= maxApplyLag {
		m.applyLag.Observe(lag.Seconds())
	}
}

func (m *metrics) observeFailure(n int, err error) {
	if m == nil {
		return
	}
	outcome := "error"
	switch {
	case errors.Is(err, ErrUnavailable):
		outcome = "unavailable"
	case errors.Is(err, ErrHalted):
		outcome = "halted"
	case errors.Is(err, ErrClosed):
		outcome = "closed"
	}
	m.proposals.WithLabelValues(outcome).Add(float64(n))
}

// Proposal stages (tether_cluster_propose_stage_seconds).
const (
	stageQueue         = "queue"
	stageCommit        = "commit"
	stageForward       = "forward"
	stageFollowerApply = "follower_apply"
)

func (m *metrics) observeStage(stage string, d time.Duration) {
	if m == nil {
		return
	}
	m.stage.WithLabelValues(stage).Observe(d.Seconds())
}

func (m *metrics) observeBatch(n int) {
	if m != nil {
		m.batchSize.Observe(float64(n))
	}
}

func (m *metrics) observeForwarded(n int) {
	if m != nil {
		m.forwarded.Add(float64(n))
	}
}

func (m *metrics) setLeader(v bool) {
	if m == nil {
		return
	}
	if v {
		m.isLeader.Set(1)
	} else {
		m.isLeader.Set(0)
	}
}

func (m *metrics) setApplied(index uint64) {
	if m != nil {
		m.appliedIndex.Set(float64(index))
	}
}

func (m *metrics) authFailure() {
	if m != nil {
		m.authFailures.Inc()
	}
}
