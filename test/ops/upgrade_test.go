package ops

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/worker"
)

// levelWatch checks, at every look, the feature-level rules on every
// running edge: no edge halted, each supports the level of its version (v1
// runs as the previous release, capped at level 1), the committed level
// never falls, never exceeds what every current voter advertised (a voter
// that has not advertised counts as level 0) and stays at 1 or below while
// any voter is a v1 edge; and below level 2 no binding carries a rank (no
// RankObserved was applied) and no overflow was recorded as cache_lost.
type levelWatch struct {
	t    *testing.T
	f    *fleet
	seen uint32
}

// waitLevel waits until every running edge's state is at cluster feature
// level want, checking the invariants on every poll.
func (w *levelWatch) waitLevel(want uint32, why string) {
	w.t.Helper()
	waitFor(w.t, 15*time.Second, fmt.Sprintf("the level to rise to %d %s", want, why), func() string {
		w.check()
		for _, s := range w.f.edges.Running() {
			if lvl := s.state().FeatureLevel(); lvl != want {
				return fmt.Sprintf("%s at level %d", s.id, lvl)
			}
		}
		return ""
	})
}

// edgeLevel is the feature level an edge of this version supports.
func edgeLevel(version string) uint32 {
	if version == "v1" {
		return fsm.FeatureLevelBase
	}
	return fsm.FeatureLevelMax
}

func (w *levelWatch) check() uint32 {
	w.t.Helper()
	var lvl uint32
	for i, s := range w.f.edges.Running() {
		ns := s.Node().Status()
		if ns.Halted != "" {
			w.t.Fatalf("%s (%s) halted: %s", s.id, s.version, ns.Halted)
		}
		if want := edgeLevel(s.version); ns.FeatureLevel != want {
			w.t.Fatalf("%s (%s) supports feature level %d, want %d", s.id, s.version, ns.FeatureLevel, want)
		}
		// Leader before the state is read: a ready leader's state holds
		// everything committed (read first, the state may predate its
		// catching up).
		leader := s.IsLeader()
		st := s.state()
		advertised := map[string]uint32{}
		for _, n := range st.Edges() {
			advertised[n.ID] = n.MaxFeatureLevel
		}
		minVoters, oldVoter := ^uint32(0), ""
		for _, p := range ns.Peers {
			if p.Voter {
				minVoters = min(minVoters, advertised[p.ID])
				if w.f.version(p.ID) == "v1" {
					oldVoter = p.ID
				}
			}
		}
		got := st.FeatureLevel()
		if got > minVoters {
			w.t.Fatalf("%s: cluster feature level %d is above what every voter advertised (%d): %+v", s.id, got, minVoters, st.Edges())
		}
		if oldVoter != "" && got > fsm.FeatureLevelBase {
			w.t.Fatalf("%s: cluster feature level %d while voter %s runs v1", s.id, got, oldVoter)
		}
		if got < w.seen && st.Index() > 0 {
			// A lagging follower may trail; only the leader's view must
			// never fall.
			if leader {
				w.t.Fatalf("%s: cluster feature level fell from %d to %d", s.id, w.seen, got)
			}
		}
		if got < fsm.FeatureLevelRanks {
			// A RankObserved is proposed only once the proposer's state
			// holds level 2, so a state below it never contains one.
			st.ForEachBinding(func(b fsm.Binding) bool {
				if b.HasRank {
					w.t.Fatalf("%s: %v binding %q has rank %d at cluster level %d", s.id, b.Fleet, b.Key, b.Rank, got)
				}
				return true
			})
			if n := st.Counters().Overflows[fsm.OverflowCacheLost]; n != 0 {
				w.t.Fatalf("%s: %d overflows recorded as cache_lost at cluster level %d", s.id, n, got)
			}
		}
		if i == 0 || got > lvl {
			lvl = got
		}
	}
	w.seen = max(w.seen, lvl)
	return lvl
}

// noRankProposals checks that no running edge proposed a RankObserved
// while its state is below level 2 (the metric is read first: an edge
// proposes one only after its state reached level 2, which never falls).
func (w *levelWatch) noRankProposals() {
	w.t.Helper()
	for _, s := range w.f.edges.Running() {
		n := rankProposals(w.t, w.f.client, s)
		if lvl := s.state().FeatureLevel(); lvl < fsm.FeatureLevelRanks && n != 0 {
			w.t.Fatalf("%s (%s) proposed %v RankObserved events at cluster level %d", s.id, s.version, n, lvl)
		}
	}
}

// advert is an edge's NodeInfo as the log holds it.
type advert struct {
	version string
	level   uint32
}

// nodeAdverts is the edges' advertised versions and levels as the log
// holds them.
func nodeAdverts(st *fsm.State) map[string]advert {
	out := map[string]advert{}
	for _, n := range st.Edges() {
		out[n.ID] = advert{n.Version, n.MaxFeatureLevel}
	}
	return out
}

// rankProposals reads an edge's tether_edge_proposals_total for
// RankObserved (every result) from its /metrics.
func rankProposals(t *testing.T, c *http.Client, s *fleetEdge) float64 {
	t.Helper()
	resp, err := c.Get(s.url() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "tether_edge_proposals_total{") || !strings.Contains(line, `type="RankObserved"`) {
			continue
		}
		_, val, _ := strings.Cut(line, "} ")
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			t.Fatalf("%s metric line %q: %v", s.id, line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s /metrics: %v", s.id, err)
	}
	return sum
}

// contextHistory is the admin history of a context-fleet key on edge s.
func contextHistory(t *testing.T, f *fleet, s *fleetEdge, key string) []admin.HistoryEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var ans struct {
		Events []admin.HistoryEntry `json:"events"`
	}
	if err := f.admin(ctx, s, "bindings/context/"+key+"/history", &ans); err != nil {
		t.Fatal(err)
	}
	return ans.Events
}

// bindIndex is the log index of the last applied Bind in a history.
func bindIndex(t *testing.T, key string, hist []admin.HistoryEntry) uint64 {
	t.Helper()
	var idx uint64
	for _, h := range hist {
		if h.Type == "Bind" && h.Status == fsm.StatusApplied.String() {
			idx = h.Index
		}
	}
	if idx == 0 {
		t.Fatalf("no applied Bind in the history of %s: %+v", key, hist)
	}
	return idx
}

// rankEvents counts the RankObserved events of a history, and those applied
// for the epoch.
func rankEvents(hist []admin.HistoryEntry, epoch uint64) (all, applied int) {
	for _, h := range hist {
		if h.Type != "RankObserved" {
			continue
		}
		all++
		// JSON numbers decode as float64; epochs here stay far below 2^53.
		fields, _ := h.Event.(map[string]any)
		if e, ok := fields["epoch"].(float64); ok && uint64(e) == epoch && h.Status == fsm.StatusApplied.String() {
			applied++
		}
	}
	return all, applied
}

// contextBinding is edge s's context-fleet binding of key.
func contextBinding(t *testing.T, s *fleetEdge, key string) fsm.Binding {
	t.Helper()
	b, ok := s.state().Lookup(fsm.FleetContext, key)
	if !ok {
		t.Fatalf("%s has no context binding for %s", s.id, key)
	}
	return b
}

// waitRank waits until every running edge's binding of key holds the rank
// the worker reported, for the placement on instance.
func waitRank(t *testing.T, f *fleet, key, instance, rank string) fsm.Binding {
	t.Helper()
	want, err := strconv.ParseUint(rank, 10, 32)
	if err != nil {
		t.Fatalf("%s: no rank in the route (%q): %v", key, rank, err)
	}
	waitFor(t, 15*time.Second, "the rank of "+key+" recorded on every edge", func() string {
		for _, s := range f.edges.Running() {
			b, ok := s.state().Lookup(fsm.FleetContext, key)
			if !ok || b.Instance != instance || !b.HasRank || b.Rank != uint32(want) {
				return fmt.Sprintf("%s sees %+v (found %v), want rank %d on %s", s.id, b, ok, want, instance)
			}
		}
		return ""
	})
	return contextBinding(t, f.leader(), key)
}

// hintCounts reads a worker's tether_worker_hint_verifications_total by
// outcome from its /metrics.
func hintCounts(t *testing.T, c *http.Client, w *worker.Server) map[string]float64 {
	t.Helper()
	resp, err := c.Get(w.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, `tether_worker_hint_verifications_total{outcome="`)
		if !ok {
			continue
		}
		outcome, val, _ := strings.Cut(rest, `"} `)
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		out[outcome] = v
	}
	return out
}

// rejected sums the outcomes that refused a request's hint.
func rejected(m map[string]float64) float64 {
	return m["missing"] + m["malformed"] + m["invalid"] + m["bad_fields"] + m["no_key"]
}

// The documented rolling upgrade, edges first, then workers, under
// continuous agent traffic. Every mixed state has assertions: requests keep
// succeeding (client retries across edges allowed), conversations keep
// their context instance, an upgraded edge sends no hints to a legacy worker
// (learned from its telemetry) while instance affinity holds, and an
// upgraded worker gets (and verifies) signed hints.
//
// What "old" means here: a v1 edge is this build run as the previous
// release, with cluster.compat_feature_level: 1 (it advertises and applies
// feature level 1 only: no RankObserved, index epochs, no cache_lost
// reason); a v2 edge runs at this build's level, 2. Old workers are real
// too: legacy_mode. The feature-level rules are checked in every mixed state
// (levelWatch): the committed level never exceeds the minimum the voters
// advertised (0 while a bootstrap voter has not advertised yet), stays 1
// while any voter is v1 (also while the last v1 edge is down: it is still a
// voter) and rises to 2 only after the last edge was upgraded; no edge
// halts; below level 2 no binding carries a rank and no edge proposed a
// RankObserved. A conversation bound at level 1 gets no rank from its turns
// there and gets one from its first sticky turn at level 2; placements made
// at level 1 carry their entry's index as epoch, those made at level 2 a
// unique epoch.
func TestRollingUpgradeEdgesThenWorkers(t *testing.T) {
	f := startFleet(t, fleetOptions{
		start:      []int{0, 1}, // edge-3, a bootstrap voter, comes later
		genWorkers: 2,           // a rolling upgrade needs a peer to take over
		version:    "v1",
		edgeConfig: func(_ int, version string, c *edge.Config) {
			if version == "v1" {
				c.Cluster.FeatureLevel = fsm.FeatureLevelBase
			}
		},
		workerConfig: func(_ string, c *worker.Config) { c.IgnoreSubagentHints = true },
	})
	legacy := func(id string, in admin.InstanceInfo) string {
		if in.VerifiesHints || in.Version != "v1" {
			return fmt.Sprintf("want a legacy v1 worker, see verifies_hints=%v version=%s", in.VerifiesHints, in.Version)
		}
		return ""
	}
	f.waitReady(30*time.Second, legacy)
	lw := &levelWatch{t: t, f: f}
	tr := f.startTraffic(6)
	defer tr.halt()
	oldEdge, newEdge := advert{"v1", fsm.FeatureLevelBase}, advert{"v2", fsm.FeatureLevelMax}

	// Mixed state 0: two of three voters advertised level 1; the third
	// has not. Under traffic the committed level stays 0.
	waitFor(t, 10*time.Second, "edge-1 and edge-2 to advertise v1 at level 1", func() string {
		if v := nodeAdverts(f.edges.Node(0).state()); v["edge-1"] != oldEdge || v["edge-2"] != oldEdge {
			return fmt.Sprintf("%v", v)
		}
		return ""
	})
	for range 3 {
		tr.waitTurns(t, 8)
		if lvl := lw.check(); lvl != 0 {
			t.Fatalf("the cluster level rose to %d while voter edge-3 had not advertised", lvl)
		}
	}
	f.startEdge(2, "v1")
	lw.waitLevel(fsm.FeatureLevelBase, "once every voter advertised")
	f.waitReady(30*time.Second, legacy)

	// A conversation placed at level 1, kept out of the traffic: its turns
	// record no rank until the cluster runs level 2.
	const oldKey, newKey = "rank-probe-level1", "rank-probe-level2"
	first, err := f.chat(0, oldKey, "", "probe: plan")
	if err != nil {
		t.Fatal(err)
	}
	oldHome := first.contextInstance()

	// Edges first, one at a time: v1 → v2.
	n := f.edges.Len()
	for i := range n {
		s := f.edges.Node(i)
		last := i == n-1
		f.stopEdge(i)
		tr.waitTurns(t, 10) // mixed: this edge down, the others serve
		if lvl := lw.check(); lvl != fsm.FeatureLevelBase {
			t.Fatalf("cluster level %d while v1 voter %s is down", lvl, s.id)
		}
		lw.noRankProposals()
		if v := nodeAdverts(f.edges.Running()[0].state()); v[s.id] != oldEdge {
			t.Fatalf("while %s is down the log should still hold its v1 NodeInfo at level 1: %v", s.id, v)
		}
		if last {
			// The last v1 voter is down: a sticky turn of the level-1
			// conversation still records no rank.
			pt, err := f.chat(i, oldKey, "", "probe: still level 1")
			if err != nil {
				t.Fatal(err)
			}
			if pt.contextInstance() != oldHome {
				t.Fatalf("%s moved from %s: %s", oldKey, oldHome, pt.route)
			}
			lw.check()
			lw.noRankProposals()
			run := f.edges.Running()[0]
			hist := contextHistory(t, f, run, oldKey)
			b := contextBinding(t, run, oldKey)
			if all, _ := rankEvents(hist, b.Epoch); all != 0 || b.HasRank {
				t.Fatalf("%s at level 1: %d RankObserved in its history, binding %+v", oldKey, all, b)
			}
			if idx := bindIndex(t, oldKey, hist); b.Epoch != idx {
				t.Fatalf("%s placed at level 1 by entry %d has epoch %d, want the entry's index", oldKey, idx, b.Epoch)
			}
		}
		f.startEdge(i, "v2")
		waitFor(t, 15*time.Second, s.id+" to advertise v2 at level 2", func() string {
			lw.check()
			for _, r := range f.edges.Running() {
				if v := nodeAdverts(r.state()); v[s.id] != newEdge {
					return fmt.Sprintf("%s sees %v", r.id, v)
				}
			}
			return ""
		})
		if !last {
			tr.waitTurns(t, 10) // mixed: i+1 edges at v2, the others v1
			if got := lw.check(); got != fsm.FeatureLevelBase {
				t.Fatalf("cluster level %d after %s rejoined with %d v1 edges left", got, s.id, n-1-i)
			}
			lw.noRankProposals()
		}
		f.waitReady(30*time.Second, legacy)
	}
	lw.waitLevel(fsm.FeatureLevelMax, "after the last edge's upgrade")
	tr.waitTurns(t, 10) // all edges at v2, workers legacy

	// Level 2: the next sticky turn of the level-1 conversation records
	// its rank (for its level-1 placement), and a new placement gets a
	// unique epoch and its rank.
	pt, err := f.chat(1, oldKey, "", "probe: level 2")
	if err != nil {
		t.Fatal(err)
	}
	inst, rank := pt.contextHop()
	if inst != oldHome {
		t.Fatalf("%s moved from %s: %s", oldKey, oldHome, pt.route)
	}
	waitRank(t, f, oldKey, inst, rank)
	nt, err := f.chat(2, newKey, "", "probe: plan")
	if err != nil {
		t.Fatal(err)
	}
	waitRank(t, f, newKey, nt.contextInstance(), func() string { _, r := nt.contextHop(); return r }())
	run := f.edges.Running()[0]
	for _, key := range []string{oldKey, newKey} {
		b := contextBinding(t, run, key)
		var hist []admin.HistoryEntry
		waitFor(t, 10*time.Second, "the RankObserved of "+key+" in the archive", func() string {
			hist = contextHistory(t, f, run, key)
			if _, applied := rankEvents(hist, b.Epoch); applied == 0 {
				return fmt.Sprintf("%d applied for epoch %d in %+v", applied, b.Epoch, hist)
			}
			return ""
		})
		idx := bindIndex(t, key, hist)
		if key == oldKey && b.Epoch != idx {
			t.Fatalf("%s (placed at level 1 by entry %d) has epoch %d now", key, idx, b.Epoch)
		}
		if key == newKey && (b.Epoch == idx || fsm.EpochIndex(b.Epoch) != idx) {
			t.Fatalf("%s placed at level 2 by entry %d has epoch %d, want a unique epoch of that entry", key, idx, b.Epoch)
		}
	}
	lw.check()

	tr.halt()
	if fails := tr.failures(); len(fails) > 0 {
		t.Fatalf("%d of %d requests failed during the edge upgrade; first: %s", len(fails), tr.turns.Load(), fails[0])
	}
	for p, homes := range tr.homes {
		if len(homes) != 1 {
			t.Errorf("edge upgrade: %s and its sub-agents moved between context instances: %v", p, homes)
		}
	}
	// No hint ever reached a legacy worker: the edges read legacy_mode
	// from telemetry and left the headers off.
	for _, id := range []string{"ctx-1", "ctx-2", "gen-1", "gen-2"} {
		if m := hintCounts(t, f.client, f.worker(id)); len(m) != 0 && (m["verified"] != 0 || m["ignored"] != 0 || rejected(m) != 0) {
			t.Errorf("legacy %s saw hint headers: %v", id, m)
		}
	}

	// Then workers, one at a time: legacy v1 → current v2.
	tr2 := f.startTraffic(6)
	defer tr2.halt()
	tr2.waitTurns(t, 10)
	upgraded := map[string]bool{}
	for _, w := range []struct {
		id    string
		fleet telemetry.Fleet
	}{{"ctx-1", telemetry.FleetContext}, {"ctx-2", telemetry.FleetContext}, {"gen-1", telemetry.FleetGeneration}, {"gen-2", telemetry.FleetGeneration}} {
		bindingsBefore := contextBindings(f, "load-parent-")
		f.startWorker(w.id, w.fleet, "v2", func(c *worker.Config) { c.IgnoreSubagentHints = false })
		upgraded[w.id] = true
		f.waitReady(30*time.Second, func(id string, in admin.InstanceInfo) string {
			if in.VerifiesHints != upgraded[id] || (in.Version == "v2") != upgraded[id] {
				return fmt.Sprintf("want upgraded=%v, see verifies_hints=%v version=%s", upgraded[id], in.VerifiesHints, in.Version)
			}
			return ""
		})
		tr2.waitTurns(t, 10)
		// Mixed state: bindings survived the replacement (same instance id:
		// every key bound to it before is bound to it still, same epoch; no
		// key is gone), sub-agents reach their parent's instance on either
		// kind of worker, and on an upgraded context worker also its rank
		// (verified hint). Keys bound elsewhere may move by routing's
		// rules meanwhile (relief, the cache-lost rebind): the load the
		// replaced worker did not take went to the others.
		if now := contextBindings(f, "load-parent-"); !keptBindings(bindingsBefore, now, w.id) {
			t.Fatalf("after replacing %s its context bindings changed:\nbefore %v\nnow    %v", w.id, bindingsBefore, now)
		}
		probeAffinity(t, f, upgraded, w.id)
		for id := range upgraded {
			if m := hintCounts(t, f.client, f.worker(id)); rejected(m) != 0 {
				t.Fatalf("upgraded %s rejected hints from upgraded edges: %v", id, m)
			}
		}
		for _, id := range []string{"ctx-1", "ctx-2", "gen-1", "gen-2"} {
			if !upgraded[id] {
				if m := hintCounts(t, f.client, f.worker(id)); m["verified"] != 0 || m["ignored"] != 0 || rejected(m) != 0 {
					t.Fatalf("legacy %s saw hint headers in a mixed state: %v", id, m)
				}
			}
		}
	}
	tr2.halt()
	if fails := tr2.failures(); len(fails) > 0 {
		t.Fatalf("%d of %d requests failed during the worker upgrade; first: %s", len(fails), tr2.turns.Load(), fails[0])
	}
	t.Logf("edge upgrade: %d turns (%d retried); worker upgrade: %d turns (%d retried)",
		tr.turns.Load(), tr.retried.Load(), tr2.turns.Load(), tr2.retried.Load())
}

// contextBindings is the leader's context-fleet bindings of keys with the
// prefix: key → "instance@epoch".
func contextBindings(f *fleet, prefix string) map[string]string {
	out := map[string]string{}
	f.leader().state().ForEachBinding(func(b fsm.Binding) bool {
		if b.Fleet == fsm.FleetContext && strings.HasPrefix(b.Key, prefix) {
			out[b.Key] = fmt.Sprintf("%s@%d", b.Instance, b.Epoch)
		}
		return true
	})
	return out
}

// keptBindings reports whether every key of before is bound in now, and
// every key bound to instance in before is bound to it in now with the
// same epoch.
func keptBindings(before, now map[string]string, instance string) bool {
	for k, v := range before {
		n, ok := now[k]
		if !ok || (strings.HasPrefix(v, instance+"@") && n != v) {
			return false
		}
	}
	return true
}

// probeAffinity finds a parent on each context worker (the traffic's bound
// parents first, then new ones) and sends a new sub-agent turn for it right
// after a parent turn: the sub-agent reaches the parent's instance always
// (instance affinity in the edges), and the parent's ADP rank when that
// worker verifies hints.
func probeAffinity(t *testing.T, f *fleet, upgraded map[string]bool, step string) {
	t.Helper()
	var parents []string
	for k := range contextBindings(f, "load-parent-") {
		parents = append(parents, k)
	}
	slices.Sort(parents)
	for n := range 40 {
		parents = append(parents, fmt.Sprintf("probe-%s-%d", step, n))
	}
	found := map[string]bool{}
	for n, parent := range parents {
		if len(found) == 2 {
			break
		}
		pt, err := f.chat(n, parent, "", "probe: plan")
		if err != nil {
			t.Fatal(err)
		}
		inst, prank := pt.contextHop()
		if found[inst] {
			continue
		}
		found[inst] = true
		before := hintCounts(t, f.client, f.worker(inst))
		ct, err := f.chat(n+1, fmt.Sprintf("%s-probe-child-%s", parent, step), parent, "probe: sub-task")
		if err != nil {
			t.Fatal(err)
		}
		cinst, crank := ct.contextHop()
		if cinst != inst {
			t.Fatalf("after upgrading %s: sub-agent of %s on %s, parent on %s", step, parent, ct.route, pt.route)
		}
		after := hintCounts(t, f.client, f.worker(inst))
		if upgraded[inst] {
			if crank != prank {
				t.Fatalf("after upgrading %s: on upgraded %s the sub-agent ran on rank %s, its parent on %s", step, inst, crank, prank)
			}
			if after["verified"] <= before["verified"] {
				t.Fatalf("after upgrading %s: upgraded %s verified no hint for the sub-agent (%v → %v)", step, inst, before, after)
			}
		} else if after["verified"] != 0 || after["ignored"] != 0 {
			t.Fatalf("after upgrading %s: legacy %s received hint headers: %v", step, inst, after)
		}
	}
	if len(found) < 2 {
		t.Fatalf("after upgrading %s: every probed parent landed on %v", step, found)
	}
}

// Why the order matters: an edge that predates signed hints forwards the
// sub-agent affinity id without a signature. An upgraded worker refuses
// that request (401), while a legacy worker ignores the header and serves
// it. Upgrading workers first would break sub-agent traffic from the old
// edges; upgrading edges first never does. (This build has no edge that
// sends unsigned hints, so the request is the one such an edge sends.)
func TestUpgradedWorkerRejectsUnsignedHintsFromAnOlderEdge(t *testing.T) {
	f := &fleet{t: t, workers: map[string]*worker.Server{}}
	f.client = &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(func() { f.closeWorkers(); f.client.CloseIdleConnections() })
	f.startWorker("ctx-new", telemetry.FleetContext, "v2", func(c *worker.Config) { c.NATS.URLs = nil })
	f.startWorker("ctx-old", telemetry.FleetContext, "v1", func(c *worker.Config) { c.NATS.URLs = nil; c.IgnoreSubagentHints = true })

	body, _ := json.Marshal(map[string]any{
		"model": testModel, "max_tokens": 1,
		"messages":             []map[string]string{{"role": "user", "content": "sub-task from an old edge"}},
		"disaggregated_params": map[string]any{"request_type": "context_only", "disagg_request_id": 4242},
		"conversation_params":  map[string]any{"conversation_id": "child-1"},
	})
	send := func(w *worker.Server) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, w.URL()+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(hintauth.HeaderAffinityID, "parent-1") // no x-trtllm-subagent-affinity-auth
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := send(f.worker("ctx-new")); code != http.StatusUnauthorized || !strings.Contains(b, "missing_subagent_affinity_signature") {
		t.Fatalf("upgraded worker, unsigned hint: %d %s; want 401 missing_subagent_affinity_signature", code, b)
	}
	if code, b := send(f.worker("ctx-old")); code != http.StatusOK {
		t.Fatalf("legacy worker, unsigned hint: %d %s; want 200 (the header is ignored)", code, b)
	}
	if m := hintCounts(t, f.client, f.worker("ctx-new")); m["missing"] != 1 {
		t.Fatalf("upgraded worker's hint metrics %v, want one missing signature", m)
	}
	if m := hintCounts(t, f.client, f.worker("ctx-old")); m["ignored"] != 1 {
		t.Fatalf("legacy worker's hint metrics %v, want one ignored", m)
	}
}
