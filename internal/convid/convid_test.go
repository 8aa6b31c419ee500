package convid

import (
	"encoding/json"
	"net/http"
	"testing"
)

func TestConversationIDPrecedence(t *testing.T) {
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	cases := []struct {
		name string
		body string
		hdr  http.Header
		want string
	}{
		{"body beats headers", "body-id", h("X-Session-Id", "hdr-id"), "body-id"},
		{"blank body falls through", "   ", h("X-Session-Id", "hdr-id"), "hdr-id"},
		{"x-session-id first", "", h("X-Correlation-Id", "corr", "X-Session-Id", "sess"), "sess"},
		{"blank header skipped", "", h("X-Session-Id", " \t", "X-Correlation-Id", "corr"), "corr"},
		{"session-affinity", "", h("X-Session-Affinity", "aff"), "aff"},
		{"multi-turn", "", h("X-Multi-Turn-Session-Id", "mt"), "mt"},
		{"case-insensitive names", "", http.Header{"x-session-id": nil}, ""},
		{"trimmed", "", h("X-Session-Id", "  padded  "), "padded"},
		{"none", "", h("X-Other", "x"), ""},
		// TensorRT-LLM's order (tensorrt_llm/serve/conversation_id.py):
		// Claude Code's session headers before x-session-id.
		{"claude code first", "", h("X-Session-Id", "sess", "X-Claude-Code-Session-Id", "cc", "X-Claude-Session-Id", "cl"), "cc"},
		{"claude session next", "", h("X-Session-Id", "sess", "X-Claude-Session-Id", "cl"), "cl"},
		{"blank claude header skipped", "", h("X-Claude-Code-Session-Id", " ", "X-Session-Id", "sess"), "sess"},
		{"body beats claude", "body-id", h("X-Claude-Code-Session-Id", "cc"), "body-id"},
	}
	for _, c := range cases {
		if got := Resolve(c.body, c.hdr); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

func TestHeaderValueCaseInsensitive(t *testing.T) {
	h := http.Header{}
	h.Set("x-dynamo-parent-session-id", "parent-1")
	if got := Header(h, "X-Dynamo-Parent-Session-ID"); got != "parent-1" {
		t.Fatalf("got %q", got)
	}
	if got := Header(h, ""); got != "" {
		t.Fatalf("unset header name must give no value, got %q", got)
	}
}

func TestClientConversationID(t *testing.T) {
	for body, want := range map[string]string{
		`{"prompt_cache_key":" thread-1 ","client_metadata":{"thread_id":"t2"}}`:          "thread-1",
		`{"prompt_cache_key":"  ","client_metadata":{"thread_id":"t2","session_id":"s"}}`: "t2",
		`{"client_metadata":{"session_id":"s"}}`:                                          "s",
		`{"client_metadata":"not an object","prompt_cache_key":7}`:                        "",
		`{}`: "",
	} {
		var top map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &top); err != nil {
			t.Fatal(err)
		}
		if got := FromClientFields(top); got != want {
			t.Errorf("%s: got %q, want %q", body, got, want)
		}
	}
}
