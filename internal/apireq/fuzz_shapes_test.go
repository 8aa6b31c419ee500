package apireq

import (
	"encoding/json"
	"strings"
	"testing"
)

// One fuzz target per agent request shape, beside FuzzParse (every
// dialect's Parse). Each holds the package's contract for any body: an
// answer or a 400 invalid_request_error with a message, never a panic, a
// chat form that is JSON, and the same outcome for the same body. Seed
// corpora: inline below and under testdata/fuzz/<target> (the captured
// clients' bodies among them).

// checkRefusal fails on an error that is not a client's 400 with a
// message.
func checkRefusal(t *testing.T, what string, err *Error) {
	t.Helper()
	if err.Status != 400 || err.Type != "invalid_request_error" || err.Message == "" {
		t.Fatalf("%s: not a 400 invalid_request_error with a message: %+v", what, err)
	}
}

// checkChatForm fails when r's chat form is not JSON or its flattened
// messages do not follow it.
func checkChatForm(t *testing.T, what string, r *Request) {
	t.Helper()
	b, err := json.Marshal(r.Chat)
	if err != nil || !json.Valid(b) {
		t.Fatalf("%s: the chat form is not JSON: %v", what, err)
	}
	_ = r.WordTokens()
}

// FuzzMessagesInlineSystem: a Messages body (and the same as count_tokens)
// with its inline system messages placed by either mode, in either order.
func FuzzMessagesInlineSystem(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":4,"system":"be brief","messages":[{"role":"user","content":"hi"},{"role":"system","content":"note"},{"role":"assistant","content":"ok"}]}`,
		`{"model":"m","max_tokens":4,"messages":[{"role":"system","content":"lead"},{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},{"role":"system","content":"between"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r"}]}]}`,
		`{"model":"m","max_tokens":4,"system":[{"type":"text","text":"x-anthropic-billing-header: cc"},{"type":"text","text":"s"}],"messages":[{"role":"user","content":"hi"},{"role":"system","content":[{"type":"text","text":"tail"}]}]}`,
		`{"model":"m","max_tokens":4,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"hi"}]}`,
	} {
		f.Add([]byte(s), uint8(0))
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, body []byte, first uint8) {
		modes := []InlineSystem{InlineSystemPreserve, InlineSystemFold}
		if first%2 == 1 {
			modes[0], modes[1] = modes[1], modes[0]
		}
		r, err := Parse(Messages, body)
		if err != nil {
			checkRefusal(t, "parse", err)
			if _, again := Parse(Messages, body); again == nil || again.Message != err.Message {
				t.Fatalf("the same body parsed twice: %v, then %v", err, again)
			}
			return
		}
		checkChatForm(t, "parse", r)
		for _, m := range append(modes, modes[0]) {
			if err := r.WithInlineSystem(m); err != nil {
				checkRefusal(t, m.String(), err)
				continue
			}
			checkChatForm(t, m.String(), r)
		}
		if c, err := ParseCountTokens(body); err != nil {
			checkRefusal(t, "count_tokens", err)
		} else {
			checkChatForm(t, "count_tokens", c)
		}
	})
}

// FuzzResponsesToolsAndItems: a Responses body (the tool union, tool
// choice, input items, reasoning), then what a worker does with it: a
// previous response's history put before its input, item references
// resolved.
func FuzzResponsesToolsAndItems(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"hi","tools":[{"type":"function","name":"f","parameters":{"type":"object"}},{"type":"web_search"}],"tool_choice":{"type":"function","name":"f"}}`,
		`{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"x"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}],"tools":[{"type":"function","name":"f"}]}`,
		`{"model":"m","instructions":"be brief","input":[{"type":"item_reference","id":"msg_1"}],"tools":[{"type":"namespace","name":"ns","tools":[{"type":"function","name":"g"},{"type":"custom","name":"h"}]}]}`,
		`{"model":"m","input":"x","reasoning":{"effort":"high","summary":"auto"},"include":["reasoning.encrypted_content"],"store":false}`,
		`{"model":"m","input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"s"}],"encrypted_content":"x"}],"previous_response_id":"resp_1"}`,
		`{"model":"m","input":"x","tools":[{"type":"mcp","server_label":"s"},{"type":"apply_patch"},{"type":"shell"}],"tool_choice":"required"}`,
	} {
		f.Add([]byte(s), []byte(`[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"before"}]}]`))
	}
	f.Fuzz(func(t *testing.T, body, history []byte) {
		r, err := Parse(Responses, body)
		if err != nil {
			checkRefusal(t, "parse", err)
			return
		}
		checkChatForm(t, "parse", r)
		for _, ref := range r.Responses.ItemReferences() {
			if ref == "" {
				t.Fatalf("an empty item reference from %s", body)
			}
		}
		if err := r.ResolveItems(func(id string) (json.RawMessage, bool) {
			return json.RawMessage(`{"type":"message","role":"user","content":"resolved ` + strings.ReplaceAll(id, `"`, ``) + `"}`), len(id)%2 == 0
		}); err != nil {
			checkRefusal(t, "resolve", err)
		}
		var items []json.RawMessage
		if json.Unmarshal(history, &items) != nil {
			return
		}
		h, err := ItemsHistory(items, "history")
		if err != nil {
			checkRefusal(t, "history", err)
			return
		}
		if err := r.WithHistory(h); err != nil {
			checkRefusal(t, "with history", err)
			return
		}
		checkChatForm(t, "with history", r)
	})
}

// FuzzConversationBodies: a Conversations body as a create, an update and
// an add of items.
func FuzzConversationBodies(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `{"metadata":{"topic":"demo"}}`, `{"metadata":null,"items":null}`,
		`{"items":[{"type":"message","role":"user","content":"hello"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}]}`,
		`{"metadata":{"a":"b"},"items":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, op := range []ConversationOp{ConversationCreate, ConversationUpdate, ConversationAddItems} {
			cb, err := ParseConversation(op, body)
			if err != nil {
				checkRefusal(t, "conversation", err)
				continue
			}
			var m map[string]string
			if json.Unmarshal(cb.Metadata, &m) != nil || len(m) > 16 {
				t.Fatalf("op %d: metadata %s is not an object of at most 16 strings", op, cb.Metadata)
			}
			if len(cb.Items) > MaxConversationItems || (op == ConversationAddItems && cb.Items == nil) {
				t.Fatalf("op %d: %d items", op, len(cb.Items))
			}
			for _, it := range cb.Items {
				if !json.Valid(it) {
					t.Fatalf("op %d: an item that is not JSON: %s", op, it)
				}
			}
		}
	})
}
