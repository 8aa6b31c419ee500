// Package chattmpl renders chat requests with the model's own chat template
// (the Jinja `chat_template` of a Hugging Face tokenizer_config.json) the way
// an OpenAI-compatible engine (vLLM) does before tokenizing, so that the
// edge's token ids, and so its block keys, are the engine's. See DESIGN.md.
//
// Rendering is a pure function of the template and the request: no I/O (a
// template cannot include files), no clock (strftime_now reads Input.Now).
// gonja's logging (logrus, global) stays at its default, off: a template
// error is returned to the caller.
package chattmpl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// Template is a parsed chat template with the special tokens it may name.
// It is safe for concurrent use.
type Template struct {
	tpl      *exec.Template
	specials map[string]any
	native   nativeRenderer // nil: gonja renders (qwen3.go)
	// partsContent: the template iterates message content parts (content.go).
	partsContent bool
}

// Input is one chat request as the engine's OpenAI server receives it.
type Input struct {
	// Messages is the request's "messages" JSON array.
	Messages json.RawMessage
	// Tools is the request's "tools" JSON array, or empty.
	Tools json.RawMessage
	// AddGenerationPrompt opens the assistant's turn (vLLM's default for
	// chat completions is true).
	AddGenerationPrompt bool
	// Kwargs are the request's chat_template_kwargs (for example
	// {"enable_thinking": false}), as a JSON object, or empty.
	Kwargs json.RawMessage
	// Now is what strftime_now formats; zero makes a template that calls
	// it fail rather than read a clock.
	Now time.Time
}

// Parse compiles a chat template. specials are the template variables a
// tokenizer_config.json provides (bos_token, eos_token, ...).
func Parse(source string, specials map[string]string) (*Template, error) {
	cfg := config.New()
	// transformers renders chat templates with trim_blocks and lstrip_blocks.
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	if err := filters.Replace("tojson", filterToJSON); err != nil {
		return nil, err
	}
	tests := exec.NewTestSet(map[string]exec.TestFunction{}).Update(builtins.Tests)
	// jinja2's `is true` / `is false` are identity with True / False;
	// gonja's are truthiness, which would take enable_thinking: 0 for false.
	for name, want := range map[string]bool{"true": true, "false": false} {
		if err := tests.Replace(name, exactBool(want)); err != nil {
			return nil, err
		}
	}
	env := &exec.Environment{
		Context:           exec.NewContext(globals()),
		Filters:           filters,
		Tests:             tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           builtins.Methods,
	}
	tpl, err := exec.NewTemplate("chat_template", cfg, &stringLoader{source}, env)
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	sp := make(map[string]any, len(specials))
	for k, v := range specials {
		sp[k] = v
	}
	return &Template{tpl: tpl, specials: sp, native: nativeFor(source), partsContent: iteratesContent(source)}, nil
}

func exactBool(want bool) func(*exec.Context, *exec.Value, *exec.VarArgs) (bool, error) {
	return func(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
		return in.IsBool() && in.Bool() == want, nil
	}
}

// globals are the functions a chat template may call: Jinja's own (without
// lipsum, which is random) and transformers' raise_exception.
func globals() map[string]any {
	g := map[string]any{}
	for _, name := range []string{"range", "dict", "namespace", "cycler", "joiner"} {
		if fn, ok := builtins.GlobalFunctions.Get(name); ok {
			g[name] = fn
		}
	}
	g["raise_exception"] = func(msg string) (string, error) {
		return "", fmt.Errorf("template raised: %s", msg)
	}
	return g
}

// Render renders in with the template, as the engine does.
func (t *Template) Render(in Input) (string, error) {
	p, err := t.prepare(in)
	if err != nil {
		return "", err
	}
	if t.native != nil {
		if out, ok := t.native(p.messages, p.tools, p.hasTools, in.AddGenerationPrompt, p.kwargs); ok {
			return out, nil
		}
	}
	return t.renderGonja(p.data, in.Now)
}

// prepared is a request shaped as the engine hands it to the template.
type prepared struct {
	messages, tools []any
	hasTools        bool
	kwargs          map[string]any // chat_template_kwargs
	data            map[string]any // every template variable
}

func (t *Template) prepare(in Input) (*prepared, error) {
	msgs, err := decodeOrdered(in.Messages)
	if err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	list, ok := msgs.([]any)
	if !ok {
		return nil, errors.New("messages: not a JSON array")
	}
	p := &prepared{messages: make([]any, len(list)), kwargs: map[string]any{}, data: map[string]any{}}
	for i, m := range list {
		if p.messages[i], err = engineMessage(m, t.partsContent); err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
	}
	for k, v := range t.specials {
		p.data[k] = v
	}
	if len(in.Kwargs) > 0 {
		kw, err := decodeOrdered(in.Kwargs)
		if err != nil {
			return nil, fmt.Errorf("chat_template_kwargs: %w", err)
		}
		d, ok := kw.(exec.Dict)
		if !ok {
			return nil, errors.New("chat_template_kwargs: not a JSON object")
		}
		for _, pair := range d.Pairs {
			p.data[pair.Key.String()] = pair.Value.Interface()
			p.kwargs[pair.Key.String()] = pair.Value.Interface()
		}
	}
	p.data["messages"] = p.messages
	p.data["add_generation_prompt"] = in.AddGenerationPrompt
	p.hasTools = len(in.Tools) > 0 && string(in.Tools) != "null"
	if p.hasTools {
		if p.tools, err = engineTools(in.Tools); err != nil {
			return nil, err
		}
		p.data["tools"] = p.tools
	}
	return p, nil
}

// renderGonja runs the template's own text (data: the template variables).
func (t *Template) renderGonja(data map[string]any, now time.Time) (string, error) {
	data["strftime_now"] = func(format string) (string, error) {
		if now.IsZero() {
			return "", errors.New("strftime_now: no time given")
		}
		return strftime(now, format), nil
	}
	out, err := t.tpl.ExecuteToString(exec.NewContext(data))
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	return out, nil
}

// engineMessage turns one request message into what vLLM hands a template
// whose content format is "string" (the template reads message.content as
// text, as Qwen's, Llama's and most do): content is a string, text parts
// joined by newlines, absent or null content ""; assistant tool-call
// arguments parsed from their JSON string into an object; tool_call_id,
// name and reasoning_content carried over.
//
// With parts (a template that iterates message content, vLLM's "openai"
// content format) content is instead a list of {"type": "text", "text"}
// parts: a string becomes one part, absent or null content none.
func engineMessage(m any, parts bool) (exec.Dict, error) {
	msg, ok := m.(exec.Dict)
	if !ok {
		return exec.Dict{}, errors.New("not a JSON object")
	}
	role, _ := dictGet(msg, "role")
	roleStr, ok := role.(string)
	if !ok || roleStr == "" {
		return exec.Dict{}, errors.New("role missing or not a string")
	}
	content, _ := dictGet(msg, "content")
	text, err := flattenContent(content)
	if err != nil {
		return exec.Dict{}, err
	}
	out := exec.Dict{Pairs: []*exec.Pair{}}
	setPair(&out, "role", roleStr)
	if parts {
		setPair(&out, "content", textParts(content))
	} else {
		setPair(&out, "content", text)
	}
	switch roleStr {
	case "assistant":
		if calls, ok := dictGet(msg, "tool_calls"); ok && calls != nil {
			parsed, err := parseToolCalls(calls)
			if err != nil {
				return exec.Dict{}, err
			}
			setPair(&out, "tool_calls", parsed)
		}
		if r, ok := dictGet(msg, "reasoning_content"); ok && r != nil {
			setPair(&out, "reasoning_content", r)
		}
	case "tool":
		if id, ok := dictGet(msg, "tool_call_id"); ok {
			setPair(&out, "tool_call_id", id)
		}
	}
	if name, ok := dictGet(msg, "name"); ok {
		if s, ok := name.(string); ok {
			setPair(&out, "name", s)
		}
	}
	return out, nil
}

// flattenContent joins the text parts of a multi-part content with "\n",
// as vLLM does for string-format templates. Parts the edge cannot render as
// the engine would (images, audio) are an error: their placeholders are
// model specific.
func flattenContent(c any) (string, error) {
	switch x := c.(type) {
	case nil:
		return "", nil
	case string:
		return x, nil
	case []any:
		texts := make([]string, 0, len(x))
		for i, p := range x {
			part, ok := p.(exec.Dict)
			if !ok {
				return "", fmt.Errorf("content[%d]: not an object", i)
			}
			typ, _ := dictGet(part, "type")
			switch typ {
			case "text", "input_text":
				t, _ := dictGet(part, "text")
				s, ok := t.(string)
				if !ok {
					return "", fmt.Errorf("content[%d]: text missing or not a string", i)
				}
				texts = append(texts, s)
			default:
				return "", fmt.Errorf("content[%d]: part type %v is not rendered at the edge", i, typ)
			}
		}
		return strings.Join(texts, "\n"), nil
	default:
		return "", errors.New("content: neither a string nor an array of parts")
	}
}

// parseToolCalls parses each call's function.arguments JSON string into an
// object: transformers' templates expect a mapping there, and vLLM converts
// it before rendering (templates that test `arguments is string` then
// tojson it).
func parseToolCalls(calls any) ([]any, error) {
	list, ok := calls.([]any)
	if !ok {
		return nil, errors.New("tool_calls: not an array")
	}
	out := make([]any, len(list))
	for i, c := range list {
		call, ok := c.(exec.Dict)
		if !ok {
			return nil, fmt.Errorf("tool_calls[%d]: not an object", i)
		}
		out[i] = call
		fn, ok := dictGet(call, "function")
		if !ok {
			continue
		}
		f, ok := fn.(exec.Dict)
		if !ok {
			return nil, fmt.Errorf("tool_calls[%d].function: not an object", i)
		}
		args, ok := dictGet(f, "arguments")
		s, isStr := args.(string)
		if !ok || !isStr {
			continue
		}
		parsed, err := decodeOrdered([]byte(s))
		if err != nil {
			return nil, fmt.Errorf("tool_calls[%d].function.arguments: %w", i, err)
		}
		setPair(&f, "arguments", parsed)
	}
	return out, nil
}

// engineTools shapes each tool as vLLM's request model dumps it: "type"
// then "function" with name, description and parameters in that order
// (null when absent), then any other keys in request order.
func engineTools(raw json.RawMessage) ([]any, error) {
	v, err := decodeOrdered(raw)
	if err != nil {
		return nil, fmt.Errorf("tools: %w", err)
	}
	list, ok := v.([]any)
	if !ok {
		return nil, errors.New("tools: not a JSON array")
	}
	out := make([]any, len(list))
	for i, t := range list {
		tool, ok := t.(exec.Dict)
		if !ok {
			return nil, fmt.Errorf("tools[%d]: not an object", i)
		}
		fn, _ := dictGet(tool, "function")
		f, ok := fn.(exec.Dict)
		if !ok {
			return nil, fmt.Errorf("tools[%d].function: missing or not an object", i)
		}
		if name, _ := dictGet(f, "name"); name == nil {
			return nil, fmt.Errorf("tools[%d].function.name: missing", i)
		}
		if typ, ok := dictGet(tool, "type"); ok && typ != "function" {
			return nil, fmt.Errorf("tools[%d].type: %v, want function", i, typ)
		}
		d := ordered(tool, "type", "function")
		setPair(&d, "type", "function")
		setPair(&d, "function", ordered(f, "name", "description", "parameters"))
		out[i] = d
	}
	return out, nil
}

// ordered returns d with the keys first in that order (null where d lacks
// them), then d's other keys in their order.
func ordered(d exec.Dict, first ...string) exec.Dict {
	out := exec.Dict{Pairs: []*exec.Pair{}}
	for _, k := range first {
		v, _ := dictGet(d, k)
		setPair(&out, k, v)
	}
	for _, p := range d.Pairs {
		k := p.Key.String()
		if !contains(first, k) {
			setPair(&out, k, p.Value.Interface())
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// stringLoader serves the one template and refuses every other name, so a
// template cannot read files ({% include %}, {% import %}, {% extends %}).
type stringLoader struct{ src string }

func (l *stringLoader) Read(path string) (io.Reader, error) {
	if path != "chat_template" {
		return nil, fmt.Errorf("chat template may not load %q", path)
	}
	return strings.NewReader(l.src), nil
}

func (l *stringLoader) Resolve(path string) (string, error) { return path, nil }

func (l *stringLoader) Inherit(string) (loaders.Loader, error) { return l, nil }
