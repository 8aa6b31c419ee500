package worker

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/tether-project/tether/test/workertest"
)

// The simulated model lets agents finish (worker/engine/sim/DESIGN.md,
// "What the model answers"). Before: free text always ran to max_tokens
// (Claude Code then asks to resume, forever), tool choice read Claude
// Code's system reminders, a request naming no tool called the first one
// (Claude Code's Agent, spawning sub-agents without end), and tool
// arguments were vocabulary words (Read got file_path "passes").

// answer is what the tests read of a Messages answer.
type answer struct {
	StopReason string `json:"stop_reason"`
	Content    []struct {
		Type     string          `json:"type"`
		Text     string          `json:"text"`
		Thinking string          `json:"thinking"`
		ID       string          `json:"id"`
		Name     string          `json:"name"`
		Input    json.RawMessage `json:"input"`
	} `json:"content"`
	Usage struct {
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

func decodeMessages(t *testing.T, r response) answer {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var a answer
	if err := json.Unmarshal(r.body, &a); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	return a
}

// toolUses are the answer's tool calls as name{input} (the input's keys
// sorted, without HTML escapes).
func (a answer) toolUses() []string {
	var out []string
	for _, b := range a.Content {
		if b.Type != "tool_use" {
			continue
		}
		var v any
		if err := json.Unmarshal(b.Input, &v); err != nil {
			out = append(out, b.Name+"(bad input "+string(b.Input)+")")
			continue
		}
		var buf strings.Builder
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(v)
		out = append(out, b.Name+strings.TrimSpace(buf.String()))
	}
	return out
}

// claudeTools are Claude Code's tools as it sends them (its capture:
// Agent first, required in its input_schema's order).
const claudeTools = `"tools":[
 {"name":"Agent","description":"Launch a new agent","input_schema":{"type":"object","properties":{"description":{"type":"string"},"prompt":{"type":"string"},"subagent_type":{"type":"string"}},"required":["description","prompt"]}},
 {"name":"Bash","description":"Run a command","input_schema":{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"number"}},"required":["command"]}},
 {"name":"Read","description":"Read a file","input_schema":{"type":"object","properties":{"file_path":{"type":"string"},"limit":{"type":"integer"}},"required":["file_path"]}},
 {"name":"WebSearch","description":"Search the web","input_schema":{"type":"object","properties":{"query":{"type":"string","minLength":2}},"required":["query"]}}]`

// reminder is a Claude Code system reminder naming tools the user did not.
const reminder = `<system-reminder>\nAttribution for git commits: use Bash and Read as you see fit; an Agent may help.\n</system-reminder>\n`

// claudeBody is a Claude Code request: the reminder and the user's text
// as two text blocks, an inline system message after them, thinking on.
func claudeBody(user string, more string) string {
	msgs := `[{"role":"user","content":[{"type":"text","text":` + jsonQuote(reminder) + `},{"type":"text","text":` + jsonQuote(user) + `}]},
	 {"role":"system","content":"# Environment\nPrimary working directory: /tmp/work"}` + more + `]`
	return `{"model":"test-model","max_tokens":32000,"stream":false,"thinking":{"type":"adaptive"},"system":"You are Claude Code.",` +
		claudeTools + `,"messages":` + msgs + `}`
}

func jsonQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestToolChoiceReadsWhatTheUserWrote(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	url := s.URL() + "/v1/messages"
	cases := []struct{ user, want string }{
		{"Use the Read tool on `/abs/path/notes.txt`", `Read{"file_path":"/abs/path/notes.txt"}`},
		// A span holding backquotes takes a longer run of them (Markdown).
		{"Use the Agent tool: `check notes` ``Use the Read tool on `/abs/notes.txt` ``",
			"Agent{\"description\":\"check notes\",\"prompt\":\"Use the Read tool on `/abs/notes.txt`\"}"},
		{"Use the Agent tool: `check notes` `Use the Read tool on /abs/notes.txt`",
			`Agent{"description":"check notes","prompt":"Use the Read tool on /abs/notes.txt"}`},
		{"Bash `ls -l > out.txt`", `Bash{"command":"ls -l > out.txt"}`},
		// The reminder names Bash and Read; the user named WebSearch.
		{"WebSearch for tether", `WebSearch{"query":`},
	}
	for _, tc := range cases {
		a := decodeMessages(t, post(t, c, url, claudeBody(tc.user, ""), nil))
		uses := a.toolUses()
		if a.StopReason != "tool_use" || len(uses) != 1 || !strings.HasPrefix(uses[0], tc.want) {
			t.Fatalf("%q: stop %s, calls %v, want %s", tc.user, a.StopReason, uses, tc.want)
		}
		for _, b := range a.Content {
			if b.Type == "thinking" && (strings.Contains(b.Thinking, "system-reminder") || !strings.Contains(b.Thinking, strings.Fields(tc.user)[0])) {
				t.Fatalf("%q: thinking %q quotes the reminder, not the user", tc.user, b.Thinking)
			}
		}
	}
	// Naming no tool, or an agent in prose, is answered in text: no
	// sub-agent is spawned unless Agent is named as written.
	for _, user := range []string{"say hello", "ask an agent to look at it", "an Agent-like helper, please", "Agents are great"} {
		a := decodeMessages(t, post(t, c, url, claudeBody(user, ""), nil))
		if a.StopReason != "end_turn" || len(a.toolUses()) != 0 {
			t.Fatalf("%q: stop %s, calls %v, want a text answer", user, a.StopReason, a.toolUses())
		}
	}
}

// Claude Code sends a tool's result in a user message that may also carry
// text blocks (reminders): the tools ran, the model answers in text and
// ends its turn.
func TestAfterToolResultsWithRemindersTheModelAnswers(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	url := s.URL() + "/v1/messages"
	user := "Use the Read tool on `/abs/path/notes.txt`"
	first := decodeMessages(t, post(t, c, url, claudeBody(user, ""), nil))
	var call struct{ ID, Input string }
	for _, b := range first.Content {
		if b.Type == "tool_use" {
			call.ID, call.Input = b.ID, string(b.Input)
		}
	}
	more := `,{"role":"assistant","content":[{"type":"tool_use","id":"` + call.ID + `","name":"Read","input":` + call.Input + `}]},
	 {"role":"user","content":[{"type":"tool_result","tool_use_id":"` + call.ID + `","content":"the notes say hi"},{"type":"text","text":` + jsonQuote(reminder) + `}]}`
	a := decodeMessages(t, post(t, c, url, claudeBody(user, more), nil))
	if a.StopReason != "end_turn" || len(a.toolUses()) != 0 {
		t.Fatalf("after the result: stop %s, calls %v", a.StopReason, a.toolUses())
	}
	text := ""
	for _, b := range a.Content {
		if b.Type == "text" {
			text += b.Text
		}
	}
	if text == "" || a.Usage.OutputTokens < 16 || a.Usage.OutputTokens > 255 {
		t.Fatalf("text %q in %d tokens: want an answer of 16..255 tokens", text, a.Usage.OutputTokens)
	}
}

// Free text ends on its own, well under max_tokens: finish stop (Messages
// end_turn, Responses completed), a length drawn from the prompt and the
// request's seed, or the length the user asks for; max_tokens still cuts.
func TestFreeTextEndsOnItsOwn(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	chat := s.URL() + "/v1/chat/completions"
	finish := func(extra, user string) (string, int) {
		out := decodeChat(t, post(t, c, chat, chatBody(user, extra), nil))
		_, n, _ := usageOf(t, post(t, c, chat, chatBody(user, extra), nil).json(t))
		return out.Choices[0].FinishReason, n
	}
	lengths := map[int]bool{}
	for seed := range 8 {
		f, n := finish(fmt.Sprintf(`"max_tokens":32000,"seed":%d`, seed), "tell me about caches")
		if f != "stop" || n < 16 || n > 255 {
			t.Fatalf("seed %d: finish %s after %d tokens, want stop after 16..255", seed, f, n)
		}
		if f2, n2 := finish(fmt.Sprintf(`"max_tokens":32000,"seed":%d`, seed), "tell me about caches"); f2 != f || n2 != n {
			t.Fatalf("seed %d not deterministic: %d then %d tokens", seed, n, n2)
		}
		lengths[n] = true
	}
	if len(lengths) < 3 {
		t.Fatalf("8 seeds gave lengths %v: want a distribution", lengths)
	}
	if f, n := finish(`"max_tokens":32000`, "Write 300 words about caches"); f != "stop" || n != 300 {
		t.Fatalf("300 words asked: finish %s after %d tokens", f, n)
	}
	if f, n := finish(`"max_tokens":5`, "tell me about caches"); f != "length" || n != 5 {
		t.Fatalf("max_tokens 5: finish %s after %d tokens", f, n)
	}
	if f, n := finish(`"max_tokens":40,"ignore_eos":true`, "tell me about caches"); f != "length" || n != 40 {
		t.Fatalf("ignore_eos: finish %s after %d tokens", f, n)
	}
	if f, n := finish(`"max_tokens":400,"min_tokens":300`, "tell me about caches"); f != "stop" || n != 300 {
		t.Fatalf("min_tokens 300: finish %s after %d tokens", f, n)
	}
	a := decodeMessages(t, post(t, c, s.URL()+"/v1/messages", `{"model":"test-model","max_tokens":32000,"messages":[{"role":"user","content":"hello"}]}`, nil))
	if a.StopReason != "end_turn" {
		t.Fatalf("Messages stop_reason %s, want end_turn", a.StopReason)
	}
	r := post(t, c, s.URL()+"/v1/responses", `{"model":"test-model","max_output_tokens":32000,"input":"hello"}`, nil)
	if st := r.json(t)["status"]; st != "completed" {
		t.Fatalf("Responses status %v, want completed: %s", st, r.body)
	}
}

// Codex: its context messages (environment context) are not the user's
// turn; a backquoted span is the command it asks to run.
func TestCodexTurnRunsTheCommandAsked(t *testing.T) {
	s := workertest.Start(t, New, testConfig("w0"))
	c := testClient(t)
	tools := `"tools":[{"type":"function","name":"exec_command","strict":false,"parameters":{"type":"object","properties":{"cmd":{"type":"string"},"workdir":{"type":"string"},"yield_time_ms":{"type":"number"}},"required":["cmd"],"additionalProperties":false}},
	 {"type":"function","name":"view_image","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}]`
	input := func(user, more string) string {
		return `{"model":"test-model","stream":false,"store":false,"tool_choice":"auto","parallel_tool_calls":true,` + tools + `,"input":[
		 {"type":"message","role":"developer","content":[{"type":"input_text","text":"You are a coding agent running in the Codex CLI."}]},
		 {"type":"message","role":"user","content":[{"type":"input_text","text":"<environment_context>\n  <cwd>/tmp/work</cwd>\n  <shell>bash</shell>\n</environment_context>"}]},
		 {"type":"message","role":"user","content":[{"type":"input_text","text":` + jsonQuote(user) + `}]}` + more + `]}`
	}
	r := post(t, c, s.URL()+"/v1/responses", input("Use exec_command to run `cat notes.txt`", ""), nil)
	var out struct {
		Status string `json:"status"`
		Output []struct {
			Type      string `json:"type"`
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
			CallID    string `json:"call_id"`
		} `json:"output"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil || r.status != 200 {
		t.Fatalf("%d %v: %s", r.status, err, r.body)
	}
	var calls []string
	callID := ""
	for _, it := range out.Output {
		if it.Type == "function_call" {
			calls, callID = append(calls, it.Name+it.Arguments), it.CallID
		}
	}
	if len(calls) != 1 || calls[0] != `exec_command{"cmd":"cat notes.txt"}` {
		t.Fatalf("calls %v: want exec_command {\"cmd\":\"cat notes.txt\"}", calls)
	}
	more := `,{"type":"function_call","call_id":"` + callID + `","name":"exec_command","arguments":"{\"cmd\":\"cat notes.txt\"}"},
	 {"type":"function_call_output","call_id":"` + callID + `","output":"hi"}`
	for _, body := range []string{input("Use exec_command to run `cat notes.txt`", more), input("say hello", "")} {
		r = post(t, c, s.URL()+"/v1/responses", body, nil)
		if err := json.Unmarshal(r.body, &out); err != nil || out.Status != "completed" || len(out.Output) == 0 || out.Output[len(out.Output)-1].Type != "message" {
			t.Fatalf("want a completed message: %s", r.body)
		}
	}
}
