package worker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/engine"
)

// Options that shape the answer (tools, tool_choice, response_format,
// stop, seed, logprobs). The worker validates them for every engine; the
// simulated engine honours them (worker/engine/sim/DESIGN.md), a proxied
// engine receives the body untouched.

// toolNameRE is OpenAI's rule for function names' characters; their
// length is bounded per dialect (toolNameLimit).
var toolNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// toolNameLimit is the longest function name of a dialect's chat form:
// OpenAI's 64 for chat, Anthropic's 128 for Messages (Claude Code's MCP
// tools are named mcp__<server>__<tool>), and for Responses a namespace's
// function under its flat name (namespace__name, internal/apireq).
func toolNameLimit(d apireq.Dialect) int {
	switch d {
	case apireq.Messages:
		return 128
	case apireq.Responses:
		return 64 + 2 + 64
	}
	return 64
}

const (
	maxTools         = 128
	maxStopSequences = 16
)

type toolSpec struct {
	Type     *string `json:"type"`
	Function *struct {
		Name       *string         `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

type responseFormat struct {
	Type       *string `json:"type"`
	JSONSchema *struct {
		Name   *string         `json:"name"`
		Schema json.RawMessage `json:"schema"`
	} `json:"json_schema"`
}

// outputOptions parses the answer-shaping options of a request body; for
// chat, msgs are the request's messages (roles already checked).
func outputOptions(top map[string]json.RawMessage, chat bool, msgs []prefix.Message, nameLimit int) (*engine.OutputOptions, *apiError) {
	o := &engine.OutputOptions{ParallelToolCalls: true}
	if e := refuseLogprobs(top, chat); e != nil {
		return nil, e
	}
	if raw, ok := present(top, "seed"); ok {
		var seed int64
		if err := json.Unmarshal(raw, &seed); err != nil {
			return nil, badRequest("seed", "seed must be an integer, got %s", truncate(string(raw), 40))
		}
		o.Seed = &seed
	}
	if raw, ok := present(top, "stop"); ok {
		stop, e := parseStop(raw)
		if e != nil {
			return nil, e
		}
		o.Stop = stop
	}
	if !chat {
		return o, nil
	}
	for _, k := range []string{"tools", "tool_choice", "parallel_tool_calls", "response_format"} {
		if _, ok := present(top, k); !ok {
			continue
		}
		var e *apiError
		switch k {
		case "tools":
			e = parseTools(top[k], o, nameLimit)
		case "tool_choice":
			e = parseToolChoice(top[k], o)
		case "parallel_tool_calls":
			if json.Unmarshal(top[k], &o.ParallelToolCalls) != nil {
				e = badRequest(k, "parallel_tool_calls must be a boolean")
			}
		case "response_format":
			e = parseResponseFormat(top[k], o)
		}
		if e != nil {
			return nil, e
		}
	}
	if e := checkToolChoice(o); e != nil {
		return nil, e
	}
	// The last user turn is the last user message with text the user
	// wrote: agent harnesses add user messages (and spans of them) of
	// their own context (userturn.go).
	last := -1
	for i, m := range msgs {
		if m.Role != "user" {
			continue
		}
		if text := userText(m.Content); text != "" {
			last, o.LastUserText = i, text
		}
	}
	for _, m := range msgs[last+1:] {
		if m.Role == "tool" || m.Role == "function" {
			o.ToolResults = true
		}
	}
	return o, nil
}

// present returns a top-level field unless it is absent or null.
func present(top map[string]json.RawMessage, k string) (json.RawMessage, bool) {
	raw, ok := top[k]
	if !ok || string(bytes.TrimSpace(raw)) == "null" {
		return nil, false
	}
	return raw, true
}

// refuseLogprobs answers 400 to a request for log probabilities: the
// simulated engine has none, and the worker does not relay a proxied
// engine's, so accepting them would silently drop them.
func refuseLogprobs(top map[string]json.RawMessage, chat bool) *apiError {
	raw, ok := present(top, "logprobs")
	if ok {
		v := string(bytes.TrimSpace(raw))
		if v != "false" && v != "0" {
			off := "0"
			if chat {
				off = "false"
			}
			return badRequest("logprobs", "logprobs are not supported by this worker (the simulated engine computes none and proxied log probabilities are not relayed); omit logprobs or set it to %s", off)
		}
	}
	if raw, ok := present(top, "top_logprobs"); ok && string(bytes.TrimSpace(raw)) != "0" {
		return badRequest("top_logprobs", "top_logprobs is not supported by this worker (no log probabilities); omit it")
	}
	return nil
}

func parseStop(raw json.RawMessage) ([]string, *apiError) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("stop", "stop must be a string or an array of strings")
	}
	if len(many) > maxStopSequences {
		return nil, badRequest("stop", "stop has %d sequences, at most %d are supported", len(many), maxStopSequences)
	}
	out := many[:0]
	for _, s := range many {
		if s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}

func parseTools(raw json.RawMessage, o *engine.OutputOptions, nameLimit int) *apiError {
	var tools []toolSpec
	if err := json.Unmarshal(raw, &tools); err != nil {
		return badRequest("tools", "tools must be an array of {\"type\":\"function\",\"function\":{\"name\":…,\"parameters\":…}}: %v", err)
	}
	if len(tools) > maxTools {
		return badRequest("tools", "%d tools, at most %d are supported", len(tools), maxTools)
	}
	seen := map[string]bool{}
	for i, t := range tools {
		if t.Type == nil || *t.Type != "function" {
			got := "missing"
			if t.Type != nil {
				got = fmt.Sprintf("%q", truncate(*t.Type, 40))
			}
			return badRequest(fmt.Sprintf("tools[%d].type", i), "tools[%d].type is %s; only \"function\" tools are supported", i, got)
		}
		if t.Function == nil || t.Function.Name == nil {
			return newAPIError(400, "invalid_request_error", "missing_required_parameter", fmt.Sprintf("tools[%d].function.name", i), "tools[%d].function.name is required", i)
		}
		name := *t.Function.Name
		if !toolNameRE.MatchString(name) || len(name) > nameLimit {
			return badRequest(fmt.Sprintf("tools[%d].function.name", i), "tools[%d].function.name %q must match ^[a-zA-Z0-9_-]{1,%d}$", i, truncate(name, 80), nameLimit)
		}
		if seen[name] {
			return badRequest(fmt.Sprintf("tools[%d].function.name", i), "tools[%d].function.name %q is a duplicate", i, name)
		}
		seen[name] = true
		params := bytes.TrimSpace(t.Function.Parameters)
		if len(params) > 0 && string(params) != "null" && params[0] != '{' {
			return badRequest(fmt.Sprintf("tools[%d].function.parameters", i), "tools[%d].function.parameters must be a JSON schema object", i)
		}
		o.Tools = append(o.Tools, engine.Tool{Name: name, Parameters: params})
	}
	return nil
}

func parseToolChoice(raw json.RawMessage, o *engine.OutputOptions) *apiError {
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		switch mode {
		case "none", "auto", "required":
			o.ToolChoice = mode
			return nil
		}
		return badRequest("tool_choice", "tool_choice %q is not one of none, auto, required (or {\"type\":\"function\",\"function\":{\"name\":…}})", truncate(mode, 40))
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
		return badRequest("tool_choice", "tool_choice must be none, auto, required or {\"type\":\"function\",\"function\":{\"name\":…}}")
	}
	o.ToolChoice, o.ToolName = "function", named.Function.Name
	return nil
}

// checkToolChoice refuses a choice that cannot be honoured: a required or
// named call without tools, or a name that is not among them.
func checkToolChoice(o *engine.OutputOptions) *apiError {
	switch o.ToolChoice {
	case "required":
		if len(o.Tools) == 0 {
			return badRequest("tool_choice", "tool_choice \"required\" needs tools")
		}
	case "function":
		for _, t := range o.Tools {
			if t.Name == o.ToolName {
				return nil
			}
		}
		return badRequest("tool_choice", "tool_choice names function %q, which is not in tools", truncate(o.ToolName, 80))
	}
	return nil
}

func parseResponseFormat(raw json.RawMessage, o *engine.OutputOptions) *apiError {
	var rf responseFormat
	if err := json.Unmarshal(raw, &rf); err != nil || rf.Type == nil {
		return badRequest("response_format", "response_format must be {\"type\":\"text\"|\"json_object\"|\"json_schema\", …}")
	}
	switch *rf.Type {
	case "text", "json_object":
	case "json_schema":
		if rf.JSONSchema == nil {
			return newAPIError(400, "invalid_request_error", "missing_required_parameter", "response_format.json_schema", "response_format type json_schema needs response_format.json_schema")
		}
		if rf.JSONSchema.Name == nil || strings.TrimSpace(*rf.JSONSchema.Name) == "" {
			return newAPIError(400, "invalid_request_error", "missing_required_parameter", "response_format.json_schema.name", "response_format.json_schema.name is required")
		}
		s := bytes.TrimSpace(rf.JSONSchema.Schema)
		if len(s) > 0 && string(s) != "null" && s[0] != '{' {
			return badRequest("response_format.json_schema.schema", "response_format.json_schema.schema must be a JSON schema object")
		}
		o.Schema = s
	default:
		return badRequest("response_format.type", "response_format.type %q is not one of text, json_object, json_schema", truncate(*rf.Type, 40))
	}
	o.ResponseFormat = *rf.Type
	return nil
}
