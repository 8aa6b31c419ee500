package chaos

import (
	"net/http"
	"testing"
	"time"
)

// TestChaosPartitionedEdgesAnswer holds what a partition asks of
// the edges beyond 0 wrong: a partitioned minority edge refuses what it may
// not serve with Retry-After (or serves it), an edge cut from NATS serves,
// and a worker cut from the edges costs no request. Every request sent to
// the cut edge (after it reported itself not ready, for a minority) must be
// answered within probeTimeout by a 200 or a 503/429 carrying Retry-After;
// with a worker cut, no request may fail on every edge it tried, and
// every edge must hold the worker unreachable until the heal.
func TestChaosPartitionedEdgesAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process chaos: not in -short")
	}
	lab := newNetlab(t, segPeers, segNATS, segWork)
	v := newNetnsEnv(t, lab, envOptions{})
	for _, sc := range partitionScenarios {
		t.Run(sc.name, func(t *testing.T) {
			v.t = t
			defer func() { v.t = t }()
			res := runPartition(t, v, lab, sc, 8*time.Second)
			if res.probe == nil {
				if res.failed != 0 {
					t.Errorf("%d requests failed on every edge they tried while %s", res.failed, sc.name)
				}
				if w := res.cutWorker; w != nil {
					heldUnreachable(t, w)
				}
				return
			}
			from := res.cutAt
			if sc.minority {
				from = res.unreadyAt
			}
			res.probe.mu.Lock()
			defer res.probe.mu.Unlock()
			bad := 0
			for _, a := range res.probe.answers {
				if a.at.Before(from) || !a.at.Before(res.healAt) {
					continue
				}
				ok := a.status == http.StatusOK ||
					((a.status == http.StatusServiceUnavailable || a.status == http.StatusTooManyRequests) && a.retryAfter)
				if !ok {
					bad++
					if bad <= 5 {
						t.Errorf("sent %s after the cut: %d %s%s after %s", a.at.Sub(res.cutAt).Round(time.Millisecond), a.status, a.code, a.err, a.took.Round(time.Millisecond))
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d requests to the cut edge were neither served nor refused with Retry-After", bad)
			}
		})
	}
}

// heldUnreachable: every edge held the cut worker unreachable just before
// the heal (the load's keys on it reach every edge, each edge's first
// hops there fail or stall, and its probes keep failing while the cut
// lasts, so the mark never lapses).
func heldUnreachable(t *testing.T, w *workerCutFigures) {
	t.Helper()
	for id := range w.connects {
		if w.unreachable[id] != 1 {
			t.Errorf("%s did not hold the cut worker unreachable before the heal (tether_edge_instance_unreachable %v)", id, w.unreachable[id])
		}
	}
}
