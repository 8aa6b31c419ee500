package edge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/natstest"
)

// claudeCodeHeaders are the identity headers Claude Code 2.1.328 sends
// (routing/testdata/claudecode): the session on every request, a Task
// sub-agent's id, and its parent agent's id when that is a sub-agent too.
func claudeCodeHeaders(session, agent, parentAgent string) map[string]string {
	h := map[string]string{"X-Claude-Code-Session-Id": session, "User-Agent": "claude-cli/2.1.328 (external, sdk-cli)",
		"Anthropic-Version": "2023-06-01"}
	if agent != "" {
		h["X-Claude-Code-Agent-Id"] = agent
	}
	if parentAgent != "" {
		h["X-Claude-Code-Parent-Agent-Id"] = parentAgent
	}
	return h
}

// postMessages posts a Messages request shaped as Claude Code's (system
// prompt, tools-sized shared prefix, one user turn) and returns the
// answer's route.
func postMessages(t *testing.T, c *http.Client, te *testEdge, system, user string, h map[string]string) (ctxInst, genInst string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 8, "system": system,
		"messages": []any{map[string]any{"role": "user", "content": user}}})
	var r response
	for deadline := time.Now().Add(time.Minute); ; {
		r = do(t, c, http.MethodPost, te.url()+"/v1/messages?beta=true", body, h)
		if !stateUnknown(r) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r.status != http.StatusOK {
		t.Fatalf("messages %v via %s: %d %s", h, te.cfg.Cluster.NodeID, r.status, r.body)
	}
	return routeOf(t, r)
}

// TestClaudeCodeSubAgentsAreChildren: with Claude Code's own headers and
// no parent header configured, a Task sub-agent is a conversation of its
// own under its session (x-claude-code-agent-id), a nested one the child of
// the agent x-claude-code-parent-agent-id names; all share the session's
// context instance, each has its own generation binding (scope context),
// and the log links each to its parent with the session as root.
func TestClaudeCodeSubAgentsAreChildren(t *testing.T) {
	ns := natstest.Start(t, nil)
	fleet := startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 2, ns.ClientURL(), func(_ int, c *Config) { c.ParentHeader = "" })
	ec.waitInstances(4)
	c := httpClient(t)

	const session = "260d357d-b8bc-4bf0-883c-0b4e9d5ea545"
	agentA := routing.ClaudeCodeAgentConversation(session, "a3c790def40f2740a")
	agentB := routing.ClaudeCodeAgentConversation(session, "acd8939ce8e7d36a9")
	system := "You are Claude Code. " + longText("tools", 60)

	mainCtx, mainGen := postMessages(t, c, ec.edge(0), system, "fix the bug", claudeCodeHeaders(session, "", ""))
	aCtx, aGen := postMessages(t, c, ec.edge(1), system, "explore package a", claudeCodeHeaders(session, "a3c790def40f2740a", ""))
	waitFor(t, "the link of agent A on edge 2", 10*time.Second, func() bool {
		_, ok := ec.edge(1).e.Node().State().Link(agentA)
		return ok
	})
	bCtx, _ := postMessages(t, c, ec.edge(1), system, "explore package b", claudeCodeHeaders(session, "acd8939ce8e7d36a9", "a3c790def40f2740a"))

	if aCtx != mainCtx || bCtx != mainCtx {
		t.Fatalf("context instances: session %s, agent A %s, agent B %s; want the session's", mainCtx, aCtx, bCtx)
	}
	for _, want := range []fsm.ParentLink{
		{Child: agentA, Parent: session, Root: session, Depth: 1},
		{Child: agentB, Parent: agentA, Root: session, Depth: 2},
	} {
		for i := range 2 {
			waitFor(t, fmt.Sprintf("edge %d to hold the link of %s", i+1, want.Child), 10*time.Second, func() bool {
				l, ok := ec.edge(i).e.Node().State().Link(want.Child)
				return ok && l.Parent == want.Parent && l.Root == want.Root && l.Depth == want.Depth
			})
		}
	}
	// Each agent has its own generation binding; none of the session's
	// context binding's children has a context binding of its own.
	for conv, gen := range map[string]string{session: mainGen, agentA: aGen} {
		waitFor(t, "the generation binding of "+conv, 10*time.Second, func() bool {
			b, ok := binding(t, c, ec.edge(0), fsm.FleetGeneration, conv)
			return ok && b.Instance == gen && b.ConversationID == conv
		})
	}
	// Agent B's Bind went through edge 2: edge 1 applies it in time.
	waitFor(t, "agent B's own generation binding on edge 1", 10*time.Second, func() bool {
		_, ok := binding(t, c, ec.edge(0), fsm.FleetGeneration, agentB)
		return ok
	})
	for _, conv := range []string{agentA, agentB} {
		if _, ok := binding(t, c, ec.edge(0), fsm.FleetContext, conv); ok {
			t.Fatalf("sub-agent %s got a context binding of its own", conv)
		}
	}
	// The context worker saw each agent under its own conversation id,
	// sub-agents with the signed hint naming the session.
	seen := map[string]seenRequest{}
	for _, s := range fleet.byID(mainCtx).requests() {
		seen[s.conversationID()] = s
	}
	for _, conv := range []string{agentA, agentB} {
		s, ok := seen[conv]
		if !ok {
			t.Fatalf("context worker never saw conversation %s (saw %v)", conv, keys(seen))
		}
		if s.header.Get(hintauth.HeaderAffinityID) != session || s.header.Get(hintauth.HeaderAffinityAuth) == "" {
			t.Fatalf("%s: hint %q, want the session, signed", conv, s.header.Get(hintauth.HeaderAffinityID))
		}
	}
}

// TestClientSubagentHeadersOff: client_subagent_headers: false routes a
// Claude Code sub-agent by its session alone (no link, no binding of its
// own); a trusted gateway strips the headers from requests it does not
// trust, as it strips the parent header.
func TestClientSubagentHeadersOffAndGateway(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
	}{
		{"off", func(c *Config) { c.ClientSubagentHeaders = false }},
		{"untrusted", func(c *Config) {
			c.TrustedGateway = TrustedGatewayConfig{Enabled: true, CIDRs: []string{"192.0.2.0/24"}}
			c.Normalize()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := natstest.Start(t, nil)
			startDisaggFleet(t, ns.ClientURL(), workerOpts{})
			ec := startEdges(t, 1, ns.ClientURL(), func(_ int, c *Config) { c.ParentHeader = ""; tc.mutate(c) })
			ec.waitInstances(4)
			c := httpClient(t)
			const session = "sess-off"
			agent := routing.ClaudeCodeAgentConversation(session, "a1")
			_, mainGen := postMessages(t, c, ec.edge(0), "sys "+longText("t", 20), "hi", claudeCodeHeaders(session, "", ""))
			_, aGen := postMessages(t, c, ec.edge(0), "sys "+longText("t", 20), "sub", claudeCodeHeaders(session, "a1", ""))
			if aGen != mainGen {
				t.Fatalf("generation instances %s and %s: the sub-agent must route as its session", mainGen, aGen)
			}
			if _, ok := ec.edge(0).e.Node().State().Link(agent); ok {
				t.Fatal("a link was recorded")
			}
			if _, ok := binding(t, c, ec.edge(0), fsm.FleetGeneration, agent); ok {
				t.Fatal("the sub-agent got a generation binding")
			}
		})
	}
}

// TestHandoffContinuingTheParentsChain: an agent framework's handoff (the
// Agents SDK with previousResponseId) sends the new agent's parent header
// with a previous_response_id of the parent's own chain. It is served on
// the instance holding that response, as the parent's conversation (no
// hint, no link), instead of being refused as a conversation naming itself
// as its parent.
func TestHandoffContinuingTheParentsChain(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	first := map[string]any{"model": testModel, "max_tokens": 8, "input": "triage " + longText("h", 30)}
	status, body, _ := postRaw(t, s.c, s.te.url()+"/v1/responses", first, map[string]string{"x-session-id": "parent-1"})
	var r1 struct{ ID string }
	if status != http.StatusOK || json.Unmarshal(body, &r1) != nil || r1.ID == "" {
		t.Fatalf("parent's response: %d %s", status, body)
	}
	gen := s.gen[0]
	before := len(gen.requests())
	handoff := map[string]any{"model": testModel, "max_tokens": 8, "input": "billing question", "previous_response_id": r1.ID}
	status, body, _ = postRaw(t, s.c, s.te.url()+"/v1/responses", handoff,
		map[string]string{"x-session-id": "child-a", parentHeader: "parent-1"})
	if status != http.StatusOK {
		t.Fatalf("handoff continuing the parent's chain: %d %s", status, body)
	}
	reqs := gen.requests()[before:]
	if len(reqs) != 1 || reqs[0].conversationID() != "parent-1" || reqs[0].header.Get(hintauth.HeaderAffinityID) != "" {
		t.Fatalf("the worker saw %d requests (%+v), want one of conversation parent-1 without a hint", len(reqs), reqs)
	}
	if _, ok := s.te.e.Node().State().Link("parent-1"); ok {
		t.Fatal("parent-1 was linked as a sub-agent")
	}
}
