package sim

import (
	"testing"
	"time"

	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/engine"
)

// A rank with two adapter slots loads an adapter before its first prefill
// (the load time on top of the TTFT), keeps it for the next request,
// replaces the least recently used idle one, and makes a third adapter
// wait while both slots run requests. An adapter's blocks are its own.
func TestVirtualRankAdapterSlots(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxLoRAs, cfg.LoRALoadTime, cfg.BlockSize = 2, 100*time.Millisecond, 4
	r, err := NewVirtualRank(0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	toks := prefix.Tokenize("a b c d e f g h i j k l m n o p")
	req := func(adapter string, out int) VirtualRequest {
		return VirtualRequest{Phase: engine.PhaseAggregated, Adapter: adapter, PromptTokens: len(toks), OutputTokens: out,
			Hashes: prefix.AdapterBlockHashes(adapter, toks, 4)}
	}
	admit := func(at time.Duration, vr VirtualRequest) VirtualResult {
		t.Helper()
		res, err := r.Admit(at, vr)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a1 := admit(0, req("agent-a", 1))
	if !a1.LoadedAdapter || a1.AdapterLoad != 100*time.Millisecond || a1.StartAt != 100*time.Millisecond {
		t.Fatalf("first agent-a: %+v", a1)
	}
	a2 := admit(time.Second, req("agent-a", 1))
	if a2.LoadedAdapter || a2.CachedTokens == 0 {
		t.Fatalf("second agent-a: %+v (want the slot and the cache)", a2)
	}
	base := admit(2*time.Second, req("", 1))
	if base.LoadedAdapter || base.CachedTokens != 0 {
		t.Fatalf("base request: %+v (want no slot and no cache: the blocks are agent-a's)", base)
	}
	// b and c take the slots with long requests; d waits for one to finish.
	b := admit(3*time.Second, req("agent-b", 400))
	c := admit(3*time.Second, req("agent-c", 400))
	if !b.LoadedAdapter || !c.LoadedAdapter {
		t.Fatalf("agent-b %+v, agent-c %+v: want loads (agent-a was idle and least recently used)", b, c)
	}
	d := admit(3*time.Second, req("agent-d", 1))
	if !d.LoadedAdapter || d.StartAt < min(b.DoneAt, c.DoneAt)+cfg.LoRALoadTime {
		t.Fatalf("agent-d started at %v; want after a running adapter drained (%v) and its load", d.StartAt, min(b.DoneAt, c.DoneAt))
	}
	st := r.Stats(10 * time.Second)
	if st.LoRALoads != 4 || len(st.LoRAAdapters) != 2 {
		t.Fatalf("stats %+v", st)
	}
}
