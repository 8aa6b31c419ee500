package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// harness applies events to a machine as successive log entries.
type harness struct {
	t      testing.TB
	m      *Machine
	index  uint64
	nextID uint64
}

func newHarness(t testing.TB) *harness { return &harness{t: t, m: NewMachine()} }

func (h *harness) id() ProposalID {
	h.nextID++
	var id ProposalID
	binary.BigEndian.PutUint64(id[8:], h.nextID)
	id[0] = 0x7e
	return id
}

// apply applies the events as one entry at the next index and log time t.
func (h *harness) apply(t int64, evs ...Event) []Result {
	h.t.Helper()
	props := make([]Proposal, len(evs))
	for i, ev := range evs {
		props[i] = Proposal{ID: h.id(), Event: ev}
	}
	return h.applyProps(t, props...)
}

func (h *harness) applyProps(t int64, props ...Proposal) []Result {
	h.t.Helper()
	data, err := EncodeEntry(props)
	if err != nil {
		h.t.Fatalf("EncodeEntry: %v", err)
	}
	h.index++
	rs, err := h.m.Apply(Entry{Index: h.index, Time: t, Data: data})
	if err != nil {
		h.t.Fatalf("Apply(index %d): %v", h.index, err)
	}
	if len(rs) != len(props) {
		h.t.Fatalf("Apply returned %d results for %d proposals", len(rs), len(props))
	}
	return rs
}

func (h *harness) one(t int64, ev Event) Result {
	h.t.Helper()
	return h.apply(t, ev)[0]
}

func bindEv(f Fleet, key, instance string) Bind {
	return Bind{Fleet: f, Key: key, ConversationID: key, Instance: instance,
		Decision: Decision{Edge: "edge-1", Policy: "least_tokens", RequestID: "req-" + key,
			Candidates: []Candidate{{Instance: instance, Score: 1}, {Instance: "other", Score: 0.5}}}}
}

func wantStatus(t *testing.T, what string, r Result, want Status) {
	t.Helper()
	if r.Status != want {
		t.Fatalf("%s: status %v (reason %q), want %v", what, r.Status, r.Reason, want)
	}
}

func TestBindFirstWins(t *testing.T) {
	h := newHarness(t)
	r := h.one(100, bindEv(FleetContext, "conv-1", "ctx-0"))
	wantStatus(t, "first bind", r, StatusApplied)
	if !r.Created || !r.Found || r.Binding.Instance != "ctx-0" || r.Binding.Epoch != 1 || r.Binding.BoundAt != 100 || r.Binding.LastUsed != 100 {
		t.Fatalf("first bind result %+v", r)
	}
	r = h.one(200, bindEv(FleetContext, "conv-1", "ctx-1"))
	wantStatus(t, "second bind", r, StatusApplied)
	if r.Created || !r.Found || r.Binding.Instance != "ctx-0" || r.Binding.Epoch != 1 {
		t.Fatalf("second bind should return the first binding, got %+v", r)
	}
	b, ok := h.m.State().Lookup(FleetContext, "conv-1")
	if !ok || b.Instance != "ctx-0" || b.LastUsed != 100 {
		t.Fatalf("Lookup = %+v %v; want ctx-0 with LastUsed 100 (a losing bind does not touch)", b, ok)
	}
	// From level 2 the losing Bind is answered superseded.
	h.one(250, ClusterFeatures{Level: FeatureLevelRanks})
	r = h.one(300, bindEv(FleetContext, "conv-1", "ctx-1"))
	wantStatus(t, "second bind at level 2", r, StatusSuperseded)
	if r.Created || !r.Found || r.Binding.Instance != "ctx-0" {
		t.Fatalf("superseded bind should return the first binding, got %+v", r)
	}
	// Same key, other fleet: an independent binding.
	r = h.one(300, bindEv(FleetGeneration, "conv-1", "gen-0"))
	if !r.Created {
		t.Fatalf("generation-fleet bind not created: %+v", r)
	}
	s := h.m.State()
	if s.Len() != 2 || s.BindingCount(FleetContext, "ctx-0") != 1 || s.BindingCount(FleetGeneration, "gen-0") != 1 || s.BindingCount(FleetContext, "gen-0") != 0 {
		t.Fatalf("Len %d, counts wrong", s.Len())
	}
	c := s.Counters()
	if c.BindsCreated != 2 || c.BindsExisting != 2 {
		t.Fatalf("counters %+v", c)
	}
}

func TestBindInvalidIsRejectedNotHalted(t *testing.T) {
	h := newHarness(t)
	for _, ev := range []Bind{
		{Fleet: 0, Key: "k", Instance: "i"},
		{Fleet: 9, Key: "k", Instance: "i"},
		{Fleet: FleetContext, Key: "", Instance: "i"},
		{Fleet: FleetContext, Key: "k", Instance: ""},
	} {
		r := h.one(1, ev)
		wantStatus(t, fmt.Sprintf("bind %+v", ev), r, StatusRejected)
		if r.Reason == "" {
			t.Fatalf("rejection without reason")
		}
	}
	if h.m.Halted() != nil || h.m.State().Len() != 0 || h.m.State().Counters().Rejected != 4 {
		t.Fatalf("invalid binds changed state: halted %v len %d", h.m.Halted(), h.m.State().Len())
	}
}

func TestBindRejectedOnDownInstance(t *testing.T) {
	h := newHarness(t)
	h.one(1, InstanceState{Instance: "ctx-0", Fleet: FleetContext, Status: InstanceDown})
	r := h.one(2, bindEv(FleetContext, "k", "ctx-0"))
	wantStatus(t, "bind to down instance", r, StatusRejected)
	if !strings.Contains(r.Reason, "ctx-0") || !strings.Contains(r.Reason, "down") {
		t.Fatalf("reason %q", r.Reason)
	}
	// Draining instances keep taking binds at the log level (placement
	// avoids them; the log does not second-guess a committed choice).
	h.one(3, InstanceState{Instance: "ctx-1", Fleet: FleetContext, Status: InstanceDraining})
	wantStatus(t, "bind to draining", h.one(4, bindEv(FleetContext, "k", "ctx-1")), StatusApplied)
}

func TestCapacityEvictsLeastRecentlyUsed(t *testing.T) {
	run := func() ([]Evicted, [32]byte) {
		h := newHarness(t)
		h.one(1, Settings{MaxBindings: 3})
		h.apply(10, bindEv(FleetContext, "a", "i0"), bindEv(FleetContext, "b", "i0"), bindEv(FleetGeneration, "c", "i1"))
		h.one(20, Touch{Keys: []FleetKey{{FleetContext, "a"}}}) // b is now the oldest
		r := h.one(30, bindEv(FleetContext, "d", "i1"))
		if len(r.Evicted) != 1 || r.Evicted[0].Key != "b" || r.Evicted[0].Reason != EvictCapacity {
			t.Fatalf("capacity eviction %+v, want b", r.Evicted)
		}
		r = h.one(40, bindEv(FleetContext, "e", "i1"))
		if len(r.Evicted) != 1 || r.Evicted[0].Key != "c" {
			t.Fatalf("second capacity eviction %+v, want c", r.Evicted)
		}
		s := h.m.State()
		if s.Len() != 3 || s.BindingCount(FleetContext, "i0") != 1 || s.BindingCount(FleetGeneration, "i1") != 0 {
			t.Fatalf("after evictions: len %d", s.Len())
		}
		if s.Counters().Evictions[EvictCapacity] != 2 {
			t.Fatalf("capacity evictions counted %d", s.Counters().Evictions[EvictCapacity])
		}
		var keys []string
		s.ForEachBinding(func(b Binding) bool { keys = append(keys, b.Key); return true })
		if strings.Join(keys, ",") != "a,d,e" {
			t.Fatalf("recency order %v, want a,d,e", keys)
		}
		return append(r.Evicted, Evicted{}), s.Hash()
	}
	e1, h1 := run()
	e2, h2 := run()
	if fmt.Sprint(e1) != fmt.Sprint(e2) || h1 != h2 {
		t.Fatal("capacity eviction is not deterministic")
	}
}

func TestCapacityTiesBreakByApplyOrder(t *testing.T) {
	h := newHarness(t)
	h.one(1, Settings{MaxBindings: 2})
	// Three binds at one log time: the first applied is the least recent.
	r := h.apply(5, bindEv(FleetContext, "z", "i"), bindEv(FleetContext, "y", "i"), bindEv(FleetContext, "x", "i"))
	if len(r[2].Evicted) != 1 || r[2].Evicted[0].Key != "z" {
		t.Fatalf("tie eviction %+v, want z", r[2].Evicted)
	}
}

func TestSettingsLoweringMaxBindingsEvictsInThatApply(t *testing.T) {
	h := newHarness(t)
	for i := 0; i < 10; i++ {
		h.one(int64(i+1), bindEv(FleetContext, fmt.Sprintf("k%d", i), "i0"))
	}
	r := h.one(100, Settings{MaxBindings: 4})
	if len(r.Evicted) != 6 {
		t.Fatalf("lowering MaxBindings evicted %d, want 6", len(r.Evicted))
	}
	for i, ev := range r.Evicted {
		if ev.Key != fmt.Sprintf("k%d", i) || ev.Reason != EvictCapacity {
			t.Fatalf("eviction %d = %+v, want k%d (oldest first)", i, ev, i)
		}
	}
	s := h.m.State()
	if s.Len() != 4 || s.MaxBindings() != 4 {
		t.Fatalf("len %d max %d", s.Len(), s.MaxBindings())
	}
	// A zero field keeps the current value.
	h.one(101, Settings{})
	if h.m.State().MaxBindings() != 4 {
		t.Fatal("Settings{} changed MaxBindings")
	}
}

func TestEvictConditions(t *testing.T) {
	h := newHarness(t)
	h.one(100, bindEv(FleetContext, "k", "i0")) // epoch 1
	cases := []struct {
		ev   Evict
		want Status
	}{
		{Evict{Fleet: FleetContext, Key: "missing", Reason: EvictTTL}, StatusConditionFailed},
		{Evict{Fleet: FleetContext, Key: "k", Reason: EvictTTL, Epoch: 7}, StatusConditionFailed},
		{Evict{Fleet: FleetContext, Key: "k", Reason: EvictTTL, IdleBefore: 100}, StatusConditionFailed}, // LastUsed 100 is not < 100
		{Evict{Fleet: FleetContext, Key: "k", Reason: 0}, StatusRejected},
		{Evict{Fleet: 0, Key: "k", Reason: EvictTTL}, StatusRejected},
		{Evict{Fleet: FleetContext, Key: "k", Reason: EvictTTL, Epoch: 1, IdleBefore: 101}, StatusApplied},
		{Evict{Fleet: FleetContext, Key: "k", Reason: EvictTTL}, StatusConditionFailed}, // already gone
	}
	for i, tc := range cases {
		r := h.one(200, tc.ev)
		wantStatus(t, fmt.Sprintf("case %d %+v", i, tc.ev), r, tc.want)
		if tc.want == StatusApplied {
			if len(r.Evicted) != 1 || r.Evicted[0].Epoch != 1 || r.Evicted[0].Reason != EvictTTL || r.Evicted[0].Instance != "i0" {
				t.Fatalf("evicted %+v", r.Evicted)
			}
		} else if _, ok := h.m.State().Lookup(FleetContext, "k"); !ok && i < 5 {
			t.Fatalf("case %d removed the binding", i)
		}
	}
	s := h.m.State()
	if s.Len() != 0 || s.BindingCount(FleetContext, "i0") != 0 {
		t.Fatal("binding not removed")
	}
	c := s.Counters()
	if c.Evictions[EvictTTL] != 1 || c.ConditionFailed != 4 || c.Rejected != 2 {
		t.Fatalf("counters %+v", c)
	}
	// Unconditional evict of a fresh binding.
	h.one(300, bindEv(FleetGeneration, "g", "i1"))
	wantStatus(t, "unconditional", h.one(300, Evict{Fleet: FleetGeneration, Key: "g", Reason: EvictAdmin}), StatusApplied)
}

func TestOverflowRebindAndCondition(t *testing.T) {
	h := newHarness(t)
	h.one(10, bindEv(FleetContext, "k", "ctx-0")) // epoch 1
	// Without Rebind: counted, binding stays, LastUsed advances.
	r := h.one(20, Overflow{Fleet: FleetContext, Key: "k", From: "ctx-0", To: "ctx-1", Reason: OverflowSaturated})
	wantStatus(t, "plain overflow", r, StatusApplied)
	if b, _ := h.m.State().Lookup(FleetContext, "k"); b.Instance != "ctx-0" || b.LastUsed != 20 || b.Epoch != 1 {
		t.Fatalf("after plain overflow %+v", b)
	}
	// Rebind from the wrong instance: condition failed, still counted.
	r = h.one(30, Overflow{Fleet: FleetContext, Key: "k", From: "ctx-9", To: "ctx-1", Reason: OverflowUnhealthy, Rebind: true})
	wantStatus(t, "rebind from wrong instance", r, StatusConditionFailed)
	if !r.Found || r.Binding.Instance != "ctx-0" {
		t.Fatalf("condition failure should report the current binding: %+v", r)
	}
	// Rebind from the bound instance: moves with a new epoch.
	r = h.one(40, Overflow{Fleet: FleetContext, Key: "k", From: "ctx-0", To: "ctx-1", Reason: OverflowUnhealthy, Rebind: true,
		Decision: Decision{Edge: "edge-2", Policy: "overflow"}})
	wantStatus(t, "rebind", r, StatusApplied)
	if !r.Found || r.Binding.Instance != "ctx-1" || r.Binding.Epoch != 4 || r.Binding.BoundAt != 40 || r.Binding.Decision.Edge != "edge-2" {
		t.Fatalf("rebind result %+v", r.Binding)
	}
	s := h.m.State()
	if b, _ := s.Lookup(FleetContext, "k"); b.Instance != "ctx-1" || b.Epoch != 4 {
		t.Fatalf("Lookup after rebind %+v", b)
	}
	if s.BindingCount(FleetContext, "ctx-0") != 0 || s.BindingCount(FleetContext, "ctx-1") != 1 {
		t.Fatal("per-instance counts not moved")
	}
	// An evict conditioned on the old epoch no longer applies.
	wantStatus(t, "stale evict", h.one(50, Evict{Fleet: FleetContext, Key: "k", Reason: EvictKVEvicted, Epoch: 1}), StatusConditionFailed)
	// Rebind of an unbound key: condition failed.
	wantStatus(t, "rebind unbound", h.one(60, Overflow{Fleet: FleetContext, Key: "nope", From: "a", To: "b", Reason: OverflowSaturated, Rebind: true}), StatusConditionFailed)
	// Rebind to a down instance: rejected.
	h.one(70, InstanceState{Instance: "ctx-2", Fleet: FleetContext, Status: InstanceDown})
	wantStatus(t, "rebind to down", h.one(80, Overflow{Fleet: FleetContext, Key: "k", From: "ctx-1", To: "ctx-2", Reason: OverflowSaturated, Rebind: true}), StatusRejected)
	wantStatus(t, "reason 0", h.one(90, Overflow{Fleet: FleetContext, Key: "k", From: "ctx-1", To: "ctx-3"}), StatusRejected)
	c := h.m.State().Counters()
	if c.Overflows[OverflowSaturated] != 3 || c.Overflows[OverflowUnhealthy] != 2 || c.Rebinds != 1 {
		t.Fatalf("overflow counters %+v", c)
	}
}

func TestInstanceDownEvictsItsBindings(t *testing.T) {
	h := newHarness(t)
	h.one(1, InstanceState{Instance: "ctx-0", Fleet: FleetContext, URL: "http://a", Status: InstanceUp, Ranks: 4})
	for i := 0; i < 5; i++ {
		h.one(int64(10+i), bindEv(FleetContext, fmt.Sprintf("a%d", i), "ctx-0"))
		h.one(int64(10+i), bindEv(FleetContext, fmt.Sprintf("b%d", i), "ctx-1"))
	}
	h.one(20, Link{Child: "child", Parent: "a0", Root: "a0", Depth: 1})
	r := h.one(30, InstanceState{Instance: "ctx-0", Fleet: FleetContext, URL: "http://a", Status: InstanceDown, Ranks: 4})
	wantStatus(t, "down", r, StatusApplied)
	if len(r.Evicted) != 5 {
		t.Fatalf("down evicted %d bindings, want 5", len(r.Evicted))
	}
	for i, ev := range r.Evicted {
		if ev.Key != fmt.Sprintf("a%d", i) || ev.Reason != EvictInstanceRemoved || ev.Instance != "ctx-0" {
			t.Fatalf("evicted[%d] = %+v", i, ev)
		}
	}
	s := h.m.State()
	if s.Len() != 5 || s.BindingCount(FleetContext, "ctx-0") != 0 || s.BindingCount(FleetContext, "ctx-1") != 5 {
		t.Fatalf("after down: len %d", s.Len())
	}
	if _, ok := s.Link("child"); ok {
		t.Fatal("link rooted at an evicted context key survived")
	}
	in, ok := s.Instance("ctx-0")
	if !ok || in.Status != InstanceDown || in.Since != 30 || in.Ranks != 4 {
		t.Fatalf("instance record %+v %v", in, ok)
	}
	// Same status again keeps Since.
	h.one(40, InstanceState{Instance: "ctx-0", Fleet: FleetContext, Status: InstanceDown})
	if in, _ := h.m.State().Instance("ctx-0"); in.Since != 30 {
		t.Fatalf("Since changed without a status change: %d", in.Since)
	}
	// Removed: evicts and deletes the record.
	r = h.one(50, InstanceState{Instance: "ctx-1", Status: InstanceRemoved})
	if len(r.Evicted) != 5 {
		t.Fatalf("removed evicted %d", len(r.Evicted))
	}
	s = h.m.State()
	if _, ok := s.Instance("ctx-1"); ok || s.Len() != 0 {
		t.Fatal("removed instance still present")
	}
	if got := s.Instances(); len(got) != 1 || got[0].ID != "ctx-0" {
		t.Fatalf("Instances() = %+v", got)
	}
	if s.Counters().Evictions[EvictInstanceRemoved] != 10 {
		t.Fatalf("instance_removed evictions %d", s.Counters().Evictions[EvictInstanceRemoved])
	}
	wantStatus(t, "bad status", h.one(60, InstanceState{Instance: "x", Fleet: FleetContext, Status: 9}), StatusRejected)
	wantStatus(t, "empty id", h.one(60, InstanceState{Fleet: FleetContext, Status: InstanceUp}), StatusRejected)
}

func TestInstancesAndNodesSorted(t *testing.T) {
	h := newHarness(t)
	for _, id := range []string{"c", "a", "b"} {
		h.one(1, InstanceState{Instance: id, Fleet: FleetGeneration, Status: InstanceUp})
		h.one(1, NodeInfo{NodeID: "edge-" + id, Version: "v1", MaxFeatureLevel: 1})
	}
	h.one(5, NodeInfo{NodeID: "edge-a", Version: "v2", MaxFeatureLevel: 1})
	s := h.m.State()
	ins, nodes := s.Instances(), s.Edges()
	if len(ins) != 3 || ins[0].ID != "a" || ins[2].ID != "c" || len(nodes) != 3 || nodes[0].ID != "edge-a" || nodes[0].Version != "v2" || nodes[0].Since != 5 || nodes[1].Since != 1 {
		t.Fatalf("instances %+v nodes %+v", ins, nodes)
	}
	ins[0].ID = "mutated"
	if s.Instances()[0].ID != "a" {
		t.Fatal("Instances() exposes state memory")
	}
	wantStatus(t, "empty node", h.one(6, NodeInfo{}), StatusRejected)
}

func TestLinkRules(t *testing.T) {
	h := newHarness(t)
	h.one(1, bindEv(FleetContext, "parent-1", "ctx-0"))
	wantStatus(t, "link a", h.one(2, Link{Child: "child-a", Parent: "parent-1", Root: "parent-1", Depth: 1}), StatusApplied)
	wantStatus(t, "link b", h.one(3, Link{Child: "child-b", Parent: "parent-1", Root: "parent-1", Depth: 1}), StatusApplied)
	// Nested: the parent is a child, the root is resolved.
	wantStatus(t, "link nested", h.one(4, Link{Child: "child-aa", Parent: "child-a", Root: "parent-1", Depth: 2}), StatusApplied)
	// First link wins.
	wantStatus(t, "relink", h.one(5, Link{Child: "child-a", Parent: "other", Root: "other", Depth: 1}), StatusApplied)
	s := h.m.State()
	if l, ok := s.Link("child-a"); !ok || l.Root != "parent-1" || l.CreatedAt != 2 || l.LastUsed != 2 || l.Depth != 1 {
		t.Fatalf("Link(child-a) = %+v %v", l, ok)
	}
	if got := s.Children("parent-1"); strings.Join(got, ",") != "child-a,child-aa,child-b" {
		t.Fatalf("Children = %v", got)
	}
	if s.Children("other") != nil {
		t.Fatal("losing link recorded children")
	}
	for _, bad := range []Link{
		{Child: "x", Parent: "x", Root: "r"},             // own parent
		{Child: "x", Parent: "p", Root: "x"},             // own root
		{Child: "x", Parent: "p", Root: ""},              // empty root
		{Child: "", Parent: "p", Root: "r"},              // empty child
		{Child: "y", Parent: "child-a", Root: "child-a"}, // root is itself a child
		{Child: "parent-1", Parent: "q", Root: "q"},      // child is a root of others
	} {
		wantStatus(t, fmt.Sprintf("link %+v", bad), h.one(6, bad), StatusRejected)
	}
	// Touch updates a link's LastUsed.
	h.one(7, Touch{Links: []string{"child-b", "unknown"}})
	if l, _ := h.m.State().Link("child-b"); l.LastUsed != 7 || l.CreatedAt != 3 {
		t.Fatalf("touched link %+v", l)
	}
	// Evicting the root's context binding drops its links.
	h.one(8, Evict{Fleet: FleetContext, Key: "parent-1", Reason: EvictAdmin})
	s = h.m.State()
	if _, ok := s.Link("child-a"); ok || s.Children("parent-1") != nil || s.LinkCount() != 0 {
		t.Fatal("links survived the eviction of their root")
	}
	if s.Counters().LinksCreated != 3 {
		t.Fatalf("LinksCreated %d", s.Counters().LinksCreated)
	}
}

func TestGenerationEvictionKeepsLinks(t *testing.T) {
	h := newHarness(t)
	h.one(1, bindEv(FleetGeneration, "p", "g0"))
	h.one(2, Link{Child: "c", Parent: "p", Root: "p", Depth: 1})
	h.one(3, Evict{Fleet: FleetGeneration, Key: "p", Reason: EvictAdmin})
	if _, ok := h.m.State().Link("c"); !ok {
		t.Fatal("a generation-fleet eviction dropped a link")
	}
}

func TestClusterFeaturesMonotone(t *testing.T) {
	h := newHarness(t)
	if h.m.State().FeatureLevel() != 0 {
		t.Fatal("initial feature level not 0")
	}
	for _, step := range []struct{ set, want uint32 }{{1, 1}, {2, 2}, {1, 2}, {0, 2}} {
		h.one(1, ClusterFeatures{Level: step.set})
		if got := h.m.State().FeatureLevel(); got != step.want {
			t.Fatalf("after ClusterFeatures{%d}: level %d, want %d", step.set, got, step.want)
		}
	}
}

func TestTouchAndIdleBindings(t *testing.T) {
	h := newHarness(t)
	for i := 0; i < 5; i++ {
		h.one(int64(100+i), bindEv(FleetContext, fmt.Sprintf("k%d", i), "i"))
	}
	h.one(200, Touch{Keys: []FleetKey{{FleetContext, "k1"}, {FleetContext, "k1"}, {FleetContext, "nope"}, {FleetGeneration, "k2"}}})
	s := h.m.State()
	if b, _ := s.Lookup(FleetContext, "k1"); b.LastUsed != 200 || b.BoundAt != 101 {
		t.Fatalf("touched binding %+v", b)
	}
	if b, _ := s.Lookup(FleetContext, "k2"); b.LastUsed != 102 {
		t.Fatal("touch of another fleet's key changed k2")
	}
	if s.Counters().Touched != 1 {
		t.Fatalf("Touched %d", s.Counters().Touched)
	}
	idle := s.IdleBindings(104, 10)
	var keys []string
	for _, b := range idle {
		keys = append(keys, b.Key)
	}
	if strings.Join(keys, ",") != "k0,k2,k3" {
		t.Fatalf("IdleBindings(104) = %v", keys)
	}
	if got := s.IdleBindings(1000, 2); len(got) != 2 || got[0].Key != "k0" || got[1].Key != "k2" {
		t.Fatalf("IdleBindings limit 2 = %+v", got)
	}
	if s.IdleBindings(1000, 0) != nil {
		t.Fatal("limit 0 returned bindings")
	}
}

func TestTimeIsMonotone(t *testing.T) {
	h := newHarness(t)
	h.one(1000, bindEv(FleetContext, "a", "i"))
	// The leader's clock jumps back: state time holds, and new records use it.
	r := h.one(500, bindEv(FleetContext, "b", "i"))
	if h.m.State().Time() != 1000 || r.Binding.BoundAt != 1000 {
		t.Fatalf("time went backwards: state %d, bound at %d", h.m.State().Time(), r.Binding.BoundAt)
	}
	h.one(2000, Touch{Keys: []FleetKey{{FleetContext, "a"}}})
	if h.m.State().Time() != 2000 {
		t.Fatal("time did not advance")
	}
	// Recency order follows the log, even across the clock jump.
	var keys []string
	h.m.State().ForEachBinding(func(b Binding) bool { keys = append(keys, b.Key); return true })
	if strings.Join(keys, ",") != "b,a" {
		t.Fatalf("order %v", keys)
	}
}

func TestDuplicateProposals(t *testing.T) {
	h := newHarness(t)
	id := ProposalID{1, 2, 3}
	r := h.applyProps(10, Proposal{ID: id, Event: bindEv(FleetContext, "k", "i0")})
	if !r[0].Created {
		t.Fatal("first bind not created")
	}
	// A retry of the same proposal (same id, even if re-decided) is a duplicate.
	r = h.applyProps(20, Proposal{ID: id, Event: bindEv(FleetContext, "k", "i1")})
	wantStatus(t, "retry", r[0], StatusDuplicate)
	if !r[0].Found || r[0].Binding.Instance != "i0" || r[0].Created {
		t.Fatalf("duplicate bind should report the binding: %+v", r[0])
	}
	// Duplicate evict: no change.
	eid := ProposalID{9}
	h.one(30, bindEv(FleetContext, "e", "i0"))
	h.applyProps(40, Proposal{ID: eid, Event: Evict{Fleet: FleetContext, Key: "e", Reason: EvictAdmin}})
	h.one(50, bindEv(FleetContext, "e", "i0"))
	wantStatus(t, "dup evict", h.applyProps(60, Proposal{ID: eid, Event: Evict{Fleet: FleetContext, Key: "e", Reason: EvictAdmin}})[0], StatusDuplicate)
	if _, ok := h.m.State().Lookup(FleetContext, "e"); !ok {
		t.Fatal("duplicate evict removed the binding")
	}
	// Within one entry, too.
	r = h.applyProps(70, Proposal{ID: ProposalID{5}, Event: ClusterFeatures{Level: 1}}, Proposal{ID: ProposalID{5}, Event: ClusterFeatures{Level: 2}})
	wantStatus(t, "same entry", r[1], StatusDuplicate)
	if h.m.State().FeatureLevel() != 1 {
		t.Fatal("duplicate within an entry applied")
	}
	// A zero id opts out of deduplication.
	r = h.applyProps(80, Proposal{Event: ClusterFeatures{Level: 2}}, Proposal{Event: ClusterFeatures{Level: 2}})
	if r[0].Status != StatusApplied || r[1].Status != StatusApplied || h.m.State().FeatureLevel() != 2 {
		t.Fatal("zero ids were deduplicated")
	}
	if h.m.State().Counters().Duplicates != 3 {
		t.Fatalf("Duplicates = %d", h.m.State().Counters().Duplicates)
	}

	// Across a snapshot and restore.
	var buf bytes.Buffer
	if err := h.m.State().WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	m2 := NewMachine()
	if err := m2.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	h2 := &harness{t: t, m: m2, index: h.index, nextID: h.nextID}
	r = h2.applyProps(90, Proposal{ID: id, Event: bindEv(FleetContext, "k", "i1")})
	wantStatus(t, "retry after restore", r[0], StatusDuplicate)
}

func TestDedupWindowGenerations(t *testing.T) {
	if testing.Short() {
		t.Skip("applies 2×65,536 proposals")
	}
	h := newHarness(t)
	first := ProposalID{0xAA}
	h.applyProps(1, Proposal{ID: first, Event: Annotation{Text: "first"}})
	// Fill the window: 2 generations minus the one already used, in entries of 1024.
	fill := func(n int) {
		for n > 0 {
			k := min(n, 1024)
			props := make([]Proposal, k)
			for i := range props {
				props[i] = Proposal{ID: h.id(), Event: Annotation{}}
			}
			h.applyProps(2, props...)
			n -= k
		}
	}
	fill(dedupGeneration - 1) // current generation full (65,536 ids incl. first)
	fill(dedupGeneration)     // rotation: first is now in the previous generation
	wantStatus(t, "still remembered", h.applyProps(3, Proposal{ID: first, Event: Annotation{}})[0], StatusDuplicate)
	fill(1) // the next rotation forgets the generation holding first
	r := h.applyProps(4, Proposal{ID: first, Event: Annotation{}})
	wantStatus(t, "forgotten", r[0], StatusApplied)
}

func unknownEvent(t EventType) []byte { return []byte{byte(t), 1, 0xde, 0xad} }

func rawEntry(t *testing.T, props ...[]byte) []byte {
	t.Helper()
	b := []byte{entryVersion}
	b = appendUvarint(b, uint64(len(props)))
	for i, p := range props {
		b = append(b, ProposalID{0xF0, byte(i)}.bytes()...)
		b = appendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return b
}

func (id ProposalID) bytes() []byte { return id[:] }

func mustEncode(t *testing.T, ev Event) []byte {
	t.Helper()
	b, err := EncodeEvent(ev)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestUnknownOptionalSkipped(t *testing.T) {
	m := NewMachine()
	data := rawEntry(t, unknownEvent(FlagIgnoreUnknown|0x3c), mustEncode(t, bindEv(FleetContext, "k", "i")))
	rs, err := m.Apply(Entry{Index: 1, Time: 5, Data: data})
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Status != StatusSkipped || rs[1].Status != StatusApplied || m.Skipped() != 1 {
		t.Fatalf("results %+v skipped %d", rs, m.Skipped())
	}
	// A retry of the skipped proposal is a duplicate like any other.
	rs, err = m.Apply(Entry{Index: 2, Time: 6, Data: rawEntry(t, unknownEvent(FlagIgnoreUnknown|0x3c))})
	if err != nil || rs[0].Status != StatusDuplicate || m.Skipped() != 1 {
		t.Fatalf("retry: %+v %v", rs, err)
	}
}

func TestUnknownRequiredHalts(t *testing.T) {
	m := NewMachine()
	if _, err := m.Apply(Entry{Index: 41, Time: 5, Data: rawEntry(t, mustEncode(t, bindEv(FleetContext, "k", "i")))}); err != nil {
		t.Fatal(err)
	}
	before := m.State()
	data := rawEntry(t, mustEncode(t, bindEv(FleetContext, "k2", "i")), unknownEvent(0x0c))
	_, err := m.Apply(Entry{Index: 42, Time: 6, Data: data})
	var ue *UnknownEventError
	if !errors.As(err, &ue) || ue.Type != 0x0c || ue.Index != 42 {
		t.Fatalf("err = %v, want *UnknownEventError{0x0c, 42}", err)
	}
	want := fmt.Sprintf("fsm: log entry 42 holds unknown required event type 0x0c; this node understands feature level %d: upgrade it to a tether release that supports this event before it can apply the log", FeatureLevelMax)
	if err.Error() != want {
		t.Fatalf("message:\n got %q\nwant %q", err.Error(), want)
	}
	if m.State() != before || m.State().Index() != 41 {
		t.Fatal("the halting entry changed the state")
	}
	if _, ok := m.State().Lookup(FleetContext, "k2"); ok {
		t.Fatal("the bind before the unknown event in the same entry was applied")
	}
	if !errors.Is(m.Halted(), err) && m.Halted().Error() != err.Error() {
		t.Fatalf("Halted() = %v", m.Halted())
	}
	// Every later apply returns the same error and changes nothing.
	_, err2 := m.Apply(Entry{Index: 43, Time: 7, Data: rawEntry(t, mustEncode(t, bindEv(FleetContext, "k3", "i")))})
	if err2 == nil || err2.Error() != err.Error() || m.State() != before {
		t.Fatalf("after halt: err %v, state changed %v", err2, m.State() != before)
	}
}

func TestCorruptEntryHalts(t *testing.T) {
	m := NewMachine()
	data := rawEntry(t, mustEncode(t, bindEv(FleetContext, "k", "i")))
	_, err := m.Apply(Entry{Index: 7, Time: 1, Data: data[:len(data)-3]})
	var de *DecodeError
	if !errors.As(err, &de) || de.Index != 7 || !strings.Contains(err.Error(), "log entry 7") {
		t.Fatalf("err = %v", err)
	}
	if m.Halted() == nil || m.State().Index() != 0 {
		t.Fatal("corrupt entry did not halt or changed state")
	}
}

func TestApplyBatchPublishesPrefixOnHalt(t *testing.T) {
	m := NewMachine()
	good := rawEntry(t, mustEncode(t, bindEv(FleetContext, "k", "i")))
	bad := rawEntry(t, unknownEvent(0x0c))
	rs, err := m.ApplyBatch([]Entry{{Index: 1, Time: 1, Data: good}, {Index: 2, Time: 2, Data: bad}, {Index: 3, Time: 3, Data: good}})
	if err == nil || len(rs) != 1 || m.State().Index() != 1 || m.State().Len() != 1 {
		t.Fatalf("rs %d err %v index %d", len(rs), err, m.State().Index())
	}
}

func TestStaleIndexRefusedWithoutHalting(t *testing.T) {
	h := newHarness(t)
	h.one(1, bindEv(FleetContext, "k", "i"))
	data := rawEntry(t, mustEncode(t, bindEv(FleetContext, "k2", "i")))
	if _, err := h.m.Apply(Entry{Index: 1, Time: 2, Data: data}); err == nil || !strings.Contains(err.Error(), "not after") {
		t.Fatalf("re-applying index 1: err %v", err)
	}
	if h.m.Halted() != nil || h.m.State().Len() != 1 {
		t.Fatal("stale entry halted or changed state")
	}
}

func TestAnnotationChangesNothingButIndex(t *testing.T) {
	h := newHarness(t)
	h.one(1, bindEv(FleetContext, "k", "i"))
	before := h.m.State()
	h.applyProps(1, Proposal{Event: Annotation{Source: "op", Text: "note"}})
	after := h.m.State()
	if after.Len() != before.Len() || after.digest != before.digest || after.Index() != before.Index()+1 {
		t.Fatal("annotation changed records")
	}
}

func TestRestoreResumesHaltedMachine(t *testing.T) {
	healthy := newHarness(t)
	healthy.one(10, bindEv(FleetContext, "k", "i"))
	var snap bytes.Buffer
	if err := healthy.m.State().WriteSnapshot(&snap); err != nil {
		t.Fatal(err)
	}
	m := NewMachine()
	if _, err := m.Apply(Entry{Index: 1, Time: 1, Data: rawEntry(t, unknownEvent(0x0d))}); err == nil || m.Halted() == nil {
		t.Fatal("machine did not halt")
	}
	if err := m.Restore(&snap); err != nil {
		t.Fatal(err)
	}
	if m.Halted() != nil {
		t.Fatalf("still halted after restore: %v", m.Halted())
	}
	if b, ok := m.State().Lookup(FleetContext, "k"); !ok || b.Instance != "i" {
		t.Fatal("restored state lacks the binding")
	}
	rs, err := m.Apply(Entry{Index: 2, Time: 20, Data: rawEntry(t, mustEncode(t, bindEv(FleetContext, "k2", "i")))})
	if err != nil || !rs[0].Created {
		t.Fatalf("apply after restore: %+v %v", rs, err)
	}
}
