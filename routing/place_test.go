package routing

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/routing/kvindex"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Unix(1_700_000_000, 0)

// bindingCounts is the replicated state's live bindings per instance.
type bindingCounts map[string]int

func (b bindingCounts) BindingCount(_ fsm.Fleet, instance string) int { return b[instance] }

func idle(ids ...string) []InstanceView {
	out := make([]InstanceView, len(ids))
	for i, id := range ids {
		out[i] = InstanceView{ID: id, Fleet: fsm.FleetContext, URL: "http://" + id, Healthy: true, Ranks: 8, VerifiesHints: true}
	}
	return out
}

func mustViews(t testing.TB, vs []InstanceView) *Views {
	t.Helper()
	v, err := NewViews(vs)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mustRouter(t testing.TB, mutate func(*Config)) *Router {
	t.Helper()
	cfg := DefaultConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func place(t testing.TB, r *Router, req Request, in Inputs) route {
	t.Helper()
	if req.Fleet == 0 {
		req.Fleet = fsm.FleetContext
	}
	if req.Now.IsZero() {
		req.Now = t0
	}
	rt, err := r.place(req, in)
	if err != nil {
		t.Fatalf("place %q: %v", req.Key, err)
	}
	return rt
}

func TestPlaceIdleFleetSpreadsNewKeys(t *testing.T) {
	r := mustRouter(t, nil)
	in := Inputs{Views: mustViews(t, idle("ctx-a", "ctx-b", "ctx-c", "ctx-d"))}

	// Without binding counts (all equal): rendezvous alone spreads keys.
	counts := map[string]int{}
	for i := 0; i < 1000; i++ {
		rt := place(t, r, Request{Key: fmt.Sprintf("conv-%d", i)}, in)
		if rt.Action != actionBind {
			t.Fatalf("new key: action %v, want bind", rt.Action)
		}
		counts[rt.Instance]++
	}
	for id, n := range counts {
		if n < 200 || n > 300 {
			t.Errorf("rendezvous spread: %s got %d of 1000 (want 250±50): %v", id, n, counts)
		}
	}
	if len(counts) != 4 {
		t.Fatalf("keys landed on %d instances, want 4: %v", len(counts), counts)
	}

	// With live binding counts the fewest-bindings tie-break comes first:
	// feeding each placement back gives an exact spread.
	live := bindingCounts{}
	in.Bindings = live
	for i := 0; i < 1000; i++ {
		rt := place(t, r, Request{Key: fmt.Sprintf("conv-%d", i)}, in)
		live[rt.Instance]++
	}
	for _, id := range []string{"ctx-a", "ctx-b", "ctx-c", "ctx-d"} {
		if live[id] != 250 {
			t.Errorf("fewest-bindings spread: %s got %d, want 250 (%v)", id, live[id], live)
		}
	}

	// Bindings decide before rendezvous: every key goes to the emptiest.
	in.Bindings = bindingCounts{"ctx-a": 5, "ctx-b": 0, "ctx-c": 5, "ctx-d": 5}
	for i := 0; i < 50; i++ {
		if rt := place(t, r, Request{Key: fmt.Sprintf("k%d", i)}, in); rt.Instance != "ctx-b" {
			t.Fatalf("key k%d went to %s, want ctx-b (fewest bindings)", i, rt.Instance)
		}
	}
}

// Without weights.live_binding, load decides and bindings break ties: a
// new key goes to the idle instance however many keys it holds.
func TestPlaceLeastLoadedBeatsBindingsWithoutSpread(t *testing.T) {
	r := mustRouter(t, func(c *Config) { c.Weights.LiveBinding = 0 })
	vs := idle("ctx-a", "ctx-b")
	vs[0].QueuedRequests, vs[0].QueuedPrefillTokens = 1, 100 // a: few bindings but busy
	in := Inputs{Views: mustViews(t, vs), Bindings: bindingCounts{"ctx-a": 0, "ctx-b": 100}}
	for i := 0; i < 20; i++ {
		if rt := place(t, r, Request{Key: fmt.Sprintf("k%d", i)}, in); rt.Instance != "ctx-b" {
			t.Fatalf("k%d: %s, want the idle ctx-b despite its 100 bindings", i, rt.Instance)
		}
	}
}

// With weights.live_binding (the default), a new key whose prompt no
// instance holds more of goes where fewer conversations live unless the
// other's queue outweighs them: many conversations starting within one
// load report no longer all land on the instance that looked idle.
func TestPlacementSpreadsNewKeysByLiveBindings(t *testing.T) {
	r := mustRouter(t, nil)
	w := r.Config().Weights.LiveBinding
	vs := idle("ctx-a", "ctx-b")
	vs[0].QueuedRequests, vs[0].QueuedPrefillTokens = 1, 100
	in := Inputs{Views: mustViews(t, vs), Bindings: bindingCounts{"ctx-a": 0, "ctx-b": 3}}
	if rt := place(t, r, Request{Key: "k"}, in); rt.Instance != "ctx-a" {
		t.Fatalf("a 100 tokens busier, b 3 conversations more: %s, want ctx-a", rt.Instance)
	}
	vs[0].QueuedPrefillTokens = int64(4 * w) // a's queue outweighs 3 bindings
	in.Views = mustViews(t, vs)
	if rt := place(t, r, Request{Key: "k"}, in); rt.Instance != "ctx-b" {
		t.Fatalf("a's queue worth 4 bindings: %s, want ctx-b", rt.Instance)
	}
	// A prompt one instance holds more of is placed by cache and load:
	// b holds it, and its bindings do not count.
	ix := kvindex.New(kvindex.Config{})
	prompt := blocks(1, 10)
	stored(t, ix, "ctx-b", 1, 0, prompt)
	vs[0].QueuedPrefillTokens = 100
	in = Inputs{Views: mustViews(t, vs), Bindings: bindingCounts{"ctx-a": 0, "ctx-b": 3}, Prefix: ix}
	if rt := place(t, r, Request{Key: "k", Blocks: prompt, PromptTokens: 640}, in); rt.Instance != "ctx-b" {
		t.Fatalf("b holds the prompt: %s, want ctx-b", rt.Instance)
	}
	// A LoRA adapter one instance holds and the other would load is
	// placed by the adapter's cost: b holds it, and its bindings do not
	// count.
	vs[1].LoRA = &LoRAView{MaxLoRAs: 2, Loaded: []string{"agent-a"}}
	vs[0].LoRA = &LoRAView{MaxLoRAs: 2}
	in = Inputs{Views: mustViews(t, vs), Bindings: bindingCounts{"ctx-a": 0, "ctx-b": 3}}
	if rt := place(t, r, Request{Key: "k", Adapter: "agent-a"}, in); rt.Instance != "ctx-b" {
		t.Fatalf("b holds the adapter: %s, want ctx-b", rt.Instance)
	}
	vs[0].LoRA, vs[1].LoRA = nil, nil
	// Unkeyed requests are not spread.
	in.Prefix = nil
	if rt := place(t, r, Request{Spread: 7}, in); rt.Instance != "ctx-b" {
		t.Fatalf("unkeyed: %s, want the idle ctx-b", rt.Instance)
	}
}

func TestPlaceExcludesDrainingAndUnhealthy(t *testing.T) {
	r := mustRouter(t, nil)
	vs := idle("ctx-a", "ctx-b", "ctx-c", "ctx-d")
	vs[0].Draining = true
	vs[1].Healthy = false
	vs[3].Fleet = fsm.FleetGeneration // other fleet
	in := Inputs{Views: mustViews(t, vs)}
	for i := 0; i < 100; i++ {
		if rt := place(t, r, Request{Key: fmt.Sprintf("k%d", i)}, in); rt.Instance != "ctx-c" {
			t.Fatalf("k%d: %s, want ctx-c (the only healthy, non-draining context instance)", i, rt.Instance)
		}
	}
	vs[2].Healthy = false
	_, err := r.place(Request{Fleet: fsm.FleetContext, Key: "k", Now: t0}, Inputs{Views: mustViews(t, vs)})
	if !errors.Is(err, ErrNoInstances) {
		t.Fatalf("no candidates: err %v, want ErrNoInstances", err)
	}
	if _, err := r.place(Request{Fleet: 9, Key: "k"}, in); err == nil {
		t.Fatal("invalid fleet accepted")
	}
}

func TestPlaceIsDeterministicAndOrderIndependent(t *testing.T) {
	r := mustRouter(t, nil)
	rng := rand.New(rand.NewPCG(7, 7))
	base := idle("ctx-a", "ctx-b", "ctx-c", "ctx-d", "ctx-e", "ctx-f")
	for i := range base {
		base[i].QueuedRequests = rng.IntN(3)
		base[i].QueuedPrefillTokens = int64(rng.IntN(2)) * 1000
		base[i].ActivePromptTokens = int64(rng.IntN(2)) * 5000
	}
	ix := kvindex.New(kvindex.Config{})
	prompt := blocks(1, 40)
	if _, err := ix.Apply(kvindex.Batch{Instance: "ctx-c", Boot: 1, Seq: 1, Events: []kvindex.RankEvent{{Rank: 2, Stored: prompt[:20]}}}); err != nil {
		t.Fatal(err)
	}
	counts := bindingCounts{"ctx-a": 3, "ctx-b": 1}
	for k := 0; k < 50; k++ {
		req := Request{Key: fmt.Sprintf("k%d", k), RequestID: "r", Edge: "edge-1", Blocks: prompt, PromptTokens: 40 * 64}
		want := place(t, r, req, Inputs{Views: mustViews(t, base), Bindings: counts, Prefix: ix})
		for trial := 0; trial < 5; trial++ {
			shuffled := append([]InstanceView(nil), base...)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			got := place(t, r, req, Inputs{Views: mustViews(t, shuffled), Bindings: counts, Prefix: ix})
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("k%d: order-dependent decision:\n got %+v\nwant %+v", k, got, want)
			}
		}
	}
}

func TestPlaceUnkeyedSpreadsWithoutBinding(t *testing.T) {
	r := mustRouter(t, nil)
	in := Inputs{Views: mustViews(t, idle("ctx-a", "ctx-b", "ctx-c")), Bindings: bindingCounts{"ctx-a": 0, "ctx-b": 50, "ctx-c": 50}}
	seen := map[string]int{}
	for i := 0; i < 300; i++ {
		req := Request{RequestID: fmt.Sprintf("req-%d", i), Spread: SpreadFor(fmt.Sprintf("req-%d", i))}
		rt := place(t, r, req, in)
		if rt.Action != actionServe {
			t.Fatalf("unkeyed request: action %v, want serve", rt.Action)
		}
		if again := place(t, r, req, in); again.Instance != rt.Instance {
			t.Fatal("same request, different instance")
		}
		seen[rt.Instance]++
	}
	// Bindings do not matter for unkeyed requests: all three get a share.
	for _, id := range []string{"ctx-a", "ctx-b", "ctx-c"} {
		if seen[id] < 60 {
			t.Errorf("unkeyed spread: %s got %d of 300: %v", id, seen[id], seen)
		}
	}
}

func TestPlaceActionByRouterType(t *testing.T) {
	in := Inputs{Views: mustViews(t, idle("ctx-a", "ctx-b"))}
	cases := []struct {
		typ  RouterType
		key  string
		want action
	}{
		{RouterConversation, "k", actionBind},
		{RouterConversation, "", actionServe},
		{RouterKVCacheAware, "k", actionServe},
		{RouterLoadBalancing, "k", actionServe},
		{RouterRoundRobin, "k", actionServe},
	}
	for _, c := range cases {
		r := mustRouter(t, func(cfg *Config) { cfg.Type = c.typ })
		if rt := place(t, r, Request{Key: c.key}, in); rt.Action != c.want {
			t.Errorf("%v key %q: action %v, want %v", c.typ, c.key, rt.Action, c.want)
		}
	}
}

func TestPlaceRoundRobinFollowsCounter(t *testing.T) {
	r := mustRouter(t, func(cfg *Config) { cfg.Type = RouterRoundRobin })
	vs := idle("ctx-c", "ctx-a", "ctx-d", "ctx-b")
	vs[2].Healthy = false
	in := Inputs{Views: mustViews(t, vs)}
	want := []string{"ctx-a", "ctx-b", "ctx-c", "ctx-a", "ctx-b", "ctx-c"}
	for i, w := range want {
		rt := place(t, r, Request{RoundRobin: uint64(i)}, in)
		if rt.Instance != w || rt.Decision.Policy != PolicyRoundRobin {
			t.Fatalf("counter %d: %s (%s), want %s", i, rt.Instance, rt.Decision.Policy, w)
		}
	}
}

// blocks returns n chained block hashes of a synthetic prompt (seed picks
// the prompt).
func blocks(seed uint32, n int) []uint64 {
	toks := make([]uint32, n*prefix.DefaultBlockSize)
	for i := range toks {
		toks[i] = seed*1_000_003 + uint32(i)
	}
	return prefix.BlockHashes(toks, prefix.DefaultBlockSize)
}

func stored(t testing.TB, ix *kvindex.Index, inst string, seq uint64, rank int, bs []uint64) {
	t.Helper()
	out, err := ix.Apply(kvindex.Batch{Instance: inst, Boot: 1, Seq: seq, Events: []kvindex.RankEvent{{Rank: rank, Stored: bs}}})
	if err != nil || out != kvindex.Applied {
		t.Fatalf("store on %s seq %d: %v %v", inst, seq, out, err)
	}
}

func TestPlaceKVAwarePrefersCachedPrefix(t *testing.T) {
	r := mustRouter(t, thresholds)
	ix := kvindex.New(kvindex.Config{})
	prompt := blocks(1, 100) // 6,400 tokens
	stored(t, ix, "ctx-b", 1, 3, prompt[:80])
	vs := idle("ctx-a", "ctx-b")
	req := Request{Key: "new-conv", RequestID: "req-1", Edge: "edge-1", Blocks: prompt, PromptTokens: 6400 + 20}

	rt := place(t, r, req, Inputs{Views: mustViews(t, vs), Prefix: ix})
	if rt.Instance != "ctx-b" || rt.CachedTokens != 80*64 || rt.Rank != 3 {
		t.Fatalf("equal load: %s cached %d rank %d, want ctx-b with 5120 tokens on rank 3", rt.Instance, rt.CachedTokens, rt.Rank)
	}
	d := rt.Decision
	if d.Policy != PolicyKVAware || d.Edge != "edge-1" || d.RequestID != "req-1" || len(d.Candidates) != 2 ||
		d.Candidates[0].Instance != "ctx-b" || d.Candidates[0].CachedTokens != 5120 || d.Candidates[1].CachedTokens != 0 {
		t.Fatalf("decision does not explain the choice: %+v", d)
	}

	// Some load on b is worth it (5,120 tokens of prefill saved)...
	vs[1].QueuedRequests, vs[1].QueuedPrefillTokens = 2, 3000
	if rt := place(t, r, req, Inputs{Views: mustViews(t, vs), Prefix: ix}); rt.Instance != "ctx-b" {
		t.Fatalf("b moderately loaded: %s, want ctx-b", rt.Instance)
	}
	// ...but not once its queue crosses the overflow threshold.
	vs[1].QueuedRequests = r.Config().Overflow.QueuedRequests
	if rt := place(t, r, req, Inputs{Views: mustViews(t, vs), Prefix: ix}); rt.Instance != "ctx-a" {
		t.Fatalf("b saturated: %s, want ctx-a", rt.Instance)
	}
	// Nor once its queued work outweighs the saving.
	vs[1].QueuedRequests, vs[1].QueuedPrefillTokens = 2, 8000
	if rt := place(t, r, req, Inputs{Views: mustViews(t, vs), Prefix: ix}); rt.Instance != "ctx-a" {
		t.Fatalf("b's queue outweighs its cache: %s, want ctx-a", rt.Instance)
	}
}

func TestPlaceCacheCreditCappedByPrompt(t *testing.T) {
	r := mustRouter(t, nil)
	ix := kvindex.New(kvindex.Config{})
	prompt := blocks(1, 10)
	stored(t, ix, "ctx-a", 1, 0, prompt)
	rt := place(t, r, Request{Key: "k", Blocks: prompt, PromptTokens: 600}, Inputs{Views: mustViews(t, idle("ctx-a", "ctx-b")), Prefix: ix})
	if rt.CachedTokens != 600 || rt.Decision.Candidates[0].CachedTokens != 600 {
		t.Fatalf("cached tokens %d, want the prompt's 600", rt.CachedTokens)
	}
}

func TestPlaceSiblingBurstLandsTogether(t *testing.T) {
	r := mustRouter(t, nil)
	const ttl = 3 * time.Second
	ix := kvindex.New(kvindex.Config{PredictTTL: ttl})
	in := Inputs{Views: mustViews(t, idle("ctx-a", "ctx-b", "ctx-c", "ctx-d")), Prefix: ix}
	shared := blocks(42, 150) // the siblings' system prompt and tools
	sibling := func(i int) Request {
		own := blocks(uint32(1000+i), 10)
		return Request{Key: fmt.Sprintf("sub-agent-%d", i), Blocks: append(append([]uint64(nil), shared...), own...)}
	}
	// Control: without predictions the siblings spread.
	spread := map[string]bool{}
	for i := 0; i < 8; i++ {
		spread[place(t, r, sibling(i), Inputs{Views: in.Views}).Instance] = true
	}
	if len(spread) < 2 {
		t.Fatalf("control: siblings without predictions all went to one instance; the test cannot tell")
	}
	// With predictions (no stored event yet), the burst follows the first.
	first := place(t, r, sibling(0), in)
	ix.Predict(first.Instance, sibling(0).Blocks, t0)
	for i := 1; i < 8; i++ {
		req := sibling(i)
		req.Now = t0.Add(time.Duration(i) * 100 * time.Millisecond)
		rt := place(t, r, req, in)
		if rt.Instance != first.Instance || rt.Decision.Policy != PolicyKVAware || rt.CachedTokens != 150*64 {
			t.Fatalf("sibling %d: %s (%s, %d cached), want %s via the prediction", i, rt.Instance, rt.Decision.Policy, rt.CachedTokens, first.Instance)
		}
		ix.Predict(rt.Instance, req.Blocks, req.Now)
	}
	// Past the TTL the predictions are gone: placement is by load again.
	late := t0.Add(700*time.Millisecond + ttl)
	for i := 0; i < 8; i++ {
		req := sibling(i)
		req.Now = late
		got := place(t, r, req, in)
		want := place(t, r, req, Inputs{Views: in.Views})
		if got.Instance != want.Instance || got.Decision.Policy != PolicyLeastLoaded {
			t.Fatalf("after TTL, sibling %d: %s (%s), want %s by load", i, got.Instance, got.Decision.Policy, want.Instance)
		}
	}
}

func TestPlaceAllColdRoutesByLoad(t *testing.T) {
	r := mustRouter(t, nil)
	ix := kvindex.New(kvindex.Config{})
	stored(t, ix, "ctx-a", 1, 0, blocks(1, 50)) // an unrelated prompt
	vs := idle("ctx-a", "ctx-b", "ctx-c")
	vs[0].QueuedRequests = 1
	vs[1].ActivePromptTokens = 100
	in := Inputs{Views: mustViews(t, vs), Prefix: ix}
	rt := place(t, r, Request{Key: "k", Blocks: blocks(2, 50)}, in)
	if rt.Instance != "ctx-c" || rt.Decision.Policy != PolicyLeastLoaded || rt.CachedTokens != 0 {
		t.Fatalf("all cold: %s (%s), want the least-loaded ctx-c", rt.Instance, rt.Decision.Policy)
	}
}

func TestPlaceIgnoresCacheOfDegradedInstance(t *testing.T) {
	r := mustRouter(t, nil)
	ix := kvindex.New(kvindex.Config{})
	prompt := blocks(1, 60)
	stored(t, ix, "ctx-b", 1, 0, prompt)
	vs := idle("ctx-a", "ctx-b")
	vs[1].ActivePromptTokens = 1000 // b slightly busier, but holds the prompt
	if rt := place(t, r, Request{Key: "k", Blocks: prompt}, Inputs{Views: mustViews(t, vs), Prefix: ix}); rt.Instance != "ctx-b" {
		t.Fatalf("healthy cache: %s, want ctx-b", rt.Instance)
	}
	vs[1].CacheDegraded = true
	rt := place(t, r, Request{Key: "k", Blocks: prompt}, Inputs{Views: mustViews(t, vs), Prefix: ix})
	if rt.Instance != "ctx-a" || rt.Decision.Policy != PolicyLeastLoaded {
		t.Fatalf("b's circuit open: %s (%s), want ctx-a by load", rt.Instance, rt.Decision.Policy)
	}
}

func TestPlaceLoadBalancingIgnoresCache(t *testing.T) {
	r := mustRouter(t, func(c *Config) { c.Type = RouterLoadBalancing })
	ix := kvindex.New(kvindex.Config{})
	prompt := blocks(1, 60)
	stored(t, ix, "ctx-b", 1, 0, prompt)
	vs := idle("ctx-a", "ctx-b")
	vs[1].ActivePromptTokens = 1000
	if rt := place(t, r, Request{Key: "k", Blocks: prompt}, Inputs{Views: mustViews(t, vs), Prefix: ix}); rt.Instance != "ctx-a" {
		t.Fatalf("load balancing: %s, want the idle ctx-a", rt.Instance)
	}
}

func TestPlacePriorityChangesChoice(t *testing.T) {
	r := mustRouter(t, nil)
	ix := kvindex.New(kvindex.Config{})
	prompt := blocks(1, 20)
	stored(t, ix, "ctx-a", 1, 0, prompt[:16]) // a holds 1,024 tokens
	vs := idle("ctx-a", "ctx-b")
	in := func() Inputs { return Inputs{Views: mustViews(t, vs), Prefix: ix} }

	// a: 1,024 cached vs 800 queued: normal → a (224 > 0); interactive
	// doubles the queue → b.
	vs[0].QueuedPrefillTokens = 800
	for _, c := range []struct {
		p    Priority
		want string
	}{{PriorityNormal, "ctx-a"}, {PriorityBackground, "ctx-a"}, {PriorityInteractive, "ctx-b"}} {
		if rt := place(t, r, Request{Key: "k", Blocks: prompt, Priority: c.p}, in()); rt.Instance != c.want {
			t.Errorf("queue 800, %v: %s, want %s", c.p, rt.Instance, c.want)
		}
	}
	// a: 1,024 cached vs 1,200 queued: normal → b; background doubles the
	// cache → a.
	vs[0].QueuedPrefillTokens = 1200
	for _, c := range []struct {
		p    Priority
		want string
	}{{PriorityNormal, "ctx-b"}, {PriorityInteractive, "ctx-b"}, {PriorityBackground, "ctx-a"}} {
		if rt := place(t, r, Request{Key: "k", Blocks: prompt, Priority: c.p}, in()); rt.Instance != c.want {
			t.Errorf("queue 1200, %v: %s, want %s", c.p, rt.Instance, c.want)
		}
	}
}

// The request-count limit, an option (shed.max_queued_requests).
func TestPlaceShedsWhenAllOverHardLimit(t *testing.T) {
	// Hard limit 64 queued, 5,500 tokens/s, Retry-After 1s..30s.
	r := mustRouter(t, func(c *Config) { c.Shed.MaxQueuedRequests, c.Shed.MaxBacklogSeconds = 64, 0 })
	cases := []struct {
		name    string
		queued  [2]int
		tokens  [2]int64
		want    time.Duration
		wantAct action
	}{
		{"one below the limit takes it", [2]int{64, 10}, [2]int64{0, 0}, 0, actionBind},
		{"drain estimate from tokens", [2]int{70, 80}, [2]int64{70 * 5500, 80 * 5500}, 7 * time.Second, actionShed},
		{"no token figures: minimum", [2]int{64, 64}, [2]int64{0, 0}, time.Second, actionShed},
		{"bounded above", [2]int{1000, 2000}, [2]int64{1000 * 5500, 2000 * 5500}, 30 * time.Second, actionShed},
	}
	for _, c := range cases {
		vs := idle("ctx-a", "ctx-b")
		for i := range vs {
			vs[i].QueuedRequests, vs[i].QueuedPrefillTokens = c.queued[i], c.tokens[i]
		}
		checkPlaceOrShed(t, r, c.name, vs, c.wantAct, c.want)
	}
}

// checkPlaceOrShed places a new key on vs and checks the action, and for a
// shed its Retry-After.
func checkPlaceOrShed(t *testing.T, r *Router, name string, vs []InstanceView, wantAct action, retryAfter time.Duration) {
	t.Helper()
	rt := place(t, r, Request{Key: "k"}, Inputs{Views: mustViews(t, vs)})
	if rt.Action != wantAct {
		t.Errorf("%s: action %v, want %v", name, rt.Action, wantAct)
		return
	}
	if wantAct == actionShed && (rt.RetryAfter != retryAfter || rt.Instance != "") {
		t.Errorf("%s: Retry-After %v, want %v", name, rt.RetryAfter, retryAfter)
	}
}

// overLimit puts v over the default hard limit: twice
// shed.max_backlog_seconds of prefill dispatched to it since its report.
func overLimit(v *InstanceView) {
	s := DefaultConfig().Shed
	v.QueuedPrefillTokens = int64(2 * s.MaxBacklogSeconds * s.PrefillTokensPerSecond)
}

// The default hard limit is seconds of prefill queued ahead, not requests:
// 128 cached turns queued on each instance (Dynamo's session workload keeps
// about that many in flight per worker) wait a few seconds at the engines'
// speed, and the request is placed; the count limit this replaced shed it.
func TestLongQueueOfCachedTurnsIsNotOverTheHardLimit(t *testing.T) {
	r := mustRouter(t, func(c *Config) { c.Shed.PrefillTokensPerSecond = 50_000 })
	vs := idle("ctx-a", "ctx-b")
	for i := range vs {
		// 128 queued and 16 running turns of 20,000 tokens, 90 % cached:
		// 256,000 tokens to compute, 5.1 s at 50,000 tokens/s.
		vs[i].QueuedRequests, vs[i].ActiveRequests = 128, 16
		vs[i].ActivePromptTokens, vs[i].HitRate = 144*20_000, 0.9
	}
	if got := r.backlogSeconds(&vs[0]); math.Abs(got-5.12) > 1e-9 {
		t.Fatalf("backlog %v s, want 5.12", got)
	}
	if c := r.Condition(&vs[0]); c != 0 {
		t.Fatalf("condition %v, want none", c)
	}
	if rt := place(t, r, Request{Key: "k", PromptTokens: 21_000}, Inputs{Views: mustViews(t, vs)}); rt.Action != actionBind {
		t.Fatalf("128 cached turns queued everywhere: %v, want a placement", rt.Action)
	}
}

// An instance whose backlog is at least shed.max_backlog_seconds of prefill
// is over its hard limit, however few requests it queues; when every one
// is, the request is shed and Retry-After is the least time one needs to
// drain below the limit.
func TestPlaceShedsOnSecondsOfBacklog(t *testing.T) {
	const tps = 5500
	r := mustRouter(t, func(c *Config) { c.Shed.MaxBacklogSeconds, c.Shed.PrefillTokensPerSecond = 10, tps })
	cases := []struct {
		name    string
		seconds [2]float64 // each instance's backlog, in seconds of prefill
		want    time.Duration
		wantAct action
	}{
		{"one below the limit takes it", [2]float64{20, 9.9}, 0, actionBind},
		{"twice the limit: the drain is the limit", [2]float64{20, 20}, 10 * time.Second, actionShed},
		{"the least drain of the candidates", [2]float64{25, 15}, 5 * time.Second, actionShed},
		{"at the limit: the minimum", [2]float64{10, 10}, time.Second, actionShed},
		{"bounded above", [2]float64{100, 200}, 30 * time.Second, actionShed},
	}
	for _, c := range cases {
		vs := idle("ctx-a", "ctx-b")
		for i := range vs {
			// Two prompts dispatched since the last report.
			vs[i].QueuedRequests, vs[i].QueuedPrefillTokens = 2, int64(c.seconds[i]*tps)
		}
		checkPlaceOrShed(t, r, c.name, vs, c.wantAct, c.want)
	}
	// The reported queue counts its uncached share: 100 queued of 200
	// requests holding 2.2 M tokens, half cached, are 550,000 tokens to
	// compute, 100 s; a bound instance over the limit counts as
	// saturated for the overload tracker.
	v := idle("ctx-a")[0]
	v.QueuedRequests, v.ActiveRequests, v.ActivePromptTokens, v.HitRate = 100, 100, 2_200_000, 0.5
	if got := r.backlogSeconds(&v); math.Abs(got-100) > 1e-9 || !r.overHard(&v) || r.Condition(&v) != fsm.OverflowSaturated {
		t.Fatalf("reported queue: %v s, over %v, condition %v; want 100 s, over, saturated", got, r.overHard(&v), r.Condition(&v))
	}
}

// A queued request whose size its worker does not report counts nothing
// toward the backlog limit (placement takes it for a turn): such a fleet
// sheds by shed.max_queued_requests.
func TestBacklogLimitCountsOnlyKnownWork(t *testing.T) {
	v := idle("ctx-a")[0]
	v.QueuedRequests = 1000
	if r := mustRouter(t, nil); r.overHard(&v) {
		t.Fatal("1,000 queued requests of unknown size: over the backlog limit")
	}
	if r := mustRouter(t, func(c *Config) { c.Shed.MaxQueuedRequests = 64 }); !r.overHard(&v) {
		t.Fatal("1,000 queued requests: not over max_queued_requests 64")
	}
}
