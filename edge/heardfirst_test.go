package edge

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
)

// Two edges placed the same new key on different instances (the second
// had not heard the first: NATS was slower than the client's next turn).
// An edge that heard both before its replica has the Bind follows the
// first placement, the one proposed first, not the racer's: before the
// Bind commits, an edge that heard the first edge's placement follows it.
// Following the newest placement instead moved the conversation's next
// turn through this edge onto the racer's instance, which the first
// committed Bind then contradicted.
func TestFirstHeardPlacementIsFollowed(t *testing.T) {
	ns := natstest.Start(t, nil)
	startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 1, ns.ClientURL(), nil)
	ec.waitInstances(4)
	te, c := ec.edge(0), httpClient(t)
	probe := (&agent{session: "first-heard-probe", system: longText("first", 20)}).send(t, c, te, "hello", nil)
	first, racer := "ctx-0", probe.ctxInst
	if racer == first {
		first = "ctx-1"
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, pl := range []telemetry.Placement{
		{Edge: "edge-first", Fleet: telemetry.FleetContext, Key: "raced-conv", ConversationID: "raced-conv", Instance: first, RequestID: "edge-first-1"},
		{Edge: "edge-racer", Fleet: telemetry.FleetContext, Key: "raced-conv", ConversationID: "raced-conv", Instance: racer, RequestID: "edge-racer-1"},
	} {
		data, err := telemetry.EncodePlacement(pl)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(telemetry.PlacementSubject(pl.Edge), data); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both placements heard", 10*time.Second, func() bool {
		return counter(t, te.registry, "tether_edge_placement_messages_total", map[string]string{"result": "heard"}) == 2
	})
	if b, ok := te.e.placements.Heard(fsm.FleetContext, "raced-conv"); !ok || b.Instance != first || b.Decision.Edge != "edge-first" {
		t.Fatalf("heard %+v (found %v), want edge-first's placement on %s", b, ok, first)
	}
	r := (&agent{session: "raced-conv", system: longText("first", 20)}).send(t, c, te, "hello", nil)
	if r.ctxInst != first {
		t.Fatalf("served on %s, want the first heard placement's %s (the racer placed it on %s)", r.ctxInst, first, racer)
	}
}
