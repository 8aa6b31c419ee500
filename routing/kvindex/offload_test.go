package kvindex

import (
	"slices"
	"testing"
)

// A rank's offloaded tier is its own holder: Match reports its leading
// blocks apart from the GPU's, Holds and the GPU counts ignore it, an
// offloaded removal leaves the GPU's blocks, and a restart drops both.
func TestOffloadedTier(t *testing.T) {
	ix := New(Config{})
	prompt := chain(300, 8)
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 1, Events: []RankEvent{
		{Rank: 1, Stored: prompt[:2]},
		{Rank: 1, Stored: prompt[:6], Offloaded: true},
	}}, Applied)
	mustApply(t, ix, Batch{Instance: "b", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: prompt, Offloaded: true}}}, Applied)
	got := matchMap(ix.Match(prompt, t0, nil))
	want := map[string]Match{
		"a": {Instance: "a", Blocks: 2, Rank: 1, Offloaded: 6, OffloadedRank: 1},
		"b": {Instance: "b", Blocks: 0, Rank: -1, Offloaded: 8, OffloadedRank: 0},
	}
	if len(got) != len(want) || got["a"] != want["a"] || got["b"] != want["b"] {
		t.Fatalf("match %+v, want %+v", got, want)
	}
	if held, _ := ix.Holds("b", -1, prompt[0], t0); held {
		t.Fatal("an offloaded block counts as held on the GPU")
	}
	kv, _ := ix.Instance("a")
	if !slices.Equal(kv.RankBlocks, []int64{0, 2}) || !slices.Equal(kv.OffloadedRankBlocks, []int64{0, 6}) {
		t.Fatalf("instance a %+v", kv)
	}
	// Removing the offloaded copies leaves the GPU's.
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 2, Events: []RankEvent{{Rank: 1, Removed: prompt[:6], Offloaded: true}}}, Applied)
	if m := matchMap(ix.Match(prompt, t0, nil))["a"]; m.Blocks != 2 || m.Offloaded != 0 {
		t.Fatalf("after the offloaded removal: %+v", m)
	}
	// A restart (Seq 1 of a new boot) drops the offloaded tier too.
	mustApply(t, ix, Batch{Instance: "b", Boot: 2, Seq: 1}, Applied)
	if _, ok := matchMap(ix.Match(prompt, t0, nil))["b"]; ok {
		t.Fatal("a restarted instance keeps its offloaded blocks")
	}
	ix.RemoveInstance("a")
	ix.RemoveInstance("b")
	if st := ix.Stats(); st.HolderBlocks != 0 || st.Blocks != 0 {
		t.Fatalf("stats after removal %+v", st)
	}
}
