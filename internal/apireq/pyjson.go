package apireq

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/tether-project/tether/internal/pyjson"
)

// pythonJSON writes a JSON value as Python's json.dumps writes it with its
// defaults: ", " and ": " separators, every character beyond ASCII
// escaped (\uXXXX, surrogate pairs beyond the BMP), floats as Python's
// repr. vLLM's Anthropic endpoint writes a tool_use block's input so as
// the arguments of the chat form's tool call
// (vllm/entrypoints/anthropic/serving.py _convert_tool_use_block:
// json.dumps(block.input)), and a chat template renders that string, so
// the chat form carries the same bytes. raw must be valid JSON.
func pythonJSON(raw json.RawMessage) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	// Per open array or object: whether a value was written in it, and
	// for an object whether the next string is a key.
	type level struct {
		object, any, key bool
	}
	var stack []level
	for {
		t, err := dec.Token()
		if err != nil {
			if b.Len() == 0 {
				return string(raw)
			}
			return b.String()
		}
		if d, ok := t.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			b.WriteRune(rune(d))
			continue
		}
		if n := len(stack); n > 0 {
			top := &stack[n-1]
			switch {
			case top.object && top.key:
				if top.any {
					b.WriteString(", ")
				}
				top.any, top.key = true, false
				pyjson.WriteString(&b, t.(string), true)
				b.WriteString(": ")
				continue
			case top.object:
				top.key = true
			default:
				if top.any {
					b.WriteString(", ")
				}
				top.any = true
			}
		}
		switch x := t.(type) {
		case json.Delim:
			b.WriteRune(rune(x))
			stack = append(stack, level{object: x == '{', key: x == '{'})
		case nil:
			b.WriteString("null")
		case bool:
			b.WriteString(strconv.FormatBool(x))
		case json.Number:
			b.WriteString(pyjson.Number(string(x)))
		case string:
			pyjson.WriteString(&b, x, true)
		}
	}
}
