package reliability

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/routing"
)

// The soak's context instances: two ranks of treeRankBlocks KV blocks of
// treeBlockSize tokens each (the edges' and the simulated engine's
// default block size).
const (
	treeRankBlocks = 64
	treeBlockSize  = 64
	treeInstBlocks = 2 * treeRankBlocks
	// treeWords sizes the parent's prompt and each sub-agent's long
	// turn (the simulated engine counts a word a token): about 0.4 of an
	// instance's cache each, so the parent and one sub-agent fit there
	// and a second does not.
	treeWords = 3300
)

// soakTree is an agent tree whose second sub-agent outgrows its parent's
// context instance (placement.overflow.subagent_tree_budget, on by
// default): the parent's long prompt and its first sub-agent's long turn
// fill about 0.8 of the instance's cache, so the second sub-agent's long
// turn goes to the other instance under its own id. grow builds it before
// the faults; the soak then keeps every member talking through the edge
// kills, and that own binding must hold through them: a later turn of the
// moved sub-agent is routed by its own id wherever the serving edge's state
// holds that binding (routecheck's JudgeSubAgent, with every other hop),
// and on every edge once all have caught up after the faults (checkMoved).
type soakTree struct {
	parent, fits, moves convWork
	home                string // the parent's context instance
	away                string // where the moved sub-agent's own binding put it
}

type sendTurn func(w convWork, turn, first int, content string) sample

func newSoakTree(seed int64) *soakTree {
	root := fmt.Sprintf("soak-%d-tree", seed)
	return &soakTree{
		parent: convWork{root: root, conv: root},
		fits:   convWork{root: root, conv: root + "-fits", parent: root},
		moves:  convWork{root: root, conv: root + "-moves", parent: root},
	}
}

// treeText is a long turn: words distinct per conversation and turn, so
// no two long prompts share a cached prefix.
func treeText(conv string, turn int) string {
	var sb strings.Builder
	for i := range treeWords {
		fmt.Fprintf(&sb, "%s-t%d-w%d ", conv, turn, i)
	}
	return sb.String()
}

func shortTreeText(conv string, turn int) string {
	return fmt.Sprintf("%s turn %d: a short step", conv, turn)
}

// grow sends the tree's first turns through the three edges, each once the
// serving edge knows what the decision reads (the parent's binding; the
// working set other edges routed), and checks each placement.
func (tr *soakTree) grow(t *testing.T, ctx context.Context, st *devstack.Stack, send sendTurn) {
	t.Helper()
	edges := st.Edges()
	ok := func(s sample, what string) sample {
		t.Helper()
		if !s.ok {
			t.Fatalf("tree: %s failed: %s", what, s.lastErr)
		}
		return s
	}
	p := ok(send(tr.parent, 0, 0, treeText(tr.parent.conv, 0)), "the parent's first turn")
	tr.home = p.route.Context
	pBlocks := int64(p.prompt / treeBlockSize)
	for _, i := range []int{1, 2} {
		waitEdgeBinding(t, ctx, edges[i], tr.parent.root, tr.home)
	}
	f0 := ok(send(tr.fits, 0, 1, shortTreeText(tr.fits.conv, 0)), "the first sub-agent's first turn")
	m0 := ok(send(tr.moves, 0, 2, shortTreeText(tr.moves.conv, 0)), "the second sub-agent's first turn")
	f1 := ok(send(tr.fits, 1, 1, treeText(tr.fits.conv, 1)), "the first sub-agent's long turn")
	lBlocks := int64(f1.prompt / treeBlockSize)
	for _, s := range []sample{f0, m0, f1} {
		if s.route.Context != tr.home || s.route.ContextOwn {
			t.Fatalf("tree: %s turn on %s (own id %v); want its parent's instance %s: the two fit there", s.conv, s.route.Context, s.route.ContextOwn, tr.home)
		}
	}
	// The premise, from the prompts as the engine counted them: the
	// parent and one long turn fit one instance, a second does not, and
	// the other instance has room for it.
	if pBlocks+lBlocks > treeInstBlocks || pBlocks+2*lBlocks <= treeInstBlocks+treeInstBlocks/16 {
		t.Fatalf("tree: prompts of %d and %d blocks against %d blocks per instance: resize treeWords", pBlocks, lBlocks, treeInstBlocks)
	}
	// The third edge has heard both long prompts routed to the parent's
	// instance.
	waitWorkingSet(t, ctx, edges[2], tr.home, pBlocks+lBlocks)
	m1 := ok(send(tr.moves, 1, 2, treeText(tr.moves.conv, 1)), "the second sub-agent's long turn")
	if !m1.route.ContextOwn || m1.route.Context == tr.home {
		t.Fatalf("tree: %s's long turn on %s (own id %v); want the other instance under its own id: %d + %d + %d blocks do not fit %s's %d",
			tr.moves.conv, m1.route.Context, m1.route.ContextOwn, pBlocks, lBlocks, lBlocks, tr.home, treeInstBlocks)
	}
	tr.away = m1.route.Context
	var b admin.BindingInfo
	waitFor(t, 30*time.Second, "the moved sub-agent's own binding in the leader's log", func() bool {
		l := st.Leader()
		if l == nil {
			return false
		}
		got, found, err := l.Binding(ctx, fsm.FleetContext, tr.moves.conv)
		b = got
		return err == nil && found
	})
	if b.Instance != tr.away || b.Policy != routing.PolicySubAgentOwn {
		t.Fatalf("tree: %s's own binding is on %s by %q; want %s by %q", tr.moves.conv, b.Instance, b.Policy, tr.away, routing.PolicySubAgentOwn)
	}
}

// talk sends short turns of the tree's three members, each to a random
// edge, until stop reports true; it returns the moved sub-agent's answers.
func (tr *soakTree) talk(send sendTurn, next func() int, stop func() bool) []sample {
	var moved []sample
	for turn := 2; !stop(); turn++ {
		for _, w := range []convWork{tr.parent, tr.fits, tr.moves} {
			s := send(w, turn, next(), shortTreeText(w.conv, turn))
			if w.conv == tr.moves.conv {
				moved = append(moved, s)
			}
		}
	}
	return moved
}

// checkMoved checks the moved sub-agent's turns sent once every edge has
// caught up after the faults: each is routed by its own id. (Its turns
// through the faults are judged with every other hop: routecheck's
// JudgeSubAgent allows a turn by its parent's key only on a replica that
// had not applied its own binding, a restarted edge catching up.)
func (tr *soakTree) checkMoved(t *testing.T, moved []sample) {
	t.Helper()
	for _, s := range moved {
		if s.ok && !s.route.ContextOwn {
			t.Errorf("tree, after the faults: %s served by %s on %s by its parent's key at state %d; its own binding is on %s",
				s.conv, s.edge, s.route.Context, s.route.ContextState, tr.away)
		}
	}
}

// waitEdgeBinding waits until the edge's replica binds key on instance.
func waitEdgeBinding(t *testing.T, ctx context.Context, e *devstack.EdgeNode, key, instance string) {
	t.Helper()
	waitFor(t, 30*time.Second, e.ID+"'s binding of "+key, func() bool {
		b, found, err := e.Binding(ctx, fsm.FleetContext, key)
		return err == nil && found && b.Instance == instance
	})
}

// waitWorkingSet waits until the edge counts at least blocks in instance's
// working set (its own routes and those the other edges told it).
func waitWorkingSet(t *testing.T, ctx context.Context, e *devstack.EdgeNode, instance string, blocks int64) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%s's working set of %s to reach %d blocks", e.ID, instance, blocks), func() bool {
		var out struct {
			Instances []admin.InstanceInfo `json:"instances"`
		}
		if err := e.AdminGet(ctx, "instances", &out); err != nil {
			return false
		}
		for _, in := range out.Instances {
			if in.ID == instance {
				return in.WorkingSet.Blocks >= blocks
			}
		}
		return false
	})
}
