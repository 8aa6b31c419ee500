package ops

import (
	"bufio"
	"bytes"
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
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/hintauth"
	"github.com/tether-project/tether/routing/telemetry"
	"github.com/tether-project/tether/worker"
)

// levelWatch checks, at every look, the feature-level rules on every
// running edge: the committed level never falls, and never exceeds what
// every current voter advertised (a voter that has not advertised counts
// as level 0).
type levelWatch struct {
	t    *testing.T
	f    *fleet
	seen uint32
}

func (w *levelWatch) check() uint32 {
	w.t.Helper()
	var lvl uint32
	for i, s := range w.f.running() {
		st := s.state()
		advertised := map[string]uint32{}
		for _, n := range st.Nodes() {
			advertised[n.ID] = n.MaxFeatureLevel
		}
		minVoters := ^uint32(0)
		for _, p := range s.edge().Node().Status().Peers {
			if p.Voter {
				minVoters = min(minVoters, advertised[p.ID])
			}
		}
		got := st.FeatureLevel()
		if got > minVoters {
			w.t.Fatalf("%s: cluster feature level %d is above what every voter advertised (%d): %+v", s.id, got, minVoters, st.Nodes())
		}
		if got < w.seen && st.Index() > 0 {
			// A lagging follower may trail; only the leader's view must
			// never fall.
			if s.edge().Node().IsLeader() {
				w.t.Fatalf("%s: cluster feature level fell from %d to %d", s.id, w.seen, got)
			}
		}
		if i == 0 || got > lvl {
			lvl = got
		}
	}
	w.seen = max(w.seen, lvl)
	return lvl
}

// nodeVersions is the edges' advertised versions as the log holds them.
func nodeVersions(st *fsm.State) map[string]string {
	out := map[string]string{}
	for _, n := range st.Nodes() {
		out[n.ID] = n.Version
	}
	return out
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
// their context instance, the committed feature level never exceeds what
// every voter advertised (and rises only once the last voter advertised),
// an upgraded edge sends no hints to a legacy worker (learned from its
// telemetry) while instance affinity holds, and an upgraded worker gets
// (and verifies) signed hints.
//
// What "old" means here: this build has a single feature level and no
// compat knob for edges (see docs/upgrades.md), so the old and new edges
// differ only in their advertised version; the level rule is exercised by
// a voter that has not advertised yet. Old workers are real: legacy_mode.
func TestRollingUpgradeEdgesThenWorkers(t *testing.T) {
	f := startFleet(t, fleetOptions{
		start:        []int{0, 1}, // edge-3, a bootstrap voter, comes later
		genWorkers:   2,           // a rolling upgrade needs a peer to take over
		version:      "v1",
		workerConfig: func(_ string, c *worker.Config) { c.LegacyMode = true },
	})
	legacy := func(id string, in edge.InstanceInfo) string {
		if in.VerifiesHints || in.Version != "v1" {
			return fmt.Sprintf("want a legacy v1 worker, see verifies_hints=%v version=%s", in.VerifiesHints, in.Version)
		}
		return ""
	}
	f.waitReady(30*time.Second, legacy)
	lw := &levelWatch{t: t, f: f}
	tr := f.startTraffic(6)
	defer tr.halt()

	// Mixed state 0: two of three voters advertised level 1; the third
	// has not. Under traffic the committed level stays 0.
	waitFor(t, 10*time.Second, "edge-1 and edge-2 to advertise", func() string {
		if v := nodeVersions(f.edges[0].state()); v["edge-1"] != "v1" || v["edge-2"] != "v1" {
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
	waitFor(t, 15*time.Second, "the level to rise once every voter advertised", func() string {
		lw.check()
		for _, s := range f.running() {
			if s.state().FeatureLevel() != fsm.FeatureLevelMax {
				return fmt.Sprintf("%s at level %d", s.id, s.state().FeatureLevel())
			}
		}
		return ""
	})
	f.waitReady(30*time.Second, legacy)

	// Edges first, one at a time: v1 → v2.
	for i := range f.edges {
		s := f.edges[i]
		f.stopEdge(i)
		tr.waitTurns(t, 10) // mixed: this edge down, the others serve
		lw.check()
		if v := nodeVersions(f.running()[0].state()); v[s.id] != "v1" {
			t.Fatalf("while %s is down the log should still hold its v1 NodeInfo: %v", s.id, v)
		}
		f.startEdge(i, "v2")
		waitFor(t, 15*time.Second, s.id+" to advertise v2", func() string {
			lw.check()
			for _, r := range f.running() {
				if v := nodeVersions(r.state()); v[s.id] != "v2" {
					return fmt.Sprintf("%s sees %v", r.id, v)
				}
			}
			return ""
		})
		tr.waitTurns(t, 10) // mixed: i+1 edges at v2
		if got := lw.check(); got != fsm.FeatureLevelMax {
			t.Fatalf("cluster level %d after %s rejoined", got, s.id)
		}
		f.waitReady(30*time.Second, legacy)
	}
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
	bindingsBefore := contextBindings(f, "load-parent-")
	for _, w := range []struct {
		id    string
		fleet telemetry.Fleet
	}{{"ctx-1", telemetry.FleetContext}, {"ctx-2", telemetry.FleetContext}, {"gen-1", telemetry.FleetGeneration}, {"gen-2", telemetry.FleetGeneration}} {
		f.startWorker(w.id, w.fleet, "v2", func(c *worker.Config) { c.LegacyMode = false })
		upgraded[w.id] = true
		f.waitReady(30*time.Second, func(id string, in edge.InstanceInfo) string {
			if in.VerifiesHints != upgraded[id] || (in.Version == "v2") != upgraded[id] {
				return fmt.Sprintf("want upgraded=%v, see verifies_hints=%v version=%s", upgraded[id], in.VerifiesHints, in.Version)
			}
			return ""
		})
		tr2.waitTurns(t, 10)
		// Mixed state: bindings survived the replacement (same instance id),
		// sub-agents reach their parent's instance on either kind of worker,
		// and on an upgraded context worker also its rank (verified hint).
		if now := contextBindings(f, "load-parent-"); !sameBindings(bindingsBefore, now) {
			t.Fatalf("after replacing %s the context bindings changed:\nbefore %v\nnow    %v", w.id, bindingsBefore, now)
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

func sameBindings(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
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
	f.startWorker("ctx-old", telemetry.FleetContext, "v1", func(c *worker.Config) { c.NATS.URLs = nil; c.LegacyMode = true })

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
