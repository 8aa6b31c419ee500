package edge

import (
	"fmt"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/natstest"
)

// The agent tree's KV budget through three edges, NATS and real workers
// (placement.overflow.subagent_tree_budget, on by default). A parent's
// long prompt and two sub-agents' first requests share one context
// instance. A sub-agent's second request, sent through a third edge, would
// not fit there beside the parent's and its sibling's prompts, as the
// edges heard them routed: it goes to the other instance, which has room,
// under its own conversation id and without a hint, and that binding is
// the log's, so its next turn through another edge stays there with its
// previous prompt cached. Its sibling's small second turn still fits and
// stays with the parent. With the budget off every turn follows the
// parent.
func TestSubAgentLeavesAFullInstanceThroughTheEdges(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("budget=%v", on), func(t *testing.T) {
			ns := natstest.Start(t, nil)
			// One rank of 128 blocks (512 tokens) per instance: the
			// instance's KV capacity is the rank's.
			fleet := startDisaggFleet(t, ns.ClientURL(), workerOpts{capacityBlocks: 128, ranks: 1})
			ec := startEdges(t, 3, ns.ClientURL(), func(_ int, c *Config) {
				if !c.Placement.Overflow.SubAgentTreeBudget {
					t.Fatal("placement.overflow.subagent_tree_budget is off by default")
				}
				c.Placement.Overflow.SubAgentTreeBudget = on
			})
			ec.waitInstances(4)
			c := httpClient(t)

			parent, childA, childB := seedAgents()
			p1 := parent.send(t, c, ec.edge(0), longText("plan", 300), nil)
			a1 := childA.send(t, c, ec.edge(1), "look at package a", nil)
			b1 := childB.send(t, c, ec.edge(1), "look at package b", nil)
			full := p1.ctxInst
			if a1.ctxInst != full || b1.ctxInst != full {
				t.Fatalf("first requests: parent on %s, child-a %s, child-b %s; want the parent's instance", full, a1.ctxInst, b1.ctxInst)
			}
			other := "ctx-0"
			if full == other {
				other = "ctx-1"
			}

			// The third edge has the parent's binding and heard the three
			// routes: its working set of the parent's instance holds their
			// prompts' whole blocks.
			awaitPlacementsApplied(t, ec, 0)
			blocks := func(r turnResult) int64 { return int64(r.prompt / testBlockSize) }
			want := blocks(p1) + blocks(a1) + blocks(b1)
			m := ec.edge(2).e.catalogue.First()
			waitFor(t, "edge-3 to hear the tree's three routes", 20*time.Second, func() bool {
				l := m.Decider.WorkingSet(m.Routers[fsm.FleetContext], full, time.Now())
				return l.Keys == 3 && l.Blocks == want
			})

			b2 := childB.send(t, c, ec.edge(2), longText("read", 200), nil)
			// The case is the one meant: child-b's prompt fits an empty
			// instance, not the parent's beside the parent and child-a.
			if n := blocks(b2); n > 128 || blocks(p1)+blocks(a1)+n <= 128 {
				t.Fatalf("prompts of %d, %d and %d blocks against 128: not the case this test is about", blocks(p1), blocks(a1), n)
			}
			rt, err := ParseRoute(b2.resp.header.Get(HeaderRoute))
			if err != nil {
				t.Fatal(err)
			}
			if !on {
				if b2.ctxInst != full || rt.ContextOwnKey {
					t.Fatalf("budget off: child-b's second turn went to %s (own key %v), want the parent's %s", b2.ctxInst, rt.ContextOwnKey, full)
				}
				if _, ok := binding(t, c, ec.edge(2), fsm.FleetContext, "child-b"); ok {
					t.Fatal("budget off: child-b got its own context binding")
				}
				return
			}
			if b2.ctxInst != other || !rt.ContextOwnKey {
				t.Fatalf("child-b's second turn went to %s (own key %v), want %s under its own id", b2.ctxInst, rt.ContextOwnKey, other)
			}
			b, ok := binding(t, c, ec.edge(2), fsm.FleetContext, "child-b")
			if !ok || b.Instance != other || b.ConversationID != "child-b" || b.Policy != routing.PolicySubAgentOwn {
				t.Fatalf("child-b's context binding %+v (found %v), want %s by policy %s", b, ok, other, routing.PolicySubAgentOwn)
			}
			// The worker saw it under its own id, with no hint to follow.
			var seen bool
			for _, s := range fleet.byID(other).requests() {
				if s.conversationID() != "child-b" {
					continue
				}
				seen = true
				if s.header.Get(hintauth.HeaderAffinityID) != "" {
					t.Fatalf("child-b's request to %s carried a hint: %v", other, s.header)
				}
			}
			if !seen {
				t.Fatalf("%s never saw child-b", other)
			}

			// Sticky, through any edge once the binding committed there, with
			// its previous prompt cached.
			waitFor(t, "edge-1 to apply child-b's binding", 20*time.Second, func() bool {
				b, ok := ec.edge(0).e.Node().State().Lookup(fsm.FleetContext, "child-b")
				return ok && b.Instance == other
			})
			b3 := childB.send(t, c, ec.edge(0), "go on", nil)
			if b3.ctxInst != other || b3.cache < b2.prompt/testBlockSize*testBlockSize {
				t.Fatalf("child-b's third turn: %s with %d cached tokens, want %s with its %d-token prompt in whole blocks",
					b3.ctxInst, b3.cache, other, b2.prompt)
			}
			// Its sibling's small second turn fits beside the parent.
			a2 := childA.send(t, c, ec.edge(2), "go on", nil)
			if a2.ctxInst != full {
				t.Fatalf("child-a's second turn went to %s, want the parent's %s", a2.ctxInst, full)
			}
		})
	}
}

// A sub-agent placed under its own id on its parent's instance
// (placement.overflow.subagent_first_with_parent: its context is cached
// there) keeps the signed hint: its context is on its parent's rank, where
// the hint keeps it. Only a sub-agent moved to another instance goes
// without it.
func TestSubAgentOnItsParentsInstanceUnderItsOwnIDKeepsTheHint(t *testing.T) {
	ns := natstest.Start(t, nil)
	fleet := startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 2, ns.ClientURL(), func(_ int, c *Config) {
		c.Placement.Overflow.SubAgentFirstWithParent = true
	})
	ec.waitInstances(4)
	c := httpClient(t)

	parent, child, _ := seedAgents()
	p1 := parent.send(t, c, ec.edge(0), "plan the work", nil)
	c1 := child.send(t, c, ec.edge(0), longText("read", 150), nil)
	if c1.ctxInst != p1.ctxInst {
		t.Fatalf("the first request went to %s, want the parent's %s", c1.ctxInst, p1.ctxInst)
	}
	// Edge 2 has the parent's binding and the child's link, its KV index
	// holds both prompts on the parent's instance, and it counts nothing
	// queued or in flight there (edge 1's dispatch heard ended): the
	// placement weighs the cache, not a backlog that is already gone.
	awaitPlacementsApplied(t, ec, 0)
	want := int64(p1.prompt/testBlockSize + c1.prompt/testBlockSize)
	waitFor(t, "edge-2 to apply child-a's parent link, index both prompts and see the parent's instance idle", 20*time.Second, func() bool {
		_, ok := ec.edge(1).e.Node().State().Link("child-a")
		in, _ := instanceInfo(t, c, ec.edge(1), p1.ctxInst)
		idle := false
		for _, v := range ec.edge(1).e.Fleet().Instances(time.Now()) {
			if v.ID == p1.ctxInst {
				idle = v.PendingRequests == 0 && v.QueuedRequests == 0 && v.ActiveRequests == 0
			}
		}
		return ok && idle && in.KV.Blocks >= want
	})
	c2 := child.send(t, c, ec.edge(1), "continue", nil)
	rt, err := ParseRoute(c2.resp.header.Get(HeaderRoute))
	if err != nil {
		t.Fatal(err)
	}
	if c2.ctxInst != p1.ctxInst || !rt.ContextOwnKey {
		t.Fatalf("second request: %s (own key %v), want its own binding on the parent's %s, where its context is cached", c2.ctxInst, rt.ContextOwnKey, p1.ctxInst)
	}
	var last seenRequest
	for _, s := range fleet.byID(p1.ctxInst).requests() {
		if s.conversationID() == "child-a" {
			last = s
		}
	}
	if last.header.Get(hintauth.HeaderAffinityID) != "parent-1" || last.header.Get(hintauth.HeaderAffinityAuth) == "" {
		t.Fatalf("child-a's second request to its parent's instance: hint %q / %q, want parent-1 signed",
			last.header.Get(hintauth.HeaderAffinityID), last.header.Get(hintauth.HeaderAffinityAuth))
	}
}
