package sim

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/tether-project/tether/worker/engine"
)

func TestCodeSpansReadAsMarkdown(t *testing.T) {
	cases := []struct {
		text    string
		spans   []string
		outside string
	}{
		{"Use the Read tool on `/abs/path/notes.txt`", []string{"/abs/path/notes.txt"}, "Use the Read tool on  "},
		{"`a` and ``b `c` d`` and `` e ``", []string{"a", "b `c` d", "e"}, "  and   and  "},
		{"an `unclosed span", nil, "an `unclosed span"},
		{"``two`` `one` ```three```", []string{"two", "one", "three"}, "     "},
		{"`line\nbreak`", []string{"line break"}, " "},
	}
	for _, tc := range cases {
		spans, outside := codeSpans(tc.text)
		if !slices.Equal(spans, tc.spans) || outside != tc.outside {
			t.Errorf("%q: spans %q outside %q, want %q %q", tc.text, spans, outside, tc.spans, tc.outside)
		}
	}
}

func TestMentionsAreWholeNames(t *testing.T) {
	cases := []struct {
		text, name  string
		exact, want bool
	}{
		{"Use the Read tool", "Read", false, true},
		{"read it", "Read", false, true},
		{"already done", "Read", false, false},
		{"use get_weather.", "get_weather", false, true},
		{"use get_weather_now", "get_weather", false, false},
		{"ListAgents shows them", "Agent", true, false},
		{"ask an agent", "Agent", true, false},
		{"Use the Agent tool:", "Agent", true, true},
		{"spawn_agent please", "spawn_agent", true, true},
	}
	for _, tc := range cases {
		if got := mentions(tc.text, tc.name, tc.exact); got != tc.want {
			t.Errorf("mentions(%q, %q, %v) = %v", tc.text, tc.name, tc.exact, got)
		}
	}
}

func TestAnswerLength(t *testing.T) {
	seen := map[int]bool{}
	for seed := range uint64(200) {
		n := answerLength(seed, "tell me")
		if n < 16 || n > 255 || n != answerLength(seed, "tell me") {
			t.Fatalf("seed %d: %d", seed, n)
		}
		seen[n/16] = true
	}
	if !seen[1] || !seen[2] || !seen[8] || !seen[15] {
		t.Fatalf("lengths by 16s: %v, want short and long answers", seen)
	}
	for text, want := range map[string]int{"Write 2000 words": 2000, "a 300-word summary": 300, "in 50 tokens": 50, "1 word": 1, "word count": 0} {
		if got := askedLength(text); got != want {
			t.Errorf("askedLength(%q) = %d, want %d", text, got, want)
		}
	}
}

func TestArgumentsTakeSpansInRequiredOrder(t *testing.T) {
	schema := []byte(`{"type":"object","properties":{
	 "mode":{"type":"string","enum":["a","b"]},"prompt":{"$ref":"#/$defs/s"},"description":{"type":"string"},"n":{"type":"integer"}},
	 "required":["mode","description","n","prompt"],"$defs":{"s":{"type":"string"}}}`)
	doc, used := argumentsInstance(schema, 1, []string{"first", "second <x>", "third"})
	if doc != `{"mode":"a","description":"first","n":0,"prompt":"second <x>"}` || used != 2 {
		t.Fatalf("%s (%d used)", doc, used)
	}
	// Two calls take the spans in turn.
	tools := []engine.Tool{{Name: "Read", Parameters: []byte(`{"type":"object","properties":{"file_path":{"type":"string"}},"required":["file_path"]}`)},
		{Name: "Bash", Parameters: []byte(`{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}`)}}
	p := planOutput(3, 4096, &engine.OutputOptions{Tools: tools, ParallelToolCalls: true, LastUserText: "Read `a.txt` then Bash `ls`"})
	if len(p.calls) != 2 || p.calls[0].Arguments != `{"file_path":"a.txt"}` || p.calls[1].Arguments != `{"command":"ls"}` {
		t.Fatalf("calls %+v", p.calls)
	}
	for _, c := range p.calls {
		if !json.Valid([]byte(c.Arguments)) {
			t.Fatalf("invalid arguments %s", c.Arguments)
		}
	}
}

// A tool that requires no string property (Codex's spawn_agent: message
// or items, neither required) takes the first span in its first optional
// string property by name; its other properties stay out.
func TestArgumentsOfAToolRequiringNoString(t *testing.T) {
	schema := []byte(`{"type":"object","properties":{"fork_context":{"type":"boolean"},"items":{"type":"array","items":{"type":"object"}},
	 "message":{"type":"string"},"model":{"type":"string"},"reasoning_effort":{"type":"string"}},"additionalProperties":false}`)
	doc, used := argumentsInstance(schema, 1, []string{"read the notes", "extra"})
	if doc != `{"message":"read the notes"}` || used != 1 {
		t.Fatalf("%s (%d used)", doc, used)
	}
	if doc, used := argumentsInstance(schema, 1, nil); doc != `{}` || used != 0 {
		t.Fatalf("no span: %s (%d used)", doc, used)
	}
	// A tool that requires a string fills only what it requires.
	req := []byte(`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"required":["a"]}`)
	if doc, used := argumentsInstance(req, 1, []string{"x", "y"}); doc != `{"a":"x"}` || used != 1 {
		t.Fatalf("required a: %s (%d used)", doc, used)
	}
}

// tool_choice required with no tool named never falls back on a tool that
// starts a sub-agent.
func TestRequiredFallbackSkipsSubagentTools(t *testing.T) {
	tools := []engine.Tool{{Name: "Agent", Subagent: true}, {Name: "Read"}}
	p := planOutput(3, 4096, &engine.OutputOptions{Tools: tools, ToolChoice: "required", LastUserText: "go on"})
	if len(p.calls) != 1 || p.calls[0].Name != "Read" {
		t.Fatalf("calls %+v", p.calls)
	}
	p = planOutput(3, 4096, &engine.OutputOptions{Tools: tools, LastUserText: "go on"})
	if len(p.calls) != 0 || p.finish != "stop" {
		t.Fatalf("auto, nothing named: %+v", p)
	}
}
