package routing

import (
	"fmt"
	"testing"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/kvindex"
	"github.com/tether-project/tether/routing/overload"
)

// fleet64 is a 64-instance context fleet under moderate, uneven load.
func fleet64(tb testing.TB) (*Views, bindingCounts) {
	tb.Helper()
	vs := make([]InstanceView, 64)
	counts := bindingCounts{}
	for i := range vs {
		id := fmt.Sprintf("ctx-%02d", i)
		vs[i] = InstanceView{
			ID: id, Fleet: fsm.FleetContext, URL: "http://" + id, Healthy: true, Ranks: 8,
			QueuedRequests: i % 5, ActiveRequests: 10 + i%7,
			QueuedPrefillTokens: int64(i%5) * 4000, ActivePromptTokens: int64(50_000 + 1000*(i%11)),
			KVUsedBlocks: 10_000, KVTotalBlocks: 16_000, HitRate: 0.8, VerifiesHints: true,
		}
		counts[id] = 100 + i%13
	}
	return mustViews(tb, vs), counts
}

// BenchmarkRouteSticky is the hot path: the decision for a bound key whose
// instance is healthy and below its thresholds. Target ≤ 1 µs, 0 allocs.
func BenchmarkRouteSticky(b *testing.B) {
	r := mustRouter(b, nil)
	views, _ := fleet64(b)
	in := Inputs{Views: views, Overload: overload.NewTracker()}
	bnd := fsm.Binding{Fleet: fsm.FleetContext, Key: "conv-123", Instance: "ctx-17", Epoch: 42}
	req := Request{Fleet: fsm.FleetContext, Key: "conv-123", ConversationID: "conv-123", RequestID: "req-1", Edge: "edge-1", Now: t0}
	if rt, err := r.stayOrMove(req, bnd, in); err != nil || rt.Action != actionSticky {
		b.Fatalf("setup: %+v %v", rt, err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var rt route
	for b.Loop() {
		rt, _ = r.stayOrMove(req, bnd, in)
	}
	if rt.Instance != "ctx-17" {
		b.Fatal(rt.Instance)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/decision")
}

// BenchmarkRouteStickyWarm is the sticky path with the cache-lost check:
// a 400-block prompt the bound instance holds in full (the common case) on
// a 64-instance fleet whose index holds 2,000 conversations.
func BenchmarkRouteStickyWarm(b *testing.B) {
	r := mustRouter(b, nil)
	views, _ := fleet64(b)
	ix := kvindex.New(kvindex.Config{})
	var prompt []uint64
	for i := 0; i < 64; i++ {
		var evs []kvindex.RankEvent
		for c := 0; c < 32; c++ {
			conv := chainHashes(uint64(i*32+c+1)<<20, 400)
			if i == 17 && c == 3 {
				prompt = conv
			}
			evs = append(evs, kvindex.RankEvent{Rank: c % 8, Stored: conv})
		}
		if _, err := ix.Apply(kvindex.Batch{Instance: fmt.Sprintf("ctx-%02d", i), Boot: 1, Seq: 1, Events: evs}); err != nil {
			b.Fatal(err)
		}
	}
	in := Inputs{Views: views, Prefix: ix, Overload: overload.NewTracker()}
	bnd := fsm.Binding{Fleet: fsm.FleetContext, Key: "conv-123", Instance: "ctx-17", Epoch: 42}
	req := Request{Fleet: fsm.FleetContext, Key: "conv-123", ConversationID: "conv-123", RequestID: "req-1", Edge: "edge-1", Now: t0,
		Blocks: prompt, PromptTokens: 400 * 64}
	if rt, err := r.stayOrMove(req, bnd, in); err != nil || rt.Action != actionSticky {
		b.Fatalf("setup: %+v %v", rt, err)
	}
	b.ReportAllocs()
	var rt route
	for b.Loop() {
		rt, _ = r.stayOrMove(req, bnd, in)
	}
	if rt.Instance != "ctx-17" || rt.Action != actionSticky {
		b.Fatal(rt.Instance)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/decision")
}

func chainHashes(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i) + 1
	}
	return out
}

// BenchmarkPlaceNew places a new conversation's 2,000-block prompt on a
// 64-instance × 8-rank fleet whose KV index holds ~200k blocks (every rank:
// its agent type's 150-block system prompt and tools, then a 400-block
// conversation). Cases: the prompt shares its agent type's prefix with
// every instance (typical new conversation), the prompt's first 1,999
// blocks are cached on one rank (the index walk's worst case), and nobody
// holds even the first block (the all-cold fast path). Target ≤ 50 µs.
func BenchmarkPlaceNew(b *testing.B) {
	r := mustRouter(b, nil)
	views, counts := fleet64(b)
	ix := kvindex.New(kvindex.Config{})
	var prefixes [8][]uint64
	for a := range prefixes {
		prefixes[a] = chainHashes(uint64(a+1)<<40, 150)
	}
	for i := 0; i < 64; i++ {
		var evs []kvindex.RankEvent
		for rank := 0; rank < 8; rank++ {
			conv := chainHashes(uint64(i*8+rank+1)<<20, 400)
			evs = append(evs, kvindex.RankEvent{Rank: rank, Stored: append(append([]uint64{}, prefixes[(i+rank)%8]...), conv...)})
		}
		if _, err := ix.Apply(kvindex.Batch{Instance: fmt.Sprintf("ctx-%02d", i), Boot: 1, Seq: 1, Events: evs}); err != nil {
			b.Fatal(err)
		}
	}
	resumed := chainHashes(1<<50, 2000)
	if _, err := ix.Apply(kvindex.Batch{Instance: "ctx-07", Boot: 1, Seq: 2, Events: []kvindex.RankEvent{{Rank: 0, Stored: resumed[:1999]}}}); err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name   string
		prompt []uint64
		policy string
	}{
		{"shared_prefix", append(append([]uint64{}, prefixes[3]...), chainHashes(1<<55, 1850)...), PolicyKVAware},
		{"deep_1999_cached", resumed, PolicyKVAware},
		{"all_cold", chainHashes(1<<60, 2000), PolicyLeastLoaded},
	}
	in := Inputs{Views: views, Bindings: counts, Prefix: ix}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			req := Request{Fleet: fsm.FleetContext, Key: "new-conversation", ConversationID: "new-conversation",
				RequestID: "req-1", Edge: "edge-1", Blocks: c.prompt, PromptTokens: 2000 * 64, Now: t0}
			rt, err := r.place(req, in)
			if err != nil || rt.Decision.Policy != c.policy {
				b.Fatalf("setup: %+v %v", rt.Decision, err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				rt, _ = r.place(req, in)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/decision")
		})
	}
}
