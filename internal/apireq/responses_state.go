package apireq

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// State a Responses request carries besides its prompt: what it asks to be
// included in its output items (include), its reasoning summary, the
// reasoning of earlier turns handed back as encrypted_content, and a
// conversation's items put before its input.

// IncludeEncryptedReasoning is the include value that asks reasoning items
// to carry encrypted_content (OpenAI's ResponseIncludable).
const IncludeEncryptedReasoning = "reasoning.encrypted_content"

// reasoningBlobPrefix starts every encrypted_content this package writes
// (ReasoningBlob): the format's name and version, then base64url of the
// reasoning text.
const reasoningBlobPrefix = "tether-rs1."

// ReasoningBlob is the encrypted_content of a reasoning item whose text is
// text: an opaque value the client hands back with the item (Codex does,
// with store: false) so the next turn's prompt holds the reasoning again.
// It is an encoding, not a cipher: a tether reasoning item also shows its
// text in content (reasoning_text), so the blob hides nothing; it must
// only survive the client's round trip and be readable by whichever edge
// (prompt keys) and worker (the prompt) the next turn reaches, with no
// key and no state. vLLM refuses encrypted_content on input
// (vllm/entrypoints/openai/responses/utils.py
// _construct_message_from_response_item: "Encrypted content is not
// supported."); this follows the encoded replay its Responses frontend
// proposes for store: false clients.
func ReasoningBlob(text string) string {
	return reasoningBlobPrefix + base64.RawURLEncoding.EncodeToString([]byte(text))
}

// readReasoningBlob decodes a ReasoningBlob.
func readReasoningBlob(blob string) (string, bool) {
	enc, ok := strings.CutPrefix(blob, reasoningBlobPrefix)
	if !ok {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

// parseEchoed checks the request fields a response object repeats as sent
// (the worker echoes them): user, safety_identifier, prompt_cache_key and
// service_tier are strings; truncation is auto or disabled (OpenAI's
// Response.truncation).
func (r *Request) parseEchoed() *Error {
	for _, name := range []string{"user", "safety_identifier", "prompt_cache_key", "service_tier", "prompt_cache_retention"} {
		if _, _, err := r.String(name); err != nil {
			return err
		}
	}
	t, ok, err := r.String("truncation")
	if err != nil {
		return err
	}
	if ok && t != "auto" && t != "disabled" {
		return BadRequest("", "truncation", "Invalid value: '%s'. Supported values are: 'auto' and 'disabled'.", truncate(t, 40))
	}
	return nil
}

// parseInclude reads include: an array of strings (values this server has
// nothing to add for are accepted and ignored, as future OpenAI values
// would be).
func (r *Request) parseInclude(rf *ResponsesFields) *Error {
	raw, ok := r.Present("include")
	if !ok {
		return nil
	}
	var vals []json.RawMessage
	if json.Unmarshal(raw, &vals) != nil {
		return BadRequest("invalid_type", "include", "invalid type for \"include\": want an array of strings, got %s", Kind(raw))
	}
	for i, v := range vals {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return BadRequest("invalid_type", fmt.Sprintf("include[%d]", i), "invalid type for \"include[%d]\": want a string, got %s", i, Kind(v))
		}
		if s == IncludeEncryptedReasoning {
			rf.EncryptedReasoning = true
		}
	}
	return nil
}

// parseReasoning reads reasoning.effort and reasoning.summary: a request
// reasons when it names an effort other than none or minimal, or asks for
// a summary without naming an effort (OpenAI's reasoning models reason by
// default); summary is auto, concise or detailed (OpenAI's
// shared/reasoning.py).
func (r *Request) parseReasoning(rf *ResponsesFields) *Error {
	raw, ok := r.Present("reasoning")
	if !ok {
		return nil
	}
	var re struct {
		Effort  *string         `json:"effort"`
		Summary json.RawMessage `json:"summary"`
	}
	if json.Unmarshal(raw, &re) != nil {
		return BadRequest("", "reasoning", "invalid reasoning: want an object")
	}
	if !IsNull(re.Summary) {
		var s string
		if json.Unmarshal(re.Summary, &s) != nil {
			return BadRequest("invalid_type", "reasoning.summary", "invalid type for \"reasoning.summary\": want one of auto, concise or detailed, got %s", Kind(re.Summary))
		}
		if s != "auto" && s != "concise" && s != "detailed" {
			return BadRequest("", "reasoning.summary", "Invalid value: '%s'. Supported values are: 'concise', 'detailed', and 'auto'.", truncate(s, 40))
		}
		rf.ReasoningSummary = s
	}
	if re.Effort != nil && !knownEffort(*re.Effort) {
		return BadRequest("invalid_value", "reasoning.effort", "Invalid value: '%s'. Supported values are: %s.", truncate(*re.Effort, 40), quotedList(reasoningEfforts))
	}
	switch {
	case re.Effort != nil:
		r.Thinking = *re.Effort != "none" && *re.Effort != "minimal"
	default:
		r.Thinking = rf.ReasoningSummary != ""
	}
	return nil
}

// reasoningEfforts are the efforts a reasoning parameter may name
// (openai-python types/shared/reasoning_effort.py); null is none named.
var reasoningEfforts = []string{"none", "minimal", "low", "medium", "high", "xhigh", "max"}

func knownEffort(e string) bool {
	for _, x := range reasoningEfforts {
		if x == e {
			return true
		}
	}
	return false
}

// openReasoning returns items with every reasoning item's encrypted_content
// read back: an item with content keeps its content (the blob is not
// needed), one without gets the blob's text as its content; either way the
// encrypted_content field is gone, so the conversion reads the item as any
// reasoning item. A blob of another provider's (a session begun there) is
// accepted and not read: the item's summary is its text, as vLLM renders
// no encrypted reasoning. A damaged blob of this package's is a 400 in
// OpenAI's shape (invalid_encrypted_content).
// items is not modified; param names the list ("input").
func openReasoning(items []json.RawMessage, param string) ([]json.RawMessage, *Error) {
	var out []json.RawMessage
	for i, raw := range items {
		if !bytes.Contains(raw, []byte(`"encrypted_content"`)) {
			continue
		}
		var it map[string]json.RawMessage
		if json.Unmarshal(raw, &it) != nil {
			continue // the conversion says what is wrong with it
		}
		var typ, blob string
		_ = json.Unmarshal(it["type"], &typ)
		if typ != "reasoning" || json.Unmarshal(it["encrypted_content"], &blob) != nil {
			continue
		}
		delete(it, "encrypted_content")
		if content := it["content"]; IsNull(content) || bytes.Equal(bytes.TrimSpace(content), []byte("[]")) {
			text, ok := readReasoningBlob(blob)
			// Another provider's blob (a session begun elsewhere) cannot be
			// read back: the item stays, its summary its only text. One
			// of tether's own that does not decode was damaged.
			if !ok && strings.HasPrefix(blob, reasoningBlobPrefix) {
				p := fmt.Sprintf("%s[%d].encrypted_content", param, i)
				return nil, BadRequest("invalid_encrypted_content", p,
					"The encrypted content for item %s[%d] could not be verified: it is not a reasoning blob as tether wrote it (want the encrypted_content of a reasoning item it returned, unchanged)", param, i)
			}
			if ok {
				it["content"] = marshal([]textPart{{Type: "reasoning_text", Text: text}})
			}
		}
		if out == nil {
			out = append([]json.RawMessage(nil), items...)
		}
		out[i] = marshal(it)
	}
	if out == nil {
		return items, nil
	}
	return out, nil
}

// responsesItems converts input items to chat messages, encrypted
// reasoning read back first; param names the list in errors.
func responsesItems(items []json.RawMessage, param string) ([]chatMessage, *Error) {
	opened, err := openReasoning(items, param)
	if err != nil {
		return nil, err
	}
	msgs, err := responsesInput(opened)
	if err != nil && param != "input" {
		err.Param = strings.Replace(err.Param, "input", param, 1)
		err.Message = strings.ReplaceAll(err.Message, "input[", param+"[")
	}
	return msgs, err
}

// ItemsHistory is a list of Responses items (a conversation's) as chat
// messages for WithHistory; param names the list in errors ("items").
func ItemsHistory(items []json.RawMessage, param string) ([]json.RawMessage, *Error) {
	msgs, err := responsesItems(items, param)
	if err != nil {
		return nil, err
	}
	out := make([]json.RawMessage, len(msgs))
	for i, m := range msgs {
		out[i] = marshal(m)
	}
	return out, nil
}
