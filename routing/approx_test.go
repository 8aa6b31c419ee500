package routing

import (
	"testing"
	"time"

	"github.com/tether-project/tether/routing/kvindex"
)

// The edge's shadow of an engine without KV events (an approximate
// instance in the index) earns cache credit, but its "not held" is no
// evidence of eviction: the cache-lost rule leaves a key bound to it, where
// the same index contents from the worker's own events would move the key
// to the instance holding its prefix.
func TestCacheLostNeverTrustsAShadowsNo(t *testing.T) {
	prompt := blocks(4, 100)
	r := mustRouter(t, nil)
	for _, approx := range []bool{false, true} {
		ix := kvindex.New(kvindex.Config{})
		out, err := ix.Apply(kvindex.Batch{Instance: "ctx-a", Boot: 1, Seq: 1, Approximate: approx,
			Events: []kvindex.RankEvent{{Rank: 0, Stored: blocks(9, 30)}}}) // none of the prompt
		if err != nil || out != kvindex.Applied {
			t.Fatalf("store: %v %v", out, err)
		}
		stored(t, ix, "ctx-b", 1, 0, prompt[:80])
		b := binding("conv-1", "ctx-a")
		b.LastUsed = t0.Add(-time.Hour).UnixNano()
		rt := routeBound(t, r, Request{ConversationID: "conv-1", Blocks: prompt, PromptTokens: 6400, Now: t0},
			b, Inputs{Views: mustViews(t, idle("ctx-a", "ctx-b")), Prefix: ix})
		moved := rt.Action == actionOverflow && rt.Rebind && rt.Instance == "ctx-b"
		if moved == approx || (!moved && rt.Action != actionSticky) {
			t.Errorf("approximate=%v: %v to %s; want moved=%v", approx, rt.Action, rt.Instance, !approx)
		}
	}
}
