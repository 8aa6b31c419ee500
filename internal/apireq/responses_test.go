package apireq

import (
	"encoding/json"
	"strings"
	"testing"
)

// A request with every type of OpenAI's tool union (Codex's default list
// holds a namespace and web_search; gpt-5 names get a custom apply_patch):
// the chat form holds the function tools and the namespace's functions by
// their flat names, nothing else.
func TestResponsesToolUnion(t *testing.T) {
	r := mustParse(t, Responses, `{"model":"m","input":"spawn a helper","tools":[
		{"type":"function","name":"exec_command","parameters":{"type":"object"},"strict":false},
		{"type":"namespace","name":"multi_agent_v1","description":"sub-agents","tools":[
			{"type":"function","name":"spawn_agent","description":"spawn","parameters":{"type":"object","properties":{"message":{"type":"string"}}},"strict":false},
			{"type":"custom","name":"notes","description":"free-form"},
			{"type":"function","name":"close_agent","parameters":{"type":"object"}}]},
		{"type":"web_search","external_web_access":false},
		{"type":"custom","name":"apply_patch","description":"patch","format":{"type":"grammar","syntax":"lark","definition":"start: x"}},
		{"type":"local_shell"},{"type":"shell"},{"type":"apply_patch"},{"type":"file_search","vector_store_ids":["vs"]},
		{"type":"mcp","server_label":"deepwiki","server_url":"https://example.invalid"},{"type":"code_interpreter","container":{"type":"auto"}},
		{"type":"image_generation"},{"type":"computer_use_preview","display_width":1,"display_height":1,"environment":"linux"},
		{"type":"tool_search"},{"type":"web_search_preview"}],
		"tool_choice":{"type":"function","name":"spawn_agent"}}`)
	var tools []chatTool
	if err := json.Unmarshal(r.Chat["tools"], &tools); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools {
		names = append(names, tl.Function.Name)
	}
	if got := strings.Join(names, ","); got != "exec_command,multi_agent_v1__spawn_agent,multi_agent_v1__close_agent" {
		t.Fatalf("chat tools %s", got)
	}
	if !strings.Contains(string(r.Chat["tools"]), `"description":"spawn","parameters":{"type":"object","properties":{"message"`) {
		t.Fatalf("namespace function lost its definition: %s", r.Chat["tools"])
	}
	// tool_choice may name a namespace's function by its own name.
	if got := string(r.Chat["tool_choice"]); got != `{"function":{"name":"multi_agent_v1__spawn_agent"},"type":"function"}` {
		t.Fatalf("tool_choice %s", got)
	}
	if got := r.Responses.CallName("multi_agent_v1__spawn_agent"); got != (ToolName{Namespace: "multi_agent_v1", Name: "spawn_agent"}) {
		t.Fatalf("CallName = %+v", got)
	}
	if got := r.Responses.CallName("exec_command"); got != (ToolName{Name: "exec_command"}) {
		t.Fatalf("CallName(exec_command) = %+v", got)
	}
	// A hosted or custom tool_choice constrains nothing, as in vLLM.
	for _, tc := range []string{`{"type":"web_search_preview"}`, `{"type":"custom","name":"apply_patch"}`, `{"type":"allowed_tools","mode":"auto","tools":[{"type":"web_search"}]}`, `{"type":"mcp","server_label":"x"}`} {
		r := mustParse(t, Responses, `{"model":"m","input":"x","tools":[{"type":"web_search"}],"tool_choice":`+tc+`}`)
		if got := string(r.Chat["tool_choice"]); got != `"auto"` {
			t.Errorf("tool_choice %s: %s", tc, got)
		}
	}
}

// Input items Codex sends back: a namespaced function call renders under
// the flat name the tools have (so the prompt's blocks do not change from
// the turn that offered it to the turn that replays it), custom tool calls
// as function calls, hosted items not at all.
func TestResponsesInputItemKinds(t *testing.T) {
	r := mustParse(t, Responses, `{"model":"m","input":[
		{"type":"message","role":"user","content":[{"type":"input_text","text":"go"}]},
		{"type":"function_call","call_id":"c1","namespace":"multi_agent_v1","name":"spawn_agent","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"spawned"},
		{"type":"custom_tool_call","call_id":"c2","name":"apply_patch","input":"*** Begin Patch"},
		{"type":"custom_tool_call_output","call_id":"c2","output":[{"type":"input_text","text":"Done"}]},
		{"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search","query":"q"}},
		{"type":"local_shell_call","call_id":"c3","status":"completed","action":{"type":"exec","command":["ls"]}},
		{"type":"tool_search_call","arguments":{"query":"x"}},{"type":"compaction","encrypted_content":"opaque"},
		{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAAA-opaque"},
		{"type":"item_reference","id":"msg_1"},{"id":"msg_2"},
		{"role":"user","content":"next"}]}`)
	want := `[{"content":"go","role":"user"},` +
		`{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{}","name":"multi_agent_v1__spawn_agent"},"id":"c1","type":"function"}]},` +
		`{"content":"spawned","role":"tool","tool_call_id":"c1"},` +
		`{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"*** Begin Patch","name":"apply_patch"},"id":"c2","type":"function"}]},` +
		`{"content":"Done","role":"tool","tool_call_id":"c2"},{"content":null,"reasoning":"","role":"assistant"},{"content":"next","role":"user"}]`
	if got := chatMessages(t, r); got != want {
		t.Fatalf("chat messages:\n got %s\nwant %s", got, want)
	}
	if got := strings.Join(r.Responses.ItemReferences(), ","); got != "msg_1,msg_2" {
		t.Fatalf("item references %s", got)
	}
	stored := map[string]string{
		"msg_1": `{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"earlier answer","annotations":[]}]}`,
		"msg_2": `{"type":"message","id":"msg_2","role":"user","content":[{"type":"input_text","text":"earlier question"}]}`,
	}
	if err := r.ResolveItems(func(id string) (json.RawMessage, bool) {
		s, ok := stored[id]
		return json.RawMessage(s), ok
	}); err != nil {
		t.Fatal(err)
	}
	if got := chatMessages(t, r); !strings.HasSuffix(got, `{"content":"Done","role":"tool","tool_call_id":"c2"},{"content":"earlier answer","reasoning":"","role":"assistant"},{"content":"earlier question","role":"user"},{"content":"next","role":"user"}]`) {
		t.Fatalf("resolved: %s", got)
	}
	err := r.ResolveItems(func(string) (json.RawMessage, bool) { return nil, false })
	if err == nil || err.Status != 400 || err.Param != "input[10].id" || !strings.Contains(err.Message, `"msg_1"`) {
		t.Fatalf("unresolved reference: %+v", err)
	}
}
