package edge

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/test/natstest"
)

// routeRank parses the context hop's rank from x-tether-route.
func routeRank(t testing.TB, r response) uint32 {
	t.Helper()
	h := r.header.Get(HeaderRoute)
	rt, err := ParseRoute(h)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(rt.ContextRank, 10, 32)
	if err != nil {
		t.Fatalf("no context rank in %s %q", HeaderRoute, h)
	}
	return uint32(n)
}

func clusterLevel(t testing.TB, c *http.Client, te *testEdge) (committed uint32, advertised map[string]uint32) {
	t.Helper()
	var info admin.ClusterInfo
	if err := json.Unmarshal(adminGet(t, c, te, "/admin/v1/cluster").body, &info); err != nil {
		t.Fatal(err)
	}
	advertised = map[string]uint32{}
	for _, n := range info.Nodes {
		advertised[n.ID] = n.MaxFeatureLevel
	}
	return info.FeatureLevel, advertised
}

// cluster.compat_feature_level caps what an edge advertises: with one edge
// at level 1 the cluster stays at level 1 and no RankObserved is emitted
// (an old edge could not apply it). Once that edge runs at this build's
// level, the cluster rises to 2 and the worker's reported rank is recorded
// on the binding (admin binding JSON, history), asynchronously.
func TestRankObservedOnlyAtFeatureLevel2(t *testing.T) {
	ns := natstest.Start(t, nil)
	startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 3, ns.ClientURL(), func(i int, c *Config) {
		if i == 2 {
			c.Cluster.FeatureLevel = fsm.FeatureLevelBase
		}
	})
	ec.waitInstances(4)
	c := httpClient(t)
	waitFor(t, "every edge's NodeInfo and the cluster level committed", 10*time.Second, func() bool {
		lvl, adv := clusterLevel(t, c, ec.edge(0))
		return len(adv) == 3 && lvl > 0
	})
	if lvl, adv := clusterLevel(t, c, ec.edge(0)); lvl != fsm.FeatureLevelBase || adv["edge-3"] != fsm.FeatureLevelBase || adv["edge-1"] != fsm.FeatureLevelMax {
		t.Fatalf("cluster level %d, advertised %v: want 1 with edge-3 at 1", lvl, adv)
	}
	a := &agent{session: "rank-conv", system: longText("rank", 24)}
	for i := range 3 {
		a.send(t, c, ec.edge(i), "turn", nil)
	}
	for i := range 3 {
		e := ec.edge(i).e
		if queued := e.recorder.QueuedRanks(); queued != 0 || counter(t, ec.edge(i).registry, "tether_edge_proposals_total", map[string]string{"type": "RankObserved"}) != 0 {
			t.Fatalf("edge-%d emitted RankObserved at cluster level 1", i+1)
		}
	}
	// The Bind is proposed beside the first request: wait for it.
	var b admin.BindingInfo
	waitFor(t, "the conversation's binding committed", 10*time.Second, func() bool {
		var ok bool
		b, ok = binding(t, c, ec.edge(0), fsm.FleetContext, a.session)
		return ok
	})
	if b.Rank != nil {
		t.Fatalf("binding at level 1: %+v, want no rank", b)
	}

	// Upgrade edge-3: restarted at this build's level.
	ec.kill(2)
	ec.edges[2].cfg.Cluster.FeatureLevel = 0
	if err := ec.start(2); err != nil {
		t.Fatal(err)
	}
	// Every edge must have applied the raised level: the edge that serves
	// the next turn emits RankObserved only at level 2 as it has applied it.
	for i := range 3 {
		waitFor(t, "the cluster level raised to this build's", 15*time.Second, func() bool {
			lvl, _ := clusterLevel(t, c, ec.edge(i))
			return lvl == fsm.FeatureLevelMax
		})
	}
	r := a.send(t, c, ec.edge(1), "after the upgrade", nil)
	rank := routeRank(t, r.resp)
	for i := range 3 {
		waitFor(t, "the rank recorded on the binding", 10*time.Second, func() bool {
			b, ok := binding(t, c, ec.edge(i), fsm.FleetContext, a.session)
			return ok && b.Rank != nil && *b.Rank == rank
		})
	}
	h := adminGet(t, c, ec.edge(0), "/admin/v1/bindings/context/rank-conv/history")
	var hist struct {
		Events []admin.HistoryEntry `json:"events"`
	}
	if err := json.Unmarshal(h.body, &hist); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ev := range hist.Events {
		if ev.Type == "RankObserved" && ev.Status == fsm.StatusApplied.String() {
			found = true
		}
	}
	if !found {
		t.Fatalf("no applied RankObserved in the history: %s", h.body)
	}
	// The same rank again is not proposed again.
	before := counter(t, ec.edge(0).registry, "tether_edge_proposals_total", map[string]string{"type": "RankObserved"})
	a.send(t, c, ec.edge(0), "again", nil)
	if after := counter(t, ec.edge(0).registry, "tether_edge_proposals_total", map[string]string{"type": "RankObserved"}); after != before {
		t.Fatalf("an unchanged rank was proposed again (%v → %v)", before, after)
	}
}
