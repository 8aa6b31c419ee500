package routing

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/kvindex"
	"github.com/tether-project/tether/routing/overload"
	"github.com/tether-project/tether/routing/workset"
)

func binding(key, inst string) fsm.Binding {
	return fsm.Binding{Fleet: fsm.FleetContext, Key: key, ConversationID: key, Instance: inst, Epoch: 7}
}

func routeBound(t testing.TB, r *Router, req Request, b fsm.Binding, in Inputs) route {
	t.Helper()
	if req.Fleet == 0 {
		req.Fleet = fsm.FleetContext
	}
	if req.Now.IsZero() {
		req.Now = t0
	}
	if req.Key == "" {
		req.Key = b.Key
	}
	rt, err := r.stayOrMove(req, b, in)
	if err != nil {
		t.Fatalf("route bound %q: %v", b.Key, err)
	}
	return rt
}

// thresholds configures the overflow thresholds without the relief rule:
// a bound key leaves its instance at 8 queued requests or 2M active prompt
// tokens (overflow.relief_factor 0).
func thresholds(c *Config) {
	c.Overflow.QueuedRequests, c.Overflow.ActivePromptTokens, c.Overflow.ReliefFactor = 8, 2_000_000, 0
}

func TestStayOrMoveConditions(t *testing.T) {
	r := mustRouter(t, thresholds)
	cases := []struct {
		name       string
		bound      func(v *InstanceView)
		missing    bool
		wantAction action
		wantReason fsm.OverflowReason
	}{
		{"healthy and below thresholds", func(v *InstanceView) { v.QueuedRequests = 7 }, false, actionSticky, 0},
		{"draining still serves its keys", func(v *InstanceView) { v.Draining = true }, false, actionSticky, 0},
		{"queue at threshold", func(v *InstanceView) { v.QueuedRequests = 8 }, false, actionOverflow, fsm.OverflowSaturated},
		{"active prompt tokens at threshold", func(v *InstanceView) { v.ActivePromptTokens = 2_000_000 }, false, actionOverflow, fsm.OverflowSaturated},
		{"unhealthy", func(v *InstanceView) { v.Healthy = false }, false, actionOverflow, fsm.OverflowUnhealthy},
		{"unknown to this edge", nil, true, actionOverflow, fsm.OverflowUnhealthy},
		// An open breaker stops crediting the cache; it never moves a
		// bound key by itself.
		{"circuit open stays", func(v *InstanceView) { v.CacheDegraded = true }, false, actionSticky, 0},
	}
	for _, c := range cases {
		vs := idle("ctx-a", "ctx-b", "ctx-c")
		vs[2].QueuedRequests = 1 // b is the better alternative
		if c.bound != nil {
			c.bound(&vs[0])
		}
		if c.missing {
			vs = vs[1:]
		}
		rt := routeBound(t, r, Request{RequestID: "req-9", Edge: "edge-2"}, binding("conv-1", "ctx-a"), Inputs{Views: mustViews(t, vs)})
		if rt.Action != c.wantAction || rt.Reason != c.wantReason {
			t.Errorf("%s: %v/%v, want %v/%v", c.name, rt.Action, rt.Reason, c.wantAction, c.wantReason)
			continue
		}
		switch rt.Action {
		case actionSticky:
			if rt.Instance != "ctx-a" || rt.URL != "http://ctx-a" || len(rt.Decision.Candidates) != 0 {
				t.Errorf("%s: sticky route %+v", c.name, rt)
			}
		case actionOverflow:
			ev := rt.OverflowEvent(Request{Fleet: fsm.FleetContext, Key: "conv-1"})
			want := fsm.Overflow{Fleet: fsm.FleetContext, Key: "conv-1", From: "ctx-a", To: "ctx-b", Reason: c.wantReason, Decision: rt.Decision}
			if rt.Instance != "ctx-b" || ev.From != want.From || ev.To != want.To || ev.Reason != want.Reason || ev.Rebind ||
				rt.Decision.Edge != "edge-2" || rt.Decision.RequestID != "req-9" {
				t.Errorf("%s: overflow %+v", c.name, ev)
			}
			for _, cand := range rt.Decision.Candidates {
				if cand.Instance == "ctx-a" {
					t.Errorf("%s: the bound instance is a candidate of its own overflow", c.name)
				}
			}
		}
	}
}

func TestStayOrMoveOverflowUsesKVScore(t *testing.T) {
	r := mustRouter(t, thresholds)
	ix := kvindex.New(kvindex.Config{})
	prompt := blocks(3, 40)
	stored(t, ix, "ctx-c", 1, 1, prompt)
	vs := idle("ctx-a", "ctx-b", "ctx-c")
	vs[0].QueuedRequests = 9
	rt := routeBound(t, r, Request{Blocks: prompt}, binding("k", "ctx-a"), Inputs{Views: mustViews(t, vs), Prefix: ix})
	if rt.Action != actionOverflow || rt.Instance != "ctx-c" || rt.CachedTokens != 40*64 {
		t.Fatalf("overflow should go where the prefix is: %+v", rt)
	}
}

func TestStayOrMoveStaysWhenNoBetterInstance(t *testing.T) {
	r := mustRouter(t, thresholds)
	vs := idle("ctx-a", "ctx-b")
	vs[0].QueuedRequests = 10 // bound: saturated, below the hard limit
	vs[1].QueuedRequests = 9  // the only alternative is saturated too
	rt := routeBound(t, r, Request{}, binding("k", "ctx-a"), Inputs{Views: mustViews(t, vs)})
	if rt.Action != actionSticky || rt.Instance != "ctx-a" || rt.Reason != fsm.OverflowSaturated {
		t.Fatalf("saturated everywhere: %+v, want sticky with reason saturated", rt)
	}
	vs[0].QueuedRequests, vs[0].CacheDegraded = 0, true
	rt = routeBound(t, r, Request{}, binding("k", "ctx-a"), Inputs{Views: mustViews(t, vs)})
	if rt.Action != actionSticky || rt.Reason != 0 {
		t.Fatalf("circuit open, alternative saturated: %+v, want sticky", rt)
	}
	// Alone in the fleet: stays.
	rt = routeBound(t, r, Request{}, binding("k", "ctx-a"), Inputs{Views: mustViews(t, vs[:1])})
	if rt.Action != actionSticky {
		t.Fatalf("only instance: %+v", rt)
	}
}

func TestStayOrMoveShedsWhenEverythingIsOverHardLimit(t *testing.T) {
	r := mustRouter(t, nil) // the relief rule cannot weigh without prompt blocks
	limit := r.Config().Shed.MaxBacklogSeconds
	vs := idle("ctx-a", "ctx-b")
	vs[0].QueuedRequests, vs[0].QueuedPrefillTokens = 3, int64((limit+6)*5500)  // 6 s above → 6s
	vs[1].QueuedRequests, vs[1].QueuedPrefillTokens = 2, int64((limit+10)*5500) // 10 s above → 10s
	rt := routeBound(t, r, Request{}, binding("k", "ctx-a"), Inputs{Views: mustViews(t, vs)})
	if rt.Action != actionShed || rt.RetryAfter != 6*time.Second {
		t.Fatalf("all over the hard limit: %+v, want shed with Retry-After 6s", rt)
	}
	// One alternative below the thresholds: overflow instead.
	vs[1].QueuedRequests, vs[1].QueuedPrefillTokens = 0, 0
	if rt := routeBound(t, r, Request{}, binding("k", "ctx-a"), Inputs{Views: mustViews(t, vs)}); rt.Action != actionOverflow || rt.Instance != "ctx-b" {
		t.Fatalf("alternative available: %+v", rt)
	}
	// Unhealthy bound and every other instance over the limit: shed.
	vs[0].Healthy = false
	overLimit(&vs[1])
	if rt := routeBound(t, r, Request{}, binding("k", "ctx-a"), Inputs{Views: mustViews(t, vs)}); rt.Action != actionShed {
		t.Fatalf("unhealthy bound, rest over limit: %+v", rt)
	}
	// Unhealthy bound and nobody else: no instance.
	_, err := r.stayOrMove(Request{Fleet: fsm.FleetContext, Key: "k", Now: t0}, binding("k", "ctx-a"), Inputs{Views: mustViews(t, vs[:1])})
	if !errors.Is(err, ErrNoInstances) {
		t.Fatalf("nowhere to go: %v", err)
	}
}

func TestStayOrMoveRebindsAfterPersistentOverload(t *testing.T) {
	r := mustRouter(t, func(c *Config) { thresholds(c); c.Overflow.RebindAfter = 30 * time.Second })
	tracker := overload.NewTracker()
	vs := idle("ctx-a", "ctx-b")
	vs[0].QueuedRequests = 12
	views := mustViews(t, vs)
	in := Inputs{Views: views, Overload: tracker}
	observe := func(at time.Time) {
		for _, v := range views.Fleet(fsm.FleetContext) {
			tracker.Observe(v.ID, r.Condition(&v) != 0, at)
		}
	}
	observe(t0)
	cases := []struct {
		after  time.Duration
		rebind bool
	}{{0, false}, {29 * time.Second, false}, {30 * time.Second, true}, {time.Hour, true}}
	for _, c := range cases {
		observe(t0.Add(c.after))
		rt := routeBound(t, r, Request{Now: t0.Add(c.after)}, binding("k", "ctx-a"), in)
		if rt.Action != actionOverflow || rt.Rebind != c.rebind {
			t.Errorf("after %v: %v rebind=%v, want overflow rebind=%v", c.after, rt.Action, rt.Rebind, c.rebind)
		}
		if ev := rt.OverflowEvent(Request{Fleet: fsm.FleetContext, Key: "k"}); ev.Rebind != c.rebind {
			t.Errorf("after %v: event rebind %v", c.after, ev.Rebind)
		}
	}
	// A healthy observation resets the clock.
	healthy := idle("ctx-a", "ctx-b")
	for _, v := range healthy {
		tracker.Observe(v.ID, r.Condition(&v) != 0, t0.Add(2*time.Hour))
	}
	observe(t0.Add(2*time.Hour + time.Second))
	if rt := routeBound(t, r, Request{Now: t0.Add(2*time.Hour + 10*time.Second)}, binding("k", "ctx-a"), in); rt.Rebind {
		t.Fatal("rebind right after a recovery")
	}
	// rebind_after 0 never rebinds.
	never := mustRouter(t, func(c *Config) { thresholds(c); c.Overflow.RebindAfter = 0 })
	if rt := routeBound(t, never, Request{Now: t0.Add(100 * time.Hour)}, binding("k", "ctx-a"), in); rt.Rebind {
		t.Fatal("rebind with rebind_after 0")
	}
}

func TestStayOrMoveCacheLost(t *testing.T) {
	prompt := blocks(4, 100)
	subAgent := false      // set by a case: the request is a sub-agent's under the key
	other := blocks(9, 10) // something a holds, so the index knows it
	cases := []struct {
		name     string
		below    float64
		setup    func(ix *kvindex.Index, vs []InstanceView)
		wantTo   string // "" = sticky on ctx-a
		wantRank int
	}{
		// This edge sent the conversation's previous prompt (60 blocks)
		// to ctx-a: the boundary is block 30 of those.
		{"the prompt grew past twice what a stored", 0.5, func(ix *kvindex.Index, _ []InstanceView) {
			stored(t, ix, "ctx-a", 1, 0, prompt[:60])
			stored(t, ix, "ctx-b", 1, 0, prompt[:20])
		}, "", -1},
		{"a lost half of what it stored", 0.5, func(ix *kvindex.Index, _ []InstanceView) {
			stored(t, ix, "ctx-a", 1, 0, prompt[:25])
			stored(t, ix, "ctx-b", 1, 2, prompt[:50])
		}, "ctx-b", 2},
		{"cache intact", 0.5, func(ix *kvindex.Index, _ []InstanceView) {
			stored(t, ix, "ctx-a", 1, 0, prompt)
			stored(t, ix, "ctx-b", 1, 0, prompt[:80])
		}, "", -1},
		// This edge did not route the previous prompt: a lost the cache
		// only when it lost the prompt's first block.
		{"a holds the head, this edge does not know what it stored", 0.5, func(ix *kvindex.Index, _ []InstanceView) {
			stored(t, ix, "ctx-a", 1, 0, prompt[:30])
			stored(t, ix, "ctx-b", 1, 5, prompt[:80])
		}, "", -1},
		{"cache lost, b holds the prefix", 0.5, func(ix *kvindex.Index, _ []InstanceView) {
			stored(t, ix, "ctx-a", 1, 0, other)
			stored(t, ix, "ctx-b", 1, 5, prompt[:80])
		}, "ctx-b", 5},
		{"what is left still beats the cold rest", 0.5, func(ix *kvindex.Index, _ []InstanceView) {
			stored(t, ix, "ctx-a", 1, 0, prompt[:30])
		}, "", -1},
		{"all cold and idle: a tie stays", 0.5, func(ix *kvindex.Index, _ []InstanceView) {
			stored(t, ix, "ctx-a", 1, 0, other)
		}, "", -1},
		{"all cold, a loaded: the lighter instance wins", 0.5, func(ix *kvindex.Index, vs []InstanceView) {
			stored(t, ix, "ctx-a", 1, 0, other)
			vs[0].QueuedRequests, vs[0].QueuedPrefillTokens = 2, 4000
			vs[2].QueuedRequests = 1
		}, "ctx-b", -1},
		{"no baseline for a: no evidence", 0.5, func(ix *kvindex.Index, _ []InstanceView) {
			stored(t, ix, "ctx-b", 1, 0, prompt[:80])
		}, "", -1},
		{"disabled", 0, func(ix *kvindex.Index, _ []InstanceView) {
			stored(t, ix, "ctx-a", 1, 0, other)
			stored(t, ix, "ctx-b", 1, 0, prompt[:80])
		}, "", -1},
		{"the better holder is over its hard limit", 0.5, func(ix *kvindex.Index, vs []InstanceView) {
			stored(t, ix, "ctx-a", 1, 0, other)
			stored(t, ix, "ctx-b", 1, 0, prompt[:80])
			vs[1].QueuedRequests = 64
			vs[2].QueuedRequests = 64
		}, "", -1},
		{"a sub-agent's request under its parent's key", 0.5, func(ix *kvindex.Index, _ []InstanceView) {
			stored(t, ix, "ctx-a", 1, 0, other)
			stored(t, ix, "ctx-b", 1, 0, prompt[:80])
			subAgent = true
		}, "", -1},
		{"draining and cold: its keys leave", 0.5, func(ix *kvindex.Index, vs []InstanceView) {
			stored(t, ix, "ctx-a", 1, 0, other)
			vs[0].Draining = true
			vs[2].QueuedRequests = 1
		}, "ctx-b", -1},
	}
	for _, c := range cases {
		r := mustRouter(t, func(cfg *Config) { cfg.Overflow.CacheLostBelow = c.below })
		ix := kvindex.New(kvindex.Config{})
		vs := idle("ctx-a", "ctx-b", "ctx-c")
		subAgent = false
		c.setup(ix, vs)
		conv := "conv-1"
		if subAgent {
			conv = "child-of-conv-1"
		}
		work := workset.New(workset.Config{})
		if strings.HasPrefix(c.name, "the prompt grew") || strings.HasPrefix(c.name, "a lost half") {
			work.Note(workKey(fsm.FleetContext, "conv-1", ""), "ctx-a", 60, t0.Add(-time.Minute))
		}
		rt := routeBound(t, r, Request{RequestID: "req-3", Edge: "edge-1", ConversationID: conv, Blocks: prompt, PromptTokens: 6400},
			binding("conv-1", "ctx-a"), Inputs{Views: mustViews(t, vs), Prefix: ix, Work: work})
		if c.wantTo == "" {
			if rt.Action != actionSticky || rt.Instance != "ctx-a" || rt.Reason != 0 {
				t.Errorf("%s: %v to %s (%v), want sticky on ctx-a", c.name, rt.Action, rt.Instance, rt.Reason)
			}
			continue
		}
		ev := rt.OverflowEvent(Request{Fleet: fsm.FleetContext, Key: "conv-1"})
		if rt.Action != actionOverflow || !rt.Rebind || ev.Reason != fsm.OverflowCacheLost || ev.From != "ctx-a" || ev.To != c.wantTo ||
			rt.Rank != c.wantRank || rt.Decision.Edge != "edge-1" || rt.Decision.RequestID != "req-3" || len(rt.Decision.Candidates) == 0 {
			t.Errorf("%s: %v rebind=%v event %+v rank %d, want a cache_lost rebind to %s (rank %d)", c.name, rt.Action, rt.Rebind, ev, rt.Rank, c.wantTo, c.wantRank)
		}
	}
}

// A binding used less than cache_lost_min_idle ago keeps its instance even
// when the index lacks the block: the worker may not have reported what the
// last request stored (the e2e leader-kill test caught a conversation's
// second turn, sent to another edge right after its first, moving this way).
func TestCacheLostWaitsForMinIdle(t *testing.T) {
	prompt := blocks(4, 100)
	r := mustRouter(t, nil)
	minIdle := r.cfg.Overflow.CacheLostMinIdle
	if minIdle <= 0 {
		t.Fatalf("default cache_lost_min_idle %s, want > 0", minIdle)
	}
	for _, c := range []struct {
		idle time.Duration
		move bool
	}{{0, false}, {minIdle - time.Millisecond, false}, {minIdle, true}, {time.Hour, true}} {
		ix := kvindex.New(kvindex.Config{})
		stored(t, ix, "ctx-a", 1, 0, blocks(9, 30)) // none of the prompt
		stored(t, ix, "ctx-b", 1, 0, prompt[:80])
		b := binding("conv-1", "ctx-a")
		b.LastUsed = t0.Add(-c.idle).UnixNano()
		rt := routeBound(t, r, Request{ConversationID: "conv-1", Blocks: prompt, PromptTokens: 6400, Now: t0},
			b, Inputs{Views: mustViews(t, idle("ctx-a", "ctx-b")), Prefix: ix})
		if moved := rt.Action == actionOverflow && rt.Rebind && rt.Instance == "ctx-b"; moved != c.move {
			t.Errorf("idle %s: %v to %s, want moved=%v", c.idle, rt.Action, rt.Instance, c.move)
		}
	}
}

func TestCacheLostBelowValidated(t *testing.T) {
	for _, v := range []float64{-0.1, 1.5} {
		cfg := DefaultConfig()
		cfg.Overflow.CacheLostBelow = v
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "router.overflow.cache_lost_below") {
			t.Errorf("cache_lost_below %g: %v, want an error naming the key", v, err)
		}
	}
	cfg := DefaultConfig()
	cfg.Overflow.CacheLostMinIdle = -time.Second
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "router.overflow.cache_lost_min_idle") {
		t.Errorf("cache_lost_min_idle -1s: %v, want an error naming the key", err)
	}
}

// Weigh (experimental): the bound instance stays while its cache outweighs
// the prefill queued ahead of it, and the key moves when another instance
// scores strictly better — below any saturation threshold.
func TestWeighMovesOnlyWhenAnotherScoresBetter(t *testing.T) {
	prompt := blocks(4, 100) // 100 blocks of 64 tokens
	r := mustRouter(t, func(cfg *Config) { cfg.Overflow.Weigh = true })
	for _, c := range []struct {
		name   string
		queued int64 // prefill tokens queued on the bound ctx-a
		move   bool
	}{
		{"cache outweighs a short queue", 1000, false},
		{"a long queue outweighs the cache", 50_000, true},
	} {
		ix := kvindex.New(kvindex.Config{})
		stored(t, ix, "ctx-a", 1, 0, prompt[:60]) // 3,840 cached tokens
		vs := idle("ctx-a", "ctx-b")
		vs[0].QueuedPrefillTokens = c.queued
		b := binding("conv-1", "ctx-a")
		b.LastUsed = t0.Add(-time.Hour).UnixNano()
		rt := routeBound(t, r, Request{ConversationID: "conv-1", Blocks: prompt, PromptTokens: 6400, Now: t0},
			b, Inputs{Views: mustViews(t, vs), Prefix: ix})
		moved := rt.Action == actionOverflow && rt.Rebind && rt.Instance == "ctx-b"
		if moved != c.move || (!moved && rt.Action != actionSticky) {
			t.Errorf("%s: %v to %s, want moved=%v", c.name, rt.Action, rt.Instance, c.move)
		}
	}
}

// The cache a bound key can use is on the rank its worker reported: a copy
// of the prompt on another rank of the same instance gives it no hit, so
// it does not keep the key there.
func TestCacheLostJudgesTheBindingsRank(t *testing.T) {
	prompt := blocks(4, 100)
	r := mustRouter(t, nil)
	for _, c := range []struct {
		name    string
		hasRank bool
		rank    uint32
		move    bool
	}{
		{"bound to the rank holding the prompt", true, 2, false},
		{"bound to another rank", true, 5, true},
		{"rank not reported: any rank counts", false, 0, false},
	} {
		ix := kvindex.New(kvindex.Config{})
		stored(t, ix, "ctx-a", 1, 2, prompt[:80])
		stored(t, ix, "ctx-b", 1, 0, prompt[:80])
		b := binding("conv-1", "ctx-a")
		b.LastUsed = t0.Add(-time.Hour).UnixNano()
		b.Rank, b.HasRank = c.rank, c.hasRank
		rt := routeBound(t, r, Request{ConversationID: "conv-1", Blocks: prompt, PromptTokens: 6400, Now: t0},
			b, Inputs{Views: mustViews(t, idle("ctx-a", "ctx-b")), Prefix: ix})
		if moved := rt.Action == actionOverflow && rt.Rebind && rt.Instance == "ctx-b"; moved != c.move {
			t.Errorf("%s: %v to %s, want moved=%v", c.name, rt.Action, rt.Instance, c.move)
		}
	}
}

// A key bound to an instance an operator drained moves on its next turn,
// with a rebind so every edge follows: to the best other instance below its
// hard limits (a saturated one too), not to the drained one; a sub-agent's
// turn routed by its parent's key moves the family. With nowhere to go it
// stays (a drained instance still serves). A worker's own draining report
// (Draining without Drained) keeps its keys until it goes down.
func TestStayOrMoveDrained(t *testing.T) {
	r := mustRouter(t, nil) // no overflow thresholds, shed at max_backlog_seconds
	drained := func(v *InstanceView) { v.Draining, v.Drained = true, true }
	cases := []struct {
		name       string
		views      func() []InstanceView
		req        Request
		wantAction action
		wantTo     string
	}{
		{"moves to the best other", func() []InstanceView {
			vs := idle("ctx-a", "ctx-b", "ctx-c")
			drained(&vs[0])
			vs[2].QueuedRequests = 1
			return vs
		}, Request{}, actionOverflow, "ctx-b"},
		{"a sub-agent's turn moves the family", func() []InstanceView {
			vs := idle("ctx-a", "ctx-b")
			drained(&vs[0])
			return vs
		}, Request{ConversationID: "child-1"}, actionOverflow, "ctx-b"},
		{"to a saturated one rather than stay", func() []InstanceView {
			vs := idle("ctx-a", "ctx-b")
			drained(&vs[0])
			vs[1].QueuedRequests = 9
			return vs
		}, Request{}, actionOverflow, "ctx-b"},
		{"saturated and drained", func() []InstanceView {
			vs := idle("ctx-a", "ctx-b")
			drained(&vs[0])
			vs[0].QueuedRequests = 9
			return vs
		}, Request{}, actionOverflow, "ctx-b"},
		{"nowhere else: stays", func() []InstanceView {
			vs := idle("ctx-a")
			drained(&vs[0])
			return vs
		}, Request{}, actionSticky, "ctx-a"},
		{"every other over its hard limit: stays", func() []InstanceView {
			vs := idle("ctx-a", "ctx-b")
			drained(&vs[0])
			overLimit(&vs[1])
			return vs
		}, Request{}, actionSticky, "ctx-a"},
		{"everything over its hard limit: shed", func() []InstanceView {
			vs := idle("ctx-a", "ctx-b")
			drained(&vs[0])
			overLimit(&vs[0])
			overLimit(&vs[1])
			return vs
		}, Request{}, actionShed, ""},
		{"the worker's own draining keeps its keys", func() []InstanceView {
			vs := idle("ctx-a", "ctx-b")
			vs[0].Draining = true
			return vs
		}, Request{}, actionSticky, "ctx-a"},
	}
	for _, c := range cases {
		rt := routeBound(t, r, c.req, binding("conv-1", "ctx-a"), Inputs{Views: mustViews(t, c.views())})
		if rt.Action != c.wantAction || rt.Instance != c.wantTo {
			t.Errorf("%s: %v to %q (reason %v), want %v to %q", c.name, rt.Action, rt.Instance, rt.Reason, c.wantAction, c.wantTo)
			continue
		}
		switch {
		case rt.Action == actionOverflow:
			ev := rt.OverflowEvent(Request{Fleet: fsm.FleetContext, Key: "conv-1"})
			if ev.Reason != fsm.OverflowDrained || !ev.Rebind || ev.From != "ctx-a" || ev.To != c.wantTo {
				t.Errorf("%s: overflow %+v, want a rebind with reason drained", c.name, ev)
			}
			for _, cand := range rt.Decision.Candidates {
				if cand.Instance == "ctx-a" {
					t.Errorf("%s: the drained instance is a candidate", c.name)
				}
			}
		case rt.Action == actionSticky && c.name != "the worker's own draining keeps its keys":
			if rt.Reason != fsm.OverflowDrained || rt.URL != "http://ctx-a" {
				t.Errorf("%s: sticky %+v, want reason drained", c.name, rt)
			}
		case rt.Action == actionSticky && rt.Reason != 0:
			t.Errorf("%s: sticky with reason %v", c.name, rt.Reason)
		}
	}
}
