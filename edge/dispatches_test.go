package edge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
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
	// Each hop carries its entry in the edge's working sets, for the
	// others: the conversation and the prompt's blocks.
	if !strings.HasSuffix(ctx.Work, "dispatch-conv") || !strings.HasPrefix(ctx.Work, "context/") || ctx.Blocks <= 0 ||
		!strings.HasPrefix(gen.Work, "generation/") || gen.Blocks != ctx.Blocks {
		t.Fatalf("working-set entries told: context %q %d blocks, generation %q %d; want dispatch-conv's on each fleet", ctx.Work, ctx.Blocks, gen.Work, gen.Blocks)
	}
	m := te.e.catalogue.First()
	before := m.Decider.WorkingSet(m.Routers[fsm.FleetContext], r.ctxInst, time.Now())

	data, err := telemetry.EncodeDispatch(telemetry.Dispatch{Edge: "edge-elsewhere", Fleet: telemetry.FleetContext, Instance: r.ctxInst, PromptTokens: 64,
		Work: "context/elsewhere-conv", Blocks: 7})
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
	// Its route counts in this edge's working set of the instance.
	waitFor(t, "the heard route in the working set", 10*time.Second, func() bool {
		got := m.Decider.WorkingSet(m.Routers[fsm.FleetContext], r.ctxInst, time.Now())
		return got.Keys == before.Keys+1 && got.Blocks == before.Blocks+7
	})
}

// An edge whose NATS peer is cut off (the socket open, nothing passing)
// serves on: a request's dispatch and placement messages are queued for
// the edge's publisher, never sent on the request's goroutine, where they
// waited on the connection's lock while nats.go's flusher wrote to the
// stalled socket (up to its write timeout, a minute by default).
func TestRequestsDoNotWaitOnAStalledNATSConnection(t *testing.T) {
	ns := natstest.Start(t, nil)
	proxy := natstest.NewStallProxy(t, ns.Addr().String())
	startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 1, "nats://"+proxy.Addr(), nil)
	ec.waitInstances(4)
	te, c := ec.edge(0), httpClient(t)
	(&agent{session: "stall-before", system: longText("stall", 20)}).send(t, c, te, "hello", nil)

	proxy.Stall()
	// Fill the socket's buffers from the edge's own connection: its writer
	// then blocks with the connection's lock held.
	conn := te.e.nats.conn
	go func() {
		big := bytes.Repeat([]byte("x"), 512<<10)
		for range 128 {
			if conn.Publish("stall.fill", big) != nil {
				return
			}
		}
	}()
	waitFor(t, "the stalled connection's lock held by a blocked write", 20*time.Second, func() bool {
		done := make(chan struct{})
		go func() { conn.IsConnected(); close(done) }()
		select {
		case <-done:
			return false
		case <-time.After(200 * time.Millisecond):
			return true
		}
	})
	client := &http.Client{Transport: c.Transport, Timeout: 15 * time.Second}
	for i, session := range []string{"stall-before", "stall-new-1", "stall-new-2"} {
		body := chatBody(t, longText("stall", 20), []string{"hello", fmt.Sprintf("turn %d", i)}, nil)
		req, _ := http.NewRequest(http.MethodPost, te.url()+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-session-id", session)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s with the NATS connection stalled: %v", session, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s with the NATS connection stalled: %d %s", session, resp.StatusCode, b)
		}
	}
}

// Three edges: a conversation one edge routes is in every edge's working
// set of the instances it went to (told with its dispatches), as the
// others' admin API shows and their placement weighs.
func TestEdgesShareTheirWorkingSets(t *testing.T) {
	ns := natstest.Start(t, nil)
	startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 3, ns.ClientURL(), nil)
	ec.waitInstances(4)
	c := httpClient(t)
	r := (&agent{session: "shared-ws", system: longText("shared-ws", 20)}).send(t, c, ec.edge(0), "hello", nil)
	for i := range 3 {
		te := ec.edge(i)
		waitFor(t, "shared-ws in the working sets of "+te.cfg.Cluster.NodeID, 10*time.Second, func() bool {
			var inst struct {
				Instances []admin.InstanceInfo `json:"instances"`
			}
			if err := json.Unmarshal(adminGet(t, c, te, "/admin/v1/instances").body, &inst); err != nil {
				t.Fatal(err)
			}
			held := 0
			for _, in := range inst.Instances {
				switch {
				case in.ID == r.ctxInst || in.ID == r.gen:
					if in.WorkingSet.Conversations == 1 && in.WorkingSet.Blocks > 0 {
						held++
					}
				case in.WorkingSet.Conversations != 0:
					t.Fatalf("%s: %s holds a working set %+v; shared-ws went to %s and %s", te.cfg.Cluster.NodeID, in.ID, in.WorkingSet, r.ctxInst, r.gen)
				}
			}
			return held == 2
		})
	}
}
