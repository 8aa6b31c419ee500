package kvshadow

import (
	"slices"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/routing/kvindex"
)

var t0 = time.Unix(1_700_000_000, 0)

// turns returns the block hashes of a conversation's first turn (n1
// blocks) and of its second turn, which extends the first by n2 blocks.
func turns(seed uint32, n1, n2 int) (first, second []uint64) {
	toks := make([]uint32, (n1+n2)*4)
	for i := range toks {
		toks[i] = seed*1_000_003 + uint32(i)
	}
	second = prefix.BlockHashes(toks, 4)
	return second[:n1], second
}

func matchOf(ix *kvindex.Index, blocks []uint64, instance string) kvindex.Match {
	for _, m := range ix.Match(blocks, t0, nil) {
		if m.Instance == instance {
			return m
		}
	}
	return kvindex.Match{Instance: instance, Rank: -1}
}

func TestRouteCreditsTheNextTurnAndStaysApproximate(t *testing.T) {
	ix := kvindex.New(kvindex.Config{PredictTTL: -1})
	s := New(ix, 100)
	first, second := turns(1, 5, 3)
	p, ok, err := s.Route("vllm-a", 1, 2, 64, first)
	if err != nil || !ok || p.Hit != 0 || p.Rank != 1 || p.Boot != 100 {
		t.Fatalf("first turn: %+v ok %v err %v", p, ok, err)
	}
	if m := matchOf(ix, second, "vllm-a"); m.Blocks != 5 || m.Rank != 1 {
		t.Fatalf("second turn's credit: %+v, want the first turn's 5 blocks on rank 1", m)
	}
	if m := matchOf(ix, second, "vllm-b"); m.Blocks != 0 {
		t.Fatalf("another instance is credited: %+v", m)
	}
	// The shadow's "no" is not eviction evidence.
	if held, synced := ix.Holds("vllm-a", 1, second[6], t0); held || synced {
		t.Fatalf("Holds on the shadow = %v, %v; want no, unsynced", held, synced)
	}
	kv, _ := ix.Instance("vllm-a")
	if !kv.Approximate || kv.Boot != 100 || kv.Seq != 1 || !slices.Equal(kv.RankBlocks, []int64{0, 5}) {
		t.Fatalf("index view: %+v", kv)
	}
	// The second turn hits what the first stored.
	p, _, err = s.Route("vllm-a", 1, 2, 64, second)
	if err != nil || p.Hit != 5 {
		t.Fatalf("second turn: %+v err %v, want a predicted hit of 5", p, err)
	}
	if m := matchOf(ix, second, "vllm-a"); m.Blocks != 8 {
		t.Fatalf("after the second turn: %+v, want 8", m)
	}
	// An unknown rank is modelled as rank 0; an all-hit route sends nothing.
	if p, _, _ = s.Route("vllm-a", -1, 2, 64, first); p.Rank != 0 || p.Hit != 0 {
		t.Fatalf("unknown rank: %+v", p)
	}
	if p, _, _ = s.Route("vllm-a", 0, 2, 64, first); p.Hit != 5 {
		t.Fatalf("repeat: %+v", p)
	}
	kv, _ = ix.Instance("vllm-a")
	if kv.Seq != 3 || !slices.Equal(kv.RankBlocks, []int64{5, 8}) {
		t.Fatalf("index view after four routes: %+v (an all-hit route must not send a batch)", kv)
	}
}

func TestCorrectionEvictsTheChainBeyondTheReportedCache(t *testing.T) {
	ix := kvindex.New(kvindex.Config{PredictTTL: -1})
	s := New(ix, 1)
	first, second := turns(2, 6, 2)
	if _, _, err := s.Route("e", 0, 1, 64, first); err != nil {
		t.Fatal(err)
	}
	p, _, _ := s.Route("e", 0, 1, 64, second)
	if p.Hit != 6 {
		t.Fatalf("predicted hit %d, want 6", p.Hit)
	}
	// The engine reports as much as predicted, or more: nothing changes.
	for _, cached := range []int{6, 7, 8} {
		if err := s.Correct(p, second, cached); err != nil {
			t.Fatal(err)
		}
		if m := matchOf(ix, second, "e"); m.Blocks != 8 {
			t.Fatalf("after a report of %d blocks: credit %d, want 8", cached, m.Blocks)
		}
	}
	// It reused only 2 blocks: the chain beyond them leaves the shadow.
	if err := s.Correct(p, second, 2); err != nil {
		t.Fatal(err)
	}
	if m := matchOf(ix, second, "e"); m.Blocks != 2 {
		t.Fatalf("credit after the correction: %d, want 2", m.Blocks)
	}
	kv, _ := ix.Instance("e")
	if !slices.Equal(kv.RankBlocks, []int64{2}) {
		t.Fatalf("index holds %v blocks, want [2]", kv.RankBlocks)
	}
	// The next turn predicts what the engine proved, and re-stores the rest.
	p2, _, _ := s.Route("e", 0, 1, 64, second)
	if p2.Hit != 2 {
		t.Fatalf("next prediction %d, want 2", p2.Hit)
	}
	// A stale placement (the shadow was rebuilt since) corrects nothing.
	if _, _, err := s.Route("e", 0, 1, 32, first); err != nil { // new capacity: new boot
		t.Fatal(err)
	}
	if err := s.Correct(p2, second, 0); err != nil {
		t.Fatal(err)
	}
	if m := matchOf(ix, first, "e"); m.Blocks != 6 {
		t.Fatalf("a correction for an old boot changed the new shadow: credit %d, want 6", m.Blocks)
	}
	kv, _ = ix.Instance("e")
	if kv.Boot != 2 || kv.Seq != 1 || !slices.Equal(kv.RankBlocks, []int64{6}) {
		t.Fatalf("after the rebuild the index holds only the new model: %+v", kv)
	}
}

func TestCapacityBoundsTheShadowLikeTheEngine(t *testing.T) {
	ix := kvindex.New(kvindex.Config{PredictTTL: -1})
	s := New(ix, 1)
	a, _ := turns(3, 4, 0)
	b, _ := turns(4, 4, 0)
	long, _ := turns(5, 10, 0)
	mustRoute := func(blocks []uint64) {
		t.Helper()
		if _, ok, err := s.Route("e", 0, 1, 6, blocks); err != nil || !ok {
			t.Fatalf("route: ok %v err %v", ok, err)
		}
	}
	mustRoute(a)
	mustRoute(b) // 8 blocks into 6: a's chain loses its tail first
	if m := matchOf(ix, a, "e"); m.Blocks != 2 {
		t.Fatalf("a after b: %d blocks, want 2 (LRU evicts chain tails)", m.Blocks)
	}
	if m := matchOf(ix, b, "e"); m.Blocks != 4 {
		t.Fatalf("b: %d, want 4", m.Blocks)
	}
	mustRoute(long) // longer than the cache: only its head fits
	if m := matchOf(ix, long, "e"); m.Blocks != 6 {
		t.Fatalf("long prompt: %d, want the capacity 6", m.Blocks)
	}
	kv, _ := ix.Instance("e")
	if kv.RankBlocks[0] != 6 {
		t.Fatalf("the index holds %d blocks for a 6-block cache", kv.RankBlocks[0])
	}
	// No capacity, no blocks: nothing is modelled.
	if _, ok, _ := s.Route("f", 0, 1, 0, a); ok {
		t.Fatal("a zero-capacity shadow modelled a prompt")
	}
	if _, ok, _ := s.Route("f", 0, 1, 8, nil); ok || s.Has("f") {
		t.Fatal("an empty prompt created a shadow")
	}
	s.Forget("e")
	if s.Has("e") {
		t.Fatal("Forget left the shadow")
	}
}
