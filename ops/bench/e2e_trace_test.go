package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// tracesDir is the traces' directory as the Makefile's TRACES names it
// (relative to the repository), or TRACES from the environment.
func tracesDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("TRACES")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared", "traces", "kv-cache-tester")
	} else if !filepath.IsAbs(dir) {
		dir = filepath.Join("..", "..", dir)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("no traces at %s (set TRACES, see BENCHMARKS.md): %v", dir, err)
	}
	return dir
}

// shortTraceWorkload is a few minutes of real traces: trace_0291 (the
// smallest trace with sub-agents) cut after its first sub-agent returns,
// beside the two conversations of the smallest traces, each started 40 s
// (engine time) after the previous one.
func shortTraceWorkload(t *testing.T) *Workload {
	t.Helper()
	dir := tracesDir(t)
	w, err := LoadTraceFiles([]string{
		filepath.Join(dir, "trace_0291.json.gz"),
	}, TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	small, err := LoadTraces(dir, TraceOptions{Smallest: 2})
	if err != nil {
		t.Fatal(err)
	}
	root := w.Agents[0]
	for i, st := range root.Steps {
		if st.SubAgent != nil {
			root.Steps = root.Steps[:i+2] // the launch and the call after it
			break
		}
	}
	w.Agents = append(w.Agents, small.Agents...)
	for i, a := range w.Agents {
		a.Start = time.Duration(i) * 40 * time.Second
	}
	return w
}

// TestSimPlacesATraceLikeALocalDeployment is TestSimPlacesLikeALocalDeployment
// on real traces (prompts synthesised from the traces' block hashes): the
// same context instance for every request in a 3-edge deployment and in
// the simulator.
func TestSimPlacesATraceLikeALocalDeployment(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local deployment")
	}
	w := shortTraceWorkload(t)
	edgeFor := func(agent string, call int) int { return int((stringHash(agent) + uint64(call)) % 3) }
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	local := LocalE2EOptions{Edges: 3, ContextWorkers: 4, GenerationWorkers: 1, Ranks: 1, CapacityBlocks: 8192, TimeScale: 0.02, Seed: 1,
		EdgeFor: edgeFor}
	real, err := ReplayLocalE2E(ctx, w, PolicyTether, local)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Policy, cfg.Log = PolicyTether, LogVirtual
	cfg.Instances, cfg.Ranks, cfg.CapacityBlocks, cfg.Edges = 4, 1, 8192, 3
	cfg.InstanceIDs = []string{"ctx-1", "ctx-2", "ctx-3", "ctx-4"}
	cfg.EdgeFor = edgeFor
	sim, err := Simulate(ctx, w, cfg)
	if err != nil {
		t.Fatal(err)
	}
	simAt := map[string]string{}
	for _, r := range sim.Records {
		simAt[fmt.Sprintf("%s/%d", r.Agent, r.Call)] = r.InstanceID
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
		if got := simAt[fmt.Sprintf("%s/%d", r.Agent, r.Call)]; got != r.InstanceID {
			t.Errorf("%s call %d: deployment placed it on %q, simulator on %q", r.Agent, r.Call, r.InstanceID, got)
		}
	}
	t.Logf("%d requests (%d of sub-agents), same placement each, over instances %v", len(real.Records), subagents, used)
	if t.Failed() {
		for _, r := range real.Records {
			t.Logf("%s call %d edge %d: real %s cached %d/%d, sim %s", r.Agent, r.Call, r.Edge, r.InstanceID, r.Cached, r.Prompt, simAt[fmt.Sprintf("%s/%d", r.Agent, r.Call)])
		}
	}
}
