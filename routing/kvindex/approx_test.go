package kvindex

import (
	"slices"
	"testing"
)

// An approximate instance (the edge's shadow of an engine without KV
// events) earns cache credit like any other, but its "no" is never a
// trusted answer: Holds reports it unsynced, so the cache-lost rule cannot
// read it as eviction.
func TestApproximateBatchCreditsButIsNotTrusted(t *testing.T) {
	ix := New(Config{})
	prompt := chain(500, 6)
	mustApply(t, ix, Batch{Instance: "eng", Boot: 1, Seq: 1, Approximate: true,
		Events: []RankEvent{{Rank: 0, Stored: prompt[:4]}}}, Applied)

	got := matchMap(ix.Match(prompt, t0, nil))
	if m := got["eng"]; m.Blocks != 4 || m.Rank != 0 {
		t.Fatalf("match on the shadow: %+v, want 4 blocks on rank 0", m)
	}
	if held, synced := ix.Holds("eng", 0, prompt[1], t0); !held || synced {
		t.Fatalf("Holds(held block) = %v, %v; want held, not synced", held, synced)
	}
	if held, synced := ix.Holds("eng", 0, prompt[5], t0); held || synced {
		t.Fatalf("Holds(missing block) = %v, %v; want not held, not synced (no eviction evidence)", held, synced)
	}
	if ix.Stale("eng") {
		t.Fatal("an approximate baseline is a baseline: the instance is not stale")
	}
	kv, ok := ix.Instance("eng")
	if !ok || !kv.Synced || !kv.Approximate || kv.Boot != 1 || kv.Seq != 1 || !slices.Equal(kv.RankBlocks, []int64{4}) {
		t.Fatalf("Instance = %+v, %v", kv, ok)
	}

	// Later batches of the same boot stay approximate; removals count.
	mustApply(t, ix, Batch{Instance: "eng", Boot: 1, Seq: 2, Approximate: true,
		Events: []RankEvent{{Rank: 0, Removed: prompt[2:4]}, {Rank: 1, Stored: prompt[:1]}}}, Applied)
	kv, _ = ix.Instance("eng")
	if !kv.Approximate || kv.Seq != 2 || !slices.Equal(kv.RankBlocks, []int64{2, 1}) {
		t.Fatalf("after seq 2: %+v", kv)
	}

	// The instance's own events (a new boot, Seq 1) replace the model.
	mustApply(t, ix, Batch{Instance: "eng", Boot: 99, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: prompt[:1]}}}, Applied)
	if held, synced := ix.Holds("eng", 0, prompt[3], t0); held || !synced {
		t.Fatalf("after the instance's own baseline: Holds = %v, %v; want a trusted no", held, synced)
	}
	kv, _ = ix.Instance("eng")
	if kv.Approximate || !slices.Equal(kv.RankBlocks, []int64{1, 0}) {
		t.Fatalf("after the real baseline: %+v", kv)
	}

	// The instance's own events joined mid-stream: the model is dropped
	// at once and the instance waits for a dump, no longer approximate.
	mustApply(t, ix, Batch{Instance: "y", Boot: 1, Seq: 1, Approximate: true, Events: []RankEvent{{Rank: 0, Stored: prompt}}}, Applied)
	mustApply(t, ix, Batch{Instance: "y", Boot: 77, Seq: 9, Events: []RankEvent{{Rank: 0, Stored: prompt[:1]}}}, NeedsDump)
	if kv, _ := ix.Instance("y"); kv.Approximate || kv.Synced || !slices.Equal(kv.RankBlocks, []int64{0}) {
		t.Fatalf("after the worker's mid-stream batch: %+v", kv)
	}

	// A dump also makes it exact.
	mustApply(t, ix, Batch{Instance: "x", Boot: 1, Seq: 1, Approximate: true, Events: []RankEvent{{Rank: 0, Stored: prompt}}}, Applied)
	if err := ix.ReplaceInstance("x", 5, 3, [][]uint64{nil, prompt[:2]}); err != nil {
		t.Fatal(err)
	}
	kv, _ = ix.Instance("x")
	if kv.Approximate || kv.Boot != 5 || kv.Seq != 3 || !slices.Equal(kv.RankBlocks, []int64{0, 2}) {
		t.Fatalf("after a dump: %+v", kv)
	}
	if _, ok := ix.Instance("nobody"); ok {
		t.Fatal("Instance of an unknown id reported ok")
	}
}
