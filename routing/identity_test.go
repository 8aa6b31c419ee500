package routing

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/tether-project/tether/fsm"
)

const parentHeader = "X-Dynamo-Parent-Session-ID"

// linkTable is the replicated state's parent links, as routing reads them.
type linkTable map[string]fsm.ParentLink

func (l linkTable) Link(child string) (fsm.ParentLink, bool) {
	pl, ok := l[child]
	return pl, ok
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// TestIdentitySpecTable is the example table of docs/subagent-routing.md.
func TestIdentitySpecTable(t *testing.T) {
	cfg := IdentityConfig{ParentHeader: parentHeader}
	cases := []struct {
		name, session, parent string
		wantKey, wantConv     string
	}{
		{"parent", "parent-1", "", "parent-1", "parent-1"},
		{"sub-agent A", "child-a", "parent-1", "parent-1", "child-a"},
		{"sub-agent B", "child-b", "parent-1", "parent-1", "child-b"},
	}
	for _, c := range cases {
		h := hdr("x-session-id", c.session)
		if c.parent != "" {
			h.Set(parentHeader, c.parent)
		}
		id, err := ResolveIdentity(cfg, "", h, linkTable{})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := id.Key(fsm.FleetContext); got != c.wantKey {
			t.Errorf("%s: context key %q, want %q", c.name, got, c.wantKey)
		}
		if id.ConversationID != c.wantConv {
			t.Errorf("%s: conversation id %q, want %q", c.name, id.ConversationID, c.wantConv)
		}
		if c.parent != "" {
			want := fsm.Link{Child: c.session, Parent: "parent-1", Root: "parent-1", Depth: 1}
			if !id.NewLink || id.Link != want || id.Depth != 1 || !id.SubAgent() {
				t.Errorf("%s: link %+v (new %v, depth %d), want %+v", c.name, id.Link, id.NewLink, id.Depth, want)
			}
		} else if id.NewLink || id.SubAgent() {
			t.Errorf("%s: a root conversation must not record a link: %+v", c.name, id)
		}
	}
}

func TestIdentityScope(t *testing.T) {
	h := hdr("x-session-id", "child-a", parentHeader, "parent-1")
	cases := []struct {
		scope   Scope
		wantGen string
	}{
		{ScopeContext, "child-a"},
		{ScopeBoth, "parent-1"},
	}
	for _, c := range cases {
		id, err := ResolveIdentity(IdentityConfig{ParentHeader: parentHeader, Scope: c.scope}, "", h, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := id.Key(fsm.FleetContext); got != "parent-1" {
			t.Errorf("scope %v: context key %q, want parent-1", c.scope, got)
		}
		if got := id.Key(fsm.FleetGeneration); got != c.wantGen {
			t.Errorf("scope %v: generation key %q, want %q", c.scope, got, c.wantGen)
		}
	}
}

func TestIdentityHeaderHandling(t *testing.T) {
	cases := []struct {
		name    string
		cfg     IdentityConfig
		h       http.Header
		body    string
		wantCtx string
		wantGen string
	}{
		{"feature off ignores the header", IdentityConfig{}, hdr("x-session-id", "child-a", parentHeader, "parent-1"), "", "child-a", "child-a"},
		{"header name is case-insensitive", IdentityConfig{ParentHeader: "x-dynamo-parent-session-id"}, hdr("X-DYNAMO-PARENT-SESSION-ID", "parent-1", "x-session-id", "child-a"), "", "parent-1", "child-a"},
		{"blank header is absent", IdentityConfig{ParentHeader: parentHeader}, hdr("x-session-id", "child-a", parentHeader, "  \t "), "", "child-a", "child-a"},
		{"first non-blank value", IdentityConfig{ParentHeader: parentHeader}, hdr("x-session-id", "child-a", parentHeader, " ", parentHeader, " parent-2 "), "", "parent-2", "child-a"},
		{"body id beats session header", IdentityConfig{ParentHeader: parentHeader}, hdr("x-session-id", "hdr-id", parentHeader, "parent-1"), "body-id", "parent-1", "body-id"},
		{"no conversation id: unkeyed", IdentityConfig{ParentHeader: parentHeader}, hdr("x-other", "x"), "", "", ""},
		{"sub-agent without own id routes by parent", IdentityConfig{ParentHeader: parentHeader}, hdr(parentHeader, "parent-1"), "", "parent-1", ""},
	}
	for _, c := range cases {
		id, err := ResolveIdentity(c.cfg, c.body, c.h, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := id.Key(fsm.FleetContext); got != c.wantCtx {
			t.Errorf("%s: context key %q, want %q", c.name, got, c.wantCtx)
		}
		if got := id.Key(fsm.FleetGeneration); got != c.wantGen {
			t.Errorf("%s: generation key %q, want %q", c.name, got, c.wantGen)
		}
		if id.ConversationID == "" && id.NewLink {
			t.Errorf("%s: a link without a child id", c.name)
		}
	}
}

func TestIdentityNesting(t *testing.T) {
	cfg := IdentityConfig{ParentHeader: parentHeader, MaxDepth: 3}
	links := linkTable{
		"child-a":      {Child: "child-a", Parent: "root", Root: "root", Depth: 1},
		"grandchild-x": {Child: "grandchild-x", Parent: "child-a", Root: "root", Depth: 2},
		"depth-3":      {Child: "depth-3", Parent: "grandchild-x", Root: "root", Depth: 3},
	}
	// A grandchild routes by the root, one level deeper than its parent.
	id, err := ResolveIdentity(cfg, "", hdr("x-session-id", "gc-new", parentHeader, "grandchild-x"), links)
	if err != nil {
		t.Fatal(err)
	}
	want := fsm.Link{Child: "gc-new", Parent: "grandchild-x", Root: "root", Depth: 3}
	if id.Key(fsm.FleetContext) != "root" || !id.NewLink || id.Link != want {
		t.Fatalf("nested: key %q link %+v, want root and %+v", id.Key(fsm.FleetContext), id.Link, want)
	}

	// Beyond the limit: routed as a child of the deepest ancestor within
	// it (grandchild-x at depth 2), flagged, same root.
	id, err = ResolveIdentity(cfg, "", hdr("x-session-id", "too-deep", parentHeader, "depth-3"), links)
	want = fsm.Link{Child: "too-deep", Parent: "grandchild-x", Root: "root", Depth: 3}
	if err != nil || !id.DepthLimited || id.RequestedDepth != 4 || id.Link != want || id.HeaderParent != "depth-3" || id.Key(fsm.FleetContext) != "root" {
		t.Fatalf("depth 4 with limit 3: %+v %v, want link %+v", id, err, want)
	}
	// A missing link on the way up falls back to the root.
	broken := linkTable{"deep": {Child: "deep", Parent: "gone", Root: "root", Depth: 4}}
	id, err = ResolveIdentity(cfg, "", hdr("x-session-id", "c2", parentHeader, "deep"), broken)
	if err != nil || !id.DepthLimited || id.Link != (fsm.Link{Child: "c2", Parent: "root", Root: "root", Depth: 1}) {
		t.Fatalf("broken chain: %+v %v", id, err)
	}
	// The default limit is DefaultMaxDepth.
	if _, err := ResolveIdentity(IdentityConfig{ParentHeader: parentHeader}, "", hdr("x-session-id", "d4", parentHeader, "depth-3"), links); err != nil {
		t.Fatalf("depth 4 under the default limit %d: %v", DefaultMaxDepth, err)
	}
}

func TestIdentityCycles(t *testing.T) {
	cfg := IdentityConfig{ParentHeader: parentHeader}
	links := linkTable{
		"b": {Child: "b", Parent: "a", Root: "a", Depth: 1},
		"c": {Child: "c", Parent: "b", Root: "a", Depth: 2},
	}
	cases := []struct {
		name, child, parent string
	}{
		{"names itself", "a", "a"},
		{"parent is its own child", "a", "b"},
		{"parent is its grandchild", "a", "c"},
	}
	for _, c := range cases {
		_, err := ResolveIdentity(cfg, "", hdr("x-session-id", c.child, parentHeader, c.parent), links)
		if !errors.Is(err, ErrAffinityCycle) {
			t.Errorf("%s: err %v, want ErrAffinityCycle", c.name, err)
		} else if !strings.Contains(err.Error(), c.child) {
			t.Errorf("%s: message %q does not name the conversation", c.name, err)
		}
	}
}

func TestIdentityRecordedLinkWins(t *testing.T) {
	cfg := IdentityConfig{ParentHeader: parentHeader, Scope: ScopeBoth}
	links := linkTable{"child-a": {Child: "child-a", Parent: "parent-1", Root: "parent-1", Depth: 1}}
	id, err := ResolveIdentity(cfg, "", hdr("x-session-id", "child-a", parentHeader, "parent-2"), links)
	if err != nil {
		t.Fatal(err)
	}
	if id.Key(fsm.FleetContext) != "parent-1" || id.Key(fsm.FleetGeneration) != "parent-1" {
		t.Fatalf("recorded link must win: keys %q/%q", id.Key(fsm.FleetContext), id.Key(fsm.FleetGeneration))
	}
	if id.NewLink || !id.ParentMismatch || id.Parent != "parent-1" || id.HeaderParent != "parent-2" {
		t.Fatalf("recorded link: %+v", id)
	}
	// Same parent: no mismatch, nothing new to record.
	id, _ = ResolveIdentity(cfg, "", hdr("x-session-id", "child-a", parentHeader, "parent-1"), links)
	if id.NewLink || id.ParentMismatch {
		t.Fatalf("same parent: %+v", id)
	}
	// Without the header the child routes by its own id.
	id, _ = ResolveIdentity(cfg, "", hdr("x-session-id", "child-a"), links)
	if id.Key(fsm.FleetContext) != "child-a" || id.SubAgent() {
		t.Fatalf("no header: %+v", id)
	}
}

func TestIdentityRejectsOversizedIDs(t *testing.T) {
	cfg := IdentityConfig{ParentHeader: parentHeader}
	long := strings.Repeat("x", MaxIDBytes+1)
	if _, err := ResolveIdentity(cfg, long, nil, nil); !errors.Is(err, ErrIDTooLong) {
		t.Fatalf("long conversation id: %v", err)
	}
	// From a session header: the error names the header.
	_, err := ResolveIdentity(cfg, "", hdr("x-session-id", long), nil)
	var ie *IdentityError
	if !errors.As(err, &ie) || ie.SessionHeader != "x-session-id" || !strings.Contains(err.Error(), "x-session-id") {
		t.Fatalf("long x-session-id: %v", err)
	}
	_, err = ResolveIdentity(cfg, "", hdr("x-session-id", "c", parentHeader, long), nil)
	if !errors.Is(err, ErrIDTooLong) || !strings.Contains(err.Error(), parentHeader) {
		t.Fatalf("long parent: %v", err)
	}
}

func TestIdentityConfigValidate(t *testing.T) {
	cases := []struct {
		cfg     IdentityConfig
		wantKey string // "" = valid
	}{
		{IdentityConfig{}, ""},
		{IdentityConfig{ParentHeader: parentHeader, Scope: ScopeBoth, MaxDepth: 2}, ""},
		{IdentityConfig{ParentHeader: "bad header"}, "conversation_affinity_header_for_subagents"},
		{IdentityConfig{ParentHeader: "X-Session-Id"}, "conversation_affinity_header_for_subagents"},
		{IdentityConfig{Scope: 7}, "subagent_affinity_scope"},
		{IdentityConfig{MaxDepth: 300}, "subagent_max_depth"},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		if c.wantKey == "" {
			if err != nil {
				t.Errorf("%+v: unexpected %v", c.cfg, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.wantKey) {
			t.Errorf("%+v: err %v, want one naming %s", c.cfg, err, c.wantKey)
		}
	}
}

func TestHintForEndpoint(t *testing.T) {
	cases := map[string]bool{
		"/v1/chat/completions":      true,
		"/v1/chat/completions/":     true,
		"/v1/completions":           false,
		"/v1/messages":              true,
		"/v1/responses":             true,
		"/v1/messages/count_tokens": false,
		"/v1/models":                false,
		"":                          false,
	}
	for path, want := range cases {
		if got := HintForEndpoint(path); got != want {
			t.Errorf("HintForEndpoint(%q) = %v, want %v", path, got, want)
		}
	}
}
