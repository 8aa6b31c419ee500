package apireq

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// OpenAI Responses API (https://platform.openai.com/docs/api-reference/responses),
// converted to the chat form as vLLM converts it
// (vllm/entrypoints/openai/responses/utils.py construct_input_messages):
// instructions become a system message; a string input one user message;
// input items in order — a message item a chat message (its text parts
// joined), a function_call item a tool call of the assistant message
// before it (or of a new one), named by its flat name when it has a
// namespace (FlatToolName), a function_call_output item a tool message, a
// reasoning item the reasoning of the assistant message before it (or of
// a new one); a custom tool's call and output as a function's; an
// item_reference once resolved (ResolveItems); the items of hosted tools
// are accepted and not rendered (unrenderedItems). Function tools and the
// functions of namespace tools become chat function tools (responsesTools),
// text.format the response_format, max_output_tokens the completion budget.
// A previous response's history (or a conversation's items) goes between
// the instructions and the input (WithHistory): the previous request's
// input items carry over, system and developer messages among them; its
// instructions do not (History leaves them out), as OpenAI's
// Response.instructions says. Fields the chat form has no use for
// (metadata, prompt_cache_key, client_metadata, service_tier, ...) are
// accepted and left to the engine.

func (r *Request) parseResponses() *Error {
	rf := &ResponsesFields{Store: true}
	r.Responses = rf
	r.IncludeUsage = r.Stream
	if err := r.maxTokens("max_output_tokens"); err != nil {
		return err
	}
	if err := r.parseStorage(rf); err != nil {
		return err
	}
	var err *Error
	if rf.Instructions, _, err = r.String("instructions"); err != nil {
		return err
	}
	if rf.Instructions != "" {
		rf.instr = []chatMessage{{Role: "system", Content: rf.Instructions}}
	}
	if err := r.parseInput(rf); err != nil {
		return err
	}
	if err := r.parseReasoning(rf); err != nil {
		return err
	}
	if err := r.parseInclude(rf); err != nil {
		return err
	}
	if err := r.parseEchoed(); err != nil {
		return err
	}
	fields := map[string]json.RawMessage{}
	if err := r.responsesTools(fields); err != nil {
		return err
	}
	if raw, ok := r.Present("parallel_tool_calls"); ok {
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return BadRequest("", "parallel_tool_calls", "invalid type for \"parallel_tool_calls\": want a boolean, got %s", Kind(raw))
		}
		fields["parallel_tool_calls"] = raw
	}
	if err := r.responsesFormat(fields); err != nil {
		return err
	}
	r.Chat = fields
	return r.rebuildResponses()
}

// parseStorage reads what the request stores and continues: store,
// background, previous_response_id and conversation.
func (r *Request) parseStorage(rf *ResponsesFields) *Error {
	var err *Error
	var ok bool
	if v, set, e := r.Bool("store"); e != nil {
		return e
	} else if set {
		rf.Store = v
	}
	if rf.Background, _, err = r.Bool("background"); err != nil {
		return err
	}
	if rf.Background && !rf.Store {
		return BadRequest("", "background", "background mode needs store: true (a background response is retrieved by id)")
	}
	if rf.PreviousResponseID, ok, err = r.String("previous_response_id"); err != nil {
		return err
	} else if ok && strings.TrimSpace(rf.PreviousResponseID) == "" {
		return BadRequest("", "previous_response_id", "previous_response_id must not be empty")
	}
	raw, ok := r.Present("conversation")
	if !ok {
		return nil
	}
	var id string
	if json.Unmarshal(raw, &id) != nil {
		var obj struct {
			ID *string `json:"id"`
		}
		if json.Unmarshal(raw, &obj) != nil || obj.ID == nil {
			return BadRequest("", "conversation", "invalid conversation: want a conversation id or {\"id\": ...}")
		}
		id = *obj.ID
	}
	rf.Conversation = strings.TrimSpace(id)
	if rf.PreviousResponseID != "" && rf.Conversation != "" {
		return BadRequest("", "previous_response_id", "previous_response_id and conversation cannot be used together")
	}
	return nil
}

// parseInput reads input: a string (one user message) or input items.
func (r *Request) parseInput(rf *ResponsesFields) *Error {
	raw, ok := r.Present("input")
	if !ok {
		return Missing("input")
	}
	if raw[0] == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		rf.Input = []json.RawMessage{marshal(map[string]any{"type": "message", "role": "user", "content": s})}
		rf.input = []chatMessage{{Role: "user", Content: s}}
		return nil
	}
	if json.Unmarshal(raw, &rf.Input) != nil {
		return BadRequest("", "input", "invalid type for \"input\": want a string or an array of input items, got %s", Kind(raw))
	}
	if len(rf.Input) == 0 {
		return BadRequest("", "input", "input must contain at least one item")
	}
	var err *Error
	rf.input, err = responsesItems(rf.Input, "input")
	return err
}

// WithHistory puts a previous response's conversation (chat messages, as
// History returned them for it) before this request's input.
func (r *Request) WithHistory(history []json.RawMessage) *Error {
	if r.Responses == nil {
		return BadRequest("", "", "not a Responses request")
	}
	r.Responses.history = history
	return r.rebuildResponses()
}

// History is this request's conversation in the chat form without its
// instructions: what an engine keeps to continue from the response (the
// response's own output appended, AssistantMessage).
func (r *Request) History() []json.RawMessage {
	var msgs []json.RawMessage
	if err := json.Unmarshal(r.Chat["messages"], &msgs); err != nil {
		return nil
	}
	if len(r.Responses.instr) > 0 && len(msgs) > 0 {
		msgs = msgs[1:]
	}
	return msgs
}

func (r *Request) rebuildResponses() *Error {
	rf := r.Responses
	history := rf.history
	msgs := make([]any, 0, len(rf.instr)+len(history)+len(rf.input))
	for _, m := range rf.instr {
		msgs = append(msgs, m)
	}
	for _, h := range history {
		msgs = append(msgs, h)
	}
	for _, m := range rf.input {
		msgs = append(msgs, m)
	}
	if err := r.setChatForm(msgs, r.Chat); err != nil {
		err.Param = strings.Replace(err.Param, "messages", "input", 1)
		return err
	}
	return nil
}

// responseItem is one input item.
type responseItem struct {
	Type      *string         `json:"type"`
	ID        *string         `json:"id"`
	Role      *string         `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    *string         `json:"call_id"`
	Name      *string         `json:"name"`
	Namespace *string         `json:"namespace"`
	// Arguments and Input are strings in the items rendered (a function's
	// and a custom tool's call); other items have other shapes there.
	Arguments json.RawMessage `json:"arguments"`
	Input     json.RawMessage `json:"input"`
	Output    json.RawMessage `json:"output"`
	Summary   []struct {
		Text string `json:"text"`
	} `json:"summary"`
}

// unrenderedItems are the input item types of OpenAI's union
// (openai-python src/openai/types/responses/response_input_item_param.py)
// that are accepted and left out of the chat form: the calls and outputs
// of hosted tools, tool search, additional tools, compaction and programs.
// vLLM's chat path converts none of them (vllm/entrypoints/openai/
// responses/utils.py _construct_message_from_response_item hands them to
// the renderer as they are, which takes no message without a role); an
// engine that serves them gets them in the body it is sent.
var unrenderedItems = map[string]bool{
	"file_search_call": true, "computer_call": true, "computer_call_output": true, "web_search_call": true,
	"tool_search_call": true, "tool_search_output": true, "additional_tools": true, "image_generation_call": true,
	"code_interpreter_call": true, "local_shell_call": true, "local_shell_call_output": true,
	"shell_call": true, "shell_call_output": true, "apply_patch_call": true, "apply_patch_call_output": true,
	"mcp_list_tools": true, "mcp_approval_request": true, "mcp_approval_response": true, "mcp_call": true,
	"compaction": true, "compaction_trigger": true, "program": true, "program_output": true,
}

// itemType is an input item's type: its type field, else an item
// reference when it has an id and no role (OpenAI's ItemReference has an
// optional type), else a message.
func (it *responseItem) itemType() string {
	switch {
	case it.Type != nil:
		return *it.Type
	case it.Role == nil && it.ID != nil:
		return "item_reference"
	}
	return "message"
}

// responsesInput converts input items to chat messages.
func responsesInput(items []json.RawMessage) ([]chatMessage, *Error) {
	c := inputConverter{}
	for i, raw := range items {
		param := fmt.Sprintf("input[%d]", i)
		var it responseItem
		if json.Unmarshal(raw, &it) != nil {
			return nil, BadRequest("", param, "%s must be an object", param)
		}
		if err := c.item(&it, param); err != nil {
			return nil, err
		}
	}
	return c.out, nil
}

// inputConverter builds the chat messages of input items in order.
type inputConverter struct{ out []chatMessage }

// lastAssistant is the last message if it is an assistant's.
func (c *inputConverter) lastAssistant() *chatMessage {
	if n := len(c.out); n > 0 && c.out[n-1].Role == "assistant" {
		return &c.out[n-1]
	}
	return nil
}

// call adds a tool call to the assistant message before it, or to a new
// one.
func (c *inputConverter) call(call chatToolCall) {
	if prev := c.lastAssistant(); prev != nil {
		prev.ToolCalls = append(prev.ToolCalls, call)
		return
	}
	c.out = append(c.out, chatMessage{Role: "assistant", ToolCalls: []chatToolCall{call}})
}

func (c *inputConverter) item(it *responseItem, param string) *Error {
	switch typ := it.itemType(); typ {
	case "message":
		return c.message(it, param)
	case "function_call":
		args, ok := stringOf(it.Arguments)
		if it.CallID == nil || it.Name == nil || !ok {
			return BadRequest("", param, "%s: a function_call item needs call_id, name and arguments (a string)", param)
		}
		c.call(chatToolCall{ID: *it.CallID, Type: "function", Function: chatToolFunction{Name: FlatToolName(deref(it.Namespace), *it.Name), Arguments: args}})
	case "custom_tool_call":
		// vLLM's chat path has no conversion for it; here a custom tool's
		// call renders as a function call whose arguments are its
		// free-form input, so the template sees the turn.
		input, ok := stringOf(it.Input)
		if it.CallID == nil || it.Name == nil || !ok {
			return BadRequest("", param, "%s: a custom_tool_call item needs call_id, name and input (a string)", param)
		}
		c.call(chatToolCall{ID: *it.CallID, Type: "function", Function: chatToolFunction{Name: FlatToolName(deref(it.Namespace), *it.Name), Arguments: input}})
	case "function_call_output", "custom_tool_call_output":
		if it.CallID == nil {
			return BadRequest("missing_required_parameter", param+".call_id", "%s.call_id is required", param)
		}
		texts, err := responsesContent(it.Output, param+".output")
		if err != nil {
			return err
		}
		id := *it.CallID
		c.out = append(c.out, chatMessage{Role: "tool", ToolCallID: &id, Content: strings.Join(texts, "\n")})
	case "reasoning":
		return c.reasoning(it, param)
	case "item_reference":
		// Rendered once resolved (ResolveItems): the edge, which stores
		// no items, keys the prompt without it.
		if it.ID == nil || *it.ID == "" {
			return BadRequest("missing_required_parameter", param+".id", "%s.id is required (the id of the item referenced)", param)
		}
	default:
		if !unrenderedItems[typ] {
			return BadRequest("", param+".type", "%s: input item type %q is not an input item type of the Responses API", param, truncate(typ, 40))
		}
	}
	return nil
}

func (c *inputConverter) message(it *responseItem, param string) *Error {
	if it.Role == nil {
		return BadRequest("", param+".role", "%s.role is required", param)
	}
	role := *it.Role
	if role != "user" && role != "assistant" && role != "system" && role != "developer" {
		return BadRequest("", param+".role", "%s.role %q is not user, assistant, system or developer", param, truncate(role, 40))
	}
	texts, err := responsesContent(it.Content, param+".content")
	if err != nil {
		return err
	}
	if role == "assistant" {
		text := strings.Join(texts, "")
		if prev := c.lastAssistant(); prev != nil && prev.Content == nil {
			prev.Content = text
			return nil
		}
		c.out = append(c.out, chatMessage{Role: "assistant", Content: text})
		return nil
	}
	m := chatMessage{Role: role, Content: contentOf(texts)}
	if m.Content == nil {
		m.Content = ""
	}
	c.out = append(c.out, m)
	return nil
}

// reasoning renders a reasoning item's text (its content, else its first
// summary). Its encrypted_content, which Codex sends back whenever it asks
// for it (include: ["reasoning.encrypted_content"]), is opaque to every
// engine but the one that wrote it: it is accepted and not rendered (vLLM
// refuses such an item, which would end a Codex session on its second
// turn).
func (c *inputConverter) reasoning(it *responseItem, param string) *Error {
	texts, err := responsesContent(it.Content, param+".content")
	if err != nil {
		return err
	}
	text := ""
	if len(texts) > 0 {
		text = texts[0]
	} else if len(it.Summary) > 0 {
		text = it.Summary[0].Text
	}
	if prev := c.lastAssistant(); prev != nil && prev.Reasoning == nil {
		prev.Reasoning = &text
		return nil
	}
	c.out = append(c.out, chatMessage{Role: "assistant", Reasoning: &text})
	return nil
}

// stringOf reads a JSON string.
func stringOf(raw json.RawMessage) (string, bool) {
	var s string
	if IsNull(raw) || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// ItemReferences are the ids the input's item_reference items name, in
// order.
func (rf *ResponsesFields) ItemReferences() []string {
	var ids []string
	for _, raw := range rf.Input {
		var it responseItem
		if json.Unmarshal(raw, &it) == nil && it.itemType() == "item_reference" && it.ID != nil {
			ids = append(ids, *it.ID)
		}
	}
	return ids
}

// ResolveItems renders each item_reference of the input as the item
// lookup finds for its id (an input or output item of a stored response),
// and refuses one it does not find.
func (r *Request) ResolveItems(lookup func(id string) (json.RawMessage, bool)) *Error {
	rf := r.Responses
	if rf == nil {
		return BadRequest("", "", "not a Responses request")
	}
	items := make([]json.RawMessage, len(rf.Input))
	for i, raw := range rf.Input {
		items[i] = raw
		var it responseItem
		if json.Unmarshal(raw, &it) != nil || it.itemType() != "item_reference" || it.ID == nil {
			continue
		}
		found, ok := lookup(*it.ID)
		var ref responseItem
		if !ok || json.Unmarshal(found, &ref) != nil || ref.itemType() == "item_reference" {
			return BadRequest("item_not_found", fmt.Sprintf("input[%d].id", i), "input[%d]: item_reference %q: no stored response holds an item with that id (items are kept with the responses stored on the instance that made them)", i, truncate(*it.ID, 200))
		}
		items[i] = found
	}
	in, err := responsesInput(items)
	if err != nil {
		return err
	}
	rf.input = in
	return r.rebuildResponses()
}

// responsesContent reads a message's (or a function output's) content as
// texts: a string, or input_text / output_text / text parts.
func responsesContent(raw json.RawMessage, param string) ([]string, *Error) {
	raw = bytes.TrimSpace(raw)
	if IsNull(raw) {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		return []string{s}, nil
	}
	var parts []struct {
		Type    *string `json:"type"`
		Text    *string `json:"text"`
		Refusal *string `json:"refusal"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return nil, BadRequest("", param, "invalid type for %q: want a string or an array of content parts, got %s", param, Kind(raw))
	}
	texts := make([]string, 0, len(parts))
	for j, p := range parts {
		pp := fmt.Sprintf("%s[%d]", param, j)
		t := "missing"
		if p.Type != nil {
			t = *p.Type
		}
		switch {
		case (t == "input_text" || t == "output_text" || t == "text" || t == "reasoning_text" || t == "summary_text") && p.Text != nil:
			texts = append(texts, *p.Text)
		case t == "refusal" && p.Refusal != nil:
			texts = append(texts, *p.Refusal)
		default:
			return nil, BadRequest("", pp+".type", "%s: content part type %q is not supported (input_text, output_text)", pp, truncate(t, 40))
		}
	}
	return texts, nil
}

// responsesTools converts the tools and tool_choice. Every type of
// OpenAI's tool union is accepted (openai-python
// src/openai/types/responses/tool_param.py); the chat form holds the
// function tools, as vLLM renders them
// (vllm/tool_parsers/utils.py iter_response_function_tool_dicts): each
// function tool, and each function of a namespace tool under its flat name
// (FlatToolName), the namespace kept to name its calls (CallName). Hosted
// tools (web_search, file_search, mcp, shell, ...), custom tools and the
// custom tools inside a namespace are not rendered, as vLLM renders none:
// an engine that serves them gets them in the body it is sent, and a model
// that does not sees no such tool and never calls it.
func (r *Request) responsesTools(fields map[string]json.RawMessage) *Error {
	rf := r.Responses
	if raw, ok := r.Present("tools"); ok {
		var tools []json.RawMessage
		if json.Unmarshal(raw, &tools) != nil {
			return BadRequest("", "tools", "invalid type for \"tools\": want an array of tools, got %s", Kind(raw))
		}
		out := make([]chatTool, 0, len(tools))
		for i, raw := range tools {
			var err *Error
			if out, err = rf.responsesTool(out, raw, fmt.Sprintf("tools[%d]", i)); err != nil {
				return err
			}
		}
		fields["tools"] = marshal(out)
	}
	raw, ok := r.Present("tool_choice")
	if !ok {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s != "auto" && s != "none" && s != "required" {
			return BadRequest("", "tool_choice", "tool_choice %q is not auto, none or required", truncate(s, 40))
		}
		fields["tool_choice"] = raw
		return nil
	}
	var tc struct {
		Type *string `json:"type"`
		Name *string `json:"name"`
	}
	if json.Unmarshal(raw, &tc) != nil || tc.Type == nil {
		return BadRequest("", "tool_choice", "tool_choice must be auto, none, required or an object with a type ({\"type\": \"function\", \"name\": ...}, allowed_tools, a hosted tool type)")
	}
	if *tc.Type != "function" {
		// allowed_tools, a hosted tool, custom, mcp, shell, apply_patch:
		// vLLM constrains none of them (vllm/tool_parsers/utils.py
		// get_json_schema_from_tools), so the model chooses as under auto.
		fields["tool_choice"] = json.RawMessage(`"auto"`)
		return nil
	}
	if tc.Name == nil || *tc.Name == "" {
		return BadRequest("", "tool_choice.name", "tool_choice.name is required when type is \"function\"")
	}
	name := *tc.Name
	if !toolNamed(fields["tools"], name) {
		name = rf.chosenTool(name)
	}
	fields["tool_choice"] = marshal(map[string]any{"type": "function", "function": map[string]string{"name": name}})
	return nil
}

// toolNamed reports whether the chat form's tools have a function name.
func toolNamed(tools json.RawMessage, name string) bool {
	var ts []chatTool
	_ = json.Unmarshal(tools, &ts)
	for _, t := range ts {
		if t.Function.Name == name {
			return true
		}
	}
	return false
}

// responsesTool adds one tool's chat function tools to out.
func (rf *ResponsesFields) responsesTool(out []chatTool, raw json.RawMessage, param string) ([]chatTool, *Error) {
	var t struct {
		Type        *string           `json:"type"`
		Name        *string           `json:"name"`
		Description *string           `json:"description"`
		Parameters  json.RawMessage   `json:"parameters"`
		Strict      *bool             `json:"strict"`
		Tools       []json.RawMessage `json:"tools"`
	}
	if json.Unmarshal(raw, &t) != nil {
		return nil, BadRequest("", param, "%s must be a tool object", param)
	}
	if t.Type == nil || *t.Type == "" {
		return nil, BadRequest("missing_required_parameter", param+".type", "%s.type is required", param)
	}
	if !knownTool(*t.Type) {
		return nil, BadRequest("invalid_value", param+".type", "Invalid value: '%s'. Supported values are: %s.", truncate(*t.Type, 40), toolTypeList)
	}
	switch *t.Type {
	case "function":
		if t.Name == nil || *t.Name == "" {
			return nil, BadRequest("missing_required_parameter", param+".name", "%s.name is required", param)
		}
		return append(out, functionTool(*t.Name, t.Description, t.Parameters, t.Strict)), nil
	case "namespace":
		if t.Name == nil || *t.Name == "" {
			return nil, BadRequest("missing_required_parameter", param+".name", "%s.name is required (the namespace)", param)
		}
		ns := *t.Name
		for j, inner := range t.Tools {
			ip := fmt.Sprintf("%s.tools[%d]", param, j)
			var f struct {
				Type        *string         `json:"type"`
				Name        *string         `json:"name"`
				Description *string         `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
				Strict      *bool           `json:"strict"`
			}
			if json.Unmarshal(inner, &f) != nil || f.Type == nil {
				return nil, BadRequest("", ip, "%s must be a function or custom tool", ip)
			}
			if f.Name == nil || *f.Name == "" {
				return nil, BadRequest("missing_required_parameter", ip+".name", "%s.name is required", ip)
			}
			if *f.Type != "function" {
				continue // a custom tool of the namespace: not rendered, as vLLM
			}
			flat := FlatToolName(ns, *f.Name)
			if rf.namespaced == nil {
				rf.namespaced = map[string]ToolName{}
			}
			rf.namespaced[flat] = ToolName{Namespace: ns, Name: *f.Name}
			out = append(out, functionTool(flat, f.Description, f.Parameters, f.Strict))
		}
	}
	return out, nil
}

// toolTypes are the tool types of the Responses API's tool union
// (openai-python types/responses/tool_param.py ToolParam: function,
// file_search, computer, computer_use_preview, web_search, mcp,
// code_interpreter, programmatic_tool_calling, image_generation,
// local_shell, shell, custom, namespace, tool_search, web_search_preview,
// apply_patch, with their dated variants). Only function tools (and a
// namespace's functions) reach the chat form; the others are accepted and
// not rendered, as vLLM renders them not.
var toolTypes = []string{"function", "file_search", "computer", "computer_use_preview", "web_search", "web_search_2025_08_26",
	"mcp", "code_interpreter", "programmatic_tool_calling", "image_generation", "local_shell", "shell", "custom", "namespace",
	"tool_search", "web_search_preview", "web_search_preview_2025_03_11", "apply_patch"}

// toolTypeList is toolTypes as OpenAI's "Supported values" sentence lists
// them.
var toolTypeList = quotedList(toolTypes)

func knownTool(typ string) bool {
	for _, t := range toolTypes {
		if t == typ {
			return true
		}
	}
	return false
}

// quotedList is 'a', 'b', and 'c'.
func quotedList(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = "'" + v + "'"
	}
	if len(q) < 2 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + ", and " + q[len(q)-1]
}

func functionTool(name string, description *string, params json.RawMessage, strict *bool) chatTool {
	if IsNull(params) {
		params = nil
	}
	return chatTool{Type: "function", Function: chatFunctionDef{Name: name, Description: description, Parameters: params, Strict: strict}}
}

// namespaceSep joins a namespace and a function name in the flat name the
// chat form gives a namespace's function: vLLM's
// (vllm/tool_parsers/utils.py flat_namespace_tool_name) and Codex's
// (codex-rs/protocol/src/tool_name.rs canonical_flat_name) "__".
const namespaceSep = "__"

// ToolName is a function's name as the Responses API names it: the
// namespace tool it belongs to ("" none) and its name there.
type ToolName struct {
	Namespace, Name string
}

// FlatToolName is the name a namespace's function has in the chat form, the
// one a model renders and calls.
func FlatToolName(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + namespaceSep + name
}

// CallName is the Responses name of a function the model called by its
// chat-form name: a namespace's function is named with its namespace, as
// vLLM answers it (vllm/tool_parsers/utils.py
// resolve_responses_tool_call_name), and as Codex reads a function_call
// item (codex-rs/protocol/src/tool_name.rs ToolName).
func (rf *ResponsesFields) CallName(flat string) ToolName {
	if t, ok := rf.namespaced[flat]; ok {
		return t
	}
	return ToolName{Name: flat}
}

// chosenTool is the chat-form name of a function tool_choice names that no
// tool has as its chat-form name: a namespace's function named by its own
// name, as vLLM accepts it (vllm/tool_parsers/utils.py
// get_json_schema_from_tools), when one namespace alone has it.
func (rf *ResponsesFields) chosenTool(name string) string {
	match := ""
	for flat, t := range rf.namespaced {
		if t.Name == name {
			if match != "" {
				return name
			}
			match = flat
		}
	}
	if match == "" {
		return name
	}
	return match
}

// responsesFormat converts text.format.
func (r *Request) responsesFormat(fields map[string]json.RawMessage) *Error {
	raw, ok := r.Present("text")
	if !ok {
		return nil
	}
	var text struct {
		Format *struct {
			Type   string          `json:"type"`
			Name   *string         `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"format"`
	}
	if json.Unmarshal(raw, &text) != nil {
		return BadRequest("", "text", "invalid text: want an object")
	}
	f := text.Format
	if f == nil {
		return nil
	}
	switch f.Type {
	case "text":
		fields["response_format"] = json.RawMessage(`{"type":"text"}`)
	case "json_object":
		fields["response_format"] = json.RawMessage(`{"type":"json_object"}`)
	case "json_schema":
		if !isObject(f.Schema) {
			return BadRequest("", "text.format.schema", "text.format.schema must be a JSON schema object")
		}
		js := map[string]any{"schema": f.Schema}
		if f.Name != nil {
			js["name"] = *f.Name
		}
		if f.Strict != nil {
			js["strict"] = *f.Strict
		}
		fields["response_format"] = marshal(map[string]any{"type": "json_schema", "json_schema": js})
	default:
		return BadRequest("", "text.format.type", "text.format.type %q is not text, json_object or json_schema", truncate(f.Type, 40))
	}
	return nil
}
