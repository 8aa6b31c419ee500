package bench

import (
	"strings"
	"testing"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/prefix"
)

// The replay sends one conversation in every dialect with the same words:
// parsed by the request model the edge uses, all three give the chat
// conversation's block keys; and each dialect's stream events are read.
func TestRequestBodiesKeyAlike(t *testing.T) {
	msgs := []prefix.Message{{Role: "system", Content: strings.Repeat("rules ", 100)}, {Role: "user", Content: strings.Repeat("ask ", 70)}}
	var want []uint64
	for _, api := range append([]string{""}, APIs...) {
		b, err := requestBody(api, "m", "conv-1", msgs, 8)
		if err != nil {
			t.Fatal(err)
		}
		d := map[string]apireq.Dialect{"": apireq.Chat, "chat": apireq.Chat, "messages": apireq.Messages, "responses": apireq.Responses}[api]
		r, aerr := apireq.Parse(d, b)
		if aerr != nil {
			t.Fatalf("%s: %v: %s", api, aerr, b)
		}
		got := prefix.BlockHashes(r.WordTokens(), 64)
		if want == nil {
			want = got
		}
		if len(got) < 2 || len(got) != len(want) || got[len(got)-1] != want[len(want)-1] {
			t.Fatalf("%s: %d blocks, chat %d", api, len(got), len(want))
		}
	}
	for _, c := range []struct {
		api, data      string
		text, usage    bool
		prompt, cached int
	}{
		{"messages", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}`, true, false, 0, 0},
		{"messages", `{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":10,"cache_read_input_tokens":64,"output_tokens":8}}`, false, true, 74, 64},
		{"responses", `{"type":"response.output_text.delta","delta":"hi","sequence_number":4}`, true, false, 0, 0},
		{"responses", `{"type":"response.completed","response":{"usage":{"input_tokens":74,"input_tokens_details":{"cached_tokens":64}}}}`, false, true, 74, 64},
		{"responses", `{"type":"response.incomplete","response":{"usage":{"input_tokens":74,"input_tokens_details":{"cached_tokens":64}}}}`, false, true, 74, 64},
		{"chat", `{"choices":[],"usage":{"prompt_tokens":74,"prompt_tokens_details":{"cached_tokens":64}}}`, false, true, 74, 64},
	} {
		ev, err := readEvent(c.api, []byte(c.data))
		if err != nil || ev.text != c.text || ev.usage != c.usage || ev.prompt != c.prompt || ev.cached != c.cached {
			t.Errorf("%s %s: %+v %v", c.api, c.data, ev, err)
		}
	}
	if _, err := readEvent("messages", []byte(`{"type":"error","error":{"type":"api_error","message":"x"}}`)); err == nil {
		t.Error("an error event was not an error")
	}
}
