package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/tether-project/tether/fsm"
)

// LogKind selects the affinity log model of sim mode.
type LogKind string

const (
	// LogVirtual: the log in virtual time with commit latency. Entries are
	// sequenced in proposal order (one leader), each commits a latency
	// drawn from CommitLatency after the previous commit at the earliest,
	// and every replica applies it at its commit time: an edge reads only
	// what has committed by then, and two edges binding one key before
	// either saw the other's Bind race, the first committed winning.
	LogVirtual LogKind = "virtual"
	// LogSequencer: the same with zero commit latency (every replica
	// applies an entry the instant it is proposed): the idealised log.
	LogSequencer LogKind = "sequencer"
)

// ParseLogKind parses --log.
func ParseLogKind(s string) (LogKind, error) {
	switch LogKind(s) {
	case LogVirtual, LogSequencer:
		return LogKind(s), nil
	case "raft":
		return "", fmt.Errorf("bench: --log raft is gone: a raft log stamps entries with wall time, and the edge judges idleness from committed times, so sim mode runs the log in virtual time with measured commit latency (--log virtual); e2e mode runs the real log")
	}
	return "", fmt.Errorf("bench: --log: unknown value %q (allowed: virtual, sequencer)", s)
}

// CommitLatency is the distribution of a proposal's commit latency: log-
// normal with the given median and 99th percentile.
type CommitLatency struct {
	P50, P99 time.Duration
}

// MeasuredCommitLatency is BenchmarkBindCommit/paced-5000 (BENCHMARKS.md:
// 3 nodes, loopback TCP, fsync on, 5,000 binds/s offered): p50 11.9 ms,
// p99 29.3 ms. The trace replays offer far fewer binds per second, so this
// overstates their latency somewhat; it is the measured figure closest to a
// paced load.
var MeasuredCommitLatency = CommitLatency{P50: 11900 * time.Microsecond, P99: 29300 * time.Microsecond}

func (c CommitLatency) validate() error {
	if c.P50 < 0 || c.P99 < c.P50 {
		return fmt.Errorf("commit latency needs 0 <= p50 <= p99, got p50 %v p99 %v", c.P50, c.P99)
	}
	return nil
}

// sample draws one latency (z is a standard normal deviate).
func (c CommitLatency) sample(z float64) time.Duration {
	if c.P50 <= 0 {
		return 0
	}
	sigma := 0.0
	if c.P99 > c.P50 {
		sigma = math.Log(float64(c.P99)/float64(c.P50)) / 2.3263478740
	}
	return time.Duration(float64(c.P50) * math.Exp(sigma*z))
}

// virtualLog is the affinity log in virtual time: a leader machine that
// orders and answers proposals, and one replica machine per edge that
// applies each entry at its commit time.
type virtualLog struct {
	leader   *fsm.Machine
	replicas []*replica
	latency  CommitLatency
	rnd      *rand.Rand
	index    uint64
	nextID   uint64
	commits  int
	last     time.Duration // the last entry's commit time
}

type replica struct {
	m       *fsm.Machine
	pending []timedEntry
}

type timedEntry struct {
	at    time.Duration
	entry fsm.Entry
}

func newVirtualLog(replicas int, latency CommitLatency, seed uint64) *virtualLog {
	l := &virtualLog{leader: fsm.NewMachine(), latency: latency, rnd: rand.New(rand.NewPCG(seed, 0x6c6f67))}
	for i := 0; i < replicas; i++ {
		l.replicas = append(l.replicas, &replica{m: fsm.NewMachine()})
	}
	return l
}

// State is edge e's replica at virtual time now: every entry committed by
// then applied.
func (l *virtualLog) State(edge int, now time.Duration) (*fsm.State, error) {
	r := l.replicas[edge]
	k := 0
	for k < len(r.pending) && r.pending[k].at <= now {
		if _, err := r.m.Apply(r.pending[k].entry); err != nil {
			return nil, fmt.Errorf("bench: log: replica %d: apply entry %d: %w", edge, r.pending[k].entry.Index, err)
		}
		k++
	}
	r.pending = r.pending[k:]
	return r.m.State(), nil
}

// Propose orders evs after every earlier proposal and returns their results
// (the leader's) and the virtual time the entry commits at.
func (l *virtualLog) Propose(now time.Duration, evs []fsm.Event) ([]fsm.Result, time.Duration, error) {
	props := make([]fsm.Proposal, len(evs))
	for i, ev := range evs {
		l.nextID++
		var id fsm.ProposalID
		for b := 0; b < 8; b++ {
			id[b] = byte(l.nextID >> (8 * b))
		}
		props[i] = fsm.Proposal{ID: id, Event: ev}
	}
	data, err := fsm.EncodeEntry(props)
	if err != nil {
		return nil, 0, fmt.Errorf("bench: log: %w", err)
	}
	at := max(now+l.latency.sample(l.rnd.NormFloat64()), l.last)
	l.last = at
	l.index++
	entry := fsm.Entry{Index: l.index, Time: epoch.Add(at).UnixNano(), Data: data}
	out, err := l.leader.Apply(entry)
	if err != nil {
		return nil, 0, fmt.Errorf("bench: log: apply entry %d: %w", l.index, err)
	}
	for _, r := range l.replicas {
		r.pending = append(r.pending, timedEntry{at: at, entry: entry})
	}
	l.commits += len(evs)
	return out, at, nil
}

// Commits counts the events committed.
func (l *virtualLog) Commits() int { return l.commits }
