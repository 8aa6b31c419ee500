package routing

import (
	"strings"

	"github.com/tether-project/tether/internal/convid"
)

// Sub-agent headers the agent CLIs send on their own (IdentityConfig.ClientHeaders).
//
// Claude Code (2.1.x): every request carries the session in
// x-claude-code-session-id; a Task sub-agent's requests add its own id in
// x-claude-code-agent-id and, when its parent is another sub-agent (not the
// main agent), that agent's id in x-claude-code-parent-agent-id. Agent ids
// are short and unique within a session only.
//
// Codex (codex-rs): a spawned thread's requests carry its own thread id in
// the thread-id header (codex-rs/codex-api/src/requests/headers.rs,
// build_session_headers) and the session's prompt_cache_key, which is the
// spawning thread's (Codex 0.169.0's requests, as captured), the
// spawning thread's id in x-codex-parent-thread-id and its kind in
// x-openai-subagent (collab_spawn for a spawned agent; review, compact,
// memory_consolidation or a label for Codex's internal ones;
// codex-rs/core/src/responses_metadata.rs, compatibility_headers and
// subagent_header_value). Thread ids are UUIDs, unique on their own.
const (
	HeaderClaudeCodeSession     = "x-claude-code-session-id"
	HeaderClaudeCodeAgent       = "x-claude-code-agent-id"
	HeaderClaudeCodeParentAgent = "x-claude-code-parent-agent-id"
	HeaderCodexParentThread     = "x-codex-parent-thread-id"
	HeaderCodexThread           = "thread-id"
	HeaderCodexSubagent         = "x-openai-subagent"
)

// ClientParentHeaders are the client headers that make a request a
// sub-agent of another conversation: a trusted gateway strips them from
// requests it does not trust, as it strips the configured parent header.
var ClientParentHeaders = []string{HeaderClaudeCodeAgent, HeaderClaudeCodeParentAgent, HeaderCodexParentThread}

// ClaudeCodeAgentSep joins a Claude Code session id and one of its agent
// ids into the agent's conversation id.
const ClaudeCodeAgentSep = "/agent/"

// ClaudeCodeAgentConversation is the conversation id of agent agentID of
// Claude Code session session: "<session>/agent/<agent id>". Agent ids are
// unique within a session only, so the session is part of the id; the form
// reads as the agent's place in the session in logs and audit output.
func ClaudeCodeAgentConversation(session, agentID string) string {
	return session + ClaudeCodeAgentSep + agentID
}

// clientAgent is a sub-agent as a client's own headers describe it.
type clientAgent struct {
	conv   string // the sub-agent's own conversation
	parent string // its parent's conversation
	// root is the conversation at the top of the chain when the headers
	// say it (Claude Code's session), "" when only recorded links can.
	root string
	// header names the header that made the request a sub-agent (errors).
	header string
	// convHeader names the header the conversation id came from ("" the
	// body or a session header).
	convHeader string
}

// clientSubAgent reads the sub-agent headers of Claude Code and Codex.
// conv is the request's conversation id as resolved from the body and the
// session headers. ok is false when the request is not a client sub-agent
// (then it resolves as any request).
func clientSubAgent(bodyConversationID, conv string, h map[string][]string) (clientAgent, bool) {
	if h == nil {
		return clientAgent{}, false
	}
	if agent := convid.Header(h, HeaderClaudeCodeAgent); agent != "" {
		session := convid.Header(h, HeaderClaudeCodeSession)
		// The agent headers qualify the session header's conversation; a
		// conversation the body names explicitly is taken as it is.
		if session != "" && session == conv && strings.TrimSpace(bodyConversationID) == "" {
			ca := clientAgent{conv: ClaudeCodeAgentConversation(session, agent), parent: session, root: session,
				header: HeaderClaudeCodeAgent, convHeader: HeaderClaudeCodeAgent}
			if p := convid.Header(h, HeaderClaudeCodeParentAgent); p != "" {
				ca.parent, ca.header = ClaudeCodeAgentConversation(session, p), HeaderClaudeCodeParentAgent
			}
			return ca, true
		}
	}
	if parent := convid.Header(h, HeaderCodexParentThread); parent != "" {
		// The thread-id header is the thread's own; prompt_cache_key (conv)
		// is the session's, shared with the spawning thread.
		own := convid.Header(h, HeaderCodexThread)
		if own == "" {
			own = conv
		}
		if own == parent {
			// A request of the parent thread itself (Codex runs some of its
			// own work in the thread that asked for it): no sub-agent.
			return clientAgent{}, false
		}
		return clientAgent{conv: own, parent: parent, header: HeaderCodexParentThread}, true
	}
	return clientAgent{}, false
}
