package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/natstest"
)

// An edge whose state lags the log must not place an
// already-bound key by degraded rendezvous. Edge C is stopped; keys are
// bound through the others; the others die (no quorum) and C restarts on
// its old data directory: its state lacks the bindings and no leader can
// tell it otherwise. A request for a bound key on C is answered 503 with
// Retry-After (before the fix: placed on the rendezvous instance, which
// differs from the binding), C's /readyz says why it is not ready, and
// once the others are back C catches up and routes the key to its
// binding.
func TestLaggingEdgeDoesNotGuessBoundKeys(t *testing.T) {
	ns := natstest.Start(t, nil)
	fleet := startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 3, ns.ClientURL(), func(i int, c *Config) {
		c.Cluster.ProposeTimeout = 300 * time.Millisecond
		c.Cluster.DegradedPlacementWindow = time.Minute // the lag, not the silence, must refuse
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
	upCtx := upInstances(ec.edge(lagging).e, fsm.FleetContext)
	ec.kill(lagging)

	// Bind conversations through the two live edges until one is bound
	// elsewhere than where rendezvous would put it.
	var key, bound string
	for i := 0; i < 16 && key == ""; i++ {
		a := &agent{session: fmt.Sprintf("lag-conv-%d", i), system: longText(fmt.Sprintf("lag%d", i), 20)}
		r := a.send(t, c, ec.edge(leader), "hello", nil)
		if r.ctxInst != routing.Rendezvous(a.session, upCtx) {
			key, bound = a.session, r.ctxInst
		}
	}
	if key == "" {
		t.Fatal("every bound key landed on its rendezvous instance: cannot tell a guess from the binding")
	}
	guess := routing.Rendezvous(key, upCtx)
	seenBefore := len(requestsFor(fleet.byID(guess), key))

	ec.kill(leader)
	ec.kill(other)
	if err := ec.start(lagging, nil); err != nil {
		t.Fatalf("restart the lagging edge: %v", err)
	}
	te := ec.edge(lagging)
	ec.waitInstances(4) // it hears the workers (only the leaderless log is missing)
	if _, ok := te.e.Node().State().Lookup(fsm.FleetContext, key); ok {
		t.Fatal("premise: the restarted edge's state already holds the binding")
	}

	body := chatBody(t, longText("lag-again", 20), []string{"next"}, nil)
	r := do(t, c, http.MethodPost, te.url()+"/v1/chat/completions", body, map[string]string{"x-session-id": key})
	if r.status == http.StatusOK {
		ci, _ := routeOf(t, r)
		t.Fatalf("the lagging edge served bound key %s on %s (bound to %s): a degraded guess", key, ci, bound)
	}
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || r.header.Get("Retry-After-Ms") == "" {
		t.Fatalf("want 503 with Retry-After, got %d %v: %s", r.status, r.header, r.body)
	}
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Code != "affinity_state_unknown" || !strings.Contains(e.Error.Message, "caught up") {
		t.Fatalf("error body %s (%v)", r.body, err)
	}
	if n := len(requestsFor(fleet.byID(guess), key)); n != seenBefore {
		t.Fatalf("the rendezvous instance %s received %s (%d requests)", guess, key, n-seenBefore)
	}
	rr := do(t, c, http.MethodGet, te.url()+"/readyz", nil, nil)
	if rr.status != http.StatusServiceUnavailable || !strings.Contains(string(rr.body), "no leader has answered since this edge started") {
		t.Fatalf("/readyz of the lagging edge: %d %s", rr.status, rr.body)
	}

	// Quorum back: the lagging edge catches up, becomes ready and routes
	// the key to its binding.
	for _, i := range []int{leader, other} {
		if err := ec.start(i, nil); err != nil {
			t.Fatalf("restart edge %d: %v", i+1, err)
		}
	}
	waitFor(t, "the restarted edge ready", 20*time.Second, func() bool {
		return do(t, c, http.MethodGet, te.url()+"/readyz", nil, nil).status == http.StatusOK
	})
	if b, ok := te.e.Node().State().Lookup(fsm.FleetContext, key); !ok || b.Instance != bound {
		t.Fatalf("ready before catching up: binding %+v (found %v), want %s", b, ok, bound)
	}
	r = do(t, c, http.MethodPost, te.url()+"/v1/chat/completions", body, map[string]string{"x-session-id": key})
	if ci, _ := routeOf(t, r); r.status != http.StatusOK || ci != bound {
		t.Fatalf("after catching up: %d on %s, want %s: %s", r.status, ci, bound, r.body)
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

// requestsFor is what w received for conversation conv.
func requestsFor(w *testWorker, conv string) []seenRequest {
	var out []seenRequest
	for _, r := range w.requests() {
		if r.conversationID() == conv {
			out = append(out, r)
		}
	}
	return out
}
