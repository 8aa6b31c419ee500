package routing

import (
	"errors"
	"net/http"
	"testing"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/convid"
)

// FuzzResolveIdentity feeds arbitrary body ids, session and parent header
// values, a recorded link and the scope to ResolveIdentity and checks its
// invariants: it never panics, refusals are typed, and an accepted identity
// routes a sub-agent by a root that is not the child itself, within the
// depth limit (an ancestor's child beyond it), with a link that matches.
func FuzzResolveIdentity(f *testing.F) {
	f.Add("", "child-a", "parent-1", "", "", 0, false)
	f.Add("", "child-a", "parent-1", "parent-1", "root", 2, true)
	f.Add("body", "  ", " \t", "", "", 0, false)
	f.Add("", "a", "a", "", "", 0, false)
	f.Add("", "a", "b", "b", "a", 1, false)
	f.Add("", "c", "p", "c", "r", 1, true)
	f.Add("", "d", "p", "p", "r", 4, false)
	f.Fuzz(func(t *testing.T, body, session, parent, linkChild, linkRoot string, linkDepth int, both bool) {
		cfg := IdentityConfig{ParentHeader: parentHeader, MaxDepth: 4}
		if both {
			cfg.Scope = ScopeBoth
		}
		h := http.Header{}
		h.Add("X-Session-Id", session)
		h.Add(parentHeader, parent)
		links := linkTable{}
		if linkChild != "" {
			links[linkChild] = fsm.ParentLink{Child: linkChild, Parent: linkRoot, Root: linkRoot, Depth: uint8(linkDepth)}
		}
		id, err := ResolveIdentity(cfg, body, h, links)
		if err != nil {
			var ie *IdentityError
			if !errors.As(err, &ie) || !(errors.Is(err, ErrAffinityCycle) || errors.Is(err, ErrNestingTooDeep) || errors.Is(err, ErrIDTooLong)) {
				t.Fatalf("untyped refusal: %v", err)
			}
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		conv := convid.Resolve(body, h)
		if id.ConversationID != conv {
			t.Fatalf("conversation id %q, want %q", id.ConversationID, conv)
		}
		ctx, gen := id.Key(fsm.FleetContext), id.Key(fsm.FleetGeneration)
		if !id.SubAgent() {
			if ctx != conv || gen != conv || id.NewLink || id.Depth != 0 {
				t.Fatalf("root conversation %q: keys %q/%q, %+v", conv, ctx, gen, id)
			}
			return
		}
		if ctx != id.Root || ctx == "" || (conv != "" && ctx == conv) {
			t.Fatalf("sub-agent %q: context key %q, root %q", conv, ctx, id.Root)
		}
		if id.Depth < 1 || (id.NewLink && id.Depth > cfg.MaxDepth) {
			t.Fatalf("depth %d outside 1..%d", id.Depth, cfg.MaxDepth)
		}
		wantGen := conv
		if both {
			wantGen = id.Root
		}
		if gen != wantGen {
			t.Fatalf("generation key %q, want %q", gen, wantGen)
		}
		if id.NewLink {
			want := fsm.Link{Child: conv, Parent: id.Parent, Root: id.Root, Depth: uint8(id.Depth)}
			// Beyond the depth limit the link names an ancestor of the
			// header's parent instead.
			if conv == "" || id.Link != want || (id.Parent != id.HeaderParent) != id.DepthLimited {
				t.Fatalf("link %+v, want %+v", id.Link, want)
			}
		}
	})
}
