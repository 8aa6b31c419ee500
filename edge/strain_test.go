package edge

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
)

// An edge tells the others each transition of its overload history (an
// instance becoming unable to take its bound keys, or able again), and an
// edge that routed nothing counts the strain from what it heard: here a
// worker only edge 1 cannot reach (its connects refused) is a strain edge 1
// sees and edge 2 hears, until edge 1 reaches it again.
func TestOverloadHistoryIsToldAndHeard(t *testing.T) {
	ns := natstest.Start(t, nil)
	var ctxs []*testWorker
	for i := range 2 {
		ctxs = append(ctxs, startWorker(t, fmt.Sprintf("ctx-%d", i), workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext, nats: ns.ClientURL()}))
		startWorker(t, fmt.Sprintf("gen-%d", i), workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration, nats: ns.ClientURL()})
	}
	cn := newCutNet()
	ec := startEdgesDeferred(t, 2, ns.ClientURL(), nil, func(i int) Deps {
		if i == 0 {
			return Deps{Transport: cn.tr}
		}
		return Deps{}
	})
	ec.waitInstances(4)
	seer, hearer, c := ec.edge(0), ec.edge(1), httpClient(t)

	bound := &agent{session: "strain-bound", system: longText("strain", 24)}
	victim := bound.send(t, c, seer, "one", nil).ctxInst
	if _, ok := hearer.e.router.OverloadedSince(victim); ok {
		t.Fatalf("%s strained on the other edge before any strain", victim)
	}
	for _, w := range ctxs {
		if w.id == victim {
			cn.cut(w, "refuse", nil)
		}
	}
	bound.send(t, c, seer, "two", nil) // its connect fails: marked unreachable on edge 1
	bound.send(t, c, seer, "three", nil)
	since, ok := seer.e.router.OverloadedSince(victim)
	if !ok {
		t.Fatalf("edge 1 routed past the unreachable %s without counting it strained", victim)
	}
	waitFor(t, "the strain heard on the other edge", 30*time.Second, func() bool {
		_, ok := hearer.e.router.OverloadedSince(victim)
		return ok
	})
	heard, _ := hearer.e.router.OverloadedSince(victim)
	if heard.Before(since) {
		t.Fatalf("heard strain since %v, before the seer's %v", heard, since)
	}
	var out struct{ Instances []admin.InstanceInfo }
	if err := json.Unmarshal(adminGet(t, c, hearer, "/admin/v1/instances").body, &out); err != nil {
		t.Fatal(err)
	}
	for _, in := range out.Instances {
		if (in.ID == victim) != (in.OverloadedSince != nil) {
			t.Fatalf("admin on the hearing edge: %s overloaded_since %v, want it set for %s only", in.ID, in.OverloadedSince, victim)
		}
	}

	// A strain one edge alone sees (here it alone cannot reach the
	// instance) is ended by an edge whose own view finds the instance
	// well, as one edge routing both edges' requests would: the seer's
	// clock starts again from its next sight, so an edge's local fault
	// does not count toward rebind_after on the fleet's behalf.
	other := &agent{session: "strain-other", system: longText("other", 24)}
	waitFor(t, "the hearer's sight of a well instance told to the seer", 30*time.Second, func() bool {
		other.send(t, c, hearer, "again", nil) // builds edge 2's views
		s, ok := seer.e.router.OverloadedSince(victim)
		return !ok || s.After(since)
	})

	for _, w := range ctxs {
		if w.id == victim {
			cn.cut(w, "", nil)
		}
	}
	waitFor(t, "the strain's end seen and heard", 30*time.Second, func() bool {
		bound.send(t, c, seer, "again", nil) // builds edge 1's views
		_, seen := seer.e.router.OverloadedSince(victim)
		_, heard := hearer.e.router.OverloadedSince(victim)
		return !seen && !heard
	})
}
