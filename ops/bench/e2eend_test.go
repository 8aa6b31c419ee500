package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestE2EEndsWhenItsRequestsDo replays, through a real local deployment, a
// conversation whose last step (an hour later) sends nothing: the replay
// ends when its one request completed instead of waiting for that step.
func TestE2EEndsWhenItsRequestsDo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local deployment")
	}
	keys := []uint64{101, 102}
	root := &Agent{ID: "ends-conv"}
	empty := &Agent{ID: "ends-conv/idle", Parent: root}
	root.Steps = []Step{
		{Request: &Request{PromptTokens: 2 * 64, OutputTokens: 4, Stream: true, Keys: keys, Blocks: ChainBlocks(keys)}},
		{At: time.Hour, SubAgent: empty},
	}
	w := &Workload{Name: "ends", BlockSize: 64, Agents: []*Agent{root}}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var stages []string
	local := LocalE2EOptions{Edges: 1, ContextWorkers: 1, GenerationWorkers: 1, Ranks: 1, CapacityBlocks: 256, TimeScale: 1, Seed: 1,
		Stage: func(what string) { stages = append(stages, what) }}
	r, err := ReplayLocalE2E(ctx, w, PolicyTether, local)
	if err != nil {
		t.Fatalf("replay did not end with its request: %v", err)
	}
	if len(r.Records) != 1 {
		t.Fatalf("%d records, want 1", len(r.Records))
	}
	if len(stages) < 2 || !strings.Contains(strings.Join(stages, "; "), "replaying through the tether deployment") {
		t.Fatalf("stages %q do not say what the run waits for", stages)
	}
}
