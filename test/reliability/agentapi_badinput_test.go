package reliability

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// badCase is one malformed request to an agent API and the answer it must
// get: the status, the API's own error shape (Anthropic's on /v1/messages,
// OpenAI's elsewhere), the error's type, and words of its message (and,
// in OpenAI's shape, its code and param when given).
type badCase struct {
	name           string
	method, path   string
	body           string
	hdr            map[string]string
	status         int
	typ            string
	msg            string // the message contains it
	code, param    string // OpenAI shape: wanted when set
	anthropicShape bool
}

// agentError is an error body of either API: Anthropic's
// {"type":"error","error":{"type","message"}} or OpenAI's
// {"error":{"message","type","param","code"}}.
type agentError struct {
	Type  string `json:"type"`
	Error *struct {
		Type    string  `json:"type"`
		Message string  `json:"message"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// check judges one answer against c.
func (c badCase) check(status int, header http.Header, body []byte) error {
	if status != c.status {
		return fmt.Errorf("status %d, want %d: %.300s", status, c.status, body)
	}
	if ct := header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return fmt.Errorf("Content-Type %q, want application/json: %.300s", ct, body)
	}
	var e agentError
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
		return fmt.Errorf("not an API error (%v): %.300s", err, body)
	}
	// An internal struct's field names are no API's shape.
	var raw map[string]map[string]any
	_ = json.Unmarshal(body, &raw)
	for k := range raw["error"] {
		if k != strings.ToLower(k) {
			return fmt.Errorf("error field %q is not the API's: %.300s", k, body)
		}
	}
	if c.anthropicShape && e.Type != "error" {
		return fmt.Errorf("not Anthropic's error shape (top-level type %q): %.300s", e.Type, body)
	}
	if !c.anthropicShape && e.Type != "" {
		return fmt.Errorf("not OpenAI's error shape (a top-level type %q): %.300s", e.Type, body)
	}
	if e.Error.Type != c.typ {
		return fmt.Errorf("error type %q, want %q: %.300s", e.Error.Type, c.typ, body)
	}
	if !strings.Contains(e.Error.Message, c.msg) {
		return fmt.Errorf("message %q lacks %q", e.Error.Message, c.msg)
	}
	if c.code != "" && (e.Error.Code == nil || *e.Error.Code != c.code) {
		return fmt.Errorf("code %v, want %q: %.300s", e.Error.Code, c.code, body)
	}
	if c.param != "" && (e.Error.Param == nil || *e.Error.Param != c.param) {
		return fmt.Errorf("param %v, want %q: %.300s", e.Error.Param, c.param, body)
	}
	return nil
}

// agentCall sends one request and returns its status, header and body.
func agentCall(t *testing.T, c *http.Client, method, url, body string, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// tamper changes one character of an id's authenticated part: a
// well-formed id this cluster never minted.
func tamper(id string) string {
	b := []byte(id)
	i := len(b) - 3
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

// nested is a JSON value nested depth levels deep.
func nested(depth int) string { return strings.Repeat("[", depth) + strings.Repeat("]", depth) }

// The bad-input catalogue of the agents' APIs: Messages (and
// count_tokens), Responses (and the by-id paths of stored responses) and
// Conversations, on one edge. Every malformed request gets its API's own
// error shape with the status, type and message a client can act on; none
// a 5xx, a plain-text body or an internal struct's field names; the edge
// serves afterwards.
func TestAgentAPIsBadInput(t *testing.T) {
	st := smallStack(t)
	c := httpClient(t)
	base := st.Edges()[0].URL()
	model := st.Model()
	anth := map[string]string{"anthropic-version": "2023-06-01"}

	// A real stored response and conversation, to name tampered ids of.
	status, _, b := agentCall(t, c, "POST", base+"/v1/responses", fmt.Sprintf(`{"model":%q,"input":"hello","max_output_tokens":2}`, model), nil)
	var resp struct {
		ID string `json:"id"`
	}
	if status != 200 || json.Unmarshal(b, &resp) != nil || resp.ID == "" {
		t.Fatalf("create a response: %d %s", status, b)
	}
	status, _, b = agentCall(t, c, "POST", base+"/v1/conversations", `{"metadata":{"a":"b"}}`, nil)
	var conv struct {
		ID string `json:"id"`
	}
	if status != 200 || json.Unmarshal(b, &conv) != nil || conv.ID == "" {
		t.Fatalf("create a conversation: %d %s", status, b)
	}
	forgedResp, forgedConv := tamper(resp.ID), tamper(conv.ID)
	hugeID := "resp_" + strings.Repeat("x", 100<<10)
	msgs := func(extra string) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]%s}`, model, extra)
	}
	rsp := func(extra string) string {
		return fmt.Sprintf(`{"model":%q,"input":"hi","max_output_tokens":2%s}`, model, extra)
	}
	metadata17 := map[string]string{}
	for i := range 17 {
		metadata17[fmt.Sprintf("k%d", i)] = "v"
	}
	m17, _ := json.Marshal(map[string]any{"metadata": metadata17})
	items21 := make([]map[string]any, 21)
	for i := range items21 {
		items21[i] = map[string]any{"type": "message", "role": "user", "content": "x"}
	}
	i21, _ := json.Marshal(map[string]any{"items": items21})

	messages := []badCase{
		{name: "malformed JSON", body: `{"model":`, status: 400, typ: "invalid_request_error", msg: "JSON"},
		{name: "body not an object", body: `[1,2]`, status: 400, typ: "invalid_request_error", msg: "JSON object"},
		{name: "empty body", body: ``, status: 400, typ: "invalid_request_error", msg: "JSON"},
		{name: "max_tokens missing", body: fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model), status: 400, typ: "invalid_request_error", msg: "max_tokens"},
		{name: "max_tokens a string", body: fmt.Sprintf(`{"model":%q,"max_tokens":"4","messages":[{"role":"user","content":"hi"}]}`, model), status: 400, typ: "invalid_request_error", msg: "max_tokens"},
		{name: "messages not an array", body: fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":"hi"}`, model), status: 400, typ: "invalid_request_error", msg: "messages"},
		{name: "messages empty", body: fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[]}`, model), status: 400, typ: "invalid_request_error", msg: "messages"},
		{name: "unknown role", body: fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"tool","content":"hi"}]}`, model), status: 400, typ: "invalid_request_error", msg: "role"},
		{name: "unknown content block", body: fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":[{"type":"bogus"}]}]}`, model), status: 400, typ: "invalid_request_error", msg: "bogus"},
		{name: "system a number", body: msgs(`,"system":5`), status: 400, typ: "invalid_request_error", msg: "system"},
		{name: "tools not an array", body: msgs(`,"tools":{}`), status: 400, typ: "invalid_request_error", msg: "tools"},
		{name: "stream a string", body: msgs(`,"stream":"yes"`), status: 400, typ: "invalid_request_error", msg: "stream"},
		{name: "deeply nested JSON", body: msgs(`,"metadata":` + nested(100000)), status: 400, typ: "invalid_request_error", msg: "JSON"},
		{name: "unknown model", body: `{"model":"nope","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, status: 404, typ: "not_found_error", msg: "nope"},
		{name: "invalid UTF-8 in a prompt", body: strings.Replace(msgs(""), `"hi"`, "\"h\xff\xfei\"", 1), status: 400, typ: "invalid_request_error", msg: "not UTF-8"},
		{name: "wrong method", method: "GET", body: ``, status: 405, typ: "invalid_request_error", msg: "GET"},
		{name: "count_tokens malformed JSON", path: "/v1/messages/count_tokens", body: `{"model":`, status: 400, typ: "invalid_request_error", msg: "JSON"},
		{name: "count_tokens messages missing", path: "/v1/messages/count_tokens", body: fmt.Sprintf(`{"model":%q}`, model), status: 400, typ: "invalid_request_error", msg: "messages"},
	}
	for i := range messages {
		messages[i].anthropicShape = true
		if messages[i].path == "" {
			messages[i].path = "/v1/messages"
		}
		messages[i].hdr = anth
	}
	responses := []badCase{
		{name: "malformed JSON", body: `{"model":`, status: 400, typ: "invalid_request_error", msg: "JSON"},
		{name: "input a number", body: fmt.Sprintf(`{"model":%q,"input":5}`, model), status: 400, typ: "invalid_request_error", msg: "input", param: "input"},
		{name: "unknown input item", body: fmt.Sprintf(`{"model":%q,"input":[{"type":"bogus"}]}`, model), status: 400, typ: "invalid_request_error", msg: "bogus"},
		{name: "unknown tool type", body: rsp(`,"tools":[{"type":"bogus"}]`), status: 400, typ: "invalid_request_error", msg: "Invalid value: 'bogus'", code: "invalid_value", param: "tools[0].type"},
		{name: "function tool without a name", body: rsp(`,"tools":[{"type":"function","parameters":{}}]`), status: 400, typ: "invalid_request_error", msg: "name"},
		{name: "tool_choice naming no tool", body: rsp(`,"tools":[{"type":"function","name":"a","parameters":{}}],"tool_choice":{"type":"function","name":"b"}`), status: 400, typ: "invalid_request_error", msg: "b"},
		{name: "reasoning effort unknown", body: rsp(`,"reasoning":{"effort":"extreme"}`), status: 400, typ: "invalid_request_error", msg: "Invalid value: 'extreme'", code: "invalid_value", param: "reasoning.effort"},
		{name: "deeply nested JSON", body: rsp(`,"metadata":` + nested(100000)), status: 400, typ: "invalid_request_error", msg: "JSON"},
		{name: "unknown model", body: `{"model":"nope","input":"hi"}`, status: 404, typ: "invalid_request_error", msg: "nope"},
		{name: "previous_response_id a number", body: rsp(`,"previous_response_id":5`), status: 400, typ: "invalid_request_error", msg: "previous_response_id"},
		{name: "previous_response_id forged", body: rsp(fmt.Sprintf(`,"previous_response_id":%q`, forgedResp)), status: 400, typ: "invalid_request_error", msg: "Previous response with id", code: "previous_response_not_found", param: "previous_response_id"},
		{name: "previous_response_id of 100 KiB", body: rsp(fmt.Sprintf(`,"previous_response_id":%q`, hugeID)), status: 400, typ: "invalid_request_error", msg: "Previous response with id", code: "previous_response_not_found"},
		{name: "conversation forged", body: rsp(fmt.Sprintf(`,"conversation":%q`, forgedConv)), status: 404, typ: "invalid_request_error", msg: "Conversation with id"},
		{name: "invalid UTF-8 in the input", body: strings.Replace(rsp(""), `"hi"`, "\"h\xffi\"", 1), status: 400, typ: "invalid_request_error", msg: "not UTF-8", code: "invalid_json"},
		{name: "GET a forged id", method: "GET", path: "/v1/responses/" + forgedResp, status: 404, typ: "invalid_request_error", msg: "Response with id"},
		{name: "GET an id of 100 KiB", method: "GET", path: "/v1/responses/" + hugeID, status: 404, typ: "invalid_request_error", msg: "Response with id"},
		{name: "DELETE a forged id", method: "DELETE", path: "/v1/responses/" + forgedResp, status: 404, typ: "invalid_request_error", msg: "Response with id"},
		{name: "cancel a forged id", method: "POST", path: "/v1/responses/" + forgedResp + "/cancel", status: 404, typ: "invalid_request_error", msg: "Response with id"},
		{name: "input_items of a forged id", method: "GET", path: "/v1/responses/" + forgedResp + "/input_items", status: 404, typ: "invalid_request_error", msg: "Response with id"},
	}
	for i := range responses {
		if responses[i].path == "" {
			responses[i].path = "/v1/responses"
		}
	}
	conversations := []badCase{
		{name: "create: malformed JSON", body: `{"metadata":`, status: 400, typ: "invalid_request_error", msg: "JSON"},
		{name: "create: body an array", body: `[]`, status: 400, typ: "invalid_request_error", msg: "JSON object"},
		{name: "create: metadata a string", body: `{"metadata":"x"}`, status: 400, typ: "invalid_request_error", msg: "metadata", code: "invalid_type", param: "metadata"},
		{name: "create: 17 metadata properties", body: string(m17), status: 400, typ: "invalid_request_error", msg: "at most 16", code: "object_above_max_properties"},
		{name: "create: a metadata value not a string", body: `{"metadata":{"a":1}}`, status: 400, typ: "invalid_request_error", msg: "metadata.a", code: "invalid_type"},
		{name: "create: items an object", body: `{"items":{}}`, status: 400, typ: "invalid_request_error", msg: "items", param: "items"},
		{name: "create: 21 items", body: string(i21), status: 400, typ: "invalid_request_error", msg: "maximum length 20", code: "array_above_max_length"},
		{name: "create: an unknown item", body: `{"items":[{"type":"bogus"}]}`, status: 400, typ: "invalid_request_error", msg: "bogus"},
		{name: "create: deeply nested JSON", body: `{"metadata":` + nested(100000) + `}`, status: 400, typ: "invalid_request_error", msg: "JSON"},
		{name: "create: invalid UTF-8 in an item", body: "{\"items\":[{\"type\":\"message\",\"role\":\"user\",\"content\":\"h\xffi\"}]}", status: 400, typ: "invalid_request_error", msg: "UTF-8"},
		{name: "GET a forged id", method: "GET", path: "/v1/conversations/" + forgedConv, status: 404, typ: "invalid_request_error", msg: "Conversation with id"},
		{name: "GET an id of 100 KiB", method: "GET", path: "/v1/conversations/conv_" + strings.Repeat("x", 100<<10), status: 404, typ: "invalid_request_error", msg: "Conversation with id"},
		{name: "DELETE a forged id", method: "DELETE", path: "/v1/conversations/" + forgedConv, status: 404, typ: "invalid_request_error", msg: "Conversation with id"},
		{name: "add items to a forged id", method: "POST", path: "/v1/conversations/" + forgedConv + "/items", body: `{"items":[{"type":"message","role":"user","content":"x"}]}`, status: 404, typ: "invalid_request_error", msg: "Conversation with id"},
		{name: "update without metadata", method: "POST", path: "/v1/conversations/" + conv.ID, body: `{}`, status: 400, typ: "invalid_request_error", msg: "metadata"},
		{name: "an unknown item id", method: "GET", path: "/v1/conversations/" + conv.ID + "/items/msg_nope", status: 404, typ: "invalid_request_error", msg: "Item with id"},
		{name: "items: limit 0", method: "GET", path: "/v1/conversations/" + conv.ID + "/items?limit=0", status: 400, typ: "invalid_request_error", msg: "limit"},
		{name: "items: order sideways", method: "GET", path: "/v1/conversations/" + conv.ID + "/items?order=sideways", status: 400, typ: "invalid_request_error", msg: "Invalid value: 'sideways'", param: "order"},
		{name: "wrong method", method: "PUT", path: "/v1/conversations/" + conv.ID, status: 405, typ: "invalid_request_error", msg: "PUT"},
		{name: "unknown path", method: "GET", path: "/v1/conversations/" + conv.ID + "/bogus", status: 404, typ: "invalid_request_error", msg: "unknown path"},
	}
	for i := range conversations {
		if conversations[i].path == "" {
			conversations[i].path = "/v1/conversations"
		}
	}
	for _, group := range []struct {
		name  string
		cases []badCase
	}{{"messages", messages}, {"responses", responses}, {"conversations", conversations}} {
		for _, tc := range group.cases {
			t.Run(group.name+"/"+tc.name, func(t *testing.T) {
				method := tc.method
				if method == "" {
					method = "POST"
				}
				status, header, body := agentCall(t, c, method, base+tc.path, tc.body, tc.hdr)
				if err := tc.check(status, header, body); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
	// Still serving, both APIs.
	if status, _, b := agentCall(t, c, "POST", base+"/v1/messages", msgs(""), map[string]string{"anthropic-version": "2023-06-01", "x-claude-code-session-id": "after-the-catalogue"}); status != 200 {
		t.Fatalf("Messages after the catalogue: %d %s", status, b)
	}
	if status, _, b := agentCall(t, c, "GET", base+"/v1/responses/"+resp.ID, "", nil); status != 200 {
		t.Fatalf("the stored response after the catalogue: %d %s", status, b)
	}
}
