package config

import (
	"math"
	"time"
)

// AdmissionConfig is the admission section: load shedding on the edge's own
// saturation (docs: README "admission", edge/DESIGN.md "Load shedding").
type AdmissionConfig struct {
	// MaxSchedulingLatency: when the 99th percentile of the time this
	// process's goroutines wait to run, over the last half second, exceeds
	// it while the edge's own CPU use is at least MinCPUShare, the edge
	// admits fewer routed requests at once (down to MinInflight) until it
	// falls back; requests beyond are shed (429).
	// Raft's heartbeats wait in the same queues, so shedding keeps them
	// ahead of the request work. 0: a fifth of
	// cluster.raft.leader_lease_timeout (200 ms at the shipped 1 s).
	// Negative: no shedding on saturation.
	MaxSchedulingLatency time.Duration `yaml:"max_scheduling_latency"`
	// MinCPUShare: a scheduling latency beyond MaxSchedulingLatency sheds
	// only while the edge's own CPU use, over the same half second, is at
	// least this share of the CPUs it may use (GOMAXPROCS, or its cgroup's
	// CPU quota where lower). Below it the goroutines wait because other
	// processes hold the CPUs, and shedding would free nothing. 0: the
	// default (DefaultMinCPUShare); negative: the latency alone decides.
	MinCPUShare float64 `yaml:"min_cpu_share"`
	// MaxInflight bounds the routed requests in progress at once, streams
	// included (429 beyond it).
	MaxInflight int `yaml:"max_inflight"`
	// MinInflight: the saturated limit never falls below this.
	MinInflight int `yaml:"min_inflight"`
	// RetryAfter is a shed request's Retry-After (Retry-After-Ms spreads
	// the retries over ±50 % of it).
	RetryAfter time.Duration `yaml:"retry_after"`
}

// Admission defaults.
const (
	DefaultMaxInflight         = 4096
	DefaultMinInflight         = 8
	DefaultAdmissionRetryAfter = time.Second
	// DefaultMinCPUShare: see MinCPUShare.
	DefaultMinCPUShare = 0.5
	// SchedulingLatencyLeaseShare: admission.max_scheduling_latency's
	// default is the leader lease divided by it: a goroutine wait of a
	// fifth of the lease still leaves the leader most of its lease to hear
	// a quorum. RELIABILITY.md "busy loops" has the bounds measured at the
	// shipped 1 s lease against starvation and beside busy loops.
	SchedulingLatencyLeaseShare = 5
)

// DefaultAdmissionConfig is what an edge sheds with unless configured
// (MaxSchedulingLatency 0: it follows the leader lease, withDefaults).
func DefaultAdmissionConfig() AdmissionConfig {
	return AdmissionConfig{MaxInflight: DefaultMaxInflight, MinInflight: DefaultMinInflight, RetryAfter: DefaultAdmissionRetryAfter, MinCPUShare: DefaultMinCPUShare}
}

// withDefaults fills the zero keys with DefaultAdmissionConfig's values
// (min_inflight at most max_inflight) and max_scheduling_latency from the
// leader lease.
func (a *AdmissionConfig) withDefaults(leaderLease time.Duration) {
	d := DefaultAdmissionConfig()
	if a.MaxSchedulingLatency == 0 {
		a.MaxSchedulingLatency = leaderLease / SchedulingLatencyLeaseShare
	}
	if a.MaxInflight == 0 {
		a.MaxInflight = d.MaxInflight
	}
	if a.MinInflight == 0 {
		a.MinInflight = min(d.MinInflight, a.MaxInflight)
	}
	if a.RetryAfter == 0 {
		a.RetryAfter = d.RetryAfter
	}
	if a.MinCPUShare == 0 {
		a.MinCPUShare = d.MinCPUShare
	}
}

// validate checks the admission keys; it only reads.
func (a AdmissionConfig) validate(bad complain) {
	if a.MaxInflight < 1 {
		bad("admission.max_inflight", "must be > 0, got %d", a.MaxInflight)
	}
	if a.MinInflight < 1 || a.MinInflight > a.MaxInflight {
		bad("admission.min_inflight", "must be in 1..admission.max_inflight (%d), got %d", a.MaxInflight, a.MinInflight)
	}
	if a.MinCPUShare > 1 || math.IsNaN(a.MinCPUShare) {
		bad("admission.min_cpu_share", "must be at most 1 (a share of the CPUs the edge may use; negative: off), got %v", a.MinCPUShare)
	}
	if a.RetryAfter < 0 {
		bad("admission.retry_after", "must be ≥ 0, got %s", a.RetryAfter)
	}
}
