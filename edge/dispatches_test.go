package edge

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
)

// An edge tells the others each request it sends to a worker (instance and
// prompt tokens, on its own subject) and again when it ended, and counts
// theirs; its own messages and malformed ones are not counted as heard.
func TestDispatchesAreToldAndHeard(t *testing.T) {
	ns := natstest.Start(t, nil)
	startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 1, ns.ClientURL(), nil)
	ec.waitInstances(4)
	te, c := ec.edge(0), httpClient(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	told := make(chan telemetry.Dispatch, 16)
	if _, err := nc.Subscribe(telemetry.DispatchSubjectAll, func(m *nats.Msg) {
		// (Answers travel on the subject too: edge/fleetview grade.go.)
		if d, err := telemetry.DecodeDispatch(m.Subject, m.Data); err == nil && d.Edge != "edge-elsewhere" && d.Answer == nil {
			told <- d
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	r := (&agent{session: "dispatch-conv", system: longText("dispatch", 20)}).send(t, c, te, "hello", nil)
	seen, ended := map[string]telemetry.Dispatch{}, map[uint64]bool{}
	deadline := time.After(10 * time.Second)
	for len(seen) < 2 || len(ended) < 2 {
		select {
		case d := <-told:
			if d.Done {
				ended[d.ID] = true
			} else {
				seen[d.Instance] = d
			}
		case <-deadline:
			t.Fatalf("dispatches told: %+v, ended %v; want the context hop to %s and the generation hop to %s, each ended", seen, ended, r.ctxInst, r.gen)
		}
	}
	for _, d := range seen {
		if !ended[d.ID] {
			t.Fatalf("dispatch %+v told, its end not (ended: %v)", d, ended)
		}
	}
	ctx, gen := seen[r.ctxInst], seen[r.gen]
	if ctx.Edge != te.cfg.Cluster.NodeID || ctx.Fleet != telemetry.FleetContext || ctx.PromptTokens <= 0 ||
		gen.Fleet != telemetry.FleetGeneration || gen.PromptTokens != ctx.PromptTokens {
		t.Fatalf("dispatches told %+v, want this edge's context hop to %s and generation hop to %s with the prompt's tokens", seen, r.ctxInst, r.gen)
	}
	if n := counter(t, te.registry, "tether_edge_dispatch_messages_total", map[string]string{"result": "heard"}); n != 0 {
		t.Fatalf("heard %v dispatches: its own were counted", n)
	}

	data, err := telemetry.EncodeDispatch(telemetry.Dispatch{Edge: "edge-elsewhere", Fleet: telemetry.FleetContext, Instance: r.ctxInst, PromptTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range [][]byte{data, []byte(`{"v":1,"edge":"edge-elsewhere"}`)} {
		if err := nc.Publish(telemetry.DispatchSubject("edge-elsewhere"), m); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the other edge's dispatch heard and the malformed one refused", 10*time.Second, func() bool {
		return counter(t, te.registry, "tether_edge_dispatch_messages_total", map[string]string{"result": "heard"}) == 1 &&
			counter(t, te.registry, "tether_edge_dispatch_messages_total", map[string]string{"result": "invalid"}) == 1
	})
}
