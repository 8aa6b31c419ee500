package routing

import (
	"math"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/kvindex"
	"github.com/tether-project/tether/routing/workset"
)

// An instance's reported queue is prefill work: its queued requests' share
// of the prompt tokens it holds, less what its cache serves. A new key goes
// to the instance with less of it, not to the one with fewer active prompt
// tokens: a holds more, but its queue is short and its cache serves 90 %;
// b's whole queue is to compute.
func TestPlacementWeighsTheReportedQueue(t *testing.T) {
	r := mustRouter(t, func(c *Config) { c.Weights.LiveBinding = 0 })
	vs := idle("ctx-a", "ctx-b")
	vs[0].QueuedRequests, vs[0].ActiveRequests, vs[0].ActivePromptTokens, vs[0].HitRate = 2, 2, 100_000, 0.9
	vs[1].QueuedRequests, vs[1].ActiveRequests, vs[1].ActivePromptTokens = 2, 1, 60_000
	if got := r.backlog(&vs[0], 0); math.Abs(got-5_000) > 1e-6 {
		t.Fatalf("a's backlog %v, want 2 of 4 requests' 100,000 tokens, 10%% uncached: 5,000", got)
	}
	if got := r.backlog(&vs[1], 0); math.Abs(got-40_000) > 1e-6 {
		t.Fatalf("b's backlog %v, want 2 of 3 requests' 60,000 tokens: 40,000", got)
	}
	if rt := place(t, r, Request{Key: "k"}, Inputs{Views: mustViews(t, vs)}); rt.Instance != "ctx-a" {
		t.Fatalf("placed on %s, want ctx-a (5,000 tokens of prefill ahead against 40,000)", rt.Instance)
	}
	// A worker that reports only request counts queues requests of
	// unknown size: a turn's worth each (weights.live_binding), or the
	// prompt being placed when it is longer.
	bare := idle("ctx-c")[0]
	bare.QueuedRequests = 3
	def := mustRouter(t, nil)
	want := 3 * def.Config().Weights.LiveBinding
	if got := def.backlog(&bare, def.unknownRequest(&Request{PromptTokens: 1000})); got != want {
		t.Fatalf("counts only: backlog %v, want 3 × %v", got, def.Config().Weights.LiveBinding)
	}
	if got := def.backlog(&bare, def.unknownRequest(&Request{PromptTokens: 90_000})); got != 270_000 {
		t.Fatalf("counts only, a 90,000-token prompt: backlog %v, want 270,000", got)
	}
}

// reliefRig is a key bound to ctx-a, whose index holds the conversation's
// prompt (cachedBlocks of its 100 blocks on a), beside an idle ctx-b.
func reliefRig(t *testing.T, cachedBlocks int) (prompt []uint64, ix *kvindex.Index, vs []InstanceView) {
	t.Helper()
	prompt = blocks(5, 100) // 6,400 tokens
	ix = kvindex.New(kvindex.Config{})
	stored(t, ix, "ctx-a", 1, 0, prompt[:cachedBlocks])
	stored(t, ix, "ctx-b", 1, 0, blocks(6, 10))
	return prompt, ix, idle("ctx-a", "ctx-b")
}

// A bound key stays while waiting on its instance costs less than
// overflow.relief_factor times moving, however many requests queue there,
// and moves (a rebind) once the prefill queued ahead outweighs that.
func TestReliefMovesWhenWaitingCostsMoreThanMoving(t *testing.T) {
	r := mustRouter(t, nil)
	rho := r.Config().Overflow.ReliefFactor
	for _, c := range []struct {
		name   string
		queued int64 // prefill tokens dispatched to ctx-a since its report
		count  int   // its queued requests
		move   bool
	}{
		// 40 queued requests of fully cached turns: a short wait.
		{"a long queue of cached turns", 2_000, 40, false},
		{"a queue worth less than relief_factor moves", int64(rho*6400) - 1000, 2, false},
		{"a queue worth more than relief_factor moves", int64(rho*6400) + 1000, 2, true},
	} {
		prompt, ix, vs := reliefRig(t, 99)
		vs[0].QueuedRequests, vs[0].QueuedPrefillTokens = c.count, c.queued
		rt := routeBound(t, r, Request{ConversationID: "conv-1", Blocks: prompt, PromptTokens: 6400},
			binding("conv-1", "ctx-a"), Inputs{Views: mustViews(t, vs), Prefix: ix})
		moved := rt.Action == actionOverflow && rt.Instance == "ctx-b" && rt.Rebind && rt.Reason == fsm.OverflowSaturated
		if moved != c.move || (!moved && rt.Action != actionSticky) {
			t.Errorf("%s: %v to %s rebind=%v reason %v, want moved=%v", c.name, rt.Action, rt.Instance, rt.Rebind, rt.Reason, c.move)
		}
	}
}

// A prefill already running shows in no request count: an instance
// prefilling one prompt of 400,000 tokens reports 1 active request and an
// empty queue, and a cached turn sent there waits for all of it. With
// placement.reported_prefill and a worker that reports the prefill it has
// still to compute, the backlog is that wait and the turn moves; without
// either (the default, or an older worker), the estimate from request
// counts sees nothing ahead and the turn stays.
func TestReliefSeesARunningPrefillWhenReported(t *testing.T) {
	for _, c := range []struct {
		option, reported, move bool
	}{{true, true, true}, {true, false, false}, {false, true, false}} {
		r := mustRouter(t, func(cfg *Config) { cfg.ReportedPrefill = c.option })
		prompt, ix, vs := reliefRig(t, 99)
		vs[0].ActiveRequests, vs[0].ActivePromptTokens, vs[0].HitRate = 1, 400_000, 0.9
		vs[0].PrefillTokens, vs[0].PrefillReported = 390_000, c.reported
		want := 0.0
		if c.move {
			want = 390_000
		}
		if got := r.backlog(&vs[0], 0); got != want {
			t.Errorf("%+v: backlog %v, want %v", c, got, want)
		}
		rt := routeBound(t, r, Request{ConversationID: "conv-1", Blocks: prompt, PromptTokens: 6400},
			binding("conv-1", "ctx-a"), Inputs{Views: mustViews(t, vs), Prefix: ix})
		moved := rt.Action == actionOverflow && rt.Instance == "ctx-b" && rt.Rebind
		if moved != c.move {
			t.Errorf("%+v: %v to %s, want moved=%v", c, rt.Action, rt.Instance, c.move)
		}
	}
	// The edges' dispatches since the report come on top.
	r := mustRouter(t, func(cfg *Config) { cfg.ReportedPrefill = true })
	v := idle("ctx-a")[0]
	v.QueuedPrefillTokens, v.PrefillTokens, v.PrefillReported, v.QueuedRequests, v.ActivePromptTokens = 5_000, 7_000, true, 3, 90_000
	if got := r.backlog(&v, 0); got != 12_000 {
		t.Fatalf("backlog %v, want 5,000 dispatched + 7,000 reported", got)
	}
}

// With placement.reported_prefill, an unkeyed request avoids the instance
// whose prefill has 390,000 tokens left, while a new conversation is placed
// by the estimate as without it: it goes where it goes whichever instance
// runs the prefill.
func TestReportedPrefillPlacesNewKeysByTheEstimate(t *testing.T) {
	r := mustRouter(t, func(cfg *Config) { cfg.ReportedPrefill, cfg.Weights.LiveBinding = true, 0 })
	var keyed []string
	for _, busy := range []int{0, 1} {
		vs := idle("ctx-a", "ctx-b")
		for i := range vs {
			vs[i].ActiveRequests, vs[i].ActivePromptTokens, vs[i].PrefillReported = 1, 400_000, true
		}
		vs[busy].PrefillTokens = 390_000
		in := Inputs{Views: mustViews(t, vs)}
		if rt := place(t, r, Request{Spread: 7}, in); rt.Instance == vs[busy].ID {
			t.Errorf("unkeyed request placed on %s, the instance with 390,000 tokens of prefill left", rt.Instance)
		}
		keyed = append(keyed, place(t, r, Request{Key: "conv-new"}, in).Instance)
	}
	if keyed[0] != keyed[1] {
		t.Errorf("the new key went to %s with the prefill on ctx-a and to %s with it on ctx-b; want the same instance (the estimate)", keyed[0], keyed[1])
	}
}

// Over its hard limit, a bound instance whose cache saves more than its
// queue costs keeps its key (it sheds only when every instance is over);
// with the relief rule off, the key overflows to an instance below it.
func TestReliefKeepsACachedKeyOnABusyInstance(t *testing.T) {
	for _, rho := range []float64{DefaultReliefFactor, 0} {
		// A hard limit of 2 s: 11,000 tokens at 5,500 tokens/s.
		r := mustRouter(t, func(c *Config) { c.Overflow.ReliefFactor, c.Shed.MaxBacklogSeconds = rho, 2 })
		prompt, ix, vs := reliefRig(t, 99)
		// 10 queued of 11 requests holding 480,000 tokens, 5 % uncached:
		// a backlog of 21,818 tokens, over the hard limit and less than
		// relief_factor times the 6,400-token prompt b lacks.
		vs[0].QueuedRequests = 10
		vs[0].ActiveRequests, vs[0].ActivePromptTokens, vs[0].HitRate = 1, 75*6400, 0.95
		rt := routeBound(t, r, Request{ConversationID: "conv-1", Blocks: prompt, PromptTokens: 6400},
			binding("conv-1", "ctx-a"), Inputs{Views: mustViews(t, vs), Prefix: ix})
		switch {
		case rho > 0 && (rt.Action != actionSticky || rt.Instance != "ctx-a" || rt.Reason != fsm.OverflowSaturated):
			t.Errorf("relief on: %v to %s (%v), want sticky on ctx-a, reason saturated", rt.Action, rt.Instance, rt.Reason)
		case rho == 0 && (rt.Action != actionOverflow || rt.Instance != "ctx-b"):
			t.Errorf("relief off: %v to %s, want an overflow to ctx-b", rt.Action, rt.Instance)
		}
	}
}

// The cost of moving includes the cache the prompt evicts where it goes:
// an idle instance whose KV cache this edge filled with other
// conversations lately is no relief.
func TestReliefWeighsTheCacheAMoveEvicts(t *testing.T) {
	r := mustRouter(t, nil)
	prompt, ix, vs := reliefRig(t, 99)
	vs[0].QueuedPrefillTokens = 40_000 // 6.25 prompts: moving to an empty b pays
	for i := range vs {
		vs[i].KVTotalBlocks = 120
	}
	in := Inputs{Views: mustViews(t, vs), Prefix: ix, Work: workset.New(workset.Config{})}
	req := Request{ConversationID: "conv-1", Blocks: prompt, PromptTokens: 6400, Now: t0}
	if rt := routeBound(t, r, req, binding("conv-1", "ctx-a"), in); rt.Action != actionOverflow || rt.Instance != "ctx-b" {
		t.Fatalf("b empty: %v to %s, want an overflow to ctx-b", rt.Action, rt.Instance)
	}
	in.Work.Note("context/other", "ctx-b", 110, t0.Add(-time.Second)) // b's cache is full
	if rt := routeBound(t, r, req, binding("conv-1", "ctx-a"), in); rt.Action != actionSticky {
		t.Fatalf("b's cache full: %v to %s, want sticky on ctx-a", rt.Action, rt.Instance)
	}
}

// A new conversation is not placed where it would evict the working set of
// the conversations routed there lately when another instance has room: a
// is slightly less loaded, but its cache is taken.
func TestPlacementAvoidsEvictingAWorkingSet(t *testing.T) {
	r := mustRouter(t, func(c *Config) { c.Weights.LiveBinding = 0 })
	prompt := blocks(7, 50)
	vs := idle("ctx-a", "ctx-b")
	vs[1].QueuedPrefillTokens = 500
	for i := range vs {
		vs[i].KVTotalBlocks = 100
	}
	work := workset.New(workset.Config{})
	in := Inputs{Views: mustViews(t, vs), Prefix: kvindex.New(kvindex.Config{}), Work: work}
	req := Request{Key: "new", ConversationID: "new", Blocks: prompt, PromptTokens: 3200, Now: t0}
	if rt := place(t, r, req, in); rt.Instance != "ctx-a" {
		t.Fatalf("both caches free: %s, want the less loaded ctx-a", rt.Instance)
	}
	work.Note("context/busy", "ctx-a", 90, t0.Add(-time.Second))
	if rt := place(t, r, req, in); rt.Instance != "ctx-b" {
		t.Fatalf("a's cache holds a 90-block working set: %s, want ctx-b", rt.Instance)
	}
	// Past the working-set window the conversation no longer counts.
	req.Now = t0.Add(workset.DefaultWindow + time.Second)
	if rt := place(t, r, req, in); rt.Instance != "ctx-a" {
		t.Fatalf("a's working set expired: %s, want ctx-a", rt.Instance)
	}
}

// A turn that more than doubles the conversation (a long tool result)
// leaves the bound instance's cache intact: the cache-lost boundary is of
// what the instance stored, the previous prompt this edge sent there, not
// of the new prompt. The bound instance is busier than the other, so a
// cache judged lost would move.
func TestCacheLostJudgesWhatTheInstanceStored(t *testing.T) {
	r := mustRouter(t, func(c *Config) { c.Overflow.ReliefFactor = 0 })
	prompt := blocks(8, 100)
	ix := kvindex.New(kvindex.Config{})
	stored(t, ix, "ctx-a", 1, 0, prompt[:40]) // all of the previous prompt
	stored(t, ix, "ctx-b", 1, 0, blocks(9, 5))
	vs := idle("ctx-a", "ctx-b")
	vs[0].QueuedPrefillTokens = 5000
	work := workset.New(workset.Config{})
	work.Note(workKey(fsm.FleetContext, "conv-1", ""), "ctx-a", 40, t0.Add(-time.Minute))
	req := Request{ConversationID: "conv-1", Blocks: prompt, PromptTokens: 6400}
	b := binding("conv-1", "ctx-a")
	rt := routeBound(t, r, req, b, Inputs{Views: mustViews(t, vs), Prefix: ix, Work: work})
	if rt.Action != actionSticky || rt.Instance != "ctx-a" {
		t.Fatalf("a holds the whole previous prompt: %v to %s, want sticky", rt.Action, rt.Instance)
	}
	// a lost the tail of what it stored (holds 15 of those 40 blocks).
	ix = kvindex.New(kvindex.Config{})
	stored(t, ix, "ctx-a", 1, 0, prompt[:15])
	stored(t, ix, "ctx-b", 1, 0, blocks(9, 5))
	rt = routeBound(t, r, req, b, Inputs{Views: mustViews(t, vs), Prefix: ix, Work: work})
	if rt.Action != actionOverflow || rt.Reason != fsm.OverflowCacheLost || rt.Instance != "ctx-b" {
		t.Fatalf("a lost most of what it stored: %v to %s (%v), want a cache_lost move to ctx-b", rt.Action, rt.Instance, rt.Reason)
	}
}

// The one-block lookup before relief's KV match decides as the match
// would: for every threshold, an instance other than the bound one holds
// more than x tokens of the prompt exactly when heldEnoughElsewhere says
// so (holders at every depth, on ranks and as predictions).
func TestHeldEnoughElsewhereAgreesWithTheMatch(t *testing.T) {
	r := mustRouter(t, nil)
	bs := r.Config().BlockSize
	prompt := make([]uint64, 12)
	for i := range prompt {
		prompt[i] = uint64(9000 + i)
	}
	ix := kvindex.New(kvindex.Config{})
	for i, depth := range []int{12, 3, 7, 0, 10} {
		id := []string{"bound", "o1", "o2", "o3", "o4"}[i]
		if id == "o4" {
			ix.Predict(id, prompt[:depth], t0)
			continue
		}
		if _, err := ix.Apply(kvindex.Batch{Instance: id, Boot: 1, Seq: 1, Events: []kvindex.RankEvent{{Rank: i % 3, Stored: prompt[:depth]}}}); err != nil {
			t.Fatal(err)
		}
	}
	b := &fsm.Binding{Fleet: fsm.FleetContext, Key: "k", Instance: "bound"}
	for _, now := range []time.Time{t0, t0.Add(time.Hour)} { // the prediction live, then expired
		req := &Request{Fleet: fsm.FleetContext, Key: "k", Blocks: prompt, Now: now}
		in := &Inputs{Prefix: ix}
		held := r.heldElsewhere(req, b, in)
		for x := -float64(bs); x <= float64((len(prompt)+1)*bs); x += float64(bs) / 4 {
			if got, want := r.heldEnoughElsewhere(req, b, in, x), float64(held*bs) > x; got != want {
				t.Errorf("now %v, x %v: heldEnoughElsewhere %v, the match (%d blocks elsewhere) says %v", now.Sub(t0), x, got, held, want)
			}
		}
	}
}
