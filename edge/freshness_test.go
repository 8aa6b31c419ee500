package edge

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/natstest"
)

// An edge whose state lags the log places a key it does not know is bound
// by its own decision — never a 503 for soft affinity — counted degraded,
// and its /readyz says why it is not ready (a load balancer sends it
// nothing). Edge C is stopped; keys are bound through the others; the
// others die (no quorum) and C restarts on its old data directory: its
// state lacks the bindings and no leader can tell it otherwise. Once the
// others are back, C's proposal is answered with the binding the log
// already held (superseded) and the key's next request goes there.
func TestLaggingEdgeDoesNotGuessBoundKeys(t *testing.T) {
	ns := natstest.Start(t, nil)
	startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 3, ns.ClientURL(), func(i int, c *Config) {
		c.Cluster.ProposeTimeout = 300 * time.Millisecond
		c.Cluster.DegradedPlacementWindow = time.Minute // the lag, not the silence, must count
	})
	ec.waitInstances(4)
	c := httpClient(t)
	waitFor(t, "four instances up in every edge's log", 10*time.Second, func() bool {
		for i := range 3 {
			if len(upInstances(ec.edge(i).e, fsm.FleetContext)) != 2 || len(upInstances(ec.edge(i).e, fsm.FleetGeneration)) != 2 {
				return false
			}
		}
		return true
	})
	leader := ec.leader(10 * time.Second)
	lagging := (leader + 1) % 3
	other := (leader + 2) % 3
	// A snapshot makes the restarted edge start from a state that knows
	// the instances (Raft restores it; entries after it wait for a leader).
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := ec.edge(lagging).e.Node().Snapshot(sctx); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	cancel()
	ec.kill(lagging)

	// Bind conversations through the two live edges.
	var keys []string
	bound := map[string]string{}
	for i := range 4 {
		a := &agent{session: fmt.Sprintf("lag-conv-%d", i), system: longText(fmt.Sprintf("lag%d", i), 20)}
		r := a.send(t, c, ec.edge(leader), "hello", nil)
		keys = append(keys, a.session)
		bound[a.session] = r.ctxInst
	}
	waitFor(t, "the bindings committed", 10*time.Second, func() bool {
		for _, k := range keys {
			if _, ok := ec.edge(other).e.Node().State().Lookup(fsm.FleetContext, k); !ok {
				return false
			}
		}
		return true
	})

	ec.kill(leader)
	ec.kill(other)
	if err := ec.start(lagging); err != nil {
		t.Fatalf("restart the lagging edge: %v", err)
	}
	te := ec.edge(lagging)
	ec.waitInstances(4) // it hears the workers (only the leaderless log is missing)
	for _, k := range keys {
		if _, ok := te.e.Node().State().Lookup(fsm.FleetContext, k); ok {
			t.Fatal("premise: the restarted edge's state already holds a binding")
		}
	}
	served := map[string]string{}
	for _, k := range keys {
		body := chatBody(t, longText("lag-again", 20), []string{"next"}, nil)
		r := do(t, c, http.MethodPost, te.url()+"/v1/chat/completions", body, map[string]string{"x-session-id": k})
		if r.status != http.StatusOK {
			t.Fatalf("the lagging edge refused soft affinity for %s: %d %s", k, r.status, r.body)
		}
		served[k], _ = routeOf(t, r)
	}
	if n := counter(t, te.registry, "tether_edge_routing_decisions_total", map[string]string{"fleet": "context", "outcome": routing.OutcomeDegraded}); n < float64(len(keys)) {
		t.Fatalf("degraded context decisions = %v, want >= %d", n, len(keys))
	}
	if n := counter(t, te.registry, "tether_edge_degraded_decisions_total", map[string]string{"fleet": "context", "cause": routing.DegradedStateNotCurrent}); n < float64(len(keys)) {
		t.Fatalf("context decisions degraded for a state not current = %v, want >= %d", n, len(keys))
	}
	rr := do(t, c, http.MethodGet, te.url()+"/readyz", nil, nil)
	if rr.status != http.StatusServiceUnavailable || !strings.Contains(string(rr.body), "no leader has answered since this edge started") {
		t.Fatalf("/readyz of the lagging edge: %d %s", rr.status, rr.body)
	}

	// Quorum back: the lagging edge catches up; its proposals are answered
	// with the bindings the log held, and each key's next request goes to
	// its binding.
	for _, i := range []int{leader, other} {
		if err := ec.start(i); err != nil {
			t.Fatalf("restart edge %d: %v", i+1, err)
		}
	}
	waitFor(t, "the restarted edge ready", 20*time.Second, func() bool {
		return do(t, c, http.MethodGet, te.url()+"/readyz", nil, nil).status == http.StatusOK
	})
	for _, k := range keys {
		if b, ok := te.e.Node().State().Lookup(fsm.FleetContext, k); !ok || b.Instance != bound[k] {
			t.Fatalf("ready before catching up: binding %+v (found %v), want %s", b, ok, bound[k])
		}
		body := chatBody(t, longText("lag-again", 20), []string{"next", "again"}, nil)
		r := do(t, c, http.MethodPost, te.url()+"/v1/chat/completions", body, map[string]string{"x-session-id": k})
		if ci, _ := routeOf(t, r); r.status != http.StatusOK || ci != bound[k] {
			t.Fatalf("after catching up: %d on %s, want %s: %s", r.status, ci, bound[k], r.body)
		}
	}
	waitFor(t, "the lagging edge's proposals answered", 20*time.Second, func() bool {
		return te.e.placements.InFlight() == 0
	})
	off := 0
	for _, k := range keys {
		if served[k] != bound[k] {
			off++
		}
	}
	if n := counter(t, te.registry, "tether_edge_speculative_requests_total", map[string]string{"fleet": "context", "result": "off_binding"}); int(n) != off {
		t.Fatalf("off_binding = %v, want %d (served %v, bound %v)", n, off, served, bound)
	}
}

func upInstances(e *Edge, f fsm.Fleet) []string {
	var out []string
	for _, in := range e.Node().State().Instances() {
		if in.Fleet == f && in.Status == fsm.InstanceUp {
			out = append(out, in.ID)
		}
	}
	return out
}
