package edge

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/natstest"
)

// An edge tells the others where it placed a new key as it dispatches it;
// a request for the key reaching another edge before that edge's replica
// has the Bind goes there too (policy followed) and proposes the same
// instance, instead of racing it with a placement of its own. Messages on
// the placement subject that do not decode are counted and ignored.
func TestHeardPlacementIsFollowed(t *testing.T) {
	ns := natstest.Start(t, nil)
	startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 1, ns.ClientURL(), nil)
	ec.waitInstances(4)
	te, c := ec.edge(0), httpClient(t)
	// Where this edge places a fresh conversation when nobody told it.
	probe := (&agent{session: "heard-probe", system: longText("heard", 20)}).send(t, c, te, "hello", nil)
	other := "ctx-0"
	if probe.ctxInst == other {
		other = "ctx-1"
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	data, err := telemetry.EncodePlacement(telemetry.Placement{Edge: "edge-elsewhere", Fleet: telemetry.FleetContext, Key: "heard-conv",
		ConversationID: "heard-conv", Instance: other, RequestID: "edge-elsewhere-1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(telemetry.PlacementSubject("edge-elsewhere"), data); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(telemetry.PlacementSubject("edge-elsewhere"), []byte(`{"v":1,"edge":"edge-elsewhere"}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the placement heard", 10*time.Second, func() bool {
		_, ok := te.e.placements.Heard(fsm.FleetContext, "heard-conv")
		return ok && counter(t, te.registry, "tether_edge_placement_messages_total", map[string]string{"result": "invalid"}) == 1
	})
	r := (&agent{session: "heard-conv", system: longText("heard", 20)}).send(t, c, te, "hello", nil)
	if r.ctxInst != other {
		t.Fatalf("served on %s, want the heard placement's %s (alone the edge picked %s for a fresh key)", r.ctxInst, other, probe.ctxInst)
	}
	if n := counter(t, te.registry, "tether_edge_routing_decisions_total", map[string]string{"fleet": "context", "policy": routing.PolicyFollowed}); n != 1 {
		t.Fatalf("followed decisions = %v, want 1", n)
	}
	b, ok := binding(t, c, te, fsm.FleetContext, "heard-conv")
	if !ok || b.Instance != other || b.Policy != routing.PolicyFollowed {
		t.Fatalf("binding %+v (found %v), want this edge's own Bind of the heard %s", b, ok, other)
	}
}
