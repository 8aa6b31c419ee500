package chattmpl

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// nativeRenderer renders a known template in Go. ok false hands the
// request to gonja (an input the native code does not cover exactly).
type nativeRenderer func(messages []any, tools []any, hasTools bool, addGen bool, kwargs map[string]any) (out string, ok bool)

// natives are templates recognised by the SHA-256 of their exact text and
// rendered natively: gonja takes 12–16 ms for a 32k-token conversation
// (DESIGN.md, "Speed"). Each is tested against the JavaScript reference and
// against gonja on generated conversations (qwen3_test.go).
var natives = map[string]nativeRenderer{
	// Qwen3's chat_template (tokenizer_config.json of Qwen3 models).
	"87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5": renderQwen3,
}

func nativeFor(source string) nativeRenderer {
	sum := sha256.Sum256([]byte(source))
	return natives[hex.EncodeToString(sum[:])]
}

const (
	qwen3ToolsHead = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
	qwen3ToolsTail = "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
)

// qwen3Msg is one shaped message as Qwen3's template reads it.
type qwen3Msg struct {
	role, content string
	reasoning     any // reasoning_content, nil when absent
	calls         []any
}

// renderQwen3 is Qwen3's chat template, statement for statement (the
// template's text is in ../hftok/testdata/qwen3/tokenizer_config.json).
func renderQwen3(messages []any, tools []any, hasTools bool, addGen bool, kwargs map[string]any) (string, bool) {
	if len(messages) == 0 {
		return "", false
	}
	msgs := make([]qwen3Msg, len(messages))
	for i, m := range messages {
		d, ok := m.(exec.Dict)
		if !ok {
			return "", false
		}
		role, _ := dictGet(d, "role")
		content, _ := dictGet(d, "content")
		msgs[i].role, _ = role.(string)
		if msgs[i].content, ok = content.(string); !ok {
			return "", false
		}
		msgs[i].reasoning, _ = dictGet(d, "reasoning_content")
		if calls, ok := dictGet(d, "tool_calls"); ok && calls != nil {
			if msgs[i].calls, ok = calls.([]any); !ok {
				return "", false
			}
		}
	}
	var b strings.Builder
	b.Grow(len(messages) * 256)
	if hasTools && len(tools) > 0 {
		b.WriteString("<|im_start|>system\n")
		if msgs[0].role == "system" {
			b.WriteString(msgs[0].content + "\n\n")
		}
		b.WriteString(qwen3ToolsHead)
		for _, t := range tools {
			b.WriteString("\n")
			if err := writeJSON(&b, t, &jsonOpts{itemSep: ", ", keySep: ": "}, 0); err != nil {
				return "", false
			}
		}
		b.WriteString(qwen3ToolsTail)
	} else if msgs[0].role == "system" {
		b.WriteString("<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n")
	}
	// The last user query: the last user turn that is not a tool response
	// wrapped as a user message.
	lastQuery := len(msgs) - 1
	for i := len(msgs) - 1; i >= 0; i-- {
		c := msgs[i].content
		if msgs[i].role == "user" && !(strings.HasPrefix(c, "<tool_response>") && strings.HasSuffix(c, "</tool_response>")) {
			lastQuery = i
			break
		}
	}
	for i, m := range msgs {
		last := i == len(msgs)-1
		switch {
		case m.role == "user" || (m.role == "system" && i > 0):
			b.WriteString("<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n")
		case m.role == "assistant":
			if !qwen3Assistant(&b, m, i > lastQuery, last) {
				return "", false
			}
		case m.role == "tool":
			if i == 0 || msgs[i-1].role != "tool" {
				b.WriteString("<|im_start|>user")
			}
			b.WriteString("\n<tool_response>\n" + m.content + "\n</tool_response>")
			if last || msgs[i+1].role != "tool" {
				b.WriteString("<|im_end|>\n")
			}
		}
	}
	if addGen {
		b.WriteString("<|im_start|>assistant\n")
		if v, ok := kwargs["enable_thinking"]; ok {
			if f, isBool := v.(bool); isBool && !f {
				b.WriteString("<think>\n\n</think>\n\n")
			}
		}
	}
	return b.String(), true
}

func qwen3Assistant(b *strings.Builder, m qwen3Msg, afterLastQuery, last bool) bool {
	content, reasoning := m.content, ""
	if m.reasoning != nil {
		s, ok := m.reasoning.(string)
		if !ok {
			return false
		}
		reasoning = s
	} else if strings.Contains(m.content, "</think>") {
		content = strings.TrimLeft(m.content[strings.LastIndex(m.content, "</think>")+len("</think>"):], "\n")
		before := strings.TrimRight(m.content[:strings.Index(m.content, "</think>")], "\n")
		if j := strings.LastIndex(before, "<think>"); j >= 0 {
			before = before[j+len("<think>"):]
		}
		reasoning = strings.TrimLeft(before, "\n")
	}
	if afterLastQuery && (last || reasoning != "") {
		b.WriteString("<|im_start|>assistant\n<think>\n" + strings.Trim(reasoning, "\n") + "\n</think>\n\n" + strings.TrimLeft(content, "\n"))
	} else {
		b.WriteString("<|im_start|>assistant\n" + content)
	}
	for j, c := range m.calls {
		if (j == 0 && content != "") || j > 0 {
			b.WriteString("\n")
		}
		call, ok := c.(exec.Dict)
		if !ok {
			return false
		}
		if fn, ok := dictGet(call, "function"); ok {
			if d, isDict := fn.(exec.Dict); isDict && len(d.Pairs) > 0 {
				call = d
			} else if fn != nil && !isDict {
				return false
			}
		}
		name, _ := dictGet(call, "name")
		nameStr, ok := name.(string)
		if !ok {
			return false
		}
		args, ok := dictGet(call, "arguments")
		if !ok {
			return false
		}
		b.WriteString("<tool_call>\n{\"name\": \"" + nameStr + "\", \"arguments\": ")
		if s, isStr := args.(string); isStr {
			b.WriteString(s)
		} else if err := writeJSON(b, args, &jsonOpts{itemSep: ", ", keySep: ": "}, 0); err != nil {
			return false
		}
		b.WriteString("}\n</tool_call>")
	}
	b.WriteString("<|im_end|>\n")
	return true
}
