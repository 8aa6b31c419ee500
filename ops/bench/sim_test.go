package bench

import (
	"context"
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/worker/engine/sim"
)

// smallTraces writes three small traces (one with two parallel sub-agents
// sharing a prefix) and loads them.
func smallTraces(t testing.TB) *Workload {
	t.Helper()
	dir := t.TempDir()
	seq := func(n int, base int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = base + i
		}
		return out
	}
	writeTrace(t, dir, "t1.json.gz", true, traceDoc("t1",
		req(0, 20*64, 40, seq(20, 1)...),
		req(3, 26*64, 40, seq(26, 1)...),
		sub(5, "agent_001", req(0, 12*64, 20, seq(12, 500)...), req(1, 14*64, 20, append(seq(12, 500), 600, 601)...)),
		sub(5.5, "agent_002", req(0, 12*64, 20, append(seq(10, 500), 700, 701)...), req(1, 13*64, 20, append(seq(10, 500), 700, 701, 702)...)),
		req(9, 34*64, 40, seq(34, 1)...),
	))
	writeTrace(t, dir, "t2.json", false, traceDoc("t2",
		req(0, 30*64, 60, seq(30, 1)...),
		req(2, 33*64, 60, seq(33, 1)...),
		req(4, 40*64, 60, seq(40, 1)...),
	))
	writeTrace(t, dir, "t3.json", false, traceDoc("t3",
		req(0.5, 16*64+10, 30, seq(17, 1)...),
		req(1, 20*64, 30, seq(20, 1)...),
	))
	w, err := LoadTraces(dir, TraceOptions{SharedPrefixBlocks: 4})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func testConfig() SimConfig {
	c := DefaultSimConfig()
	c.Instances, c.Ranks, c.CapacityBlocks, c.Edges = 3, 2, 200, 3
	c.Log = LogSequencer
	return c
}

func TestSimulateIsDeterministic(t *testing.T) {
	w := smallTraces(t)
	ctx := context.Background()
	policies := append(append([]Policy(nil), AllPolicies...), TetherVariants...)
	for _, p := range policies {
		cfg := testConfig()
		cfg.Policy = p
		a, err := Simulate(ctx, w, cfg)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		b, err := Simulate(ctx, w, cfg)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if !reflect.DeepEqual(a.Records, b.Records) || !reflect.DeepEqual(a.InstancePrefillTokens, b.InstancePrefillTokens) ||
			a.Commits != b.Commits || a.Overflows != b.Overflows || a.VirtualEnd != b.VirtualEnd {
			t.Fatalf("%s: two runs with the same seed differ:\n%+v\n%+v", p, Summarize(a), Summarize(b))
		}
		if len(a.Records) != 12 {
			t.Fatalf("%s: %d records, want all 12 requests", p, len(a.Records))
		}
		if a.TTLEvictions != 0 {
			// The traces last seconds, far below session_ttl: the sweeper
			// stand-in must judge idleness from committed last-use times.
			t.Fatalf("%s: %d TTL evictions in a replay shorter than the TTL", p, a.TTLEvictions)
		}
		if p.usesSharedLog() && a.Commits == 0 {
			t.Fatalf("%s: no affinity-log commits", p)
		}
	}
}

// TestVirtualLogRacingBindsFirstCommittedWins: two edges bind one key
// before either has applied the other's Bind; the first committed wins for
// both, and each replica sees a commit only from its commit time on.
func TestVirtualLogRacingBindsFirstCommittedWins(t *testing.T) {
	l := newVirtualLog(2, CommitLatency{P50: 10 * time.Millisecond, P99: 10 * time.Millisecond}, 1)
	reg := []fsm.Event{
		fsm.InstanceState{Instance: "a", Fleet: fsm.FleetContext, URL: "sim://a", Status: fsm.InstanceUp, FeatureLevel: fsm.FeatureLevelMax, Ranks: 1},
		fsm.InstanceState{Instance: "b", Fleet: fsm.FleetContext, URL: "sim://b", Status: fsm.InstanceUp, FeatureLevel: fsm.FeatureLevelMax, Ranks: 1},
	}
	if _, _, err := l.Propose(0, reg); err != nil {
		t.Fatal(err)
	}
	bind := func(inst string) fsm.Event {
		return fsm.Bind{Fleet: fsm.FleetContext, Key: "k", ConversationID: "k", Instance: inst}
	}
	r0, at0, err := l.Propose(time.Second, []fsm.Event{bind("a")})
	if err != nil {
		t.Fatal(err)
	}
	// Edge 1, 2 ms later, has not applied edge 0's Bind yet.
	st, err := l.State(1, time.Second+2*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st.Lookup(fsm.FleetContext, "k"); ok {
		t.Fatalf("edge 1 sees a bind that commits at %v at %v", at0, time.Second+2*time.Millisecond)
	}
	r1, at1, err := l.Propose(time.Second+2*time.Millisecond, []fsm.Event{bind("b")})
	if err != nil {
		t.Fatal(err)
	}
	if at1 < at0 {
		t.Fatalf("second proposal commits at %v before the first at %v", at1, at0)
	}
	if r0[0].Binding.Instance != "a" || !r1[0].Found || r1[0].Binding.Instance != "a" {
		t.Fatalf("results %+v / %+v: want both on a (first committed)", r0[0], r1[0])
	}
	for e := 0; e < 2; e++ {
		st, err := l.State(e, at1)
		if err != nil {
			t.Fatal(err)
		}
		if b, ok := st.Lookup(fsm.FleetContext, "k"); !ok || b.Instance != "a" {
			t.Fatalf("edge %d at %v: %+v %v, want bound to a", e, at1, b, ok)
		}
	}
}

// TestCommitLatencyDelaysNewBindsOnly: with commit_first and commit
// latency a new key's first request waits for its Bind; the same replay
// with a zero-latency log has no such wait, and neither has the shipped
// speculative placement, which dispatches beside the proposal.
func TestCommitLatencyDelaysNewBindsOnly(t *testing.T) {
	w := smallTraces(t)
	ctx := context.Background()
	cfg := testConfig()
	cfg.Edges = 1
	cfg.CommitFirst = true
	zero, err := Simulate(ctx, w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Log = LogVirtual
	cfg.CommitLatency = CommitLatency{P50: 50 * time.Millisecond, P99: 50 * time.Millisecond}
	lat, err := Simulate(ctx, w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.CommitFirst = false
	spec, err := Simulate(ctx, w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	first := func(r *RunResult) time.Duration {
		for _, rec := range r.Records {
			if rec.Agent == r.Records[0].Agent && rec.Call == 0 {
				return rec.TTFT
			}
		}
		return -1
	}
	if d := first(lat) - first(zero); d < 50*time.Millisecond {
		t.Fatalf("a new key's first request waited %v more with 50 ms commits, want >= 50ms", d)
	}
	if d := first(spec) - first(zero); d != 0 {
		t.Fatalf("dispatched beside its Bind, a new key's first request waited %v more with 50 ms commits, want 0", d)
	}
}

func TestSimulateRejectsBadConfig(t *testing.T) {
	w := smallTraces(t)
	for _, mut := range []func(*SimConfig){
		func(c *SimConfig) { c.Edges = 0 },
		func(c *SimConfig) { c.Instances = 0 },
		func(c *SimConfig) { c.Ranks = 0 },
		func(c *SimConfig) { c.CapacityBlocks = 1 },
		func(c *SimConfig) { c.TimeScale = 0 },
		func(c *SimConfig) { c.Policy = "fastest" },
		func(c *SimConfig) { c.Log = "paper" },
	} {
		cfg := testConfig()
		mut(&cfg)
		if _, err := Simulate(context.Background(), w, cfg); err == nil {
			t.Fatalf("config %+v: want an error", cfg)
		}
	}
}

// conversation builds a root agent whose turn i sends blocks[i] blocks,
// each turn extending the previous one, block-aligned.
func conversation(id string, at []time.Duration, blocks []int, out int) *Agent {
	a := &Agent{ID: id}
	for i, n := range blocks {
		keys := make([]uint64, n)
		for j := range keys {
			keys[j] = namespaceKey(stringHash(id), int64(j))
		}
		a.Steps = append(a.Steps, Step{At: at[i], Request: &Request{PromptTokens: 64 * n, OutputTokens: out, Keys: keys, Blocks: ChainBlocks(keys)}})
	}
	return a
}

func cachedByCall(r *RunResult, agent string) []int {
	var out []int
	for _, rec := range r.Records {
		if rec.Agent == agent {
			out = append(out, rec.Cached)
		}
	}
	return out
}

func instancesOf(r *RunResult, agent string) []int {
	var out []int
	for _, rec := range r.Records {
		if rec.Agent == agent {
			out = append(out, rec.Instance)
		}
	}
	return out
}

func TestPolicySanityOnAThreeTurnConversation(t *testing.T) {
	ctx := context.Background()
	secs := func(s ...float64) []time.Duration {
		var out []time.Duration
		for _, x := range s {
			out = append(out, time.Duration(x*float64(time.Second)))
		}
		return out
	}
	// Turns of 4, 6 and 8 blocks: a sticky policy caches all of the
	// previous turn (256, then 384 tokens).
	conv := conversation("conv", secs(0.5, 3, 4.5), []int{4, 6, 8}, 10)
	// Two background conversations load the context instances so that an
	// edge that never saw conv places its turn 2 elsewhere: bg1 prefills
	// 130 blocks on X until ~1.5 s (turn 1 goes to Y), bg2 prefills 200
	// blocks on Y from 1 s to ~3.3 s (an edge placing turn 2 at 3 s picks
	// X).
	bg1 := conversation("bg1", secs(0), []int{130}, 10)
	bg2 := conversation("bg2", secs(1), []int{200}, 10)
	w := &Workload{Name: "three-turns", BlockSize: 64, Agents: []*Agent{bg1, conv, bg2}}
	// Edges: bg1 and bg2 through edge 0; conv's turns through edges 1, 0, 1.
	edgeFor := func(agent string, call int) int {
		if agent == "conv" && call != 1 {
			return 1
		}
		return 0
	}
	run := func(p Policy, edges int, seed uint64) *RunResult {
		t.Helper()
		cfg := testConfig()
		cfg.Policy, cfg.Edges, cfg.Seed = p, edges, seed
		cfg.Instances, cfg.Ranks, cfg.CapacityBlocks = 2, 1, 1000
		if edges > 1 {
			cfg.EdgeFor = edgeFor
		}
		r, err := Simulate(ctx, w, cfg)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return r
	}
	want := []int{0, 256, 384}
	for _, p := range []Policy{PolicySession, PolicyTether} {
		r := run(p, 2, 1)
		if got := cachedByCall(r, "conv"); !slices.Equal(got, want) {
			t.Fatalf("%s: cached tokens per turn %v, want %v", p, got, want)
		}
		if in := instancesOf(r, "conv"); in[0] != in[1] || in[1] != in[2] {
			t.Fatalf("%s: turns on instances %v, want one", p, in)
		}
	}
	// One edge: session_local is a perfect sticky router.
	if got := cachedByCall(run(PolicySessionLocal, 1, 1), "conv"); !slices.Equal(got, want) {
		t.Fatalf("session_local with one edge: cached %v, want %v", got, want)
	}
	// Two edges: edge 0 never saw turn 1 and places turn 2 by load (on X,
	// a miss); turn 3 returns to edge 1's binding (Y), which holds only
	// turn 1's blocks.
	sl := run(PolicySessionLocal, 2, 1)
	in := instancesOf(sl, "conv")
	if in[0] == in[1] || in[2] != in[0] {
		t.Fatalf("session_local with 2 edges: turns on %v, want turn 2 scattered", in)
	}
	if got := cachedByCall(sl, "conv"); !slices.Equal(got, []int{0, 0, 256}) {
		t.Fatalf("session_local with 2 edges: cached %v, want [0 0 256]", got)
	}
	// Random over 3 instances hits less often than a sticky policy (which
	// hits on every later turn), summed over seeds.
	var randomCached, stickyCached int
	for seed := uint64(1); seed <= 20; seed++ {
		cfg := testConfig()
		cfg.Policy, cfg.Edges, cfg.Seed = PolicyRandom, 2, seed
		cfg.Instances, cfg.Ranks, cfg.CapacityBlocks = 3, 1, 1000
		r, err := Simulate(ctx, w, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cachedByCall(r, "conv") {
			randomCached += c
		}
		stickyCached += 256 + 384
	}
	if randomCached >= stickyCached {
		t.Fatalf("random cached %d tokens over 20 seeds, sticky %d: random must do worse", randomCached, stickyCached)
	}
}

func TestSubAgentsFollowTheirParentOnlyWithTether(t *testing.T) {
	w := smallTraces(t)
	for _, p := range []Policy{PolicyTether, PolicySession} {
		cfg := testConfig()
		cfg.Policy = p
		r, err := Simulate(context.Background(), w, cfg)
		if err != nil {
			t.Fatal(err)
		}
		parent := -1
		together := true
		for _, rec := range r.Records {
			if rec.Agent == "t1" {
				parent = rec.Instance
			}
			if rec.SubAgent && rec.Instance != parent {
				together = false
			}
		}
		if p == PolicyTether && !together {
			t.Fatalf("tether: sub-agents must run on their parent's instance: %+v", r.Records)
		}
		if p == PolicyTether {
			// Both siblings share 4 shared + 10 common blocks: the
			// second sibling's first call hits them.
			var firsts []int
			for _, rec := range r.Records {
				if rec.SubAgent && rec.Call == 0 {
					firsts = append(firsts, rec.Cached)
				}
			}
			if len(firsts) != 2 || max(firsts[0], firsts[1]) < 14*64 {
				t.Fatalf("tether: sibling first calls cached %v, want one to hit the 14 common blocks", firsts)
			}
		}
	}
}

func TestUpperBoundIsAtLeastEveryPolicy(t *testing.T) {
	w := smallTraces(t)
	base := testConfig()
	base.CapacityBlocks = 60 // small caches: evictions everywhere
	rep, err := Replay(context.Background(), w, ReplayOptions{Base: base, Policies: AllPolicies, Edges: []int{1, 3}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.UpperBound <= 0 || rep.UpperBound >= 1 {
		t.Fatalf("upper bound %v", rep.UpperBound)
	}
	for _, s := range rep.Policies {
		if s.HitRate > rep.UpperBound+1e-12 {
			t.Fatalf("%s with %d edges: hit rate %.4f above the upper bound %.4f", s.Name, s.Edges, s.HitRate, rep.UpperBound)
		}
	}
	// One instance with one unbounded rank is the infinite cache: the
	// simulation and the bound agree exactly.
	one := testConfig()
	one.Instances, one.Ranks, one.CapacityBlocks, one.Edges, one.Policy = 1, 1, 1<<16, 1, PolicyTether
	r, err := Simulate(context.Background(), w, one)
	if err != nil {
		t.Fatal(err)
	}
	if s := Summarize(r); math.Abs(s.HitRate-rep.UpperBound) > 1e-12 {
		t.Fatalf("one unbounded cache: hit rate %.6f, upper bound %.6f", s.HitRate, rep.UpperBound)
	}
}

func TestReportJSONHasTheDocumentedFields(t *testing.T) {
	w := smallTraces(t)
	rep, err := Replay(context.Background(), w, ReplayOptions{Base: testConfig(), Policies: []Policy{PolicyRandom, PolicyTether}, Edges: []int{3}})
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if _, ok := doc["upper_bound_hit_rate"].(float64); !ok {
		t.Fatalf("no upper_bound_hit_rate in %s", data)
	}
	pols, ok := doc["policies"].([]any)
	if !ok || len(pols) != 2 {
		t.Fatalf("policies: %s", data)
	}
	for _, p := range pols {
		m := p.(map[string]any)
		for _, f := range []string{"name", "edges", "hit_rate", "subagent_hit_rate", "prefill_tokens", "ttft_p50_ms", "ttft_p99_ms", "load_cov", "overflows", "commits"} {
			if _, ok := m[f]; !ok {
				t.Fatalf("policy entry lacks %q: %v", f, m)
			}
		}
	}
	if pols[1].(map[string]any)["name"] != "tether" || pols[1].(map[string]any)["commits"].(float64) <= 0 {
		t.Fatalf("tether entry: %v", pols[1])
	}
}

func TestReplayCancelled(t *testing.T) {
	w := smallTraces(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Replay(ctx, w, ReplayOptions{Base: testConfig(), Policies: AllPolicies, Edges: []int{3}}); err == nil {
		t.Fatal("want an error from a cancelled replay")
	}
}

// Agents of different types that share a tool block, starting one after
// another: KV-aware placement (prefix, and tether's placement of new keys)
// sends a new agent's first call where the shared block is cached, pure
// least-loaded placement does not look. Medians of
// what the published report shows: 0.157 against 0.000.
func TestKVAwareBeatsLeastLoadedOnFirstCalls(t *testing.T) {
	base := DefaultSimConfig()
	base.Instances, base.Ranks, base.CapacityBlocks = 8, 2, 16384
	rep, err := RunAgents(context.Background(), AgentOptions{Pattern: PatternTAG},
		ReplayOptions{Base: base, Policies: []Policy{PolicyLeastLoaded, PolicyPrefix, PolicyTether}, Edges: []int{3}, Parallel: 1})
	if err != nil {
		t.Fatal(err)
	}
	first := map[string]float64{}
	for _, p := range rep.Policies {
		first[p.Name] = p.FirstCallHitRate
	}
	ll := first[string(PolicyLeastLoaded)]
	for _, p := range []Policy{PolicyPrefix, PolicyTether} {
		if first[string(p)] <= ll {
			t.Errorf("%s first-call hit rate %.3f, least_loaded %.3f: KV-aware placement must find the shared tool block", p, first[string(p)], ll)
		}
	}
}

// TestSessionTTLJudgesCommittedLastUse: a conversation idle 50 minutes keeps
// its binding under a one-hour TTL and loses it under a 30-minute one.
func TestSessionTTLJudgesCommittedLastUse(t *testing.T) {
	dir := t.TempDir()
	writeTrace(t, dir, "idle.json", false, traceDoc("idle",
		req(0, 10*64, 20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
		req(3000, 12*64, 20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12),
	))
	w, err := LoadTraces(dir, TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ttl  time.Duration
		want int
	}{{time.Hour, 0}, {30 * time.Minute, 1}} {
		cfg := testConfig()
		cfg.Policy, cfg.SessionTTL = PolicySession, c.ttl
		r, err := Simulate(context.Background(), w, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if r.TTLEvictions != c.want {
			t.Fatalf("ttl %v: %d evictions, want %d", c.ttl, r.TTLEvictions, c.want)
		}
	}
}

// A simulated edge follows the first placement it heard of a key, as the
// edge does, whatever the order of the edges that proposed it.
func TestSimHeardFollowsTheFirstPlacement(t *testing.T) {
	k := fsm.FleetKey{Fleet: fsm.FleetContext, Key: "conv"}
	bind := func(inst string) fsm.Bind { return fsm.Bind{Fleet: k.Fleet, Key: k.Key, Instance: inst} }
	s := &simulator{cfg: SimConfig{Share: Share{Placements: true}, ShareLatency: time.Millisecond}, now: 10 * time.Millisecond}
	listener := &simEdge{proposals: map[fsm.FleetKey]*simProposal{}}
	later := &simEdge{proposals: map[fsm.FleetKey]*simProposal{k: {bind: bind("ctx-1"), at: 5 * time.Millisecond, commitAt: 20 * time.Millisecond}}}
	earlier := &simEdge{proposals: map[fsm.FleetKey]*simProposal{k: {bind: bind("ctx-2"), at: 2 * time.Millisecond, commitAt: 20 * time.Millisecond}}}
	s.edges = []*simEdge{listener, later, earlier}
	b, ok := simPlacements{s: s, e: listener}.Heard(k.Fleet, k.Key)
	if !ok || b.Instance != "ctx-2" {
		t.Fatalf("heard %v (%v), want the first placement, on ctx-2", b, ok)
	}
	s.now = 20 * time.Millisecond // both committed: nothing in flight to hear
	if b, ok := (simPlacements{s: s, e: listener}).Heard(k.Fleet, k.Key); ok {
		t.Fatalf("heard %v after the commits", b)
	}
}

// The simulated workers report the prefill still ahead as a tether worker
// does (worker/engine/sim PrefillLeft): a queued request's uncached tokens
// whole, a running prefill's rest, nothing once its first token is out;
// requests the report does not cover yet (admitted at or after it) are the
// edges' own pending dispatches.
func TestSimReportCountsThePrefillLeft(t *testing.T) {
	s := time.Second
	in := &simInstance{inflight: []*inflight{
		{arrival: 0, start: 0, firstToken: 10 * s, done: 20 * s, uncached: 100_000, prompt: 100_000},       // running: 40 % left at 6 s
		{arrival: 1 * s, start: 10 * s, firstToken: 11 * s, done: 30 * s, uncached: 2_000, prompt: 50_000}, // queued: all of its uncached part
		{arrival: 0, start: 0, firstToken: 2 * s, done: 40 * s, uncached: 9_000, prompt: 9_000},            // decoding: none
		{arrival: 6 * s, start: 11 * s, firstToken: 12 * s, done: 40 * s, uncached: 7_000, prompt: 7_000},  // not in this report
	}}
	in.report(6*s, 0)
	if in.repPrefill != 42_000 || in.repQueued != 1 || in.repActive != 2 {
		t.Fatalf("report at 6 s: prefill %d, queued %d, active %d; want 40,000 + 2,000, 1 queued, 2 active", in.repPrefill, in.repQueued, in.repActive)
	}
}

// An engine refuses a prompt larger than a rank's KV cache at once
// (RefuseOversized, as vLLM and e2e mode do): the record is a full miss on
// no instance, its time to first token the prefill modelled alone, and a
// turn sent to the same instance right after does not wait behind it —
// where computing it in full (the default) holds the rank's prefill.
func TestRefuseOversizedHoldsNoRank(t *testing.T) {
	dir := t.TempDir()
	seq := func(n, base int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = base + i
		}
		return out
	}
	writeTrace(t, dir, "big.json", false, traceDoc("big", req(0, 300*64, 10, seq(300, 1)...)))
	writeTrace(t, dir, "small.json", false, traceDoc("small", req(0.5, 10*64, 10, seq(10, 5000)...)))
	w, err := LoadTraces(dir, TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultSimConfig()
	cfg.Instances, cfg.Ranks, cfg.CapacityBlocks, cfg.Edges, cfg.Log, cfg.Policy = 1, 1, 100, 1, LogSequencer, PolicyTether
	ttfts := func(refuse bool) (big, small RequestRecord, res *RunResult) {
		t.Helper()
		c := cfg
		c.RefuseOversized = refuse
		res, err := Simulate(context.Background(), w, c)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.Records {
			if r.Root == "big" {
				big = r
			} else {
				small = r
			}
		}
		return big, small, res
	}
	big, small, res := ttfts(false)
	if !big.Oversized || big.Instance != 0 || small.TTFT < big.TTFT-time.Second {
		t.Fatalf("computed in full: big %+v, small %+v; want the small turn to wait behind the big prefill", big, small)
	}
	bigComputed := res.InstancePrefillTokens[0]
	big, small, res = ttfts(true)
	tokens := float64(300 * 64)
	prefill := sim.DefaultPrefillOverhead + time.Duration(tokens/sim.DefaultPrefillTokensPerSec*float64(time.Second))
	if !big.Oversized || big.Instance != -1 || big.Cached != 0 || big.TTFT != prefill || res.Refused != 1 {
		t.Fatalf("refused: %+v (refused %d); want a full miss on no instance, TTFT %v", big, res.Refused, prefill)
	}
	if small.TTFT >= big.TTFT/2 {
		t.Fatalf("refused: the small turn's TTFT %v; it should not wait behind the refused prompt (%v)", small.TTFT, big.TTFT)
	}
	if got := res.InstancePrefillTokens[0]; got != int64(10*64) || bigComputed <= got {
		t.Fatalf("refused: the instance computed %d tokens (computing the big one: %d); want only the small turn's %d", got, bigComputed, 10*64)
	}
}
