package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/prefix"
)

func TestPromptMessagesSynthesiseEqualBlocksFromEqualKeys(t *testing.T) {
	keys := []uint64{11, 22, 33}
	a := &Request{PromptTokens: 3*64 - 10, Keys: keys}
	b := &Request{PromptTokens: 4 * 64, Keys: append(append([]uint64(nil), keys[:2]...), 99, 100)}
	ta := prefix.Tokenize(prefix.RenderChat(PromptMessages(a, 64)))
	tb := prefix.Tokenize(prefix.RenderChat(PromptMessages(b, 64)))
	// One role marker token, then one token per word.
	if len(ta) != 1+a.PromptTokens || len(tb) != 1+b.PromptTokens {
		t.Fatalf("token counts %d and %d, want %d and %d", len(ta), len(tb), 1+a.PromptTokens, 1+b.PromptTokens)
	}
	common := 0
	for common < len(ta) && common < len(tb) && ta[common] == tb[common] {
		common++
	}
	if common != 1+2*64 {
		t.Fatalf("prompts share %d tokens, want the marker and the 2 common blocks (129)", common)
	}
	ha, hb := prefix.BlockHashes(ta, 64), prefix.BlockHashes(tb, 64)
	if ha[0] != hb[0] || ha[1] == hb[2] {
		t.Fatal("block hashes must follow the shared key prefix")
	}
}

// TestE2EAgainstLocalDeployments replays the supervisor pattern against two
// real local deployments (edges on loopback Raft, embedded NATS, simulated
// workers over HTTP): tether sends the sub-agents to their parent's context
// instance, where their shared tool prefix is cached, and reproduces the
// sim ranking against round robin.
func TestE2EAgainstLocalDeployments(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two local deployments")
	}
	w, err := Agents(AgentOptions{Pattern: PatternSupervisor})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	local := LocalE2EOptions{Edges: 3, ContextWorkers: 4, GenerationWorkers: 1, Ranks: 2, CapacityBlocks: 4096, TimeScale: 0.01, Seed: 1}
	sim := ReplayOptions{Base: testConfig()}
	cmp, err := CompareE2E(ctx, w, []Policy{PolicyRandom, PolicyRoundRobin, PolicyTether}, local, sim)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmp.Skipped) != 1 || cmp.Skipped[0] != string(PolicyRandom) {
		t.Fatalf("skipped %v, want random only", cmp.Skipped)
	}
	if len(cmp.Policies) != 2 || len(cmp.Runs) != 2 {
		t.Fatalf("e2e ran %d policies", len(cmp.Policies))
	}
	by := map[string]Summary{}
	for _, s := range cmp.Policies {
		by[s.Name] = s
		if s.Requests != 20 {
			t.Fatalf("%s: %d requests recorded, want 20", s.Name, s.Requests)
		}
	}
	tether, rr := by[string(PolicyTether)], by[string(PolicyRoundRobin)]
	if tether.SubagentFirstCallHitRate <= 0 {
		t.Fatalf("tether e2e: sub-agents' first calls hit nothing (%+v)", tether)
	}
	if tether.HitRate <= rr.HitRate {
		t.Fatalf("tether e2e hit rate %.3f, round robin %.3f", tether.HitRate, rr.HitRate)
	}
	// Every tether sub-agent request ran on its parent's context instance.
	for _, r := range cmp.Runs {
		if r.Policy != PolicyTether {
			continue
		}
		parent := -1
		for _, rec := range r.Records {
			if !rec.SubAgent && rec.Call == 0 {
				parent = rec.Instance
			}
		}
		for _, rec := range r.Records {
			if rec.SubAgent && (rec.Instance != parent || parent < 0) {
				t.Fatalf("tether e2e: sub-agent %s call %d on instance %d, parent on %d", rec.Agent, rec.Call, rec.Instance, parent)
			}
		}
	}
	if !cmp.Reproduced {
		t.Fatalf("e2e does not reproduce the sim ranking: %v", cmp.Inversions)
	}
	if md := cmp.Markdown(); !strings.Contains(md, "reproduces the sim ranking") {
		t.Fatalf("markdown: %s", md)
	}
}

// TestSimPlacesLikeALocalDeployment replays a short workload (the agent
// patterns one after another, 30 s apart, so telemetry and KV events
// settle between them) through a real 3-edge in-process deployment
// (ops/devstack: edges on loopback Raft, NATS, simulated workers over HTTP)
// and through the simulator, each request through the same edge, and
// checks that every request reached the same context instance: both run
// the same decision (routing.Decider).
func TestSimPlacesLikeALocalDeployment(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local deployment")
	}
	// One execution of each pattern, 30 s apart (engine time): different
	// prompts, so placements spread; the supervisor's second execution
	// shares its first's system and tool prefix. Not tag: its sub-agents
	// are new keys placed while their siblings load the instance, so the
	// placement depends on how fresh each edge's load view is — timing the
	// simulator models but cannot reproduce request by request.
	var w *Workload
	for i, p := range []Pattern{PatternSupervisor, PatternReAct, PatternFanout, PatternSupervisor} {
		pw, err := Agents(AgentOptions{Pattern: p})
		if err != nil {
			t.Fatal(err)
		}
		var rename func(a *Agent)
		rename = func(a *Agent) {
			a.ID = fmt.Sprintf("%s-%d", a.ID, i)
			for _, st := range a.Steps {
				if st.SubAgent != nil {
					rename(st.SubAgent)
				}
			}
		}
		for _, a := range pw.Agents {
			rename(a)
			a.Start += time.Duration(i) * 30 * time.Second
		}
		if w == nil {
			w = pw
			continue
		}
		w.Agents = append(w.Agents, pw.Agents...)
	}
	placesLikeADeployment(t, w, 4096, 0.1)
}

// placesLikeADeployment replays w through a 3-edge deployment (4 context
// workers of capacity blocks each, one rank) at timeScale and through the
// simulator with the same edge per request and the same instance ids, and
// fails for every request the two placed on different context instances.
func placesLikeADeployment(t *testing.T, w *Workload, capacity int, timeScale float64) {
	t.Helper()
	edgeFor := func(agent string, call int) int { return int((stringHash(agent) + uint64(call)) % 3) }
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	local := LocalE2EOptions{Edges: 3, ContextWorkers: 4, GenerationWorkers: 1, Ranks: 1, CapacityBlocks: capacity, TimeScale: timeScale, Seed: 1,
		EdgeFor: edgeFor}
	real, err := ReplayLocalE2E(ctx, w, PolicyTether, local)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Policy, cfg.Log = PolicyTether, LogVirtual
	cfg.Instances, cfg.Ranks, cfg.CapacityBlocks, cfg.Edges = 4, 1, capacity, 3
	cfg.InstanceIDs = []string{"ctx-1", "ctx-2", "ctx-3", "ctx-4"}
	cfg.EdgeFor = edgeFor
	sim, err := Simulate(ctx, w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	type call struct {
		agent string
		n     int
	}
	simAt := map[call]string{}
	for _, r := range sim.Records {
		simAt[call{r.Agent, r.Call}] = r.InstanceID
	}
	if len(real.Records) != len(sim.Records) || len(real.Records) == 0 {
		t.Fatalf("deployment recorded %d requests, simulator %d", len(real.Records), len(sim.Records))
	}
	used, subagents := map[string]bool{}, 0
	for _, r := range real.Records {
		used[r.InstanceID] = true
		if r.SubAgent {
			subagents++
		}
		if got := simAt[call{r.Agent, r.Call}]; got != r.InstanceID {
			t.Errorf("%s call %d: deployment placed it on %q, simulator on %q", r.Agent, r.Call, r.InstanceID, got)
		}
	}
	t.Logf("%d requests (%d of sub-agents), same placement each, over instances %v", len(real.Records), subagents, used)
	if t.Failed() {
		for _, r := range real.Records {
			t.Logf("%s call %d edge %d: real %s cached %d/%d, sim %s", r.Agent, r.Call, r.Edge, r.InstanceID, r.Cached, r.Prompt, simAt[call{r.Agent, r.Call}])
		}
		for _, r := range sim.Records {
			t.Logf("sim %s call %d edge %d at %v: %s cached %d/%d", r.Agent, r.Call, r.Edge, r.Arrival, r.InstanceID, r.Cached, r.Prompt)
		}
	}
}
