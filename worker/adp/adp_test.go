package adp

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"gopkg.in/yaml.v3"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newScheduler(t testing.TB, opts Options) *Scheduler {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var allPlacements = []Placement{RoundRobin, LeastTokens, LeastQueued}

func TestNewConversationsSpreadAndLaterTurnsStick(t *testing.T) {
	for _, p := range allPlacements {
		t.Run(p.String(), func(t *testing.T) {
			s := newScheduler(t, Options{Ranks: 4, ConversationAffinity: true, Placement: p})
			first := map[string]int{}
			seen := map[int]bool{}
			for i := 0; i < 4; i++ {
				id := fmt.Sprintf("conv-%d", i)
				d := s.Place(Request{ConversationID: id, PromptTokens: 1000})
				if d.Reason != ReasonNew || d.Key != id || d.HomeRank != d.Rank {
					t.Fatalf("%s: decision %+v, want a new binding on its rank", id, d)
				}
				if seen[d.Rank] {
					t.Fatalf("%s landed on rank %d, already used: %v", id, d.Rank, first)
				}
				seen[d.Rank] = true
				first[id] = d.Rank
			}
			// Later turns return home regardless of how load moved.
			for turn := 0; turn < 3; turn++ {
				for i := 3; i >= 0; i-- {
					id := fmt.Sprintf("conv-%d", i)
					d := s.Place(Request{ConversationID: id, PromptTokens: 5000 * (i + 1)})
					if d.Rank != first[id] || d.Reason != ReasonBound || d.Overflow {
						t.Fatalf("turn %d of %s: %+v, want bound rank %d", turn, id, d, first[id])
					}
				}
			}
		})
	}
}

// kv_aware places a new conversation on the rank holding the longest prefix
// unless that rank's load outweighs what the cache saves.
func TestKVAwarePlacesOnTheCachedRankAgainstLoad(t *testing.T) {
	s := newScheduler(t, Options{Ranks: 4, ConversationAffinity: true, Placement: KVAware})
	if d := s.Place(Request{ConversationID: "a", PromptTokens: 700, CachedTokens: []int{0, 0, 576, 0}}); d.Rank != 2 || d.Reason != ReasonNew {
		t.Fatalf("idle ranks, 576 cached on rank 2: %+v", d)
	}
	// Rank 2 now carries 700 placed tokens: 576 cached no longer pays.
	if d := s.Place(Request{ConversationID: "b", PromptTokens: 700, CachedTokens: []int{0, 0, 576, 0}}); d.Rank == 2 {
		t.Fatalf("rank 2 loaded with 700 tokens still chosen for 576 cached: %+v", d)
	}
	// Without cache information it balances load like least_tokens.
	if d := s.Place(Request{ConversationID: "c", PromptTokens: 10}); d.Rank == 2 {
		t.Fatalf("no cache info: chose the loaded rank 2")
	}
	// A returning conversation keeps its rank whatever the cache says.
	if d := s.Place(Request{ConversationID: "a", PromptTokens: 800, CachedTokens: []int{800, 0, 0, 0}}); d.Rank != 2 || d.Reason != ReasonBound {
		t.Fatalf("returning conversation: %+v", d)
	}
}

func TestLeastQueuedPicksFewestRequests(t *testing.T) {
	s := newScheduler(t, Options{Ranks: 4, ConversationAffinity: true, Placement: LeastQueued})
	for rank, n := range []int{5, 1, 3, 4} {
		for i := 0; i < n; i++ {
			// Tokens are inverse to counts: least_queued must ignore them.
			if _, err := s.Assign(rank, 10_000/n); err != nil {
				t.Fatal(err)
			}
		}
	}
	if d := s.Place(Request{ConversationID: "new", PromptTokens: 10}); d.Rank != 1 {
		t.Fatalf("least_queued with loads [5,1,3,4] chose rank %d, want 1", d.Rank)
	}
	// Active and queued both count.
	s2 := newScheduler(t, Options{Ranks: 2, Placement: LeastQueued})
	a, _ := s2.Assign(0, 1)
	s2.Start(&a)
	if _, err := s2.Assign(1, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Assign(1, 1); err != nil {
		t.Fatal(err)
	}
	if d := s2.Place(Request{}); d.Rank != 0 {
		t.Fatalf("1 active vs 2 queued: chose rank %d, want 0", d.Rank)
	}
}

func TestLeastTokensCountsSameBatchAssignments(t *testing.T) {
	s := newScheduler(t, Options{Ranks: 2, ConversationAffinity: true, Placement: LeastTokens})
	ds := s.PlaceBatch([]Request{
		{ConversationID: "a", PromptTokens: 500},
		{ConversationID: "b", PromptTokens: 500},
		{ConversationID: "c", PromptTokens: 500},
	})
	perRank := map[int]int{}
	for _, d := range ds {
		perRank[d.Rank]++
	}
	if perRank[0] == 3 || perRank[1] == 3 || perRank[0]+perRank[1] != 3 {
		t.Fatalf("3 equal requests on 2 idle ranks: %v (all on one rank)", perRank)
	}

	s = newScheduler(t, Options{Ranks: 2, ConversationAffinity: true, Placement: LeastTokens})
	ds = s.PlaceBatch([]Request{
		{ConversationID: "heavy", PromptTokens: 50_000},
		{ConversationID: "l1", PromptTokens: 1000},
		{ConversationID: "l2", PromptTokens: 1000},
		{ConversationID: "l3", PromptTokens: 1000},
	})
	for _, d := range ds[1:] {
		if d.Rank == ds[0].Rank {
			t.Fatalf("light request %s placed with the heavy one on rank %d: %+v", d.Key, d.Rank, ds)
		}
	}
	loads := s.Loads()
	if loads[ds[0].Rank].PromptTokens != 50_000 || loads[ds[1].Rank].PromptTokens != 3000 {
		t.Fatalf("loads %+v, want 50000 and 3000 prompt tokens", loads)
	}
}

func TestSaturatedHomeOverflowsAndKeepsBinding(t *testing.T) {
	s := newScheduler(t, Options{Ranks: 3, ConversationAffinity: true, Placement: LeastQueued, MaxRequestsPerRank: 2})
	first := s.Place(Request{ConversationID: "c", PromptTokens: 100})
	home := first.Rank
	second := s.Place(Request{ConversationID: "c", PromptTokens: 100}) // home now at its cap of 2
	if second.Rank != home {
		t.Fatalf("second turn on %d, want home %d", second.Rank, home)
	}
	third := s.Place(Request{ConversationID: "c", PromptTokens: 100})
	if !third.Overflow || third.Rank == home || third.HomeRank != home || third.Reason != ReasonBound {
		t.Fatalf("saturated home: %+v, want overflow away from %d", third, home)
	}
	if r, ok := s.Binding("c"); !ok || r != home {
		t.Fatalf("binding after overflow = %d %v, want kept on %d", r, ok, home)
	}
	if c := s.Counters(); c.Overflows != 1 {
		t.Fatalf("Overflows = %d, want 1", c.Overflows)
	}
	s.Finish(&first.Ticket) // home drops below its cap
	fourth := s.Place(Request{ConversationID: "c", PromptTokens: 100})
	if fourth.Rank != home || fourth.Overflow {
		t.Fatalf("after draining: %+v, want home %d", fourth, home)
	}
}

func TestEveryRankSaturatedStaysHome(t *testing.T) {
	s := newScheduler(t, Options{Ranks: 2, ConversationAffinity: true, MaxRequestsPerRank: 1})
	a := s.Place(Request{ConversationID: "a"})
	b := s.Place(Request{ConversationID: "b"})
	if a.Rank == b.Rank {
		t.Fatal("two new conversations on 2 free ranks share one")
	}
	d := s.Place(Request{ConversationID: "a"})
	if d.Rank != a.Rank || d.Overflow {
		t.Fatalf("all saturated: %+v, want home %d without overflow", d, a.Rank)
	}
	if c := s.Counters(); c.AllSaturated != 1 || c.Overflows != 0 {
		t.Fatalf("counters %+v, want AllSaturated 1, Overflows 0", c)
	}
}

func TestMaxSessionsEvictsLeastRecentlyUsed(t *testing.T) {
	type ev struct {
		key  string
		rank int
	}
	var evicted []ev
	s := newScheduler(t, Options{Ranks: 2, ConversationAffinity: true, MaxSessions: 2,
		OnBindingEvicted: func(k string, r int) {
			evicted = append(evicted, ev{k, r})
		}})
	a := s.Place(Request{ConversationID: "a"})
	s.Place(Request{ConversationID: "b"})
	s.Place(Request{ConversationID: "a"}) // a is now more recent than b
	s.Place(Request{ConversationID: "c"}) // evicts b
	bRank := 1 - a.Rank
	if len(evicted) != 1 || evicted[0] != (ev{"b", bRank}) {
		t.Fatalf("evicted %v, want [b on rank %d]", evicted, bRank)
	}
	if _, ok := s.Binding("b"); ok {
		t.Fatal("b still bound")
	}
	if _, ok := s.Binding("a"); !ok {
		t.Fatal("a (recently used) was evicted")
	}
	if d := s.Place(Request{ConversationID: "b"}); d.Reason != ReasonNew {
		t.Fatalf("b after eviction: %+v, want a new binding", d)
	}
	c := s.Counters()
	if c.BindingsEvicted != 2 || c.Bindings != 2 || len(evicted) != 2 || evicted[1].key != "a" {
		t.Fatalf("counters %+v, evicted %v: want 2 evictions (b then a), 2 bindings", c, evicted)
	}
}

func TestSubagentJoinsParentRankWithoutChangingParent(t *testing.T) {
	s := newScheduler(t, Options{Ranks: 4, ConversationAffinity: true, Placement: LeastTokens, MaxRequestsPerRank: 3})
	parent := s.Place(Request{ConversationID: "parent-1", PromptTokens: 20_000})
	for _, child := range []string{"child-a", "child-b"} {
		d := s.Place(Request{ConversationID: child, AffinityID: "parent-1", PromptTokens: 8000})
		if d.Rank != parent.Rank || !d.Subagent || d.Key != "parent-1" || d.Reason != ReasonBound {
			t.Fatalf("%s: %+v, want the parent's rank %d via key parent-1", child, d, parent.Rank)
		}
		if _, ok := s.Binding(child); ok {
			t.Fatalf("%s got a binding of its own", child)
		}
	}
	// The parent's rank is now saturated (3 requests): a third child
	// overflows, and neither the overflow nor the children rebind the parent.
	d := s.Place(Request{ConversationID: "child-c", AffinityID: "parent-1", PromptTokens: 8000})
	if !d.Overflow || d.Rank == parent.Rank {
		t.Fatalf("child on saturated parent rank: %+v, want overflow", d)
	}
	if r, ok := s.Binding("parent-1"); !ok || r != parent.Rank {
		t.Fatalf("parent binding = %d %v, want unchanged %d", r, ok, parent.Rank)
	}
	if c := s.Counters(); c.SubagentBound != 3 || c.Bindings != 1 {
		t.Fatalf("counters %+v, want 3 sub-agent placements and only the parent's binding", c)
	}

	// A child whose parent has no binding here creates the parent's key
	// (siblings and the parent then co-locate), not one under its own id.
	d1 := s.Place(Request{ConversationID: "child-x", AffinityID: "parent-2"})
	d2 := s.Place(Request{ConversationID: "child-y", AffinityID: "parent-2"})
	p2 := s.Place(Request{ConversationID: "parent-2"})
	if d1.Reason != ReasonNew || d2.Rank != d1.Rank || p2.Rank != d1.Rank {
		t.Fatalf("unbound parent: %+v %+v %+v, want siblings and parent together", d1, d2, p2)
	}
}

func TestAffinityDisabledUsesPolicyForEverything(t *testing.T) {
	s := newScheduler(t, Options{Ranks: 3, ConversationAffinity: false, Placement: RoundRobin})
	var ranks []int
	for i := 0; i < 6; i++ {
		d := s.Place(Request{ConversationID: "same", AffinityID: "parent"})
		if d.Reason != ReasonUnbound || d.Key != "" || d.HomeRank != -1 {
			t.Fatalf("affinity disabled: %+v, want unbound", d)
		}
		ranks = append(ranks, d.Rank)
	}
	if fmt.Sprint(ranks) != "[0 1 2 0 1 2]" {
		t.Fatalf("round robin ranks %v, want [0 1 2 0 1 2]", ranks)
	}
	if c := s.Counters(); c.Bindings != 0 {
		t.Fatalf("bindings %d with affinity disabled", c.Bindings)
	}
}

func TestNoConversationIDIsPlacedButNotBound(t *testing.T) {
	s := newScheduler(t, Options{Ranks: 2, ConversationAffinity: true})
	a := s.Place(Request{PromptTokens: 10})
	b := s.Place(Request{PromptTokens: 10})
	if a.Reason != ReasonUnbound || b.Reason != ReasonUnbound || a.Rank == b.Rank {
		t.Fatalf("unkeyed: %+v %+v, want unbound round robin", a, b)
	}
	if s.Counters().Bindings != 0 {
		t.Fatal("unkeyed request created a binding")
	}
}

func TestTicketsAccountLoad(t *testing.T) {
	s := newScheduler(t, Options{Ranks: 2, Placement: LeastTokens})
	d := s.Place(Request{PromptTokens: 300})
	if l := s.Loads()[d.Rank]; l != (RankLoad{Rank: d.Rank, PromptTokens: 300, Queued: 1}) {
		t.Fatalf("after Place: %+v", l)
	}
	s.Start(&d.Ticket)
	s.Start(&d.Ticket)
	if l := s.Loads()[d.Rank]; l.Active != 1 || l.Queued != 0 {
		t.Fatalf("after Start: %+v", l)
	}
	s.Finish(&d.Ticket)
	s.Finish(&d.Ticket)
	var zero Ticket
	s.Finish(&zero)
	s.Start(nil)
	for _, l := range s.Loads() {
		if l.PromptTokens != 0 || l.Active != 0 || l.Queued != 0 {
			t.Fatalf("after Finish: %+v, want idle", l)
		}
	}
	if _, err := s.Assign(2, 1); err == nil || !strings.Contains(err.Error(), "rank 2") {
		t.Fatalf("Assign to missing rank: %v", err)
	}
}

func TestParsePlacement(t *testing.T) {
	for in, want := range map[string]Placement{"": RoundRobin, "round_robin": RoundRobin, "least_tokens": LeastTokens, " least_queued ": LeastQueued} {
		got, err := ParsePlacement(in)
		if err != nil || got != want {
			t.Fatalf("ParsePlacement(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"random", "LEAST_TOKENS", "least-tokens"} {
		_, err := ParsePlacement(bad)
		if err == nil {
			t.Fatalf("ParsePlacement(%q) accepted an unknown value", bad)
		}
		msg := err.Error()
		if !strings.Contains(msg, "kv_cache_routing_new_conv_placement") || !strings.Contains(msg, bad) ||
			!strings.Contains(msg, "round_robin, least_tokens, least_queued") {
			t.Fatalf("error %q must name the key, the value and the allowed values", msg)
		}
	}
}

func TestConfigFromYAML(t *testing.T) {
	var c Config
	doc := `
enable_attention_dp: true
attention_dp_config:
  kv_cache_routing_conversation_affinity: true
  kv_cache_routing_new_conv_placement: least_tokens
  ranks: 8
  max_requests_per_rank: 16
`
	if err := yaml.Unmarshal([]byte(doc), &c); err != nil {
		t.Fatal(err)
	}
	o, err := c.Options()
	if err != nil {
		t.Fatal(err)
	}
	if o.Ranks != 8 || !o.ConversationAffinity || o.Placement != LeastTokens || o.MaxRequestsPerRank != 16 {
		t.Fatalf("options %+v", o)
	}

	bad := []struct{ doc, key string }{
		{"enable_attention_dp: true\nattention_dp_config: {kv_cache_routing_new_conv_placement: fastest, ranks: 2}", "kv_cache_routing_new_conv_placement"},
		{"enable_attention_dp: true\nattention_dp_config: {ranks: 0}", "attention_dp_config.ranks"},
		{"enable_attention_dp: false\nattention_dp_config: {ranks: 4}", "attention_dp_config.ranks"},
		{"enable_attention_dp: true\nattention_dp_config: {ranks: 2, max_sessions: -1}", "attention_dp_config.max_sessions"},
		{"enable_attention_dp: true\nattention_dp_config: {ranks: 2, max_requests_per_rank: -3}", "attention_dp_config.max_requests_per_rank"},
	}
	for _, b := range bad {
		var c Config
		if err := yaml.Unmarshal([]byte(b.doc), &c); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Options(); err == nil || !strings.Contains(err.Error(), b.key) {
			t.Fatalf("%q: error %v, want one naming %s", b.doc, err, b.key)
		}
	}
	// Without attention DP: one rank, affinity has nothing to choose from.
	var off Config
	o, err = off.Options()
	if err != nil || o.Ranks != 1 || o.ConversationAffinity {
		t.Fatalf("default config: %+v %v", o, err)
	}
	if _, err := New(Options{Ranks: 0}); err == nil {
		t.Fatal("New accepted 0 ranks")
	}
}

func TestDeterministicAcrossRuns(t *testing.T) {
	run := func() string {
		s := newScheduler(t, Options{Ranks: 5, ConversationAffinity: true, Placement: LeastTokens, MaxSessions: 7, MaxRequestsPerRank: 4})
		var b strings.Builder
		var open []Ticket
		for i := 0; i < 300; i++ {
			d := s.Place(Request{ConversationID: fmt.Sprintf("c%d", (i*7)%13), PromptTokens: (i * 37) % 900})
			fmt.Fprintf(&b, "%d%v%v,", d.Rank, d.Reason, d.Overflow)
			open = append(open, d.Ticket)
			if i%3 == 0 {
				s.Finish(&open[0])
				open = open[1:]
			}
		}
		return b.String()
	}
	if a, b := run(), run(); a != b {
		t.Fatal("same calls gave different decisions")
	}
}

func TestConcurrentUseKeepsLoadConsistent(t *testing.T) {
	s := newScheduler(t, Options{Ranks: 8, ConversationAffinity: true, Placement: LeastQueued, MaxSessions: 50, MaxRequestsPerRank: 10})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				d := s.Place(Request{ConversationID: fmt.Sprintf("g%d-%d", g, i%20), PromptTokens: 100})
				s.Start(&d.Ticket)
				s.Finish(&d.Ticket)
			}
		}(g)
	}
	wg.Wait()
	for _, l := range s.Loads() {
		if l.PromptTokens != 0 || l.Active != 0 || l.Queued != 0 {
			t.Fatalf("rank %d not idle after all finished: %+v", l.Rank, l)
		}
	}
	if c := s.Counters(); c.Placements != 4000 || c.Bindings > 50 {
		t.Fatalf("counters %+v", c)
	}
}

// BenchmarkSchedule places requests on 8 ranks: 80% returning turns of
// 10,000 live conversations, 20% new conversations (which also evict the
// oldest bindings at the 10,000 limit), each finished right away.
func BenchmarkSchedule(b *testing.B) {
	s := newScheduler(b, Options{Ranks: 8, ConversationAffinity: true, Placement: LeastTokens, MaxSessions: 10_000, MaxRequestsPerRank: 64})
	const live = 10_000
	returning := make([]string, live)
	for i := range returning {
		returning[i] = fmt.Sprintf("conv-%d", i)
		s.Place(Request{ConversationID: returning[i]})
	}
	fresh := make([]string, 1<<16)
	for i := range fresh {
		fresh[i] = fmt.Sprintf("new-%d", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// New ids cycle through 65,536 names; by the time one repeats it
		// has long been evicted from the 10,000-binding LRU.
		req := Request{ConversationID: returning[(i*7919)%live], PromptTokens: 2_000}
		if i%5 == 4 {
			req = Request{ConversationID: fresh[(i/5)%len(fresh)], PromptTokens: 20_000}
		}
		d := s.Place(req)
		s.Finish(&d.Ticket)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/placement")
}

// BenchmarkScheduleParallel is BenchmarkSchedule from all cores at once,
// to show the cost of the scheduler's single lock under contention.
func BenchmarkScheduleParallel(b *testing.B) {
	s := newScheduler(b, Options{Ranks: 8, ConversationAffinity: true, Placement: LeastTokens, MaxSessions: 10_000})
	ids := make([]string, 4096)
	for i := range ids {
		ids[i] = fmt.Sprintf("conv-%d", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			d := s.Place(Request{ConversationID: ids[i%len(ids)], PromptTokens: 1000})
			s.Finish(&d.Ticket)
			i += 7
		}
	})
}

// New conversations of an adapter keep to the ranks holding it (unless
// those are saturated); bound conversations keep their rank.
func TestAdapterRanksPreferred(t *testing.T) {
	for _, p := range allPlacements {
		s := newScheduler(t, Options{Ranks: 4, ConversationAffinity: true, Placement: p, MaxRequestsPerRank: 3})
		holds := []bool{false, false, true, false}
		for i := range 3 {
			d := s.Place(Request{ConversationID: fmt.Sprintf("a-%d", i), PromptTokens: 100, AdapterRanks: holds})
			if d.Rank != 2 {
				t.Fatalf("%s: conversation %d on rank %d, want the adapter's rank 2", p, i, d.Rank)
			}
		}
		// Rank 2 is saturated now: the next one goes elsewhere.
		if d := s.Place(Request{ConversationID: "a-3", PromptTokens: 100, AdapterRanks: holds}); d.Rank == 2 {
			t.Fatalf("%s: a saturated adapter rank still took a new conversation", p)
		}
		if d := s.Place(Request{ConversationID: "a-0", AdapterRanks: []bool{true, false, false, false}}); d.HomeRank != 2 || d.Reason != ReasonBound {
			t.Fatalf("%s: bound conversation moved: %+v", p, d)
		}
	}
}
