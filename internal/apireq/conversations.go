package apireq

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// The bodies of the Conversations API (OpenAI's; openai-python
// resources/conversations/conversations.py and items.py): a create takes
// optional items (at most 20 input items) and metadata; an update takes
// metadata, required; an add takes items, required (at most 20). Metadata
// is an object of at most 16 string values, keys of at most 64 characters,
// values of at most 512; null is {}. An empty body is {}.

// ConversationOp is which Conversations body is parsed.
type ConversationOp uint8

const (
	// ConversationCreate: POST /v1/conversations.
	ConversationCreate ConversationOp = iota
	// ConversationUpdate: POST /v1/conversations/{id}.
	ConversationUpdate
	// ConversationAddItems: POST /v1/conversations/{id}/items.
	ConversationAddItems
)

// MaxConversationItems bounds the items one create or add carries
// (OpenAI's "up to 20 items at a time").
const MaxConversationItems = 20

// ConversationBody is a validated Conversations body.
type ConversationBody struct {
	// Metadata is the metadata object ({} when absent or null).
	Metadata json.RawMessage
	// Items are the input items as sent (nil when none).
	Items []json.RawMessage
}

// ParseConversation decodes and validates a Conversations body of op.
func ParseConversation(op ConversationOp, body []byte) (*ConversationBody, *Error) {
	top := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(body)) > 0 {
		var err *Error
		if top, err = decodeObject(body); err != nil {
			return nil, err
		}
	}
	out := &ConversationBody{Metadata: json.RawMessage("{}")}
	if op == ConversationCreate || op == ConversationUpdate {
		raw, ok := top["metadata"]
		if !ok && op == ConversationUpdate {
			return nil, Missing("metadata")
		}
		meta, err := conversationMetadata(raw)
		if err != nil {
			return nil, err
		}
		out.Metadata = meta
	}
	if op == ConversationCreate || op == ConversationAddItems {
		items, err := conversationItems(top, op == ConversationAddItems)
		if err != nil {
			return nil, err
		}
		out.Items = items
	}
	return out, nil
}

// conversationMetadata validates metadata as OpenAI does.
func conversationMetadata(raw json.RawMessage) (json.RawMessage, *Error) {
	if raw == nil || IsNull(raw) {
		return json.RawMessage("{}"), nil
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return nil, BadRequest("invalid_type", "metadata", "Invalid type for 'metadata': expected a metadata object, but got %s instead.", Kind(raw))
	}
	if len(m) > 16 {
		return nil, BadRequest("object_above_max_properties", "metadata",
			"Invalid 'metadata': too many properties. Expected an object with at most 16 properties, but got an object with %d properties instead.", len(m))
	}
	for k, v := range m {
		var s string
		switch {
		case utf8.RuneCountInString(k) > 64:
			return nil, BadRequest("", "metadata", "Invalid 'metadata': key %q is longer than 64 characters.", truncate(k, 80))
		case json.Unmarshal(v, &s) != nil:
			return nil, BadRequest("invalid_type", "metadata."+truncate(k, 64), "Invalid type for 'metadata.%s': expected a string, but got %s instead.", truncate(k, 64), Kind(v))
		case utf8.RuneCountInString(s) > 512:
			return nil, BadRequest("string_above_max_length", "metadata."+truncate(k, 64), "Invalid 'metadata.%s': string too long. Expected a string with maximum length 512.", truncate(k, 64))
		}
	}
	out, _ := json.Marshal(m)
	return out, nil
}

// conversationItems validates a body's items (required or not): at most
// MaxConversationItems input items the Responses API takes.
func conversationItems(top map[string]json.RawMessage, required bool) ([]json.RawMessage, *Error) {
	raw, ok := top["items"]
	if !ok || IsNull(raw) {
		if required {
			return nil, Missing("items")
		}
		return nil, nil
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil, BadRequest("invalid_type", "items", "Invalid type for 'items': expected an array of input items, but got %s instead.", Kind(raw))
	}
	if len(items) > MaxConversationItems {
		return nil, BadRequest("array_above_max_length", "items",
			"Invalid 'items': array too long. Expected an array with maximum length %d, but got an array with length %d instead.", MaxConversationItems, len(items))
	}
	if _, err := ItemsHistory(items, "items"); err != nil {
		return nil, err
	}
	return items, nil
}
