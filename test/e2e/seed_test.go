package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tether-project/tether/ops/devstack"
)

// blockSize is the KV block size of the dev stack (the simulated engine's
// and the edges' default): cached prompts are reported in whole blocks.
const blockSize = 64

func words(tag string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s-%d ", tag, i)
	}
	return b.String()
}

// TestSeedTableThroughTetherDev is docs/subagent-routing.md's table end to end through
// `tether dev`: parent-1 on edge 1, sub-agent child-a on edge 2, child-b on
// edge 3. All three share one context instance (and ADP rank); the admin
// API of every edge and the x-tether-route headers agree; each keeps its
// own conversation id (the workers verify hints signed for the child's own
// id; under context scope the generation fleet binds the children by their
// own ids, under both scope they share the parent's generation instance).
// Second turns report the first turn's prompt as cached, in whole blocks.
func TestSeedTableThroughTetherDev(t *testing.T) {
	for _, scope := range []string{"context", "both"} {
		t.Run(scope, func(t *testing.T) {
			p := startDev(t, "--scope", scope)
			c := p.client(t)
			model := devstack.DefaultModel
			// Sub-agents share a long prefix with each other (their own
			// system prompt and tools), not with the parent.
			explore := "You are an Explore sub-agent. " + words("explore-tools", 400)
			parent := &agent{session: "parent-1", system: "You are the lead agent. " + words("lead-tools", 300)}
			childA := &agent{session: "child-a", parent: "parent-1", system: explore}
			childB := &agent{session: "child-b", parent: "parent-1", system: explore}

			p1 := parent.mustSend(t, c, p.edge(0), model, "plan the refactoring of package routing")
			// The parent's first call was dispatched beside its Binds; its
			// sub-agents follow the committed binding once their edges have
			// it (a child racing the commit costs at most its cache hit).
			awaitBinding(t, c, p, "context", "parent-1", p1.ctxInst)
			if scope == "both" {
				awaitBinding(t, c, p, "generation", "parent-1", p1.genInst)
			}
			a1 := childA.mustSend(t, c, p.edge(1), model, "find every caller of routing.Place")
			b1 := childB.mustSend(t, c, p.edge(2), model, "list the tests of package routing")

			if a1.ctxInst != p1.ctxInst || b1.ctxInst != p1.ctxInst {
				t.Fatalf("context instances: parent %s, child-a %s, child-b %s; want one shared", p1.ctxInst, a1.ctxInst, b1.ctxInst)
			}
			if a1.ctxRank != p1.ctxRank || b1.ctxRank != p1.ctxRank {
				t.Fatalf("context ADP ranks: parent %s, child-a %s, child-b %s; want the parent's", p1.ctxRank, a1.ctxRank, b1.ctxRank)
			}
			for i := range 3 {
				b, ok := adminBinding(t, c, p.edge(i), p.token, "context", "parent-1")
				if !ok || b.Instance != p1.ctxInst || b.ConversationID != "parent-1" {
					t.Fatalf("edge-%d: context binding of parent-1 = %+v (found %v); x-tether-route said %s", i+1, b, ok, p1.ctxInst)
				}
				for _, child := range []string{"child-a", "child-b"} {
					if b, ok := adminBinding(t, c, p.edge(i), p.token, "context", child); ok {
						t.Fatalf("edge-%d: sub-agent %s has its own context binding %+v", i+1, child, b)
					}
				}
			}

			switch scope {
			case "both":
				if a1.genInst != p1.genInst || b1.genInst != p1.genInst {
					t.Fatalf("scope both: generation instances parent %s, child-a %s, child-b %s; want one shared", p1.genInst, a1.genInst, b1.genInst)
				}
				b, ok := adminBinding(t, c, p.edge(2), p.token, "generation", "parent-1")
				if !ok || b.Instance != p1.genInst {
					t.Fatalf("scope both: generation binding of parent-1 = %+v (found %v), want %s", b, ok, p1.genInst)
				}
				for _, child := range []string{"child-a", "child-b"} {
					if b, ok := adminBinding(t, c, p.edge(0), p.token, "generation", child); ok {
						t.Fatalf("scope both: %s has its own generation binding %+v", child, b)
					}
				}
			case "context":
				for _, x := range []struct {
					conv string
					tr   turn
				}{{"child-a", a1}, {"child-b", b1}} {
					awaitBinding(t, c, p, "generation", x.conv, x.tr.genInst)
					for i := range 3 {
						b, ok := adminBinding(t, c, p.edge(i), p.token, "generation", x.conv)
						if !ok || b.Instance != x.tr.genInst || b.ConversationID != x.conv {
							t.Fatalf("scope context, edge-%d: generation binding of %s = %+v (found %v), want its own on %s",
								i+1, x.conv, b, ok, x.tr.genInst)
						}
					}
				}
			}

			// Second turns: the same instances, the previous prompt cached.
			for _, x := range []struct {
				a    *agent
				prev turn
				edge int
			}{{parent, p1, 0}, {childA, a1, 1}, {childB, b1, 2}} {
				r2 := x.a.mustSend(t, c, p.edge(x.edge), model, "continue with the next step")
				if r2.ctxInst != x.prev.ctxInst {
					t.Fatalf("%s turn 2 moved from %s to %s", x.a.session, x.prev.ctxInst, r2.ctxInst)
				}
				want := x.prev.prompt / blockSize * blockSize
				if want == 0 || r2.cached < want || r2.cached%blockSize != 0 || r2.cached > r2.prompt {
					t.Fatalf("%s turn 2: cached_tokens %d of %d; want whole %d-token blocks covering turn 1's %d-token prompt (>= %d)",
						x.a.session, r2.cached, r2.prompt, blockSize, x.prev.prompt, want)
				}
			}

			// The workers' view: hints were verified for the children's own
			// conversation ids (the signature binds the child's id), only on
			// the shared context instance (and, scope both, the shared
			// generation instance); nothing failed verification.
			verified := func(id string) float64 {
				u := p.worker(id)
				if u == "" {
					t.Fatalf("tether dev printed no URL for worker %s", id)
				}
				return metricSum(t, c, u, "tether_worker_hint_verifications_total", map[string]string{"outcome": "verified"})
			}
			for _, id := range []string{"ctx-1", "ctx-2", "gen-1", "gen-2"} {
				v := verified(id)
				shared := id == p1.ctxInst || (scope == "both" && id == p1.genInst)
				switch {
				case shared && v != 4:
					t.Fatalf("%s verified %v sub-agent hints, want 4 (two children, two turns)", id, v)
				case !shared && v != 0:
					t.Fatalf("%s verified %v sub-agent hints, want 0", id, v)
				}
				if f := metricSum(t, c, p.worker(id), "tether_worker_hint_verification_failures_total", nil); f != 0 {
					t.Fatalf("%s: %v hint verification failures", id, f)
				}
			}
			p.stop(t)
		})
	}
}
