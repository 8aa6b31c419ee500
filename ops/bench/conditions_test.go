package bench

import (
	"context"
	"testing"
	"time"
)

func TestMedianIntervalIsTheSignTestsOrderStatistics(t *testing.T) {
	xs := []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	s := MedianInterval(xs)
	if s.Median != 5.5 || s.Lo != 2 || s.Hi != 9 || s.N != 10 {
		t.Fatalf("n=10: %+v, want median 5.5 in [2, 9] (x(2), x(9): 97.9 %%)", s)
	}
	if s := MedianInterval([]float64{3, 1, 2}); s.Median != 2 || s.Lo != 1 || s.Hi != 3 {
		t.Fatalf("n=3: %+v, want the range", s)
	}
	if Verdict(&Stat{Lo: 0.001, Hi: 0.01, N: 10}) != "tether leads" || Verdict(&Stat{Lo: -0.01, Hi: 0.01, N: 10}) != "no difference shown" ||
		Verdict(&Stat{Lo: -0.02, Hi: -0.01, N: 10}) != "tether trails" {
		t.Fatal("a lead must need the whole paired interval above zero")
	}
}

// The ratio to the one ideal edge is tether's own figure: it is reported
// when tether runs alone, not only beside another policy.
func TestIdealRatioWithTetherAlone(t *testing.T) {
	var jobs []arrangedJob
	var sums []Summary
	for a, hits := range [][2]float64{{0.50, 0.45}, {0.40, 0.40}, {0.30, 0.33}} {
		jobs = append(jobs, arrangedJob{arr: a, name: idealName, edges: 1}, arrangedJob{arr: a, name: string(PolicyTether), edges: 3})
		sums = append(sums, Summary{HitRate: hits[0]}, Summary{HitRate: hits[1]})
	}
	rep := buildArranged(ArrangedOptions{Arrangements: []uint64{1, 2, 3}}, jobs, sums)
	r, ok := rep.IdealRatio[3]
	if !ok || r.N != 3 || r.Lo != 0.9 || r.Median != 1 || r.Hi != 1.1 {
		t.Fatalf("ratio at 3 edges: %+v (reported %v), want median 1.0 over [0.9, 1.1]", r, ok)
	}
}

func TestArrangementsDrawStartsAndJitterFromTheSeed(t *testing.T) {
	starts := func(seed uint64, burst bool) (map[string]time.Duration, *Workload) {
		w := smallTraces(t)
		if err := (Arrangement{Seed: seed, Stagger: 10 * time.Minute, Burst: burst}).Arrange(w); err != nil {
			t.Fatal(err)
		}
		out := map[string]time.Duration{}
		for _, a := range w.Agents {
			if a.Start < 0 || a.Start >= 10*time.Minute {
				t.Fatalf("seed %d: %s starts at %v, outside the stagger", seed, a.ID, a.Start)
			}
			out[a.ID] = a.Start
			for _, st := range a.Steps {
				if st.SubAgent != nil {
					out[st.SubAgent.ID] = st.At
				}
			}
		}
		return out, w
	}
	a1, _ := starts(1, false)
	again, _ := starts(1, false)
	a2, _ := starts(2, false)
	zero, _ := starts(0, false)
	same, differ := true, false
	for id, v := range a1 {
		same = same && again[id] == v
		differ = differ || a2[id] != v
	}
	if !same || !differ {
		t.Fatalf("an arrangement is a function of its seed: same %v, seeds 1 and 2 differ %v", same, differ)
	}
	if zero["t1/agent_001"] != 5*time.Second || zero["t1/agent_002"] != 5500*time.Millisecond {
		t.Fatalf("arrangement 0 keeps the trace's sub-agent offsets, got %v and %v", zero["t1/agent_001"], zero["t1/agent_002"])
	}
	b, w := starts(1, true)
	if d := b["t1/agent_002"] - b["t1/agent_001"]; d < -BurstWindow || d > BurstWindow {
		t.Fatalf("burst siblings %v apart, want within %v", d, BurstWindow)
	}
	if !w.Burst || w.Agents[0].Steps[2].SubAgent.BurstSibling != 1 || w.Agents[0].Steps[3].SubAgent.BurstSibling != 2 {
		t.Fatal("burst siblings must be numbered for the edges")
	}
}

// conversations: 24 conversations of 3 turns of different sizes, a minute
// apart (beyond the edges' 5 s prediction lifetime), starting within 20 s.
func conversations(t *testing.T) *Workload {
	t.Helper()
	w := &Workload{Name: "conversations", BlockSize: 64}
	for k := range 24 {
		one, err := SessionWorkload(SessionOptions{Sessions: k + 1, Turns: 3, Concurrency: k + 1, InputTokens: 64 * (4 + 3*k), OutputTokens: 64, BlockSize: 64})
		if err != nil {
			t.Fatal(err)
		}
		a := one.Agents[k] // its own blocks
		for i := range a.Steps {
			a.Steps[i].At = time.Duration(i) * time.Minute
		}
		w.Agents = append(w.Agents, a)
	}
	if err := (Arrangement{Seed: 1, Stagger: 20 * time.Second}).Arrange(w); err != nil {
		t.Fatal(err)
	}
	return w
}

func hitRate(t *testing.T, w *Workload, cfg SimConfig) float64 {
	t.Helper()
	r, err := Simulate(context.Background(), w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return Summarize(r).HitRate
}

// Without engine events an index knows only its edge's predictions, which
// expire: the prefix router loses the conversations between turns, while
// tether's bindings in the log keep them.
func TestKVEventsNoneLeavesEdgesTheirOwnKnowledge(t *testing.T) {
	w := conversations(t)
	cfg := DefaultSimConfig()
	cfg.Instances, cfg.CapacityBlocks, cfg.Edges = 8, 4000, 3
	hit := map[Policy]map[KVEventsMode]float64{}
	for _, p := range []Policy{PolicyPrefix, PolicyTether} {
		hit[p] = map[KVEventsMode]float64{}
		for _, m := range []KVEvents{{Mode: KVEventsExact}, {Mode: KVEventsLag, Lag: 2 * time.Second}, {Mode: KVEventsNone}} {
			c := cfg
			c.Policy, c.KVEvents = p, m
			hit[p][m.Mode] = hitRate(t, w, c)
		}
	}
	if !(hit[PolicyPrefix][KVEventsNone] < hit[PolicyPrefix][KVEventsExact]-0.2) {
		t.Fatalf("prefix without events %.3f, with %.3f: it should lose the conversations", hit[PolicyPrefix][KVEventsNone], hit[PolicyPrefix][KVEventsExact])
	}
	if !(hit[PolicyTether][KVEventsNone] >= hit[PolicyTether][KVEventsExact]-0.01 && hit[PolicyTether][KVEventsNone] > hit[PolicyPrefix][KVEventsNone]+0.2) {
		t.Fatalf("tether keeps its conversations in the log: %v (prefix %v)", hit[PolicyTether], hit[PolicyPrefix])
	}
	if _, err := ParseKVEvents("lag=0s"); err == nil {
		t.Fatal("lag=0s must be refused")
	}
	if _, err := ParseKVEvents("sometimes"); err == nil {
		t.Fatal("an unknown mode must be refused")
	}
}

// A restarted edge keeps what its policy persists: tether's bindings are in
// the log; the TensorRT-LLM router's table and Dynamo's claims (held by the
// restarted frontend's lease) are gone, and their next turns are placed
// again, away from their cache.
func TestEdgeRestartsKeepWhatThePolicyPersists(t *testing.T) {
	w := conversations(t)
	cfg := DefaultSimConfig()
	cfg.Instances, cfg.CapacityBlocks, cfg.Edges = 8, 4000, 1
	for _, tc := range []struct {
		p     Policy
		loses bool
	}{{PolicyTether, false}, {PolicyTRTLLMConversation, true}, {PolicyDynamo, true}} {
		c := cfg
		c.Policy, c.KVEvents = tc.p, KVEvents{Mode: KVEventsNone}
		before := hitRate(t, w, c)
		c.EdgeRestarts = 2
		r, err := Simulate(context.Background(), w, c)
		if err != nil {
			t.Fatal(err)
		}
		after := Summarize(r).HitRate
		if r.Restarts != 2 {
			t.Fatalf("%s: %d restarts, want 2", tc.p, r.Restarts)
		}
		if tc.loses != (after < before) || after > before {
			t.Errorf("%s: hit %.3f without restarts, %.3f with (loses state: %v)", tc.p, before, after, tc.loses)
		}
	}
}

// Dynamo's session claims live in etcd: every replica routes a session to
// the worker its first request was bound to. TensorRT-LLM's conversation
// table is per router: the same conversation through three routers is
// placed three times.
func TestPeersShareWhatTheirReplicasShare(t *testing.T) {
	w := conversations(t)
	cfg := DefaultSimConfig()
	cfg.Instances, cfg.CapacityBlocks, cfg.Edges = 8, 4000, 3
	cfg.EdgeFor = func(_ string, call int) int { return call % 3 }
	cfg.KVEvents = KVEvents{Mode: KVEventsNone}
	places := func(p Policy) (moved int) {
		c := cfg
		c.Policy = p
		r, err := Simulate(context.Background(), w, c)
		if err != nil {
			t.Fatal(err)
		}
		first := map[string]int{}
		for _, rec := range r.Records {
			if i, ok := first[rec.Agent]; !ok {
				first[rec.Agent] = rec.Instance
			} else if i != rec.Instance {
				moved++
			}
		}
		return moved
	}
	if n := places(PolicyDynamo); n != 0 {
		t.Fatalf("dynamo moved %d turns off their session's worker", n)
	}
	if n := places(PolicyTRTLLMConversation); n == 0 {
		t.Fatal("trtllm_conversation's routers share nothing: some turns must move")
	}
}

func TestSessionWorkloadIsAClosedLoop(t *testing.T) {
	w, err := SessionWorkload(SessionOptions{Sessions: 5, Turns: 3, Concurrency: 2, InputTokens: 128, OutputTokens: 16, BlockSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultSimConfig()
	cfg.Instances, cfg.CapacityBlocks = 2, 1000
	r, err := Simulate(context.Background(), w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Records) != 15 {
		t.Fatalf("%d requests, want 15", len(r.Records))
	}
	first, last := map[string]time.Duration{}, map[string]time.Duration{}
	for _, rec := range r.Records {
		if _, ok := first[rec.Agent]; !ok {
			first[rec.Agent] = rec.Arrival
		}
		last[rec.Agent] = max(last[rec.Agent], rec.Arrival)
	}
	// Client 0 runs sessions 0, 2, 4 one after another.
	if !(first["session-00002"] > last["session-00000"] && first["session-00004"] > last["session-00002"]) {
		t.Fatalf("a client's next session must start after its previous one: %v %v", first, last)
	}
	if first["session-00001"] != 0 || first["session-00000"] != 0 {
		t.Fatal("the first Concurrency sessions start at once")
	}
	if _, err := SessionWorkload(SessionOptions{Sessions: 0, Turns: 1, Concurrency: 1, InputTokens: 1, OutputTokens: 1, BlockSize: 64}); err == nil {
		t.Fatal("zero sessions must be refused")
	}
}
