package apireq

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tether-project/tether/internal/prefix"
)

// parseChat validates a chat completions body: its messages are the chat
// form as they are.
func (r *Request) parseChat() *Error {
	if err := r.parseOpenAICommon(); err != nil {
		return err
	}
	if _, ok := r.Top["prompt"]; ok {
		return BadRequest("", "prompt", "prompt is not a chat completions parameter (use messages, or POST /v1/completions)")
	}
	raw, ok := r.Present("messages")
	if !ok {
		return Missing("messages")
	}
	msgs, err := FlattenMessages(raw)
	if err != nil {
		return err
	}
	r.Chat, r.Messages = r.Top, msgs
	return nil
}

// parseCompletions validates a completions body.
func (r *Request) parseCompletions() *Error {
	if err := r.parseOpenAICommon(); err != nil {
		return err
	}
	if _, ok := r.Top["messages"]; ok {
		return BadRequest("", "messages", "messages is not a completions parameter (use prompt, or POST /v1/chat/completions)")
	}
	return r.parsePrompt(r.Top["prompt"])
}

// FlattenMessages validates OpenAI chat messages (a JSON array) and
// flattens each one's content to text: a string, or its text parts joined
// by newlines, or "" for null. Errors name the message as messages[i].
func FlattenMessages(raw json.RawMessage) ([]prefix.Message, *Error) {
	var msgs []struct {
		Role    json.RawMessage `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) && typ.Field != "" {
			return nil, BadRequest("", "messages", "every message must be an object with role and content: %v", err)
		}
		return nil, BadRequest("", "messages", "invalid type for \"messages\": want an array of messages, got %s", Kind(raw))
	}
	if len(msgs) == 0 {
		return nil, BadRequest("", "messages", "messages must contain at least one message")
	}
	out := make([]prefix.Message, len(msgs))
	for i, m := range msgs {
		var role string
		if err := json.Unmarshal(m.Role, &role); err != nil || strings.TrimSpace(role) == "" {
			return nil, BadRequest("", fmt.Sprintf("messages[%d].role", i), "messages[%d].role is required (a non-empty string)", i)
		}
		if !knownRoles[role] {
			return nil, BadRequest("", fmt.Sprintf("messages[%d].role", i),
				"messages[%d].role %q is not a chat role (system, developer, user, assistant, tool)", i, truncate(role, 40))
		}
		content, err := FlattenContent(m.Content)
		if err != nil {
			return nil, BadRequest("", fmt.Sprintf("messages[%d].content", i), "messages[%d].content: %v", i, err)
		}
		out[i] = prefix.Message{Role: role, Content: content}
	}
	return out, nil
}

// FlattenContent turns a chat message's content into the text both edges
// and workers key: a string, or text parts joined by newlines, or "" for
// null. Parts other than text (images, audio) are an error: the edge
// cannot render them as the engine would.
func FlattenContent(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return "", nil
	case raw[0] == '"':
		// Fast path: no escapes and valid UTF-8 (the decoder already
		// validated the JSON) is the text between the quotes.
		if len(raw) >= 2 && raw[len(raw)-1] == '"' {
			if inner := raw[1 : len(raw)-1]; bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
				return string(inner), nil
			}
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		return s, nil
	case raw[0] == '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", err
		}
		var sb strings.Builder
		for i, p := range parts {
			var part struct {
				Type *string `json:"type"`
				Text *string `json:"text"`
			}
			if err := json.Unmarshal(p, &part); err != nil {
				return "", fmt.Errorf("part %d: want an object with type and text", i)
			}
			if part.Type == nil || *part.Type != "text" {
				t := "missing"
				if part.Type != nil {
					t = strconv.Quote(*part.Type)
				}
				return "", fmt.Errorf("part %d: content part type %s is not supported (only \"text\")", i, t)
			}
			if part.Text == nil {
				return "", fmt.Errorf("part %d: text part without a text string", i)
			}
			if i > 0 {
				sb.WriteByte('\n')
			}
			sb.WriteString(*part.Text)
		}
		return sb.String(), nil
	}
	return "", errors.New("want a string or an array of content parts")
}

// parsePrompt reads a completions prompt: a string, an array of one
// string, or an array of token ids.
func (r *Request) parsePrompt(raw json.RawMessage) *Error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return Missing("prompt")
	}
	switch raw[0] {
	case '"':
		if err := json.Unmarshal(raw, &r.Prompt); err != nil {
			return BadRequest("", "prompt", "prompt: %v", err)
		}
	case '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return BadRequest("", "prompt", "prompt: %v", err)
		}
		if len(elems) == 0 {
			return BadRequest("", "prompt", "prompt must not be an empty array")
		}
		first := bytes.TrimSpace(elems[0])
		switch {
		case len(first) > 0 && first[0] == '"':
			if len(elems) != 1 {
				return BadRequest("", "prompt", "batched prompts (%d strings) are not supported; send one request per prompt", len(elems))
			}
			if err := json.Unmarshal(first, &r.Prompt); err != nil {
				return BadRequest("", "prompt", "prompt[0]: %v", err)
			}
		case len(first) > 0 && first[0] == '[':
			return BadRequest("", "prompt", "batched token prompts are not supported; send one request per prompt")
		default:
			toks := make([]uint32, len(elems))
			for i, e := range elems {
				var v int64
				if err := json.Unmarshal(e, &v); err != nil || v < 0 || v > 1<<31-1 {
					return BadRequest("", "prompt", "prompt[%d]: want a token id (an integer 0..%d), got %s", i, 1<<31-1, truncate(string(e), 40))
				}
				toks[i] = uint32(v)
			}
			r.PromptIDs = toks
		}
	default:
		return BadRequest("", "prompt", "prompt must be a string, an array of one string, or an array of token ids; got %s", Kind(raw))
	}
	if r.PromptIDs == nil && strings.TrimSpace(r.Prompt) == "" {
		return BadRequest("", "prompt", "the prompt is empty (no tokens)")
	}
	return nil
}
