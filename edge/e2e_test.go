package edge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/natstest"
)

// disaggFleet is two context and two generation workers on one NATS server.
type disaggFleet struct {
	ctx, gen []*testWorker
}

func (f *disaggFleet) all() []*testWorker {
	return append(append([]*testWorker(nil), f.ctx...), f.gen...)
}

func (f *disaggFleet) byID(id string) *testWorker {
	for _, w := range f.all() {
		if w.id == id {
			return w
		}
	}
	return nil
}

func startDisaggFleet(t testing.TB, natsURL string, o workerOpts) *disaggFleet {
	t.Helper()
	f := &disaggFleet{}
	for i := range 2 {
		co := o
		co.fleet, co.role, co.nats = telemetry.FleetContext, hintauth.RoleContext, natsURL
		f.ctx = append(f.ctx, startWorker(t, fmt.Sprintf("ctx-%d", i), co))
		gopt := o
		gopt.fleet, gopt.role, gopt.nats = telemetry.FleetGeneration, hintauth.RoleGeneration, natsURL
		f.gen = append(f.gen, startWorker(t, fmt.Sprintf("gen-%d", i), gopt))
	}
	return f
}

type turnResult struct {
	resp          response
	body          map[string]any
	ctxInst, gen  string
	prompt, cache int
}

// agent is one conversation of the seed's table.
type agent struct {
	session, parent string
	system          string
	turns           []string // user and assistant messages so far
}

// seedAgents are the seed table's agents: a parent session and two
// sub-agents of it sharing its tool definitions.
func seedAgents() (parent, childA, childB *agent) {
	shared := longText("shared-tools", 40)
	return &agent{session: "parent-1", system: "parent " + shared},
		&agent{session: "child-a", parent: "parent-1", system: "explore " + shared},
		&agent{session: "child-b", parent: "parent-1", system: "explore " + shared}
}

func (a *agent) send(t *testing.T, c *http.Client, te *testEdge, user string, extra map[string]any) turnResult {
	t.Helper()
	a.turns = append(a.turns, user)
	h := map[string]string{"x-session-id": a.session}
	if a.parent != "" {
		h[parentHeader] = a.parent
	}
	r := postChat(t, c, te.url(), chatBody(t, a.system, a.turns, extra), h)
	if r.status != http.StatusOK {
		t.Fatalf("%s via %s: %d %s", a.session, te.cfg.Cluster.NodeID, r.status, r.body)
	}
	m := r.json(t)
	choice := m["choices"].([]any)[0].(map[string]any)
	reply := choice["message"].(map[string]any)["content"].(string)
	a.turns = append(a.turns, reply)
	ci, gi := routeOf(t, r)
	return turnResult{resp: r, body: m, ctxInst: ci, gen: gi, prompt: promptTokensOf(t, m), cache: cachedTokens(t, m)}
}

// postChat posts a chat completion to the edge at baseURL. An edge whose
// Bind did not commit and apply within propose_timeout (a loaded machine)
// answers 503 affinity_state_unknown with Retry-After-Ms: a client comes
// back after the pause, and so does this one, for a minute at most.
func postChat(t testing.TB, c *http.Client, baseURL string, body []byte, h map[string]string) response {
	t.Helper()
	r := do(t, c, http.MethodPost, baseURL+"/v1/chat/completions", body, h)
	for deadline := time.Now().Add(time.Minute); stateUnknown(r) && time.Now().Before(deadline); {
		ms, _ := strconv.Atoi(r.header.Get("Retry-After-Ms"))
		time.Sleep(min(time.Duration(ms)*time.Millisecond, time.Second))
		r = do(t, c, http.MethodPost, baseURL+"/v1/chat/completions", body, h)
	}
	return r
}

// stateUnknown reports whether r asks to retry a placement the affinity
// log could not record in time (503 affinity_state_unknown, Retry-After-Ms).
func stateUnknown(r response) bool {
	return r.status == http.StatusServiceUnavailable && r.header.Get("Retry-After-Ms") != "" &&
		bytes.Contains(r.body, []byte(`"affinity_state_unknown"`))
}

// TestSeedTableAcrossThreeEdges is the example table of
// docs/subagent-routing.md: a parent on edge 1
// and its two sub-agents on edges 2 and 3 share one context instance, keep
// their own conversation ids, and (scope both) share the generation
// instance too, or (scope context) are placed on the generation fleet by
// their own ids. Second turns report the first turn's prompt as cached.
func TestSeedTableAcrossThreeEdges(t *testing.T) {
	for _, scope := range []routing.Scope{routing.ScopeBoth, routing.ScopeContext} {
		t.Run(scope.String(), func(t *testing.T) {
			ns := natstest.Start(t, nil)
			fleet := startDisaggFleet(t, ns.ClientURL(), workerOpts{})
			ec := startEdges(t, 3, ns.ClientURL(), func(i int, c *Config) { c.Scope = scope })
			ec.waitInstances(4)
			c := httpClient(t)

			parent, childA, childB := seedAgents()

			p1 := parent.send(t, c, ec.edge(0), "plan the work", nil)
			a1 := childA.send(t, c, ec.edge(1), "look at package a", nil)
			b1 := childB.send(t, c, ec.edge(2), "look at package b", nil)

			if p1.ctxInst == "" || a1.ctxInst != p1.ctxInst || b1.ctxInst != p1.ctxInst {
				t.Fatalf("context instances: parent %s, child-a %s, child-b %s; want one shared", p1.ctxInst, a1.ctxInst, b1.ctxInst)
			}
			// Every edge's admin API reports the same binding of the root
			// (once the entry replicated to it).
			for i := range 3 {
				waitFor(t, fmt.Sprintf("edge %d to report parent-1 on %s", i+1, p1.ctxInst), 30*time.Second, func() bool {
					b, ok := binding(t, c, ec.edge(i), fsm.FleetContext, "parent-1")
					return ok && b.Instance == p1.ctxInst && b.ConversationID == "parent-1"
				})
			}
			for _, child := range []string{"child-a", "child-b"} {
				if _, ok := binding(t, c, ec.edge(0), fsm.FleetContext, child); ok {
					t.Fatalf("a sub-agent got its own context binding %s", child)
				}
			}
			switch scope {
			case routing.ScopeBoth:
				if a1.gen != p1.gen || b1.gen != p1.gen {
					t.Fatalf("scope both: generation instances parent %s, child-a %s, child-b %s; want one shared", p1.gen, a1.gen, b1.gen)
				}
				if _, ok := binding(t, c, ec.edge(1), fsm.FleetGeneration, "child-a"); ok {
					t.Fatal("scope both: child-a has its own generation binding")
				}
			case routing.ScopeContext:
				for _, r := range []struct {
					conv string
					res  turnResult
				}{{"child-a", a1}, {"child-b", b1}} {
					waitFor(t, "scope context: the generation binding of "+r.conv+" on edge 1", 30*time.Second, func() bool {
						b, ok := binding(t, c, ec.edge(0), fsm.FleetGeneration, r.conv)
						return ok && b.Instance == r.res.gen && b.ConversationID == r.conv
					})
				}
			}

			// What the workers saw: each conversation under its own id,
			// sub-agents with the edge-signed hint naming the parent.
			ctxW := fleet.byID(p1.ctxInst)
			convs := map[string]seenRequest{}
			for _, s := range ctxW.requests() {
				convs[s.conversationID()] = s
			}
			for _, conv := range []string{"parent-1", "child-a", "child-b"} {
				s, ok := convs[conv]
				if !ok {
					t.Fatalf("context worker %s never saw conversation %s (saw %v)", ctxW.id, conv, keys(convs))
				}
				if s.requestType() != "context_only" {
					t.Fatalf("%s: request type %s", conv, s.requestType())
				}
				aff := s.header.Get(hintauth.HeaderAffinityID)
				if conv == "parent-1" {
					if aff != "" || s.header.Get(hintauth.HeaderAffinityAuth) != "" {
						t.Fatalf("the parent's request carried a hint: %v", s.header)
					}
					continue
				}
				if aff != "parent-1" || s.header.Get(hintauth.HeaderAffinityAuth) == "" {
					t.Fatalf("%s: hint %q / %q, want parent-1 signed", conv, aff, s.header.Get(hintauth.HeaderAffinityAuth))
				}
			}
			genW := fleet.byID(a1.gen)
			for _, s := range genW.requests() {
				if s.conversationID() != "child-a" {
					continue
				}
				hasHint := s.header.Get(hintauth.HeaderAffinityID) != ""
				if hasHint != (scope == routing.ScopeBoth) {
					t.Fatalf("scope %s: generation hint present = %v", scope, hasHint)
				}
				if s.requestType() != "generation_only" {
					t.Fatalf("generation hop request type %s", s.requestType())
				}
			}

			// Second turns: the previous prompt is cached, in whole blocks.
			for _, x := range []struct {
				a    *agent
				prev turnResult
				te   *testEdge
			}{{parent, p1, ec.edge(0)}, {childA, a1, ec.edge(1)}, {childB, b1, ec.edge(2)}} {
				r2 := x.a.send(t, c, x.te, "continue", nil)
				want := x.prev.prompt / testBlockSize * testBlockSize
				if r2.ctxInst != x.prev.ctxInst {
					t.Fatalf("%s turn 2 moved from %s to %s", x.a.session, x.prev.ctxInst, r2.ctxInst)
				}
				if r2.cache < want {
					t.Fatalf("%s turn 2: cached_tokens %d, want >= %d (turn 1's %d-token prompt in whole blocks)", x.a.session, r2.cache, want, x.prev.prompt)
				}
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestLeaderKillDuringConversations kills the leader edge while
// conversations are bound: the survivors keep routing them to their
// instances (a local read, no leader needed), and new conversations are
// placed and bound once a new leader exists.
func TestLeaderKillDuringConversations(t *testing.T) {
	ns := natstest.Start(t, nil)
	startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 3, ns.ClientURL(), nil)
	ec.waitInstances(4)
	c := httpClient(t)

	agents := make([]*agent, 6)
	first := make([]turnResult, len(agents))
	for i := range agents {
		agents[i] = &agent{session: fmt.Sprintf("conv-%d", i), system: longText(fmt.Sprintf("sys%d", i), 30)}
		first[i] = agents[i].send(t, c, ec.edge(i%3), "hello", nil)
	}
	leader := ec.leader(10 * time.Second)
	ec.kill(leader)
	survivors := []int{}
	for i := range 3 {
		if i != leader {
			survivors = append(survivors, i)
		}
	}
	// Immediately, election or not: bound conversations stay put.
	for i, a := range agents {
		te := ec.edge(survivors[i%2])
		r := a.send(t, c, te, "next step", nil)
		if r.ctxInst != first[i].ctxInst || r.gen != first[i].gen {
			t.Fatalf("%s moved after the leader died: context %s→%s, generation %s→%s",
				a.session, first[i].ctxInst, r.ctxInst, first[i].gen, r.gen)
		}
	}
	newLeader := ec.leader(15 * time.Second)
	if newLeader == leader {
		t.Fatal("the killed edge is still leader")
	}
	// New conversations are placed through the log again.
	for i := range 3 {
		a := &agent{session: fmt.Sprintf("after-%d", i), system: longText("after", 20)}
		te := ec.edge(survivors[i%2])
		r := a.send(t, c, te, "hi", nil)
		for _, s := range survivors {
			te := ec.edge(s)
			waitFor(t, "the new conversation's binding on "+te.cfg.Cluster.NodeID, 10*time.Second, func() bool {
				b, ok := binding(t, c, te, fsm.FleetContext, a.session)
				return ok && b.Instance == r.ctxInst
			})
		}
	}
}

// TestDegradedModeWithoutQuorum kills two of three edges: a new key on the
// survivor is placed by the survivor's own decision, served (never a 503)
// and counted degraded; its next turn stays there; once quorum is back the
// proposal the survivor kept retrying commits as the key's Bind.
func TestDegradedModeWithoutQuorum(t *testing.T) {
	ns := natstest.Start(t, nil)
	startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 3, ns.ClientURL(), func(i int, c *Config) {
		c.Cluster.ProposeTimeout = 300 * time.Millisecond
		// Degraded placement needs a leader heard within the window: the
		// test may run slowly (race detector, loaded machine).
		c.Cluster.DegradedPlacementWindow = 30 * time.Second
	})
	ec.waitInstances(4)
	c := httpClient(t)
	// The log must know the instances (the leader records them up), and
	// every edge must be ready (its state caught up with the leader's:
	// only then may it place keys without the log).
	waitFor(t, "four instances up in every edge's log", 10*time.Second, func() bool {
		for i := range 3 {
			n := 0
			for _, in := range ec.edge(i).e.Node().State().Instances() {
				if in.Status == fsm.InstanceUp {
					n++
				}
			}
			if n != 4 {
				return false
			}
		}
		return true
	})
	waitFor(t, "every edge ready", 10*time.Second, func() bool {
		for i := range 3 {
			if do(t, c, http.MethodGet, ec.edge(i).url()+"/readyz", nil, nil).status != http.StatusOK {
				return false
			}
		}
		return true
	})
	// The survivor is a follower: with the leader and the other follower
	// gone, its proposals reach no log (a leader's own proposal could sit
	// in its log and commit later, ahead of the degraded Bind).
	leader := ec.leader(10 * time.Second)
	survivor := (leader + 1) % 3
	// And the log must be quiet: an entry the survivor holds but has not
	// seen committed when the others die may have been committed by them,
	// so the survivor rightly refuses to guess ("log entries up to N are
	// not applied yet"). Wait until the leader's log end has stood still,
	// committed and applied by the survivor, for 300 ms.
	stable, last := 0, uint64(0)
	waitFor(t, "a quiet log, applied by the survivor", 15*time.Second, func() bool {
		ls, ss := ec.edge(leader).e.Node().Status(), ec.edge(survivor).e.Node().Status()
		quiet := ls.LastLogIndex == ls.CommitIndex && ss.AppliedIndex == ls.LastLogIndex && ss.LastLogIndex == ls.LastLogIndex
		if !quiet || ls.LastLogIndex != last {
			stable, last = 0, ls.LastLogIndex
			return false
		}
		stable++
		return stable >= 30 // 10 ms polls: longer than a round of leader duties
	})
	var dead []int
	for i := range 3 {
		if i != survivor {
			ec.kill(i)
			dead = append(dead, i)
		}
	}
	a := &agent{session: "degraded-conv", system: longText("deg", 20)}
	r := a.send(t, c, ec.edge(survivor), "hello", nil)
	reg := ec.edge(survivor).registry
	// Its Bind cannot commit: once the survivor knows the log is down, the
	// key's requests are served on its proposal and counted degraded.
	waitFor(t, "the survivor to know the log cannot commit", 20*time.Second, func() bool { return ec.edge(survivor).e.proposer.Down() })
	// A second turn while still degraded stays on the same instance.
	r2 := a.send(t, c, ec.edge(survivor), "again", nil)
	if r2.ctxInst != r.ctxInst {
		t.Fatalf("degraded key moved from %s to %s", r.ctxInst, r2.ctxInst)
	}
	if n := counter(t, reg, "tether_edge_routing_decisions_total", map[string]string{"fleet": "context", "outcome": routing.OutcomeDegraded}); n < 1 {
		t.Fatalf("degraded context decisions = %v, want >= 1", n)
	}
	if n := counter(t, reg, "tether_edge_degraded_decisions_total", map[string]string{"fleet": "context", "cause": routing.DegradedLogDown}); n < 1 {
		t.Fatalf("context decisions degraded because the log is down = %v, want >= 1", n)
	}
	if _, ok := binding(t, c, ec.edge(survivor), fsm.FleetContext, "degraded-conv"); ok {
		t.Fatal("the key is bound while the log cannot commit")
	}
	// Quorum back: the edges restart on their data directories.
	for _, i := range dead {
		if err := ec.start(i); err != nil {
			t.Fatalf("restart edge %d: %v", i+1, err)
		}
	}
	waitFor(t, "the degraded placement recorded as a Bind", 20*time.Second, func() bool {
		b, ok := binding(t, c, ec.edge(survivor), fsm.FleetContext, "degraded-conv")
		return ok && b.Instance == r.ctxInst && b.Policy != routing.PolicyDegraded
	})
	waitFor(t, "the proposal counted as won", 10*time.Second, func() bool {
		return counter(t, reg, "tether_edge_placements_total", map[string]string{"fleet": "context", "result": "won"}) >= 1
	})
	h := adminGet(t, c, ec.edge(survivor), "/admin/v1/bindings/context/degraded-conv/history")
	var hist struct {
		Events []historyEntry `json:"events"`
	}
	if err := json.Unmarshal(h.body, &hist); err != nil || len(hist.Events) == 0 || hist.Events[0].Type != "Bind" ||
		hist.Events[0].Event.Decision.Edge != ec.edge(survivor).cfg.Cluster.NodeID {
		t.Fatalf("history: %d %s", h.status, h.body)
	}
}
