package routing

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/convid"
)

// DefaultMaxDepth is the default sub-agent nesting limit (a direct child of a
// root conversation has depth 1).
const DefaultMaxDepth = 4

// MaxIDBytes bounds a conversation id or parent id taken from a request.
const MaxIDBytes = 1024

// IdentityConfig is the edge's sub-agent affinity configuration.
type IdentityConfig struct {
	// ParentHeader is conversation_affinity_header_for_subagents: the
	// request header naming the parent conversation. "" turns the
	// feature off (the header is then ignored).
	ParentHeader string `yaml:"conversation_affinity_header_for_subagents"`
	// Scope is subagent_affinity_scope.
	Scope Scope `yaml:"subagent_affinity_scope"`
	// MaxDepth is subagent_max_depth; 0 means DefaultMaxDepth.
	MaxDepth int `yaml:"subagent_max_depth"`
	// ClientHeaders reads the sub-agent headers Claude Code and Codex
	// send (clientagents.go) when the request carries no ParentHeader.
	ClientHeaders bool `yaml:"client_subagent_headers"`
}

// Validate checks the configuration and names the offending key.
func (c IdentityConfig) Validate() error {
	var errs []error
	if c.ParentHeader != "" {
		if !validHeaderName(c.ParentHeader) {
			errs = append(errs, fmt.Errorf("conversation_affinity_header_for_subagents: %q is not a valid HTTP header name", c.ParentHeader))
		}
		for _, s := range convid.SessionHeaders {
			if strings.EqualFold(s, c.ParentHeader) {
				errs = append(errs, fmt.Errorf("conversation_affinity_header_for_subagents: %q is a session header; use a dedicated parent-session header", c.ParentHeader))
			}
		}
	}
	if c.Scope != ScopeContext && c.Scope != ScopeBoth {
		errs = append(errs, fmt.Errorf("subagent_affinity_scope: unknown scope %d (allowed: context, both)", uint8(c.Scope)))
	}
	if c.MaxDepth < 0 || c.MaxDepth > 255 {
		errs = append(errs, fmt.Errorf("subagent_max_depth: must be 1..255 (0 for the default %d), got %d", DefaultMaxDepth, c.MaxDepth))
	}
	return errors.Join(errs...)
}

func (c IdentityConfig) maxDepth() int {
	if c.MaxDepth <= 0 {
		return DefaultMaxDepth
	}
	return c.MaxDepth
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// LinkReader reads recorded sub-agent links (the replicated fsm state).
type LinkReader interface {
	Link(child string) (fsm.ParentLink, bool)
}

// Errors of ResolveIdentity, wrapped in an *IdentityError. The edge answers
// each with 400 and the error's message.
var (
	ErrNestingTooDeep = errors.New("sub-agent nesting too deep")
	ErrAffinityCycle  = errors.New("sub-agent affinity cycle")
	ErrIDTooLong      = errors.New("id too long")
)

// IdentityError explains a refused identity.
type IdentityError struct {
	Err    error  // ErrAffinityCycle or ErrIDTooLong (ErrNestingTooDeep is no longer returned)
	Header string // the parent header's name ("" when not involved)
	// SessionHeader names the session header an over-long conversation id
	// came from ("" when it came from the body).
	SessionHeader string
	Child         string
	Parent        string
	Root          string
	Depth         int
	MaxDepth      int
}

func (e *IdentityError) Error() string {
	switch e.Err {
	case ErrNestingTooDeep:
		return fmt.Sprintf("%s: conversation %q names parent %q (root %q) in header %s: depth %d exceeds the limit of %d",
			e.Err, e.Child, e.Parent, e.Root, e.Header, e.Depth, e.MaxDepth)
	case ErrAffinityCycle:
		if e.Child == e.Parent {
			return fmt.Sprintf("%s: conversation %q names itself as parent in header %s", e.Err, e.Child, e.Header)
		}
		return fmt.Sprintf("%s: conversation %q names parent %q in header %s, but %q is itself rooted at %q",
			e.Err, e.Child, e.Parent, e.Header, e.Parent, e.Root)
	case ErrIDTooLong:
		if e.Child != "" {
			return fmt.Sprintf("%s: the conversation id header %s makes is longer than %d bytes", e.Err, e.Header, MaxIDBytes)
		}
		if e.SessionHeader != "" {
			return fmt.Sprintf("%s: header %s value is longer than %d bytes", e.Err, e.SessionHeader, MaxIDBytes)
		}
		if e.Header != "" {
			return fmt.Sprintf("%s: header %s value is longer than %d bytes", e.Err, e.Header, MaxIDBytes)
		}
		return fmt.Sprintf("%s: conversation id is longer than %d bytes", e.Err, MaxIDBytes)
	}
	return e.Err.Error()
}

func (e *IdentityError) Unwrap() error { return e.Err }

// Identity is who a request is and which key it routes by on each fleet.
type Identity struct {
	// ConversationID is the request's own conversation ("" = none).
	ConversationID string
	// Parent is the parent in effect: the recorded link's parent when the
	// child already has one, else the header's ("" = not a sub-agent).
	Parent string
	// Root is the root conversation the context fleet routes by for a
	// sub-agent ("" when not a sub-agent).
	Root string
	// Depth is the nesting depth (0 for a root conversation).
	Depth int
	// HeaderParent is the parent named by this request's header.
	HeaderParent string
	// DepthLimited: the header's parent was at or beyond the nesting
	// limit, so Parent is its deepest ancestor within the limit (the
	// request routes as that ancestor's child); RequestedDepth is the
	// depth the header asked for.
	DepthLimited   bool
	RequestedDepth int
	// ParentMismatch: the header named a different parent than the
	// recorded link; the recorded link won (stable routing).
	ParentMismatch bool
	// NewLink is set when the link is not recorded yet: the edge proposes
	// Link (fsm.Link) through the log.
	NewLink bool
	Link    fsm.Link

	contextKey, generationKey string
}

// Key returns the routing key on fleet f ("" = unkeyed: place by load and
// prefix, do not bind).
func (id Identity) Key(f fsm.Fleet) string {
	if f == FleetGeneration {
		return id.generationKey
	}
	return id.contextKey
}

// SubAgent reports whether the request routes by a parent's root.
func (id Identity) SubAgent() bool { return id.Root != "" }

// FleetContext and FleetGeneration re-export the fsm fleets for callers of Key.
const (
	FleetContext    = fsm.FleetContext
	FleetGeneration = fsm.FleetGeneration
)

// ResolveIdentity extracts a request's identity: its conversation id (body
// conversation_params.conversation_id, then the session headers of h, the
// request's header as net/http keeps it: an http.Header) and, when
// cfg.ParentHeader is set and the request carries it (case-insensitive name,
// non-blank value), its parent. Without that header, and with
// cfg.ClientHeaders, the sub-agent headers of Claude Code and Codex name
// the conversation and the parent (clientagents.go): a Claude Code agent's
// conversation is ClaudeCodeAgentConversation(session, agent id), its parent
// the agent its parent-agent header names or else the session, its root the
// session; a Codex thread's parent is the thread x-codex-parent-thread-id
// names. A sub-agent's context-fleet key is its
// parent's root; its generation-fleet key is the root with ScopeBoth and its
// own conversation id with ScopeContext. links may be nil (no links known).
//
// Nesting: a parent that is itself a recorded child resolves to its root,
// and depth is its depth plus one; beyond cfg.MaxDepth the request routes
// as a child of the parent's deepest ancestor within the limit
// (DepthLimited; it keeps the root, so the same context placement). A child naming itself, or a parent rooted at
// the child, is refused (ErrAffinityCycle). A child that already has a
// recorded link keeps it even if the header names another parent (the first
// link wins, so the child's routing never flips); ParentMismatch reports it.
// The link applies only while the request carries the header: a request
// without it routes by its own conversation id.
//
// A sub-agent request without its own conversation id still routes by its
// parent's root on the context fleet (the client asked for that placement)
// but records no link, and is unkeyed on the generation fleet with
// ScopeContext.
func ResolveIdentity(cfg IdentityConfig, bodyConversationID string, h map[string][]string, links LinkReader) (Identity, error) {
	conv := convid.Resolve(bodyConversationID, h)
	if len(conv) > MaxIDBytes {
		ie := &IdentityError{Err: ErrIDTooLong}
		if strings.TrimSpace(bodyConversationID) == "" {
			for _, name := range convid.SessionHeaders {
				if convid.Header(h, name) != "" {
					ie.SessionHeader = name
					break
				}
			}
		}
		return Identity{}, ie
	}
	var parent, header, knownRoot string
	if cfg.ParentHeader != "" {
		parent, header = convid.Header(h, cfg.ParentHeader), cfg.ParentHeader
	}
	if parent == "" && cfg.ClientHeaders {
		if ca, ok := clientSubAgent(bodyConversationID, conv, h); ok {
			if len(ca.conv) > MaxIDBytes {
				return Identity{}, &IdentityError{Err: ErrIDTooLong, Header: ca.header, Child: ca.conv}
			}
			conv, parent, header, knownRoot = ca.conv, ca.parent, ca.header, ca.root
		}
	}
	if parent == "" {
		return Identity{ConversationID: conv, contextKey: conv, generationKey: conv}, nil
	}
	if len(parent) > MaxIDBytes {
		return Identity{}, &IdentityError{Err: ErrIDTooLong, Header: header}
	}
	return resolveChild(cfg, conv, parent, header, knownRoot, links)
}

// resolveChild is ResolveIdentity for a request naming parent in header.
// knownRoot is the root the request's headers name ("" when only the
// recorded links can tell): it stands in for a parent link not recorded
// (yet), so a nested sub-agent keeps the root's placement.
func resolveChild(cfg IdentityConfig, conv, parent, header, knownRoot string, links LinkReader) (Identity, error) {
	if parent == conv {
		return Identity{}, &IdentityError{Err: ErrAffinityCycle, Header: header, Child: conv, Parent: parent, Root: parent}
	}
	id := Identity{ConversationID: conv, HeaderParent: parent}
	if conv != "" && links != nil {
		if l, ok := links.Link(conv); ok && l.Root != "" {
			if l.Root == conv {
				return Identity{}, &IdentityError{Err: ErrAffinityCycle, Header: header, Child: conv, Parent: l.Parent, Root: l.Root}
			}
			id.Parent, id.Root, id.Depth = l.Parent, l.Root, max(int(l.Depth), 1)
			id.ParentMismatch = l.Parent != parent
			if pl, ok := links.Link(parent); id.ParentMismatch && ok && int(pl.Depth)+1 > cfg.maxDepth() {
				// Recorded when it was first seen beyond the limit.
				id.DepthLimited, id.RequestedDepth = true, int(pl.Depth)+1
			}
			id.setKeys(cfg.Scope)
			return id, nil
		}
	}
	root, depth := parent, 1
	if knownRoot != "" && knownRoot != parent {
		// The parent is itself a sub-agent of knownRoot: at least depth 2.
		root, depth = knownRoot, 2
	}
	if links != nil {
		if pl, ok := links.Link(parent); ok && pl.Root != "" && pl.Root != parent {
			root, depth = pl.Root, int(pl.Depth)+1
		}
	}
	if conv != "" && root == conv {
		return Identity{}, &IdentityError{Err: ErrAffinityCycle, Header: header, Child: conv, Parent: parent, Root: root}
	}
	if max := cfg.maxDepth(); depth > max {
		// Beyond the limit an agent framework still needs a route: the
		// request becomes a child of the parent's deepest ancestor within
		// the limit (same root, so the same context placement).
		id.DepthLimited, id.RequestedDepth = true, depth
		parent, depth = ancestorAtDepth(links, parent, depth-1, max-1, root)
	}
	id.Parent, id.Root, id.Depth = parent, root, depth
	if conv != "" {
		id.NewLink = true
		id.Link = fsm.Link{Child: conv, Parent: parent, Root: root, Depth: uint8(depth)}
	}
	id.setKeys(cfg.Scope)
	return id, nil
}

// ResolveContinuing is ResolveIdentity for a request that continues
// conversation continued (the conversation of the stored response a
// Responses request names in previous_response_id), which takes the place
// of the body's conversation id. A request whose parent is that very
// conversation, or a sub-agent of it, is not a sub-agent of itself: an
// agent framework handing a conversation over to another agent (the
// Agents SDK's handoff with previousResponseId) sends the new agent's
// parent header while continuing the parent's own chain. Such a request
// continues the conversation as the conversation itself: its prompt is the
// conversation's, held on the conversation's instance and rank, and the
// responses it makes stay in the conversation's chain. No link is recorded.
func ResolveContinuing(cfg IdentityConfig, continued string, h map[string][]string, links LinkReader) (Identity, error) {
	id, err := ResolveIdentity(cfg, continued, h, links)
	var ie *IdentityError
	if errors.As(err, &ie) && ie.Err == ErrAffinityCycle && ie.Child == strings.TrimSpace(continued) {
		own := cfg
		own.ParentHeader, own.ClientHeaders = "", false
		return ResolveIdentity(own, continued, h, links)
	}
	return id, err
}

// ancestorAtDepth walks up the recorded links from node (at depth) to its
// ancestor at depth want; the root (depth 0) when a link is missing. It
// returns the ancestor and the depth of a child of it.
func ancestorAtDepth(links LinkReader, node string, depth, want int, root string) (string, int) {
	for depth > want && depth > 0 {
		l, ok := links.Link(node)
		if !ok || l.Parent == "" || int(l.Depth) != depth {
			return root, 1
		}
		node, depth = l.Parent, depth-1
	}
	if depth == 0 {
		return root, 1
	}
	return node, depth + 1
}

func (id *Identity) setKeys(scope Scope) {
	id.contextKey = id.Root
	if scope == ScopeBoth {
		id.generationKey = id.Root
	} else {
		id.generationKey = id.ConversationID
	}
}

// HintForEndpoint reports whether requests on path get rank-level (ADP)
// affinity, i.e. whether the edge forwards the signed sub-agent hint: the
// conversation endpoints (/v1/chat/completions, /v1/messages,
// /v1/responses) get instance and rank affinity; /v1/completions (and
// anything else) gets instance affinity only.
func HintForEndpoint(path string) bool {
	switch strings.TrimSuffix(path, "/") {
	case "/v1/chat/completions", "/v1/messages", "/v1/responses":
		return true
	}
	return false
}
