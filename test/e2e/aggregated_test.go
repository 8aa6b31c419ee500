package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tether-project/tether/ops/devstack"
)

// `tether dev --generation-workers 0` runs one aggregated fleet: its
// banner says so and lists only the context fleet's workers, a
// conversation sent through each of the three edges in turn stays on one
// instance and rank with its earlier turns cached, every edge's log binds
// it there, and its sub-agent, through another edge, joins it with the
// shared system prompt cached. Before, the flag was refused.
func TestAggregatedDevServesAConversation(t *testing.T) {
	p := startDev(t, "--generation-workers", "0")
	out := p.output()
	if !strings.Contains(out, "2 aggregated workers serving whole requests") {
		t.Fatalf("the banner does not name the aggregated fleet:\n%s", out)
	}
	p.mu.Lock()
	workers := len(p.workers)
	for id := range p.workers {
		if !strings.HasPrefix(id, "ctx-") {
			t.Errorf("worker %s in an aggregated stack", id)
		}
	}
	p.mu.Unlock()
	if workers != devstack.DefaultContextWorkers || strings.Contains(out, "generation worker") {
		t.Fatalf("%d workers listed, want the %d aggregated ones:\n%s", workers, devstack.DefaultContextWorkers, out)
	}
	c := p.client(t)
	system := "You are the lead agent. " + words("lead-tools", 250)
	lead := &agent{session: "agg-lead", system: system, aggregated: true}
	var first turn
	for i := range 4 {
		tr := lead.mustSend(t, c, p.edge(i%3), devstack.DefaultModel, fmt.Sprintf("step %d: %s", i, words("detail", 30)))
		if i == 0 {
			first = tr
			continue
		}
		if tr.ctxInst != first.ctxInst || tr.ctxRank != first.ctxRank {
			t.Fatalf("turn %d via %s on %s/%s; the conversation is on %s/%s", i, tr.via, tr.ctxInst, tr.ctxRank, first.ctxInst, first.ctxRank)
		}
		if tr.cached < 256 || tr.cached >= tr.prompt {
			t.Fatalf("turn %d via %s: cached_tokens %d of %d, want the turns before", i, tr.via, tr.cached, tr.prompt)
		}
	}
	awaitBinding(t, c, p, "context", "agg-lead", first.ctxInst)
	child := &agent{session: "agg-child", parent: "agg-lead", system: system, aggregated: true}
	tr := child.mustSend(t, c, p.edge(1), devstack.DefaultModel, "explore package routing")
	if tr.ctxInst != first.ctxInst || tr.ctxRank != first.ctxRank || tr.cached < 256 {
		t.Fatalf("sub-agent on %s/%s with %d cached tokens; its parent is on %s/%s", tr.ctxInst, tr.ctxRank, tr.cached, first.ctxInst, first.ctxRank)
	}
	p.stop(t)
}
