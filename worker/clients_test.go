package worker

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The Responses shapes Codex sends (codex-rs: namespace tools, hosted
// tools, custom tools) and reads back (a function_call item with its
// namespace; function_call_arguments.done with the name).

const codexTools = `"tools":[
 {"type":"function","name":"exec_command","parameters":{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]},"strict":false},
 {"type":"namespace","name":"multi_agent_v1","description":"sub-agents","tools":[
  {"type":"function","name":"spawn_agent","parameters":{"type":"object","properties":{"message":{"type":"string"}},"required":["message"]},"strict":false},
  {"type":"custom","name":"notes"}]},
 {"type":"web_search","external_web_access":false},
 {"type":"custom","name":"apply_patch","format":{"type":"grammar","syntax":"lark","definition":"start: x"}}]`

// A call of a namespace's function is a function_call item named by the
// function's own name with its namespace, streamed and whole.
func TestResponsesNamespaceCall(t *testing.T) {
	s := startServer(t, testConfig("w-ns"))
	c := testClient(t)
	body := `{"model":"test-model","input":"delegate this to a helper",` + codexTools + `,"tool_choice":{"type":"function","name":"spawn_agent"}`
	r := post(t, c, s.URL()+"/v1/responses", body+`}`, nil)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var obj struct {
		Output []map[string]any `json:"output"`
	}
	if err := json.Unmarshal(r.body, &obj); err != nil || len(obj.Output) != 1 {
		t.Fatalf("output (%v): %s", err, r.body)
	}
	if it := obj.Output[0]; it["type"] != "function_call" || it["name"] != "spawn_agent" || it["namespace"] != "multi_agent_v1" {
		t.Fatalf("call item %v", it)
	}
	r = post(t, c, s.URL()+"/v1/responses", body+`,"stream":true}`, nil)
	if r.status != 200 {
		t.Fatalf("stream status %d: %s", r.status, r.body)
	}
	var added, done, argsDone bool
	for _, data := range sseData(t, r.body) {
		var ev struct {
			Type string         `json:"type"`
			Name string         `json:"name"`
			Item map[string]any `json:"item"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case "response.output_item.added", "response.output_item.done":
			if ev.Item["name"] != "spawn_agent" || ev.Item["namespace"] != "multi_agent_v1" {
				t.Fatalf("%s item %v", ev.Type, ev.Item)
			}
			added, done = added || ev.Type == "response.output_item.added", done || ev.Type == "response.output_item.done"
		case "response.function_call_arguments.done":
			if ev.Name != "spawn_agent" {
				t.Fatalf("arguments.done names %q: %s", ev.Name, data)
			}
			argsDone = true
		}
	}
	if !added || !done || !argsDone {
		t.Fatalf("events added %v done %v arguments.done %v:\n%s", added, done, argsDone, r.body)
	}
}

// Under auto the simulated model calls a function the user names, never
// a hosted or custom tool, even when the user names one.
func TestResponsesHostedToolsNeverCalled(t *testing.T) {
	s := startServer(t, testConfig("w-hosted"))
	c := testClient(t)
	r := post(t, c, s.URL()+"/v1/responses", `{"model":"test-model","input":"use web_search and apply_patch",`+
		`"tools":[{"type":"web_search"},{"type":"custom","name":"apply_patch"},{"type":"local_shell"},{"type":"mcp","server_label":"x"}],"tool_choice":"auto","max_output_tokens":8}`, nil)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if strings.Contains(string(r.body), `"function_call"`) || strings.Contains(string(r.body), `"custom_tool_call"`) {
		t.Fatalf("a tool the model does not have was called: %s", r.body)
	}
}

// An item_reference names an item of a response this worker stores: it
// renders as that item; an id no stored response holds is refused by name.
func TestResponsesItemReference(t *testing.T) {
	s := startServer(t, testConfig("w-ref"))
	c := testClient(t)
	r := post(t, c, s.URL()+"/v1/responses", `{"model":"test-model","input":[{"type":"message","id":"msg_q1","role":"user","content":"first question"}],"max_output_tokens":4}`, nil)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var first struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
		Output []struct {
			ID string `json:"id"`
		} `json:"output"`
	}
	if err := json.Unmarshal(r.body, &first); err != nil || len(first.Output) == 0 {
		t.Fatalf("first (%v): %s", err, r.body)
	}
	ref := `{"model":"test-model","input":[{"type":"item_reference","id":"msg_q1"},{"id":"` + first.Output[0].ID + `"},{"role":"user","content":"second"}],"max_output_tokens":4}`
	r = post(t, c, s.URL()+"/v1/responses", ref, nil)
	var second struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &second) != nil {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	// Both referenced items entered the prompt.
	if second.Usage.InputTokens <= first.Usage.InputTokens+4 {
		t.Fatalf("input tokens %d after %d: the referenced items were not rendered", second.Usage.InputTokens, first.Usage.InputTokens)
	}
	r = post(t, c, s.URL()+"/v1/responses", `{"model":"test-model","input":[{"type":"item_reference","id":"msg_nowhere"},{"role":"user","content":"x"}]}`, nil)
	if r.status != 400 || !strings.Contains(string(r.body), "msg_nowhere") || !strings.Contains(string(r.body), `"param":"input[0].id"`) {
		t.Fatalf("unknown reference: %d %s", r.status, r.body)
	}
}

// namedEvents are the data payloads of an SSE body whose events may be
// named (event: lines).
func sseData(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	for _, block := range strings.Split(string(body), "\n\n") {
		for _, line := range strings.Split(block, "\n") {
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				out = append(out, data)
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no SSE events: %.300s", body)
	}
	return out
}

// clientRequest is a captured request of a real CLI
// (test/agentapi/testdata/clients).
type clientRequest struct {
	Method  string                     `json:"method"`
	Path    string                     `json:"path"`
	Headers map[string]json.RawMessage `json:"headers"`
	Body    json.RawMessage            `json:"body"`
}

func clientFixtures(t *testing.T) map[string]clientRequest {
	t.Helper()
	files, err := filepath.Glob("../test/agentapi/testdata/clients/*/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no client fixtures (%v)", err)
	}
	out := map[string]clientRequest{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var cr clientRequest
		if err := json.Unmarshal(b, &cr); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(filepath.Dir(f))+"/"+filepath.Base(f)] = cr
	}
	return out
}

// Every captured Claude Code and Codex request is answered 200 with a
// complete stream, its model renamed to the worker's.
func TestClientFixturesServed(t *testing.T) {
	cfg := testConfig("w-clients")
	cfg.MaxTokensLimit = 131072
	s := startServer(t, cfg)
	c := testClient(t)
	for name, cr := range clientFixtures(t) {
		var body map[string]json.RawMessage
		if err := json.Unmarshal(cr.Body, &body); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		body["model"] = json.RawMessage(`"test-model"`)
		path, _, _ := strings.Cut(cr.Path, "?")
		r := post(t, c, s.URL()+cr.Path, mustJSON(t, body), nil)
		if r.status != 200 {
			t.Errorf("%s: %d %s", name, r.status, r.body)
			continue
		}
		last := map[string]string{"/v1/messages": "message_stop", "/v1/responses": "response.completed"}[path]
		events := sseData(t, r.body)
		if len(events) == 0 || !strings.Contains(events[len(events)-1], `"type":"`+last+`"`) {
			tail := ""
			if len(events) > 0 {
				tail = events[len(events)-1]
			}
			t.Errorf("%s: the stream does not end with %s: %.300s", name, last, tail)
		}
	}
}

// anthropic_inline_system: fold merges an inline system message into the
// user turn before it, as an engine folding it renders the prompt (one
// role marker fewer than preserve, the default); a mode that is neither is
// refused at start.
func TestWorkerInlineSystemSetting(t *testing.T) {
	body := `{"model":"test-model","max_tokens":4,"system":"sys","messages":[{"role":"user","content":"q1"},{"role":"system","content":"reminder"}]}`
	inputTokens := func(setting string) int {
		cfg := testConfig("w-inline-" + setting)
		cfg.AnthropicInlineSystem = setting
		s := startServer(t, cfg)
		r := post(t, testClient(t), s.URL()+"/v1/messages", body, nil)
		var m struct {
			Usage struct {
				InputTokens int `json:"input_tokens"`
			} `json:"usage"`
		}
		if r.status != 200 || json.Unmarshal(r.body, &m) != nil {
			t.Fatalf("%q: %d %s", setting, r.status, r.body)
		}
		return m.Usage.InputTokens
	}
	if p, f := inputTokens("preserve"), inputTokens("fold"); f != p-1 {
		t.Fatalf("input tokens: preserve %d, fold %d (want one role marker fewer)", p, f)
	}
	cfg := testConfig("w-inline-bad")
	cfg.AnthropicInlineSystem = "hoist"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "anthropic_inline_system") {
		t.Fatalf("a bad mode: %v", err)
	}
}

// Under tool_choice auto, a namespace's function is named by its own name:
// the user turn "Use spawn_agent …" calls multi_agent_v1's spawn_agent (a
// sub-agent tool, named exactly), its message from the backquoted span;
// its flat name alone names nothing.
func TestResponsesNamespaceFunctionNamedByItsOwnName(t *testing.T) {
	s := startServer(t, testConfig("w-ns-auto"))
	c := testClient(t)
	for input, want := range map[string]string{
		"Use spawn_agent: `check the notes`": `{"message":"check the notes"}`,
		"Use Spawn_Agent: `check the notes`": "",
		"delegate this to a helper":          "",
	} {
		body := `{"model":"test-model","input":` + strconv.Quote(input) + `,` + codexTools + `}`
		r := post(t, c, s.URL()+"/v1/responses", body, nil)
		if r.status != 200 {
			t.Fatalf("%q: status %d: %s", input, r.status, r.body)
		}
		var obj struct {
			Output []map[string]any `json:"output"`
		}
		if err := json.Unmarshal(r.body, &obj); err != nil {
			t.Fatal(err)
		}
		var call map[string]any
		for _, it := range obj.Output {
			if it["type"] == "function_call" {
				call = it
			}
		}
		switch {
		case want == "" && call != nil:
			t.Errorf("%q called %v", input, call)
		case want != "" && (call == nil || call["name"] != "spawn_agent" || call["namespace"] != "multi_agent_v1" || call["arguments"] != want):
			t.Errorf("%q: call %v, want spawn_agent in multi_agent_v1 with %s", input, call, want)
		}
	}
}
