package chattmpl

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// The Qwen3 template of the test data is recognised and rendered natively
// (the golden test, TestQwen3MatchesJavaScriptReference, then checks the
// native renderer against the JavaScript reference).
func TestQwen3IsRenderedNatively(t *testing.T) {
	if qwenTemplate(t).native == nil {
		t.Fatal("Qwen3's chat_template was not recognised")
	}
	if tpl, err := Parse("{{ messages[0].content }} ", nil); err != nil || tpl.native != nil {
		t.Fatalf("another template: native %v, err %v", tpl != nil && tpl.native != nil, err)
	}
}

// On generated conversations (every role, think blocks in content and as
// reasoning_content, tool calls with and without a function wrapper, tool
// responses, tools, enable_thinking of several types, with and without a
// generation prompt) the native renderer writes what gonja writes from the
// template's own text.
func TestQwen3NativeMatchesGonja(t *testing.T) {
	native := qwenTemplate(t)
	gonja := *native
	gonja.native = nil
	rng := rand.New(rand.NewPCG(12, 34))
	pick := func(xs ...any) any { return xs[rng.IntN(len(xs))] }
	contents := []any{"", "Hello", "\n\nleading and trailing\n\n", "<think>\nplan\n</think>\n\nanswer",
		"<think>a</think>b</think>c", "x<think>y<think>z</think>\n\nw", "</think>", "<tool_response>\nr\n</tool_response>",
		"<tool_response>partial", "é 😀 中文", nil, []any{map[string]any{"type": "text", "text": "part1"}, map[string]any{"type": "text", "text": "part2"}}}
	natives, fallbacks, gonjaErrors := 0, 0, 0
	for n := range 600 {
		var msgs []any
		for range 1 + rng.IntN(7) {
			role := pick("system", "user", "user", "assistant", "assistant", "tool", "developer").(string)
			m := map[string]any{"role": role, "content": pick(contents...)}
			if role == "assistant" {
				switch rng.IntN(4) {
				case 0:
					m["reasoning_content"] = pick("", "thought", "\nthought\n")
				}
				if rng.IntN(3) == 0 {
					var calls []any
					for j := range rng.IntN(3) {
						args, _ := json.Marshal(map[string]any{"q": pick("a", "é", "x\"y").(string), "n": j})
						fn := map[string]any{"name": pick("search", "get_weather"), "arguments": string(args)}
						if rng.IntN(5) == 0 {
							calls = append(calls, fn) // no function wrapper
						} else {
							calls = append(calls, map[string]any{"id": "c", "type": "function", "function": fn})
						}
					}
					m["tool_calls"] = calls
				}
			}
			if role == "tool" {
				m["tool_call_id"] = "c"
			}
			msgs = append(msgs, m)
		}
		in := Input{AddGenerationPrompt: rng.IntN(4) != 0}
		in.Messages, _ = json.Marshal(msgs)
		switch rng.IntN(4) {
		case 0:
			in.Tools = json.RawMessage(`[{"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}]`)
		case 1:
			in.Tools = json.RawMessage(`[]`)
		}
		if rng.IntN(3) == 0 {
			in.Kwargs, _ = json.Marshal(map[string]any{"enable_thinking": pick(true, false, 0, "no")})
		}
		want, wantErr := gonja.Render(in)
		got, gotErr := native.Render(in)
		if wantErr != nil && gotErr == nil {
			// gonja cannot call string methods on an empty string
			// ("".lstrip): jinja2 and the JavaScript reference can; the
			// golden conversations pin the native rendering of such cases.
			gonjaErrors++
			continue
		}
		if (wantErr == nil) != (gotErr == nil) || got != want {
			t.Fatalf("conversation %d %s tools %s kwargs %s:\nnative %q (%v)\n gonja %q (%v)", n, in.Messages, in.Tools, in.Kwargs, got, gotErr, want, wantErr)
		}
		if _, ok := native.nativeRender(in); ok {
			natives++
		} else {
			fallbacks++
		}
	}
	t.Logf("%d native, %d fell back to gonja, %d gonja could not render", natives, fallbacks, gonjaErrors)
	if natives < 450 {
		t.Fatalf("only %d of 600 conversations rendered natively (%d fell back to gonja)", natives, fallbacks)
	}
}

// nativeRender is the native path alone (ok false: it would fall back).
func (t *Template) nativeRender(in Input) (string, bool) {
	p, err := t.prepare(in)
	if err != nil {
		return "", false
	}
	return t.native(p.messages, p.tools, p.hasTools, in.AddGenerationPrompt, p.kwargs)
}
