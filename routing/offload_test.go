package routing

import (
	"strings"
	"testing"

	"github.com/tether-project/tether/routing/kvindex"
)

// Blocks held only in an offloaded tier earn weights.offloaded_block of a
// GPU block's credit: the offloaded holder beats a cold instance at a
// weight above 0 and scores as cold at 0; a GPU holder beats it.
func TestPlaceCreditsOffloadedBlocks(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	prompt := blocks(3, 40) // 2,560 tokens
	if _, err := ix.Apply(kvindex.Batch{Instance: "ctx-b", Boot: 1, Seq: 1, Events: []kvindex.RankEvent{{Rank: 2, Stored: prompt, Offloaded: true}}}); err != nil {
		t.Fatal(err)
	}
	req := Request{RequestID: "r", Edge: "edge-1", Blocks: prompt, PromptTokens: 40 * 64}
	score := func(rt route, id string) float64 {
		for _, c := range rt.Decision.Candidates {
			if c.Instance == id {
				return c.Score
			}
		}
		t.Fatalf("%s not among the candidates %+v", id, rt.Decision.Candidates)
		return 0
	}
	// ctx-a is cold and slightly less loaded.
	vs := idle("ctx-a", "ctx-b")
	vs[1].QueuedPrefillTokens = 100
	in := Inputs{Views: mustViews(t, vs), Prefix: ix}

	rt := place(t, mustRouter(t, nil), req, in)
	if rt.Instance != "ctx-b" || rt.Rank != 2 || rt.Decision.Policy != PolicyKVAware {
		t.Fatalf("default weight: %+v", rt)
	}
	if got, want := score(rt, "ctx-b"), DefaultOffloadedBlock*40*64-100; got != want {
		t.Fatalf("offloaded holder scores %g, want %g", got, want)
	}

	rt = place(t, mustRouter(t, func(c *Config) { c.Weights.OffloadedBlock = 0 }), req, in)
	if rt.Instance != "ctx-a" || rt.Decision.Policy == PolicyKVAware || score(rt, "ctx-b") != -100 {
		t.Fatalf("weight 0 credits offloaded blocks: %+v", rt)
	}

	// A GPU holder of the whole prompt beats the offloaded one (at weight
	// 1 they would be worth the same, and load would decide).
	if _, err := ix.Apply(kvindex.Batch{Instance: "ctx-c", Boot: 1, Seq: 1, Events: []kvindex.RankEvent{{Rank: 0, Stored: prompt}}}); err != nil {
		t.Fatal(err)
	}
	vs = idle("ctx-a", "ctx-b", "ctx-c")
	vs[2].QueuedPrefillTokens = 100
	rt = place(t, mustRouter(t, nil), req, Inputs{Views: mustViews(t, vs), Prefix: ix})
	if rt.Instance != "ctx-c" || rt.Rank != 0 || rt.CachedTokens != 40*64 {
		t.Fatalf("GPU holder lost to the offloaded one: %+v", rt)
	}
	// Blocks beyond a GPU prefix, offloaded: credited at the weight.
	if _, err := ix.Apply(kvindex.Batch{Instance: "ctx-c", Boot: 1, Seq: 2, Events: []kvindex.RankEvent{{Rank: 0, Removed: prompt[10:]}, {Rank: 0, Stored: prompt, Offloaded: true}}}); err != nil {
		t.Fatal(err)
	}
	rt = place(t, mustRouter(t, nil), req, Inputs{Views: mustViews(t, idle("ctx-c")), Prefix: ix})
	if got, want := score(rt, "ctx-c"), 10*64+DefaultOffloadedBlock*30*64; got != want || rt.CachedTokens != 10*64 {
		t.Fatalf("GPU prefix and offloaded rest score %g (cached %d), want %g", got, rt.CachedTokens, want)
	}
}

func TestOffloadedBlockWeightValidated(t *testing.T) {
	for _, v := range []float64{-0.1, 1.5} {
		c := DefaultConfig()
		c.Weights.OffloadedBlock = v
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "router.weights.offloaded_block") {
			t.Fatalf("offloaded_block %g: %v", v, err)
		}
	}
}
