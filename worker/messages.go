package worker

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/worker/engine"
)

// countTokensPath is the Messages API's token count.
const countTokensPath = "/v1/messages/count_tokens"

// answerer writes one request's answer in its dialect.
type answerer interface {
	// emit sends one streamed chunk.
	emit(engine.Chunk) error
	// finish ends a stream; respond writes a whole answer. Both return
	// the status answered.
	finish(engine.Completion) int
	respond(engine.Completion) int
	// streamError reports an error after the stream started.
	streamError(e *apiError) error
}

// chatAnswer is the chat completions and completions shape (handler.go).
type chatAnswer struct{ x *exchange }

func (a chatAnswer) emit(c engine.Chunk) error       { return a.x.emitChunk(c) }
func (a chatAnswer) finish(c engine.Completion) int  { return a.x.finishStream(c) }
func (a chatAnswer) respond(c engine.Completion) int { return a.x.respond(c) }
func (a chatAnswer) streamError(e *apiError) error {
	return a.x.sendEvent(e.JSON(apireq.Chat))
}

// reasoningText is what the simulated model reasons when asked to
// (Messages thinking, Responses reasoning): a fixed sentence over the
// first words of the last user turn (what the user wrote, never a
// harness's reminder: OutputOptions.LastUserText).
func reasoningText(o *engine.OutputOptions) string {
	words := strings.Fields(o.LastUserText)
	if len(words) == 0 {
		return "The conversation goes on. I answer it."
	}
	if len(words) > 8 {
		words = words[:8]
	}
	return "The user asks: " + strings.Join(words, " ") + ". I answer it."
}

// Anthropic Messages answers, as the Messages API writes them
// (https://docs.anthropic.com/en/api/messages-streaming): a message
// object; streamed, message_start, ping, then per content block
// content_block_start, its deltas (text_delta, input_json_delta,
// thinking_delta and signature_delta) and content_block_stop, then
// message_delta with the stop reason and usage, and message_stop. Usage
// counts the cached prompt apart, as Anthropic's API does: input_tokens
// are the uncached prompt tokens, cache_read_input_tokens the cached ones
// (tensorrt_llm/serve/anthropic_adapter.py convert_usage maps an OpenAI
// usage the same way).
type messagesAnswer struct {
	x       *exchange
	started bool
	index   int    // the open (or next) block's index
	open    string // the open block's type ("" none)
}

// stopReasons maps the engine's finish reasons to Anthropic's.
var stopReasons = map[string]string{"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

func stopReason(finish string) string {
	if r, ok := stopReasons[finish]; ok {
		return r
	}
	return "end_turn"
}

func (a *messagesAnswer) usage(c engine.Completion) map[string]int {
	prompt := c.PromptTokens
	if prompt == 0 {
		prompt = len(a.x.p.prompt)
	}
	return map[string]int{"input_tokens": max(prompt-c.CachedTokens, 0), "cache_creation_input_tokens": 0,
		"cache_read_input_tokens": c.CachedTokens, "output_tokens": c.CompletionTokens}
}

func (a *messagesAnswer) message(content []any, stop, stopSeq any, usage any) map[string]any {
	return map[string]any{"id": a.x.id, "type": "message", "role": "assistant", "model": a.x.p.model,
		"content": content, "stop_reason": stop, "stop_sequence": stopSeq, "usage": usage}
}

func (a *messagesAnswer) start() error {
	if a.started {
		return a.x.writeErr
	}
	a.started = true
	x := a.x
	err := x.sendNamed("message_start", map[string]any{"type": "message_start",
		"message": a.message([]any{}, nil, nil, map[string]int{"input_tokens": len(x.p.prompt), "output_tokens": 0})})
	if err == nil {
		err = x.sendNamed("ping", map[string]string{"type": "ping"})
	}
	if err == nil && x.p.req.Thinking {
		text := reasoningText(x.p.output)
		err = a.block("thinking", map[string]any{"type": "thinking", "thinking": "", "signature": ""},
			map[string]any{"type": "thinking_delta", "thinking": text})
		if err == nil {
			err = a.delta(map[string]any{"type": "signature_delta", "signature": "sim-" + randomID()})
		}
	}
	return err
}

// block closes the open block, opens one of typ and sends its first delta.
func (a *messagesAnswer) block(typ string, content map[string]any, first map[string]any) error {
	if err := a.closeBlock(); err != nil {
		return err
	}
	a.open = typ
	if err := a.x.sendNamed("content_block_start", map[string]any{"type": "content_block_start", "index": a.index, "content_block": content}); err != nil {
		return err
	}
	if first == nil {
		return nil
	}
	return a.delta(first)
}

func (a *messagesAnswer) delta(d map[string]any) error {
	return a.x.sendNamed("content_block_delta", map[string]any{"type": "content_block_delta", "index": a.index, "delta": d})
}

func (a *messagesAnswer) closeBlock() error {
	if a.open == "" {
		return nil
	}
	a.open = ""
	err := a.x.sendNamed("content_block_stop", map[string]any{"type": "content_block_stop", "index": a.index})
	a.index++
	return err
}

func (a *messagesAnswer) emit(c engine.Chunk) error {
	if err := a.start(); err != nil {
		return err
	}
	if tc := c.ToolCall; tc != nil {
		if tc.ID != "" {
			var first map[string]any
			if tc.Arguments != "" {
				first = map[string]any{"type": "input_json_delta", "partial_json": tc.Arguments}
			}
			return a.block("tool_use", map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Name, "input": map[string]any{}}, first)
		}
		if tc.Arguments == "" {
			return nil
		}
		return a.delta(map[string]any{"type": "input_json_delta", "partial_json": tc.Arguments})
	}
	if c.Text == "" {
		return nil
	}
	if a.open != "text" {
		return a.block("text", map[string]any{"type": "text", "text": ""}, map[string]any{"type": "text_delta", "text": c.Text})
	}
	return a.delta(map[string]any{"type": "text_delta", "text": c.Text})
}

func (a *messagesAnswer) finish(c engine.Completion) int {
	x := a.x
	if a.start() != nil || a.closeBlock() != nil {
		return statusClientClosed
	}
	if x.sendNamed("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stopReason(c.FinishReason), "stop_sequence": nil}, "usage": a.usage(c)}) != nil {
		return statusClientClosed
	}
	if x.sendNamed("message_stop", map[string]string{"type": "message_stop"}) != nil {
		return statusClientClosed
	}
	return http.StatusOK
}

func (a *messagesAnswer) respond(c engine.Completion) int {
	x := a.x
	var content []any
	if x.p.req.Thinking {
		content = append(content, map[string]any{"type": "thinking", "thinking": reasoningText(x.p.output), "signature": "sim-" + randomID()})
	}
	if c.Text != "" || len(c.ToolCalls) == 0 {
		content = append(content, map[string]any{"type": "text", "text": c.Text})
	}
	for _, tc := range c.ToolCalls {
		input := json.RawMessage(tc.Arguments)
		if !json.Valid(input) || len(input) == 0 || input[0] != '{' {
			input = json.RawMessage("{}")
		}
		content = append(content, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Name, "input": input})
	}
	x.extendDeadline()
	writeJSON(x.w, http.StatusOK, a.message(content, stopReason(c.FinishReason), nil, a.usage(c)))
	return http.StatusOK
}

func (a *messagesAnswer) streamError(e *apiError) error {
	return a.x.sendNamed("error", e.JSON(apireq.Messages))
}
