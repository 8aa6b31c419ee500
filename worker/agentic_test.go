package worker

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tether-project/tether/test/workertest"
)

// The simulated engine answers like a model an agent framework can drive
// (worker/engine/sim/DESIGN.md, "What the model answers"). Before, tools,
// tool_choice, response_format, stop and logprobs were accepted and
// ignored: every answer was free text.

const weatherTools = `"tools":[
 {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city","unit"],"additionalProperties":false}}},
 {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string"}},"required":["zone"]}}}]`

func agentBody(msgs string, extra string) string {
	b := `{"model":"test-model","messages":` + msgs
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

const userAsks = `[{"role":"system","content":"you are an agent"},{"role":"user","content":"what is the weather in Paris? use get_weather"}]`

type toolCallOut struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatOut struct {
	ID      string `json:"id"`
	Choices []struct {
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Role      string        `json:"role"`
			Content   *string       `json:"content"`
			ToolCalls []toolCallOut `json:"tool_calls"`
		} `json:"message"`
	} `json:"choices"`
}

func decodeChat(t *testing.T, r response) chatOut {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var out chatOut
	if err := json.Unmarshal(r.body, &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("bad response (%v): %s", err, r.body)
	}
	return out
}

func TestToolChoiceAutoCallsTheNamedToolThenAnswers(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	url := s.URL() + "/v1/chat/completions"
	r := post(t, c, url, agentBody(userAsks, weatherTools), nil)
	out := decodeChat(t, r)
	ch := out.Choices[0]
	if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 {
		t.Fatalf("want one tool call with finish_reason tool_calls: %s", r.body)
	}
	if !strings.Contains(string(r.body), `"content":null`) {
		t.Fatalf("a tool-call answer has content null: %s", r.body)
	}
	call := ch.Message.ToolCalls[0]
	if call.Type != "function" || call.Function.Name != "get_weather" || !strings.HasPrefix(call.ID, "call_") {
		t.Fatalf("call %+v: want get_weather (named in the user message)", call)
	}
	var args map[string]any
	if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil {
		t.Fatalf("arguments %q are not JSON: %v", call.Function.Arguments, err)
	}
	if _, ok := args["city"].(string); !ok || args["unit"] != "celsius" || len(args) != 2 {
		t.Fatalf("arguments %v: want a string city and the first enum unit", args)
	}
	// Deterministic: the same request gives the same call.
	if again := decodeChat(t, post(t, c, url, agentBody(userAsks, weatherTools), nil)); again.Choices[0].Message.ToolCalls[0] != call {
		t.Fatalf("not deterministic: %+v then %+v", call, again.Choices[0].Message.ToolCalls[0])
	}
	// A seed varies it, deterministically.
	seeded := decodeChat(t, post(t, c, url, agentBody(userAsks, weatherTools+`,"seed":7`), nil)).Choices[0].Message.ToolCalls[0]
	if seeded.ID == call.ID {
		t.Fatalf("seed 7 gave the same call id %s", call.ID)
	}
	if again := decodeChat(t, post(t, c, url, agentBody(userAsks, weatherTools+`,"seed":7`), nil)).Choices[0].Message.ToolCalls[0]; again != seeded {
		t.Fatalf("seed 7 not deterministic: %+v then %+v", seeded, again)
	}

	// With the tool's result in the conversation, the model answers.
	msgs := `[{"role":"system","content":"you are an agent"},{"role":"user","content":"what is the weather in Paris? use get_weather"},
	 {"role":"assistant","content":null,"tool_calls":[{"id":"` + call.ID + `","type":"function","function":{"name":"get_weather","arguments":` + mustJSON(t, call.Function.Arguments) + `}}]},
	 {"role":"tool","tool_call_id":"` + call.ID + `","content":"sunny, 21C"}]`
	ans := decodeChat(t, post(t, c, url, agentBody(msgs, weatherTools), nil)).Choices[0]
	if len(ans.Message.ToolCalls) != 0 || ans.Message.Content == nil || *ans.Message.Content == "" || ans.FinishReason == "tool_calls" {
		t.Fatalf("after the tool result: want text, got %+v", ans)
	}
}

func TestToolChoiceModes(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	url := s.URL() + "/v1/chat/completions"
	plain := `[{"role":"user","content":"hello"}]`
	names := func(extra string) []string {
		out := decodeChat(t, post(t, c, url, agentBody(plain, weatherTools+","+extra), nil)).Choices[0]
		var n []string
		for _, tc := range out.Message.ToolCalls {
			n = append(n, tc.Function.Name)
		}
		return n
	}
	if n := names(`"tool_choice":"none"`); len(n) != 0 {
		t.Fatalf("none: calls %v", n)
	}
	// auto with no tool named answers in text (calling the first tool
	// made agents loop: Claude Code's first tool spawns a sub-agent);
	// required calls one anyway.
	if n := names(`"tool_choice":"auto"`); len(n) != 0 {
		t.Fatalf("auto, no tool named: calls %v, want a text answer", n)
	}
	if n := names(`"tool_choice":"required"`); len(n) != 1 || n[0] != "get_weather" {
		t.Fatalf("required, no tool named: calls %v, want the first tool", n)
	}
	if n := names(`"tool_choice":{"type":"function","function":{"name":"get_time"}}`); len(n) != 1 || n[0] != "get_time" {
		t.Fatalf("named get_time: calls %v", n)
	}
	// required calls a tool even after tool results.
	after := `[{"role":"user","content":"hello"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_time","arguments":"{}"}}]},{"role":"tool","tool_call_id":"call_1","content":"noon"}]`
	out := decodeChat(t, post(t, c, url, agentBody(after, weatherTools+`,"tool_choice":"required"`), nil)).Choices[0]
	if len(out.Message.ToolCalls) != 1 {
		t.Fatalf("required after results: %+v", out)
	}
	// Parallel calls: both tools named; parallel_tool_calls false keeps one.
	both := `[{"role":"user","content":"call get_weather and get_time"}]`
	out = decodeChat(t, post(t, c, url, agentBody(both, weatherTools), nil)).Choices[0]
	if len(out.Message.ToolCalls) != 2 || out.Message.ToolCalls[0].ID == out.Message.ToolCalls[1].ID {
		t.Fatalf("parallel: %+v", out.Message.ToolCalls)
	}
	out = decodeChat(t, post(t, c, url, agentBody(both, weatherTools+`,"parallel_tool_calls":false`), nil)).Choices[0]
	if len(out.Message.ToolCalls) != 1 {
		t.Fatalf("parallel_tool_calls false: %+v", out.Message.ToolCalls)
	}
}

// Streaming tool calls arrive as OpenAI streams them: the first delta has
// role, null content, index, id, type and name with empty arguments; then
// argument pieces by index; then finish_reason tool_calls; the pieces
// concatenate to the non-streamed arguments.
func TestStreamedToolCallDeltas(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	url := s.URL() + "/v1/chat/completions"
	both := `[{"role":"user","content":"call get_weather and get_time"}]`
	whole := decodeChat(t, post(t, c, url, agentBody(both, weatherTools), nil)).Choices[0].Message.ToolCalls
	r := post(t, c, url, agentBody(both, weatherTools+`,"stream":true`), nil)
	events := sseEvents(t, r.body)
	if events[len(events)-1] != "[DONE]" {
		t.Fatalf("no [DONE]: %v", events)
	}
	type delta struct {
		Role      *string         `json:"role"`
		Content   json.RawMessage `json:"content"`
		ToolCalls []struct {
			Index    *int   `json:"index"`
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      *string `json:"name"`
				Arguments *string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	var chunks []struct {
		Choices []struct {
			Delta        delta   `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	for _, ev := range events[:len(events)-1] {
		var ch struct {
			Choices []struct {
				Delta        delta   `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &ch); err != nil {
			t.Fatalf("chunk %s: %v", ev, err)
		}
		chunks = append(chunks, ch)
	}
	first := chunks[0].Choices[0].Delta
	if first.Role == nil || *first.Role != "assistant" || string(first.Content) != "null" || len(first.ToolCalls) != 1 {
		t.Fatalf("first chunk %s", events[0])
	}
	got := make([]toolCallOut, 2)
	for i, ch := range chunks {
		c := ch.Choices[0]
		if i == len(chunks)-1 {
			if c.FinishReason == nil || *c.FinishReason != "tool_calls" || len(c.Delta.ToolCalls) != 0 {
				t.Fatalf("last chunk %s", events[i])
			}
			continue
		}
		if c.FinishReason != nil {
			t.Fatalf("finish before the end: %s", events[i])
		}
		for _, tc := range c.Delta.ToolCalls {
			if tc.Index == nil || *tc.Index > 1 {
				t.Fatalf("delta without a valid index: %s", events[i])
			}
			g := &got[*tc.Index]
			if tc.ID != "" {
				if g.ID != "" || tc.Type != "function" || tc.Function.Name == nil || tc.Function.Arguments == nil || *tc.Function.Arguments != "" {
					t.Fatalf("opening delta %s", events[i])
				}
				g.ID, g.Type, g.Function.Name = tc.ID, tc.Type, *tc.Function.Name
				continue
			}
			if tc.Function.Name != nil || tc.Function.Arguments == nil {
				t.Fatalf("argument delta %s", events[i])
			}
			g.Function.Arguments += *tc.Function.Arguments
		}
	}
	for i := range got {
		if got[i] != whole[i] {
			t.Fatalf("streamed call %d %+v, non-streamed %+v", i, got[i], whole[i])
		}
	}
}

func TestResponseFormatJSON(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	url := s.URL() + "/v1/chat/completions"
	plain := `[{"role":"user","content":"summarize"}]`
	out := decodeChat(t, post(t, c, url, agentBody(plain, `"response_format":{"type":"json_object"}`), nil)).Choices[0]
	var obj map[string]any
	if out.Message.Content == nil || json.Unmarshal([]byte(*out.Message.Content), &obj) != nil || out.FinishReason != "stop" {
		t.Fatalf("json_object: %+v", out)
	}
	schema := `{"type":"object","additionalProperties":false,"required":["title","score","tags","owner","status","ratio","note"],
	 "properties":{"title":{"type":"string","minLength":12},"score":{"type":"integer","minimum":3},
	 "tags":{"type":"array","items":{"type":"string"},"minItems":2},
	 "owner":{"$ref":"#/$defs/person"},"status":{"enum":["open","closed"]},"ratio":{"type":"number","exclusiveMinimum":0.5},
	 "note":{"anyOf":[{"type":"null"},{"type":"boolean"}]},"optional":{"type":"string"}},
	 "$defs":{"person":{"type":"object","properties":{"name":{"type":"string"},"email":{"type":"string","format":"email"}},"required":["name","email"]}}}`
	rf := `"response_format":{"type":"json_schema","json_schema":{"name":"report","strict":true,"schema":` + schema + `}}`
	out = decodeChat(t, post(t, c, url, agentBody(plain, rf), nil)).Choices[0]
	var rep struct {
		Title string   `json:"title"`
		Score int      `json:"score"`
		Tags  []string `json:"tags"`
		Owner struct {
			Name  string `json:"name"`
			Email string `json:"email"`
		} `json:"owner"`
		Status string          `json:"status"`
		Ratio  float64         `json:"ratio"`
		Note   json.RawMessage `json:"note"`
	}
	d := json.NewDecoder(strings.NewReader(*out.Message.Content))
	d.DisallowUnknownFields()
	if err := d.Decode(&rep); err != nil {
		t.Fatalf("json_schema answer %s: %v", *out.Message.Content, err)
	}
	if len(rep.Title) < 12 || rep.Score != 3 || len(rep.Tags) != 2 || rep.Owner.Name == "" || rep.Owner.Email != "agent@example.com" ||
		rep.Status != "open" || rep.Ratio <= 0.5 || string(rep.Note) != "false" {
		t.Fatalf("json_schema answer %s does not satisfy the schema", *out.Message.Content)
	}
	// A small explicit max_tokens cuts the JSON, as a real engine would.
	out = decodeChat(t, post(t, c, url, agentBody(plain, rf+`,"max_tokens":2`), nil)).Choices[0]
	if out.FinishReason != "length" || len(*out.Message.Content) > 8 {
		t.Fatalf("max_tokens 2: %+v", out)
	}
}

func TestStopSequences(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	url := s.URL() + "/v1/chat/completions"
	body := chatBody("tell me more", `"max_tokens":12`)
	full := *decodeChat(t, post(t, c, url, body, nil)).Choices[0].Message.Content
	words := strings.Fields(full)
	stop := words[3]
	cut := full[:strings.Index(full, stop)]
	out := decodeChat(t, post(t, c, url, chatBody("tell me more", `"max_tokens":12,"stop":[`+mustJSON(t, stop)+`]`), nil)).Choices[0]
	if out.FinishReason != "stop" || *out.Message.Content != cut {
		t.Fatalf("stop %q in %q: got %q (%s), want %q", stop, full, *out.Message.Content, out.FinishReason, cut)
	}
	// Streamed, the chunks add up to the same cut text.
	r := post(t, c, url, chatBody("tell me more", `"max_tokens":12,"stream":true,"stop":`+mustJSON(t, stop)), nil)
	var got strings.Builder
	var finish string
	for _, ev := range sseEvents(t, r.body) {
		if ev == "[DONE]" {
			break
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &ch); err != nil {
			t.Fatal(err)
		}
		for _, c := range ch.Choices {
			got.WriteString(c.Delta.Content)
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
	}
	if got.String() != cut || finish != "stop" {
		t.Fatalf("streamed stop: %q (%s), want %q", got.String(), finish, cut)
	}
}

func TestAnswerOptionsRefusedClearly(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	url := s.URL() + "/v1/chat/completions"
	plain := `[{"role":"user","content":"hi"}]`
	cases := []struct{ name, body, param, msg string }{
		{"logprobs", agentBody(plain, `"logprobs":true`), "logprobs", "not supported"},
		{"top_logprobs", agentBody(plain, `"top_logprobs":2`), "top_logprobs", "not supported"},
		{"unknown role", agentBody(`[{"role":"wizard","content":"hi"}]`, ""), "messages[0].role", `"wizard"`},
		{"tool type", agentBody(plain, `"tools":[{"type":"code_interpreter"}]`), "tools[0].type", "function"},
		{"tool name", agentBody(plain, `"tools":[{"type":"function","function":{"name":"has space"}}]`), "tools[0].function.name", "must match"},
		{"named tool missing", agentBody(plain, weatherTools+`,"tool_choice":{"type":"function","function":{"name":"nope"}}`), "tool_choice", `"nope"`},
		{"required without tools", agentBody(plain, `"tool_choice":"required"`), "tool_choice", "needs tools"},
		{"response_format type", agentBody(plain, `"response_format":{"type":"yaml"}`), "response_format.type", `"yaml"`},
		{"json_schema without name", agentBody(plain, `"response_format":{"type":"json_schema","json_schema":{"schema":{}}}`), "response_format.json_schema.name", "required"},
		{"n", agentBody(plain, `"n":2`), "n", "n must be 1"},
		{"stop type", agentBody(plain, `"stop":5`), "stop", "string"},
	}
	for _, tc := range cases {
		r := post(t, c, url, tc.body, nil)
		if r.status != 400 {
			t.Fatalf("%s: status %d %s", tc.name, r.status, r.body)
		}
		e := r.json(t)["error"].(map[string]any)
		if e["param"] != tc.param || !strings.Contains(e["message"].(string), tc.msg) {
			t.Fatalf("%s: error %v, want param %s and %q in the message", tc.name, e, tc.param, tc.msg)
		}
	}
	// Completions take logprobs as an integer: 0 is "none".
	if r := post(t, c, s.URL()+"/v1/completions", `{"model":"test-model","prompt":"hi","logprobs":0}`, nil); r.status != 200 {
		t.Fatalf("completions logprobs 0: %d %s", r.status, r.body)
	}
}

// Completion ids are random: a restarted worker (same instance id) does
// not repeat them (before, "chatcmpl-w0-1" came again after every start).
func TestCompletionIDsDoNotRepeatAcrossRestarts(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 2; i++ {
		s := workertest.Start(t, New, testConfig("w0"))
		for j := 0; j < 2; j++ {
			id, _ := post(t, testClient(t), s.URL()+"/v1/chat/completions", chatBody("hello", ""), nil).json(t)["id"].(string)
			if !strings.HasPrefix(id, "chatcmpl-") || len(id) != len("chatcmpl-")+24 || seen[id] {
				t.Fatalf("id %q (seen before: %v)", id, seen[id])
			}
			seen[id] = true
		}
	}
}

// GET /v1/models/{id}: the served model, 404 model_not_found otherwise.
func TestModelRetrieve(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	if r := do(t, c, "GET", s.URL()+"/v1/models/test-model", "", nil); r.status != 200 || r.json(t)["id"] != "test-model" {
		t.Fatalf("served model: %d %s", r.status, r.body)
	}
	r := do(t, c, "GET", s.URL()+"/v1/models/other", "", nil)
	if r.status != 404 || r.json(t)["error"].(map[string]any)["code"] != "model_not_found" {
		t.Fatalf("other model: %d %s", r.status, r.body)
	}
}
