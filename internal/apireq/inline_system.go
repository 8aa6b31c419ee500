package apireq

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Inline system messages of the Messages API. Claude Code appends a
// role "system" message to messages on most turns. Moved to the system
// prompt at the head of the conversation, each one would change the
// prompt's first block and every block after it, turn after turn; vLLM's
// Anthropic endpoint therefore keeps them in place or folds them into a
// neighbouring message, so each request renders as an extension of the
// one before (vllm/entrypoints/anthropic/inline_system.py
// normalize_inline_system, used by serving.py to_chat_completion_request).
// The chat form here follows it step for step, so the prompt an edge keys
// is the one such an engine renders:
//
//   - System messages leading messages join the system prompt (their text
//     after it, each part separated by a blank line).
//   - A system message between an assistant's tool_use and the user
//     message holding the results moves after that message.
//   - preserve: the others stay where they are, as system messages. With
//     no system prompt and no leading system message they are folded, as
//     vLLM folds them then (a template may render request-level tools at
//     the first system message wherever it is).
//   - fold: a system message's text is appended to the user message just
//     before it (to its last text block, or to its last tool result when
//     it holds only tool results); after an assistant message it waits for
//     the next message: prepended to the next user message, or as a user
//     message of its own before the next assistant message or at the end.
//
// Texts join with a blank line; Claude Code's billing header block is
// never part of a system text. vLLM's `auto` chooses between the two by
// rendering probe conversations with the model's template once; tether
// cannot, so a model's setting names the mode (ParseInlineSystem).

// InlineSystem is where a Messages request's inline system messages go.
type InlineSystem uint8

const (
	// InlineSystemPreserve keeps them in place as system messages.
	InlineSystemPreserve InlineSystem = iota
	// InlineSystemFold merges their text into neighbouring user messages.
	InlineSystemFold
)

func (m InlineSystem) String() string {
	if m == InlineSystemFold {
		return "fold"
	}
	return "preserve"
}

// ParseInlineSystem reads a setting: "preserve" (also "", the default) or
// "fold".
func ParseInlineSystem(s string) (InlineSystem, error) {
	switch s {
	case "", "preserve":
		return InlineSystemPreserve, nil
	case "fold":
		return InlineSystemFold, nil
	}
	return 0, fmt.Errorf("%q is not preserve or fold", s)
}

// WithInlineSystem rebuilds a Messages request's chat form with its inline
// system messages placed by mode (Parse places them by
// InlineSystemPreserve); other requests are left as they are.
func (r *Request) WithInlineSystem(mode InlineSystem) *Error {
	if r.anthropic == nil || r.anthropic.mode == mode {
		return nil
	}
	return r.messagesChatForm(mode)
}

// anthropicForm is what a Messages request's chat form is built from.
type anthropicForm struct {
	system string // the system prompt's text
	msgs   []anthropicMsg
	fields map[string]json.RawMessage // the chat form's other fields
	mode   InlineSystem               // the placement the chat form has
}

// anthropicMsg is one message of messages: its role, its content as sent
// (a string or an array of blocks) and where it was, for errors.
type anthropicMsg struct {
	role    string
	content json.RawMessage
	param   string
}

// systemText is a system message's text: a string, or its text blocks
// concatenated, Claude Code's billing header left out.
func systemText(m anthropicMsg) (string, *Error) {
	c := m.content
	if len(c) > 0 && c[0] == '"' {
		var s string
		_ = json.Unmarshal(c, &s)
		if strings.HasPrefix(s, billingHeader) {
			return "", nil
		}
		return s, nil
	}
	texts, err := anthropicSystem(c, m.param+".content")
	return strings.Join(texts, ""), err
}

// joinText joins the non-empty texts with a blank line.
func joinText(texts ...string) string {
	out := make([]string, 0, len(texts))
	for _, t := range texts {
		if t != "" {
			out = append(out, t)
		}
	}
	return strings.Join(out, "\n\n")
}

// normalizeInlineSystem places the system messages of msgs: the text of
// those leading msgs (for the system message), and the messages that
// follow with the others kept or folded by mode.
func normalizeInlineSystem(system string, msgs []anthropicMsg, mode InlineSystem) (string, []anthropicMsg, *Error) {
	n := 0
	for n < len(msgs) && msgs[n].role == "system" {
		n++
	}
	if n == 0 && !hasSystem(msgs) {
		return "", msgs, nil
	}
	lead := make([]string, n)
	for i, m := range msgs[:n] {
		lead[i], _ = systemText(m) // checked when read
	}
	leading := joinText(lead...)
	rest := moveOutOfToolRuns(msgs[n:])
	if mode == InlineSystemPreserve && (system != "" || leading != "") {
		return leading, rest, nil
	}
	var out []anthropicMsg
	var pending []string // system text after an assistant turn
	for _, m := range rest {
		if m.role == "system" {
			text, _ := systemText(m)
			if text == "" {
				continue
			}
			if k := len(out); k > 0 && out[k-1].role == "user" && len(pending) == 0 {
				c, err := appendToUser(out[k-1].content, text)
				if err != nil {
					return "", nil, err
				}
				out[k-1].content = c
			} else {
				pending = append(pending, text)
			}
			continue
		}
		if len(pending) > 0 {
			text := joinText(pending...)
			pending = pending[:0]
			if m.role == "user" {
				c, err := addText(m.content, text, false)
				if err != nil {
					return "", nil, err
				}
				m.content = c
			} else {
				out = append(out, anthropicMsg{role: "user", content: marshal(text), param: m.param})
			}
		}
		out = append(out, m)
	}
	if len(pending) > 0 {
		out = append(out, anthropicMsg{role: "user", content: marshal(joinText(pending...)), param: "messages"})
	}
	return leading, out, nil
}

func hasSystem(msgs []anthropicMsg) bool {
	for _, m := range msgs {
		if m.role == "system" {
			return true
		}
	}
	return false
}

// moveOutOfToolRuns moves each system message that stands between an
// assistant's tool_use and the message answering it to after that
// message.
func moveOutOfToolRuns(msgs []anthropicMsg) []anthropicMsg {
	out := make([]anthropicMsg, 0, len(msgs))
	var held []anthropicMsg
	awaiting := false
	for _, m := range msgs {
		if m.role == "system" {
			if awaiting {
				held = append(held, m)
			} else {
				out = append(out, m)
			}
			continue
		}
		if m.role == "assistant" {
			out, held = append(out, held...), held[:0]
		}
		out = append(out, m)
		if m.role == "user" {
			out, held = append(out, held...), held[:0]
		}
		awaiting = m.role == "assistant" && hasBlock(m.content, "tool_use")
	}
	return append(out, held...)
}

// blockType is a content block's type ("" none).
func blockType(raw json.RawMessage) string {
	var b struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &b)
	return b.Type
}

// contentBlocks reads content as blocks (ok false: a string or null).
func contentBlocks(content json.RawMessage) ([]json.RawMessage, bool, *Error) {
	if IsNull(content) || content[0] == '"' {
		return nil, false, nil
	}
	var blocks []json.RawMessage
	if json.Unmarshal(content, &blocks) != nil {
		return nil, false, BadRequest("", "messages", "invalid content: want a string or an array of content blocks, got %s", Kind(content))
	}
	return blocks, true, nil
}

func hasBlock(content json.RawMessage, typ string) bool {
	blocks, _, _ := contentBlocks(content)
	for _, b := range blocks {
		if blockType(b) == typ {
			return true
		}
	}
	return false
}

// appendToUser appends text to a user message: to its own text, or, when
// it holds only tool results, to the last one's content (its own text
// then follows the tool messages, so no turn is added either way).
func appendToUser(content json.RawMessage, text string) (json.RawMessage, *Error) {
	blocks, isList, err := contentBlocks(content)
	if err != nil || !isList {
		if err != nil {
			return nil, err
		}
		return addText(content, text, true)
	}
	results := 0
	for _, b := range blocks {
		if blockType(b) == "tool_result" {
			results++
		}
	}
	if len(blocks) > 0 && results == len(blocks) {
		var last map[string]json.RawMessage
		if json.Unmarshal(blocks[len(blocks)-1], &last) != nil {
			return nil, BadRequest("", "messages", "a tool_result block must be an object")
		}
		c, err := addText(bytes.TrimSpace(last["content"]), text, true)
		if err != nil {
			return nil, err
		}
		last["content"] = c
		out := append(append([]json.RawMessage(nil), blocks[:len(blocks)-1]...), marshal(last))
		return marshal(out), nil
	}
	own, tools := []json.RawMessage{}, []json.RawMessage{}
	for _, b := range blocks {
		if blockType(b) == "tool_result" {
			tools = append(tools, b)
		} else {
			own = append(own, b)
		}
	}
	c, err := addText(marshal(own), text, true)
	if err != nil {
		return nil, err
	}
	var added []json.RawMessage
	_ = json.Unmarshal(c, &added)
	return marshal(append(tools, added...)), nil
}

// addText joins text onto the text at one end of content (a string, null
// or blocks): merged into the text block there, as some templates join
// text blocks without a separator, else as a new text block.
func addText(content json.RawMessage, text string, atEnd bool) (json.RawMessage, *Error) {
	blocks, isList, err := contentBlocks(content)
	if err != nil {
		return nil, err
	}
	if !isList {
		var s string
		if !IsNull(content) {
			_ = json.Unmarshal(content, &s)
		}
		if atEnd {
			return marshal(joinText(s, text)), nil
		}
		return marshal(joinText(text, s)), nil
	}
	end := 0
	if atEnd {
		end = len(blocks) - 1
	}
	if len(blocks) > 0 && blockType(blocks[end]) == "text" {
		var b map[string]json.RawMessage
		if json.Unmarshal(blocks[end], &b) != nil {
			return nil, BadRequest("", "messages", "a text block must be an object")
		}
		var old string
		_ = json.Unmarshal(b["text"], &old)
		if atEnd {
			b["text"] = marshal(joinText(old, text))
		} else {
			b["text"] = marshal(joinText(text, old))
		}
		out := append([]json.RawMessage(nil), blocks...)
		out[end] = marshal(b)
		return marshal(out), nil
	}
	block := marshal(map[string]string{"type": "text", "text": text})
	if atEnd {
		return marshal(append(append([]json.RawMessage(nil), blocks...), block)), nil
	}
	return marshal(append([]json.RawMessage{block}, blocks...)), nil
}
