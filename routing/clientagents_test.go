package routing

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-project/tether/fsm"
)

const session = "260d357d-b8bc-4bf0-883c-0b4e9d5ea545"

func clientCfg() IdentityConfig { return IdentityConfig{ClientHeaders: true} }

// TestClaudeCodeSubAgents: the main agent is the session's conversation; a
// Task sub-agent is a conversation of its own under the session, routed by
// the session on the context fleet and by itself on the generation fleet;
// a sub-agent of a sub-agent is linked to its parent agent, rooted at the
// session.
func TestClaudeCodeSubAgents(t *testing.T) {
	links := linkTable{}
	main, err := ResolveIdentity(clientCfg(), "", hdr(HeaderClaudeCodeSession, session), links)
	if err != nil || main.SubAgent() || main.ConversationID != session || main.Key(fsm.FleetGeneration) != session {
		t.Fatalf("main agent: %+v %v", main, err)
	}

	a := ClaudeCodeAgentConversation(session, "a3c790def40f2740a")
	child, err := ResolveIdentity(clientCfg(), "", hdr(HeaderClaudeCodeSession, session, "X-Claude-Code-Agent-Id", "a3c790def40f2740a"), links)
	if err != nil {
		t.Fatal(err)
	}
	want := fsm.Link{Child: a, Parent: session, Root: session, Depth: 1}
	if child.ConversationID != a || child.Key(fsm.FleetContext) != session || child.Key(fsm.FleetGeneration) != a ||
		!child.NewLink || child.Link != want {
		t.Fatalf("direct child: %+v, want conversation %q, keys %q/%q, link %+v", child, a, session, a, want)
	}
	links[a] = fsm.ParentLink{Child: a, Parent: session, Root: session, Depth: 1}

	b := ClaudeCodeAgentConversation(session, "acd8939ce8e7d36a9")
	gc, err := ResolveIdentity(clientCfg(), "", hdr(HeaderClaudeCodeSession, session,
		HeaderClaudeCodeAgent, "acd8939ce8e7d36a9", HeaderClaudeCodeParentAgent, "a3c790def40f2740a"), links)
	want = fsm.Link{Child: b, Parent: a, Root: session, Depth: 2}
	if err != nil || gc.Link != want || gc.Key(fsm.FleetContext) != session || gc.Key(fsm.FleetGeneration) != b {
		t.Fatalf("grandchild: %+v %v, want link %+v", gc, err, want)
	}

	// Before its parent's link is recorded (another edge, or not applied
	// yet), a nested agent still roots at the session.
	c := ClaudeCodeAgentConversation(session, "a32db7fd18567aaad")
	early, err := ResolveIdentity(clientCfg(), "", hdr(HeaderClaudeCodeSession, session,
		HeaderClaudeCodeAgent, "a32db7fd18567aaad", HeaderClaudeCodeParentAgent, "acd8939ce8e7d36a9"), links)
	want = fsm.Link{Child: c, Parent: b, Root: session, Depth: 2}
	if err != nil || early.Link != want || early.Key(fsm.FleetContext) != session {
		t.Fatalf("nested agent with its parent's link unknown: %+v %v, want %+v", early, err, want)
	}

	// Two sessions' agents with the same agent id are two conversations.
	other, _ := ResolveIdentity(clientCfg(), "", hdr(HeaderClaudeCodeSession, "other-session", HeaderClaudeCodeAgent, "a3c790def40f2740a"), links)
	if other.ConversationID == a || other.Key(fsm.FleetContext) != "other-session" {
		t.Fatalf("another session's agent: %+v", other)
	}

	// With the setting off the agent headers are not read.
	off, _ := ResolveIdentity(IdentityConfig{}, "", hdr(HeaderClaudeCodeSession, session, HeaderClaudeCodeAgent, "a3c790def40f2740a"), links)
	if off.SubAgent() || off.ConversationID != session {
		t.Fatalf("client headers off: %+v", off)
	}
	// A body conversation id is taken as it is.
	body, _ := ResolveIdentity(clientCfg(), "body-conv", hdr(HeaderClaudeCodeSession, session, HeaderClaudeCodeAgent, "a3c790def40f2740a"), links)
	if body.SubAgent() || body.ConversationID != "body-conv" {
		t.Fatalf("body conversation: %+v", body)
	}
	// The configured parent header wins over the client's.
	cfg := clientCfg()
	cfg.ParentHeader = parentHeader
	gw, _ := ResolveIdentity(cfg, "", hdr(HeaderClaudeCodeSession, session, HeaderClaudeCodeAgent, "x", parentHeader, "gateway-parent"), links)
	if gw.Parent != "gateway-parent" || gw.ConversationID != session {
		t.Fatalf("configured parent header: %+v", gw)
	}
	// An agent naming itself as its parent is refused, naming the header.
	_, err = ResolveIdentity(clientCfg(), "", hdr(HeaderClaudeCodeSession, session, HeaderClaudeCodeAgent, "x", HeaderClaudeCodeParentAgent, "x"), links)
	if !errors.Is(err, ErrAffinityCycle) || !strings.Contains(err.Error(), HeaderClaudeCodeParentAgent) {
		t.Fatalf("self parent: %v", err)
	}
	// An agent id that makes the conversation id too long.
	_, err = ResolveIdentity(clientCfg(), "", hdr(HeaderClaudeCodeSession, session, HeaderClaudeCodeAgent, strings.Repeat("a", MaxIDBytes)), links)
	if !errors.Is(err, ErrIDTooLong) || !strings.Contains(err.Error(), HeaderClaudeCodeAgent) {
		t.Fatalf("long agent id: %v", err)
	}
}

// TestClaudeCodeCaptures resolves the captured requests of a Claude Code
// 2.1.328 session whose Task sub-agent spawned a sub-agent that spawned
// another (testdata/claudecode: headers as the CLI sent them).
func TestClaudeCodeCaptures(t *testing.T) {
	files, err := filepath.Glob("testdata/claudecode/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no captures: %v", err)
	}
	links := linkTable{}
	depths := map[int]int{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var capt struct {
			Headers http.Header `json:"headers"`
		}
		if err := json.Unmarshal(raw, &capt); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		id, err := ResolveIdentity(clientCfg(), "", capt.Headers, links)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if id.Key(fsm.FleetContext) != session {
			t.Errorf("%s: context key %q, want the session", f, id.Key(fsm.FleetContext))
		}
		if id.NewLink {
			links[id.Link.Child] = fsm.ParentLink{Child: id.Link.Child, Parent: id.Link.Parent, Root: id.Link.Root, Depth: id.Link.Depth}
		}
		depths[id.Depth]++
	}
	if depths[0] == 0 || depths[1] == 0 || depths[2] == 0 || depths[3] == 0 {
		t.Fatalf("depths seen %v, want the session and three levels of agents", depths)
	}
}

// TestCodexSubAgents: a spawned Codex thread is its own conversation (its
// thread id, prompt_cache_key), child of the thread that spawned it.
func TestCodexSubAgents(t *testing.T) {
	const parent, child = "01a24bfe-8209-7bc2-a62b-999e8f738638", "01a24c00-1111-7222-8333-444455556666"
	h := hdr("Session-Id", parent, "Thread-Id", child, "X-Codex-Parent-Thread-Id", parent, "X-OpenAI-Subagent", "collab_spawn")
	id, err := ResolveIdentity(clientCfg(), child, h, nil) // the edge passes prompt_cache_key as the body id
	want := fsm.Link{Child: child, Parent: parent, Root: parent, Depth: 1}
	if err != nil || id.ConversationID != child || id.Key(fsm.FleetContext) != parent || id.Key(fsm.FleetGeneration) != child || id.Link != want {
		t.Fatalf("spawned thread: %+v %v, want link %+v", id, err, want)
	}
	// Without prompt_cache_key the thread-id header names the thread.
	id, err = ResolveIdentity(clientCfg(), "", h, nil)
	if err != nil || id.ConversationID != child || id.Link != want {
		t.Fatalf("thread-id header: %+v %v", id, err)
	}
	// As Codex 0.169.0 sends it: the spawned thread's prompt_cache_key is
	// the session's (its parent's thread id); its thread-id header is its
	// own.
	id, err = ResolveIdentity(clientCfg(), parent, h, nil)
	if err != nil || id.ConversationID != child || id.Key(fsm.FleetGeneration) != child || id.Link != want {
		t.Fatalf("prompt_cache_key of the parent: %+v %v, want the thread %s, link %+v", id, err, child, want)
	}
	// Without a thread-id header, prompt_cache_key names it.
	id, err = ResolveIdentity(clientCfg(), child, hdr(HeaderCodexParentThread, parent), nil)
	if err != nil || id.ConversationID != child || id.Link != want {
		t.Fatalf("no thread-id header: %+v %v", id, err)
	}
	// A parent that is itself a spawned thread: the link's root rules.
	links := linkTable{child: {Child: child, Parent: parent, Root: parent, Depth: 1}}
	id, err = ResolveIdentity(clientCfg(), "grandchild", hdr(HeaderCodexParentThread, child), links)
	if err != nil || id.Root != parent || id.Depth != 2 || id.Parent != child {
		t.Fatalf("nested thread: %+v %v", id, err)
	}
	// The parent thread's own requests (same thread id) are no sub-agent.
	id, err = ResolveIdentity(clientCfg(), parent, hdr(HeaderCodexParentThread, parent, HeaderCodexSubagent, "compact"), nil)
	if err != nil || id.SubAgent() || id.ConversationID != parent {
		t.Fatalf("parent's own request: %+v %v", id, err)
	}
	// Off: ignored.
	id, _ = ResolveIdentity(IdentityConfig{}, child, h, nil)
	if id.SubAgent() {
		t.Fatalf("client headers off: %+v", id)
	}
}

// TestResolveContinuing: a sub-agent continuing its parent's stored chain
// (a handoff with previous_response_id) continues it as the parent itself;
// one continuing its own chain stays a sub-agent.
func TestResolveContinuing(t *testing.T) {
	cfg := IdentityConfig{ParentHeader: parentHeader}
	h := hdr("x-session-id", "child-a", parentHeader, "parent-1")
	if _, err := ResolveIdentity(cfg, "parent-1", h, nil); !errors.Is(err, ErrAffinityCycle) {
		t.Fatalf("ResolveIdentity with the parent's conversation: %v, want the cycle", err)
	}
	id, err := ResolveContinuing(cfg, "parent-1", h, nil)
	if err != nil || id.SubAgent() || id.NewLink || id.ConversationID != "parent-1" ||
		id.Key(fsm.FleetContext) != "parent-1" || id.Key(fsm.FleetGeneration) != "parent-1" {
		t.Fatalf("handoff continuing the parent: %+v %v", id, err)
	}
	// The chain of the parent's root (the parent is a sub-agent of it).
	links := linkTable{"parent-1": {Child: "parent-1", Parent: "root", Root: "root", Depth: 1}}
	id, err = ResolveContinuing(cfg, "root", h, links)
	if err != nil || id.SubAgent() || id.ConversationID != "root" {
		t.Fatalf("handoff continuing the root: %+v %v", id, err)
	}
	// Its own chain: an ordinary sub-agent turn.
	id, err = ResolveContinuing(cfg, "child-a", h, nil)
	if err != nil || !id.SubAgent() || id.ConversationID != "child-a" || id.Key(fsm.FleetContext) != "parent-1" {
		t.Fatalf("own chain: %+v %v", id, err)
	}
	// A request with no continued conversation is refused as before.
	if _, err := ResolveContinuing(cfg, "", hdr("x-session-id", "a", parentHeader, "a"), nil); !errors.Is(err, ErrAffinityCycle) {
		t.Fatalf("self parent without a chain: %v", err)
	}
}

// FuzzClientSubAgentHeaders: arbitrary Claude Code and Codex header values
// never panic, refusals are typed, and an accepted sub-agent routes by a
// root other than itself.
func FuzzClientSubAgentHeaders(f *testing.F) {
	f.Add("", session, "a1", "", "", "")
	f.Add("", session, "a2", "a1", "", "")
	f.Add("", session, "a1", "a1", "", "")
	f.Add("t2", "", "", "", "t1", "t2")
	f.Add("", "", "", "", "t1", "t1")
	f.Fuzz(func(t *testing.T, body, sess, agent, parentAgent, codexParent, thread string) {
		h := http.Header{}
		for k, v := range map[string]string{HeaderClaudeCodeSession: sess, HeaderClaudeCodeAgent: agent,
			HeaderClaudeCodeParentAgent: parentAgent, HeaderCodexParentThread: codexParent, HeaderCodexThread: thread} {
			h.Set(k, v)
		}
		links := linkTable{}
		if a := strings.TrimSpace(parentAgent); a != "" {
			c := ClaudeCodeAgentConversation(strings.TrimSpace(sess), a)
			links[c] = fsm.ParentLink{Child: c, Parent: strings.TrimSpace(sess), Root: strings.TrimSpace(sess), Depth: 1}
		}
		id, err := ResolveIdentity(clientCfg(), body, h, links)
		if err != nil {
			var ie *IdentityError
			if !errors.As(err, &ie) || err.Error() == "" {
				t.Fatalf("untyped refusal: %v", err)
			}
			return
		}
		if id.SubAgent() && (id.Root == "" || id.Root == id.ConversationID || id.Key(fsm.FleetContext) != id.Root) {
			t.Fatalf("sub-agent %+v", id)
		}
		if id.NewLink && (id.Link.Child != id.ConversationID || id.Link.Child == id.Link.Parent || id.Link.Child == id.Link.Root) {
			t.Fatalf("link %+v", id.Link)
		}
	})
}
