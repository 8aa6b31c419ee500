package agentapi

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/waitfor"
)

// capture is one request a real CLI sent (testdata/clients).
type capture struct {
	Path    string              `json:"path"`
	Headers map[string][]string `json:"headers"`
	Body    json.RawMessage     `json:"body"`
}

func readCapture(t *testing.T, file string) capture {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "clients", file))
	if err != nil {
		t.Fatal(err)
	}
	var c capture
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	c.Path, _, _ = strings.Cut(c.Path, "?")
	return c
}

// header is the capture's first value of header name.
func (c capture) header(name string) string {
	for k, v := range c.Headers {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// replay sends c through the edge at base as the CLI sent it and checks
// that its stream completes: 200, the API's last event, no error event.
func replay(t *testing.T, base, file string) reply {
	t.Helper()
	c := readCapture(t, file)
	hdr := map[string]string{}
	for k, v := range c.Headers {
		if !strings.EqualFold(k, "Authorization") && len(v) > 0 {
			hdr[k] = v[0]
		}
	}
	r := do(t, "POST", base+c.Path, c.Body, hdr)
	if r.status != 200 {
		t.Fatalf("%s through %s: %d %s", file, base, r.status, r.body)
	}
	evs := events(t, r.body)
	last := ""
	for _, ev := range evs {
		typ, _ := ev.data["type"].(string)
		if ev.name == "error" || typ == "error" || typ == "response.failed" {
			t.Fatalf("%s: error event %v", file, ev.data)
		}
		last = typ
	}
	want := map[string]string{"/v1/messages": "message_stop", "/v1/responses": "response.completed"}[c.Path]
	if last != want {
		t.Fatalf("%s: the stream ends with %q, want %q (%d events)", file, last, want, len(evs))
	}
	return r
}

// The captured requests of Claude Code 2.1.328 and Codex 0.169.0 replay
// through three edges of tether dev with 200 and complete streams, and
// their sub-agents are sub-agents: Claude Code's Task agents
// (x-claude-code-agent-id, nested by x-claude-code-parent-agent-id) and a
// thread Codex spawned (x-codex-parent-thread-id; its prompt_cache_key is
// its parent's, its thread-id its own) are linked under their roots in the
// log, run on their root's context instance, and have generation bindings
// of their own.
func TestClientCapturesAcrossEdges(t *testing.T) {
	st := startStack(t, devstack.Options{})
	edges := st.Edges()
	url := func(i int) string { return edges[i%len(edges)].URL() }

	const cc = "claude-code-2.1.328/"
	session := readCapture(t, cc+"0002.json").header("X-Claude-Code-Session-Id")
	ccFiles := []string{"0002.json", "0003.json", "0004.json", "0006.json", "0008.json", "0011.json"}
	var ccInst string
	for i, f := range ccFiles {
		ctxInst, _ := route(t, replay(t, url(i), cc+f))
		if ccInst == "" {
			ccInst = ctxInst
		}
		if ctxInst != ccInst {
			t.Errorf("%s ran on context instance %s, the session's first request on %s", f, ctxInst, ccInst)
		}
	}

	const cx = "codex-0.169.0/"
	parentThread := readCapture(t, cx+"subagent-1-parent.json").header("Thread-Id")
	childThread := readCapture(t, cx+"subagent-3-child.json").header("Thread-Id")
	var cxInst string
	for i, f := range []string{"subagent-1-parent.json", "subagent-2-parent-after-spawn.json", "subagent-3-child.json", "subagent-4-child-tool-output.json"} {
		ctxInst, _ := route(t, replay(t, url(i+1), cx+f))
		if cxInst == "" {
			cxInst = ctxInst
		}
		if ctxInst != cxInst {
			t.Errorf("%s ran on context instance %s, the thread's first request on %s", f, ctxInst, cxInst)
		}
	}

	ccAgent := func(f string) string {
		return routing.ClaudeCodeAgentConversation(session, readCapture(t, cc+f).header("X-Claude-Code-Agent-Id"))
	}
	wantLinks := map[string]fsm.ParentLink{
		// 0006: a direct child of the main agent; 0008 its child; 0011 a
		// child of 0008's agent.
		ccAgent("0006.json"): {Parent: session, Root: session, Depth: 1},
		ccAgent("0008.json"): {Parent: ccAgent("0006.json"), Root: session, Depth: 2},
		ccAgent("0011.json"): {Parent: ccAgent("0008.json"), Root: session, Depth: 3},
		childThread:          {Parent: parentThread, Root: parentThread, Depth: 1},
	}
	for _, n := range edges {
		waitfor.Reason(t, 30*time.Second, n.ID+" holds every sub-agent's link", func() string {
			state := n.Edge().Node().State()
			for child, want := range wantLinks {
				got, ok := state.Link(child)
				if !ok {
					return "no link of " + child
				}
				// A nested agent's depth is its parent's recorded depth
				// plus one where its edge had applied the parent's link,
				// else the depth its headers show (1: its parent is an
				// agent of the session).
				if got.Parent != want.Parent || got.Root != want.Root || got.Depth < 1 || got.Depth > want.Depth {
					return fmt.Sprintf("%s: link %s → root %s at depth %d, want %s → root %s at depth ≤ %d",
						child, got.Parent, got.Root, got.Depth, want.Parent, want.Root, want.Depth)
				}
			}
			return ""
		})
	}
	ctx := context.Background()
	for child := range wantLinks {
		if _, found, err := edges[0].Binding(ctx, fsm.FleetGeneration, child); err != nil || !found {
			t.Errorf("no generation binding of the sub-agent %s (%v)", child, err)
		}
	}
}
