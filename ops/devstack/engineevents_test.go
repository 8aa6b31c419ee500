package devstack

import (
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/prefix"
)

// engineEventsOutcome is what one stack did with the same three requests.
type engineEventsOutcome struct {
	childSameCtx, otherSameCtx bool // landed on the parent's context instance
	childCached, otherCached   int  // usage.prompt_tokens_details.cached_tokens
}

// runSharedPrefixScenario sends a parent, waits until the edge's KV index
// holds the parent's system-prompt blocks from worker telemetry (not from
// the edge's own short-lived predictions), then a sub-agent and an
// unrelated conversation re-sending the same system prompt.
func runSharedPrefixScenario(t *testing.T, mode string, aggregated bool) engineEventsOutcome {
	o := Options{Edges: 1, ContextWorkers: 2, GenerationWorkers: 1, Ranks: 2, EngineEvents: mode}
	if aggregated {
		o.Aggregated, o.GenerationWorkers = true, 0
	}
	st := startStack(t, o)
	c := stackClient(t, st)
	n := st.Edges()[0]
	parent := chat(t, c, st, n, "parent-1", "", "plan the work")
	parentCtx := contextInstance(t, parent.route)

	sys := prefix.Tokenize(prefix.RenderChat([]prefix.Message{{Role: "system", Content: strings.Repeat("you are a careful coding agent; ", 40)}}))
	blocks := prefix.BlockHashes(sys, st.EdgeConfig(0).Placement.BlockSize)
	if len(blocks) == 0 {
		t.Fatal("the system prompt fills no block")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		// An hour ahead every prediction has expired: only blocks a
		// worker reported count.
		held := 0
		for _, m := range n.Edge().Fleet().Index().Match(blocks, time.Now().Add(time.Hour), nil) {
			if m.Instance == parentCtx && m.Rank >= 0 {
				held = m.Blocks
			}
		}
		if held == len(blocks) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s mode: the edge's KV index never held the parent's %d system-prompt blocks on %s (held %d)", mode, len(blocks), parentCtx, held)
		}
		time.Sleep(10 * time.Millisecond)
	}
	child := chat(t, c, st, n, "child-a", "parent-1", "explore package routing")
	other := chat(t, c, st, n, "other-1", "", "write the tests")
	return engineEventsOutcome{
		childSameCtx: contextInstance(t, child.route) == parentCtx, childCached: child.cached,
		otherSameCtx: contextInstance(t, other.route) == parentCtx, otherCached: other.cached,
	}
}

// With simulated engines publishing vLLM-format KV events behind proxy
// workers, sub-agent affinity, KV-aware placement of a new conversation
// and the cached_tokens clients see are exactly those of the native mode,
// on split fleets and on an aggregated one.
func TestEngineEventsModeMatchesNative(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four stacks")
	}
	for _, aggregated := range []bool{false, true} {
		native := runSharedPrefixScenario(t, "", aggregated)
		viaEvents := runSharedPrefixScenario(t, EngineEventsVLLM, aggregated)
		t.Logf("aggregated %v: native %+v; vllm engine events %+v", aggregated, native, viaEvents)
		if !native.childSameCtx || native.childCached == 0 {
			t.Fatalf("aggregated %v, native mode: %+v, want the sub-agent on the parent's instance with cached tokens", aggregated, native)
		}
		if viaEvents != native {
			t.Fatalf("aggregated %v: vllm engine-events mode %+v, native mode %+v: want the same placements and cached tokens", aggregated, viaEvents, native)
		}
	}
}
