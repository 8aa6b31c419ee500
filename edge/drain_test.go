package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
)

func drainCall(t testing.TB, c *http.Client, te *testEdge, instance, op string, headers map[string]string) response {
	t.Helper()
	if headers == nil {
		headers = map[string]string{"Authorization": "Bearer " + testAdmin}
	}
	return do(t, c, http.MethodPost, te.url()+"/admin/v1/instances/"+url.PathEscape(instance)+"/"+op, nil, headers)
}

func instanceInfo(t testing.TB, c *http.Client, te *testEdge, id string) (admin.InstanceInfo, bool) {
	t.Helper()
	var out struct {
		Instances []admin.InstanceInfo `json:"instances"`
	}
	if err := json.Unmarshal(adminGet(t, c, te, "/admin/v1/instances").body, &out); err != nil {
		t.Fatal(err)
	}
	for _, in := range out.Instances {
		if in.ID == id {
			return in, true
		}
	}
	return admin.InstanceInfo{}, false
}

// drainedOn reports whether te's replica records id drained as want.
func drainedOn(te *testEdge, id string, want bool) bool {
	rec, ok := te.e.Node().State().Instance(id)
	return ok && rec.Drained == want
}

// An operator drains a context instance through one edge's admin API:
// every edge records it (the log), no new conversation lands there, each
// conversation bound to it moves on its next turn with a rebind of reason
// drained (history and evidence say so), and the mark survives what the
// leader records from telemetry (the worker's own draining report when it
// stops, its return at a new URL), a leader change and an edge restart,
// until an undrain ends it.
func TestOperatorDrain(t *testing.T) {
	ns := natstest.Start(t, nil)
	fl := startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 3, ns.ClientURL(), nil)
	ec.waitInstances(4)
	c := httpClient(t)
	for i := range 3 {
		waitFor(t, "feature level 3 committed", 10*time.Second, func() bool {
			return ec.edge(i).e.Node().State().FeatureLevel() == fsm.FeatureLevelMax
		})
	}

	agents := make([]*agent, 6)
	first := make([]turnResult, len(agents))
	for i := range agents {
		agents[i] = &agent{session: fmt.Sprintf("drain-conv-%d", i), system: longText(fmt.Sprintf("drain%d", i), 24)}
		first[i] = agents[i].send(t, c, ec.edge(i%3), "hello", nil)
	}
	home := first[0].ctxInst
	var onHome []int
	for i, f := range first {
		if f.ctxInst == home {
			onHome = append(onHome, i)
		}
	}

	// Through a follower: the proposal is forwarded to the leader.
	via := ec.edge((ec.leader(10*time.Second) + 1) % 3)
	r := drainCall(t, c, via, home, "drain", nil)
	var dr admin.DrainResult
	if r.status != http.StatusOK || json.Unmarshal(r.body, &dr) != nil {
		t.Fatalf("drain %s: %d %s", home, r.status, r.body)
	}
	if dr.Instance != home || !dr.Drained || !dr.Changed || dr.DrainedSince == nil || dr.LogStatus != "up" || dr.Bindings < len(onHome) {
		t.Fatalf("drain answer %+v (%d conversations bound there)", dr, len(onHome))
	}
	for i := range 3 {
		te := ec.edge(i)
		waitFor(t, "the drain on "+te.cfg.Cluster.NodeID, 10*time.Second, func() bool { return drainedOn(te, home, true) })
		in, ok := instanceInfo(t, c, te, home)
		if !ok || !in.Drained || !in.Draining || in.LogStatus != "up" || in.DrainedSince == nil {
			t.Fatalf("%s lists %s as %+v", te.cfg.Cluster.NodeID, home, in)
		}
		if v := counter(t, te.registry, "tether_edge_instance_draining", map[string]string{"instance": home}); v != 1 {
			t.Fatalf("%s: tether_edge_instance_draining{instance=%s} = %v", te.cfg.Cluster.NodeID, home, v)
		}
	}
	if r := drainCall(t, c, ec.edge(0), home, "drain", nil); r.status != http.StatusOK || json.Unmarshal(r.body, &dr) != nil || dr.Changed {
		t.Fatalf("a second drain: %d %s, want 200 with changed false", r.status, r.body)
	}

	// No new conversation goes there.
	for i := range 8 {
		a := &agent{session: fmt.Sprintf("drain-new-%d", i), system: longText(fmt.Sprintf("new%d", i), 20)}
		if r := a.send(t, c, ec.edge(i%3), "hi", nil); r.ctxInst == home {
			t.Fatalf("%s was placed on the drained %s", a.session, home)
		}
	}

	// Each conversation on it moves on its next turn, for every edge. A
	// move is an overflow committed before the turn is served; when the log
	// cannot commit it in time (a starved host), the drained instance keeps
	// the turn, as a drain never fails a request, and a later turn moves.
	moved := map[string]string{}
	for _, i := range onHome {
		a := agents[i]
		r := a.send(t, c, ec.edge((i+1)%3), "next", nil)
		for try := 1; r.ctxInst == home; try++ {
			if try == 5 {
				t.Fatalf("%s stayed on the drained %s for %d turns", a.session, home, try)
			}
			t.Logf("%s: turn %d stayed on the drained %s (its overflow did not commit in time)", a.session, try, home)
			r = a.send(t, c, ec.edge((i+1)%3), "next", nil)
		}
		moved[a.session] = r.ctxInst
		for j := range 3 {
			waitFor(t, "the moved binding on every edge", 10*time.Second, func() bool {
				b, ok := binding(t, c, ec.edge(j), fsm.FleetContext, a.session)
				return ok && b.Instance == r.ctxInst
			})
		}
		// The turn after stays where it went.
		if again := a.send(t, c, ec.edge(i%3), "and again", nil); again.ctxInst != r.ctxInst {
			t.Fatalf("%s moved again: %s, then %s", a.session, r.ctxInst, again.ctxInst)
		}
	}
	// The history says why: a rebind with reason drained, and the evidence
	// names the drained instance it left.
	key := agents[onHome[0]].session
	waitFor(t, "the drained move and its evidence in the history", 10*time.Second, func() bool {
		var hist struct {
			Events []struct {
				Type   string         `json:"type"`
				Status string         `json:"status"`
				Event  map[string]any `json:"event"`
			} `json:"events"`
		}
		if err := json.Unmarshal(adminGet(t, c, ec.edge(0), "/admin/v1/bindings/context/"+key+"/history").body, &hist); err != nil {
			t.Fatal(err)
		}
		overflow, evidence := false, false
		for _, h := range hist.Events {
			switch h.Type {
			case "Overflow":
				overflow = overflow || h.Status == "applied" && h.Event["reason"] == "drained" && h.Event["rebind"] == true &&
					h.Event["from"] == home && h.Event["to"] == moved[key]
			case "Evidence":
				if h.Event["rule"] != "overflow:drained" {
					continue
				}
				cands, _ := h.Event["candidates"].([]any)
				for _, x := range cands {
					cand, _ := x.(map[string]any)
					state, _ := cand["state"].([]any)
					if cand["instance"] == home && slices.Contains(state, any("bound")) && slices.Contains(state, any("draining")) {
						evidence = true
					}
				}
			}
		}
		return overflow && evidence
	})

	// The worker stops (its own draining report, which the leader records)
	// and comes back under the same id at a new URL: the leader's instance
	// states change the record's status and URL, never the drain.
	w := fl.ctx[slices.IndexFunc(fl.ctx, func(w *testWorker) bool { return w.id == home })]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	leaderState := func() *fsm.State { return ec.edge(ec.leader(10 * time.Second)).e.Node().State() }
	waitFor(t, "the stopped worker's own draining (or down) recorded", 15*time.Second, func() bool {
		rec, _ := leaderState().Instance(home)
		return rec.Status == fsm.InstanceDraining || rec.Status == fsm.InstanceDown
	})
	if rec, _ := leaderState().Instance(home); !rec.Drained {
		t.Fatalf("the worker's own draining undid the operator's drain: %+v", rec)
	}
	back := startWorker(t, home, workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext, nats: ns.ClientURL()})
	waitFor(t, "the worker back up at its new URL", 15*time.Second, func() bool {
		rec, _ := leaderState().Instance(home)
		return rec.Status == fsm.InstanceUp && rec.URL == back.proxy.URL
	})
	if rec, _ := leaderState().Instance(home); !rec.Drained {
		t.Fatalf("the worker's return undid the operator's drain: %+v", rec)
	}

	// Leadership moves, and an edge restarts on its data: the mark stays.
	old := ec.leader(10 * time.Second)
	if err := ec.edge(old).e.Node().TransferLeadership(ctx, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new leader", 15*time.Second, func() bool {
		for i := range 3 {
			if te := ec.edge(i); i != old && te.e != nil && te.e.Node().IsLeader() {
				return true
			}
		}
		return false
	})
	restarted := old
	ec.kill(restarted)
	if err := ec.start(restarted); err != nil {
		t.Fatal(err)
	}
	ec.waitInstances(4)
	// The restarted edge applies its log again once it hears the leader's
	// commit index: the mark comes back with it.
	for i := range 3 {
		te := ec.edge(i)
		waitFor(t, te.cfg.Cluster.NodeID+" has the drain after the leader change and restart", 15*time.Second, func() bool {
			return drainedOn(te, home, true)
		})
	}
	for i := range 4 {
		a := &agent{session: fmt.Sprintf("drain-later-%d", i), system: longText(fmt.Sprintf("later%d", i), 20)}
		if r := a.send(t, c, ec.edge(i%3), "hi", nil); r.ctxInst == home {
			t.Fatalf("%s was placed on the drained %s after the leader change", a.session, home)
		}
	}

	// Undrain: every edge agrees, and new conversations may go there again.
	if r := drainCall(t, c, ec.edge(restarted), home, "undrain", nil); r.status != http.StatusOK || json.Unmarshal(r.body, &dr) != nil || dr.Drained || !dr.Changed {
		t.Fatalf("undrain: %d %s", r.status, r.body)
	}
	for i := range 3 {
		te := ec.edge(i)
		waitFor(t, "the undrain on "+te.cfg.Cluster.NodeID, 10*time.Second, func() bool { return drainedOn(te, home, false) })
		waitFor(t, "the undrained instance in the list and the metric", 10*time.Second, func() bool {
			in, ok := instanceInfo(t, c, te, home)
			return ok && !in.Drained && !in.Draining && in.DrainedSince == nil &&
				counter(t, te.registry, "tether_edge_instance_draining", map[string]string{"instance": home}) == 0
		})
	}
	landed := false
	for i := 0; i < 12 && !landed; i++ {
		a := &agent{session: fmt.Sprintf("drain-after-%d", i), system: longText(fmt.Sprintf("after%d", i), 20)}
		landed = a.send(t, c, ec.edge(i%3), "hi", nil).ctxInst == home
	}
	if !landed {
		t.Fatalf("no new conversation went to %s after the undrain (it holds the fewest bindings)", home)
	}
}

// The drain endpoints answer operator mistakes plainly: no token, the
// wrong method, an unknown instance or operation, and a cluster whose
// committed feature level predates drains (an edge of the previous release
// among the voters could not apply the event).
func TestDrainAdminErrors(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	waitFor(t, "feature level 3 and ctx-0 in the log", 10*time.Second, func() bool {
		st := s.te.e.Node().State()
		_, ok := st.Instance("ctx-0")
		return ok && st.FeatureLevel() == fsm.FeatureLevelMax
	})
	if r := drainCall(t, s.c, s.te, "ctx-0", "drain", map[string]string{}); r.status != http.StatusUnauthorized {
		t.Fatalf("without a token: %d %s", r.status, r.body)
	}
	if r := adminGet(t, s.c, s.te, "/admin/v1/instances/ctx-0/drain"); r.status != http.StatusMethodNotAllowed {
		t.Fatalf("GET drain: %d %s", r.status, r.body)
	}
	for _, c := range []struct {
		instance, op string
		status       int
		code         string
	}{
		{"nosuch", "drain", http.StatusNotFound, "instance_not_found"},
		{"nosuch", "undrain", http.StatusNotFound, "instance_not_found"},
		{"ctx-0", "cordon", http.StatusNotFound, "unknown_url"},
	} {
		r := drainCall(t, s.c, s.te, c.instance, c.op, nil)
		if m := r.json(t); r.status != c.status || m["error"].(map[string]any)["code"] != c.code {
			t.Errorf("%s %s: %d %s, want %d %s", c.op, c.instance, r.status, r.body, c.status, c.code)
		}
	}
	if drainedOn(s.te, "ctx-0", true) {
		t.Fatal("a refused call drained ctx-0")
	}

	old := startStatic(t, 1, 1, func(c *Config) { c.Cluster.FeatureLevel = fsm.FeatureLevelRanks })
	waitFor(t, "ctx-0 in the level-2 log", 10*time.Second, func() bool {
		_, ok := old.te.e.Node().State().Instance("ctx-0")
		return ok && old.te.e.Node().State().FeatureLevel() == fsm.FeatureLevelRanks
	})
	r := drainCall(t, old.c, old.te, "ctx-0", "drain", nil)
	if m := r.json(t); r.status != http.StatusConflict || m["error"].(map[string]any)["code"] != "feature_level_too_low" {
		t.Fatalf("drain at cluster level 2: %d %s", r.status, r.body)
	}
	if m := r.json(t); !strings.Contains(m["error"].(map[string]any)["message"].(string), "level 2") {
		t.Fatalf("the refusal does not name the cluster's level: %s", r.body)
	}
}
