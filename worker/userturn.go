package worker

import "strings"

// What the user wrote in a user message, without the context agent
// harnesses put in user messages: the simulated model reads the last
// user turn to choose its tools and its answer, and must not take a
// harness's reminder for the user's request.

// contextSpan is a span of harness context: from open to the next close
// (or the end of the text when unclosed).
type contextSpan struct{ open, close string }

// contextSpans are the context harnesses put in user messages:
//   - Claude Code's <system-reminder> blocks, a text block of their own or
//     inside one (attribution, CLAUDE.md, tool and date reminders);
//   - Codex's contextual user messages, which it does not count as user
//     turns itself (openai/codex codex-rs/core/src/context/
//     contextual_user_message.rs: the AGENTS.md instructions, the
//     environment context, skills, user shell commands, aborted turns,
//     sub-agent notifications), and its former <user_instructions>.
var contextSpans = []contextSpan{
	{"<system-reminder>", "</system-reminder>"},
	{"<environment_context>", "</environment_context>"},
	{"# AGENTS.md instructions for ", "</INSTRUCTIONS>"},
	{"<user_instructions>", "</user_instructions>"},
	{"<skill>", "</skill>"},
	{"<user_shell_command>", "</user_shell_command>"},
	{"<turn_aborted>", "</turn_aborted>"},
	{"<subagent_notification>", "</subagent_notification>"},
}

// userText is content without its context spans, trimmed ("" when the
// message is harness context only).
func userText(content string) string {
	for _, sp := range contextSpans {
		content = stripSpans(content, sp)
	}
	return strings.TrimSpace(content)
}

// stripSpans removes every span of sp from s.
func stripSpans(s string, sp contextSpan) string {
	i := strings.Index(s, sp.open)
	if i < 0 {
		return s
	}
	var b strings.Builder
	for i >= 0 {
		b.WriteString(s[:i])
		rest := s[i+len(sp.open):]
		j := strings.Index(rest, sp.close)
		if j < 0 {
			return b.String()
		}
		s = rest[j+len(sp.close):]
		i = strings.Index(s, sp.open)
	}
	b.WriteString(s)
	return b.String()
}
