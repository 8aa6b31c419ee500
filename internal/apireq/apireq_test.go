package apireq

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/prefix"
)

func mustParse(t *testing.T, d Dialect, body string) *Request {
	t.Helper()
	r, err := Parse(d, []byte(body))
	if err != nil {
		t.Fatalf("%s %s: %v", d, body, err)
	}
	return r
}

func chatMessages(t *testing.T, r *Request) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(r.Chat["messages"], &v); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func TestMessagesToChatForm(t *testing.T) {
	r := mustParse(t, Messages, `{"model":"m","max_tokens":64,"stream":true,
		"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1;"},{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],
		"messages":[
		 {"role":"user","content":"list files"},
		 {"role":"assistant","content":[{"type":"thinking","thinking":"use ls","signature":"s"},{"type":"text","text":"Running ls."},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]},
		 {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"a.go"},{"type":"text","text":"b.go"}]},{"type":"text","text":"now read a.go"}]}],
		"tools":[{"name":"Bash","description":"run","input_schema":{"type":"object","properties":{"command":{"type":"string"}}}}],
		"metadata":{"user_id":"u"},"temperature":0.5}`)
	want := `[{"content":"You are Claude Code.","role":"system"},{"content":"list files","role":"user"},` +
		`{"content":"Running ls.","reasoning":"use ls","role":"assistant","tool_calls":[{"function":{"arguments":"{\"command\": \"ls\"}","name":"Bash"},"id":"toolu_1","type":"function"}]},` +
		`{"content":"a.go\nb.go","role":"tool","tool_call_id":"toolu_1"},{"content":"now read a.go","role":"user"}]`
	if got := chatMessages(t, r); got != want {
		t.Fatalf("chat messages:\n got %s\nwant %s", got, want)
	}
	if r.MaxTokens != 64 || !r.Stream || !r.IncludeUsage {
		t.Fatalf("max %d stream %v usage %v", r.MaxTokens, r.Stream, r.IncludeUsage)
	}
	if string(r.Chat["tool_choice"]) != `"auto"` || !strings.Contains(string(r.Chat["tools"]), `"parameters":{"type":"object"`) {
		t.Fatalf("tools %s choice %s", r.Chat["tools"], r.Chat["tool_choice"])
	}
	if string(r.Chat["temperature"]) != "0.5" {
		t.Fatalf("temperature %s", r.Chat["temperature"])
	}
	wantFlat := []prefix.Message{{Role: "system", Content: "You are Claude Code."}, {Role: "user", Content: "list files"},
		{Role: "assistant", Content: "Running ls."}, {Role: "tool", Content: "a.go\nb.go"}, {Role: "user", Content: "now read a.go"}}
	if len(r.Messages) != len(wantFlat) {
		t.Fatalf("flat %+v", r.Messages)
	}
	for i := range wantFlat {
		if r.Messages[i] != wantFlat[i] {
			t.Fatalf("flat[%d] = %+v, want %+v", i, r.Messages[i], wantFlat[i])
		}
	}
}

func TestResponsesToChatForm(t *testing.T) {
	r := mustParse(t, Responses, `{"model":"m","instructions":"Be brief.","max_output_tokens":32,
		"input":[{"role":"user","content":[{"type":"input_text","text":"weather in Paris?"}]},
		 {"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"call the tool"}]},
		 {"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
		 {"type":"function_call_output","call_id":"call_1","output":"sunny"},
		 {"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"Sunny.","annotations":[]}]}],
		"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"},"strict":true}],
		"tool_choice":{"type":"function","name":"get_weather"},
		"text":{"format":{"type":"json_schema","name":"w","schema":{"type":"object"},"strict":true}},
		"store":false,"prompt_cache_key":"thread-1"}`)
	want := `[{"content":"Be brief.","role":"system"},{"content":"weather in Paris?","role":"user"},` +
		`{"content":null,"reasoning":"call the tool","role":"assistant","tool_calls":[{"function":{"arguments":"{\"city\":\"Paris\"}","name":"get_weather"},"id":"call_1","type":"function"}]},` +
		`{"content":"sunny","role":"tool","tool_call_id":"call_1"},{"content":"Sunny.","role":"assistant"}]`
	if got := chatMessages(t, r); got != want {
		t.Fatalf("chat messages:\n got %s\nwant %s", got, want)
	}
	if r.Responses.Store || r.MaxTokens != 32 {
		t.Fatalf("store %v max %d", r.Responses.Store, r.MaxTokens)
	}
	if !strings.Contains(string(r.Chat["response_format"]), `"json_schema"`) || !strings.Contains(string(r.Chat["tool_choice"]), `"name":"get_weather"`) {
		t.Fatalf("format %s choice %s", r.Chat["response_format"], r.Chat["tool_choice"])
	}
	// A previous response's history goes after the instructions, the
	// system messages of its input kept (History holds no instructions).
	hist := []json.RawMessage{json.RawMessage(`{"role":"system","content":"old"}`), json.RawMessage(`{"role":"user","content":"hi"}`),
		AssistantMessage("hello", "", nil)}
	if err := r.WithHistory(hist); err != nil {
		t.Fatal(err)
	}
	if got := chatMessages(t, r); !strings.HasPrefix(got, `[{"content":"Be brief.","role":"system"},{"content":"old","role":"system"},{"content":"hi","role":"user"},{"content":"hello","role":"assistant"},{"content":"weather in Paris?"`) {
		t.Fatalf("with history: %s", got)
	}
	if h := r.History(); len(h) != 7 || !strings.Contains(string(h[0]), `"old"`) {
		t.Fatalf("history %d %s", len(h), h)
	}
	s := mustParse(t, Responses, `{"model":"m","input":"hello","stream":true}`)
	if got := chatMessages(t, s); got != `[{"content":"hello","role":"user"}]` || !s.Responses.Store || !s.IncludeUsage {
		t.Fatalf("string input: %s store %v", got, s.Responses.Store)
	}
}

func TestEquivalentConversationsKeyAlike(t *testing.T) {
	chat := mustParse(t, Chat, `{"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"q one"},{"role":"assistant","content":"a one"},{"role":"user","content":"q two"}]}`)
	msgs := mustParse(t, Messages, `{"model":"m","max_tokens":8,"system":"sys","messages":[{"role":"user","content":"q one"},{"role":"assistant","content":[{"type":"text","text":"a one"}]},{"role":"user","content":"q two"}]}`)
	resp := mustParse(t, Responses, `{"model":"m","instructions":"sys","input":[{"role":"user","content":"q one"},{"role":"assistant","content":[{"type":"output_text","text":"a one"}]},{"role":"user","content":"q two"}]}`)
	want := prefix.BlockHashes(chat.WordTokens(), 2)
	for _, r := range []*Request{msgs, resp} {
		got := prefix.BlockHashes(r.WordTokens(), 2)
		if len(got) == 0 || len(got) != len(want) {
			t.Fatalf("%s: %d blocks, chat %d", r.Dialect, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: block %d differs", r.Dialect, i)
			}
		}
	}
}

func TestRefusals(t *testing.T) {
	cases := []struct {
		d          Dialect
		body       string
		param, msg string
	}{
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"}`, "temperature", `invalid type for "temperature": want a number, got a string`},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":0}`, "top_p", "top_p must be in (0, 1]"},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"seed":1.5}`, "seed", "want an integer"},
		{Completions, `{"model":"m","prompt":"x","temperature":-1}`, "temperature", "non-negative"},
		{Messages, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens", "max_tokens is required"},
		{Messages, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"top_k":"1"}`, "top_k", "want an integer"},
		{Messages, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, "messages[0].content[0].type", "image blocks are not supported"},
		{Messages, `{"model":"m","max_tokens":1,"messages":[{"role":"tool","content":"x"}]}`, "messages[0].role", "not a Messages role"},
		{Responses, `{"model":"m","input":"x","temperature":"hot"}`, "temperature", "want a number"},
		{Responses, `{"model":"m"}`, "input", "input is required"},
		{Responses, `{"model":"m","input":"x","background":true,"store":false}`, "background", "needs store"},
		{Responses, `{"model":"m","input":[{"type":"item_referense","id":"x"}]}`, "input[0].type", "not an input item type"},
		{Responses, `{"model":"m","input":[{"type":"item_reference"}]}`, "input[0].id", "id is required"},
		{Responses, `{"model":"m","input":"x","tools":[{"name":"f"}]}`, "tools[0].type", "type is required"},
		{Responses, `{"model":"m","input":"x","tools":[{"type":"namespace","tools":[]}]}`, "tools[0].name", "name is required"},
		{Responses, `{"model":"m","input":"x","tools":[{"type":"namespace","name":"n","tools":[{"type":"function"}]}]}`, "tools[0].tools[0].name", "name is required"},
		{Responses, `{"model":"m","input":"x","tool_choice":{"type":"function"}}`, "tool_choice.name", "name is required"},
		{Responses, `{"model":"m","input":"x","previous_response_id":"a","conversation":"c"}`, "previous_response_id", "cannot be used together"},
		{Responses, `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, "input[0].content[0].type", "not supported"},
	}
	for _, c := range cases {
		_, err := Parse(c.d, []byte(c.body))
		if err == nil {
			t.Errorf("%s %s: accepted", c.d, c.body)
			continue
		}
		if err.Status != 400 || err.Param != c.param || !strings.Contains(err.Message, c.msg) {
			t.Errorf("%s %s: %d %q %q, want param %q and %q", c.d, c.body, err.Status, err.Param, err.Message, c.param, c.msg)
		}
	}
}

func TestErrorShapes(t *testing.T) {
	e := BadRequest("", "max_tokens", "max_tokens is required")
	w := httptest.NewRecorder()
	e.Write(w, Messages)
	if w.Code != 400 || strings.TrimSpace(w.Body.String()) != `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens is required"}}` {
		t.Fatalf("anthropic: %d %s", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	e.Write(w, Responses)
	if strings.TrimSpace(w.Body.String()) != `{"error":{"message":"max_tokens is required","type":"invalid_request_error","param":"max_tokens","code":"invalid_value"}}` {
		t.Fatalf("openai: %s", w.Body)
	}
	for status, typ := range map[int]string{404: "not_found_error", 429: "rate_limit_error", 503: "api_error", 529: "overloaded_error", 413: "request_too_large"} {
		if got := AnthropicType(status); got != typ {
			t.Errorf("AnthropicType(%d) = %s, want %s", status, got, typ)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"model":"m","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"x"}]}]}`,
		`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"n","arguments":"{}"}]}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, d := range []Dialect{Chat, Completions, Messages, Responses} {
			r, err := Parse(d, []byte(body))
			if err != nil {
				if err.Status != 400 || err.Message == "" {
					t.Fatalf("%s: %+v", d, err)
				}
				continue
			}
			_ = r.WordTokens()
		}
	})
}

// A body that is not UTF-8 is not JSON (RFC 8259 section 8.1), in any
// dialect: it is refused with a 400 naming the offset, where the decoder
// would otherwise read the bytes as U+FFFD and serve a prompt the client
// never wrote (a Messages prompt with \xff\xfe was answered 200).
func TestBodyNotUTF8IsRefused(t *testing.T) {
	bodies := map[Dialect]string{
		Chat:        `{"model":"m","messages":[{"role":"user","content":"hi X"}]}`,
		Completions: `{"model":"m","prompt":"hi X"}`,
		Messages:    `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi X"}]}`,
		Responses:   `{"model":"m","input":"hi X"}`,
	}
	for d, body := range bodies {
		if _, err := Parse(d, []byte(body)); err != nil {
			t.Fatalf("%s: the valid body: %v", d, err)
		}
		bad := strings.Replace(body, "X", "\xff\xfe", 1)
		_, err := Parse(d, []byte(bad))
		if err == nil || err.Status != 400 || err.Type != "invalid_request_error" || !strings.Contains(err.Message, "not UTF-8") ||
			!strings.Contains(err.Message, fmt.Sprintf("offset %d", strings.Index(bad, "\xff"))) {
			t.Errorf("%s with invalid UTF-8: %+v", d, err)
		}
	}
	if _, err := ParseCountTokens([]byte("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\"}]}")); err == nil || !strings.Contains(err.Message, "not UTF-8") {
		t.Errorf("count_tokens with a truncated UTF-8 sequence: %+v", err)
	}
	// Valid multi-byte text stays valid.
	if _, err := Parse(Messages, []byte(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"héllo 世界 🙂"}]}`)); err != nil {
		t.Errorf("valid UTF-8: %v", err)
	}
}

// A Responses tool of a type outside the API's tool union, and a reasoning
// effort outside the API's efforts, are refused in OpenAI's words
// ("Invalid value: 'x'. Supported values are: …", code invalid_value, the
// param named); every type of the union (openai-python
// types/responses/tool_param.py) is accepted.
func TestResponsesToolTypesAndEffortsOfTheAPI(t *testing.T) {
	_, err := Parse(Responses, []byte(`{"model":"m","input":"x","tools":[{"type":"function","name":"f"},{"type":"bogus"}]}`))
	if err == nil || err.Status != 400 || err.Code != "invalid_value" || err.Param != "tools[1].type" ||
		!strings.HasPrefix(err.Message, "Invalid value: 'bogus'. Supported values are: 'function', ") || !strings.HasSuffix(err.Message, ", and 'apply_patch'.") {
		t.Errorf("unknown tool type: %+v", err)
	}
	for _, typ := range toolTypes {
		tool := fmt.Sprintf(`{"type":%q,"name":"n"}`, typ)
		if _, err := Parse(Responses, []byte(`{"model":"m","input":"x","tools":[`+tool+`]}`)); err != nil {
			t.Errorf("tool type %s: %v", typ, err)
		}
	}
	_, err = Parse(Responses, []byte(`{"model":"m","input":"x","reasoning":{"effort":"extreme"}}`))
	if err == nil || err.Status != 400 || err.Code != "invalid_value" || err.Param != "reasoning.effort" ||
		err.Message != "Invalid value: 'extreme'. Supported values are: 'none', 'minimal', 'low', 'medium', 'high', 'xhigh', and 'max'." {
		t.Errorf("unknown effort: %+v", err)
	}
	for _, e := range append(append([]string(nil), reasoningEfforts...), "null") {
		v := `"` + e + `"`
		if e == "null" {
			v = e
		}
		if _, err := Parse(Responses, []byte(`{"model":"m","input":"x","reasoning":{"effort":`+v+`}}`)); err != nil {
			t.Errorf("effort %s: %v", e, err)
		}
	}
}

// An Error marshalled into a JSON answer is OpenAI's error object, never
// its Go field names: an edge writing {"error": <Error>} for a header
// net/http refused answered {"error":{"Status":0,"Type":…,"RetryAfter":0}}.
func TestErrorMarshalsAsOpenAIsObject(t *testing.T) {
	b, err := json.Marshal(struct {
		Error Error `json:"error"`
	}{Error{Status: 400, Type: "invalid_request_error", Code: "malformed_request", Message: "bad header", RetryAfter: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"error":{"message":"bad header","type":"invalid_request_error","param":null,"code":"malformed_request"}}` {
		t.Fatalf("%s", b)
	}
	e := BadRequest("", "tools[0].type", "x")
	if got := string(e.JSON(Responses)); got != `{"error":{"message":"x","type":"invalid_request_error","param":"tools[0].type","code":"invalid_value"}}` {
		t.Fatalf("JSON(Responses) = %s", got)
	}
}
