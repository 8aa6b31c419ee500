// Package api is the edge's HTTP API surface, the vocabulary its handlers
// speak: the dialects by path (chat completions, completions, Anthropic
// Messages, Responses), the request body as the request model workers share
// parses it (internal/apireq) with the internal fields removed and each
// hop's body built from it, error answers in each dialect's shape (and the
// requests net/http rejects before a handler runs, rewritten into that shape
// on the connection), the response writer that knows its dialect and when a
// stream must end by aborting, the relay of a worker's answer (usage read
// and patched, Responses ids rewritten, a stream cut short ended with an
// error event in the dialect's shape), and the route headers (x-tether-route
// and the rank) with their reader. It routes nothing and knows no edge.
package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/internal/apireq"
)

// IDs rewrites the ids of the response objects an answer names (a
// Responses answer: the engine's ids become the ones the client sees,
// edge/stored).
type IDs interface {
	// Rewrite rewrites the ids of one response object ("object":
	// "response"); it reports whether it changed one.
	Rewrite(obj map[string]json.RawMessage) bool
	// Text replaces, in an answer's bytes, every engine id it knows that
	// is still there with the client's.
	Text(b []byte) []byte
}

// Answer reads and rewrites a worker's answer on its way to the client, in
// the request's dialect: the usage it reports (for the breaker and the
// shadow), the context phase's cached tokens written into it, Responses
// ids rewritten, and whether a stream reached its last event.
type Answer struct {
	Dialect apireq.Dialect
	// Cached >= 0 replaces the usage's cached tokens (after a context hop
	// the prefill worker's figure is the one that counts).
	Cached int
	// NullCached: the context phase reported no cached tokens, so the
	// answer reports none either (prompt_tokens_details null): the
	// generation worker's figure counts the tokens it received.
	NullCached bool
	// IDs rewrites Responses ids (nil: none to rewrite).
	IDs IDs
	// OnUsage receives each usage the answer reports.
	OnUsage func(disagg.Usage)

	// stream state
	event    string // the current SSE event's name
	terminal bool   // the stream's last event went by
	seq      int64  // the last sequence_number seen (Responses)
	lastResp map[string]json.RawMessage
}

// text is b with the engine ids IDs knows replaced.
func (a *Answer) text(b []byte) []byte {
	if a.IDs == nil {
		return b
	}
	return a.IDs.Text(b)
}

// Body rewrites a whole (non-streamed) answer.
func (a *Answer) Body(b []byte) []byte {
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil {
		return b
	}
	changed := a.object(top, false)
	if a.IDs != nil && a.IDs.Rewrite(top) {
		changed = true
	}
	if !changed {
		return a.text(b)
	}
	out := MustMarshal(top)
	if bytes.HasSuffix(b, []byte("\n")) {
		out = append(out, '\n') // as the worker ended it
	}
	return a.text(out)
}

// Line rewrites one line of an SSE stream.
func (a *Answer) Line(line []byte) []byte {
	trimmed := bytes.TrimRight(line, "\r\n")
	if ev, ok := bytes.CutPrefix(trimmed, []byte("event:")); ok {
		a.event = string(bytes.TrimSpace(ev))
		return line
	}
	data, ok := bytes.CutPrefix(trimmed, []byte("data:"))
	if !ok {
		return line
	}
	data = bytes.TrimPrefix(data, []byte(" "))
	if string(data) == "[DONE]" {
		a.terminal = true
		return line
	}
	switch a.Dialect {
	case apireq.Messages:
		if a.event == "message_stop" || a.event == "error" {
			a.terminal = true
		}
	case apireq.Chat, apireq.Completions:
		if bytes.HasPrefix(data, []byte(`{"error"`)) {
			a.terminal = true // the worker's own error event ends it
		}
	}
	needUsage := bytes.Contains(data, []byte(`"usage"`))
	needResp := a.Dialect == apireq.Responses
	if !needUsage && !needResp {
		return line
	}
	var ev map[string]json.RawMessage
	if json.Unmarshal(data, &ev) != nil {
		return line
	}
	changed := false
	if a.Dialect == apireq.Responses {
		var typ string
		_ = json.Unmarshal(ev["type"], &typ)
		switch typ {
		case "response.completed", "response.incomplete", "response.failed", "error":
			a.terminal = true
		}
		if s, ok := ev["sequence_number"]; ok {
			_ = json.Unmarshal(s, &a.seq)
		}
		if raw, ok := ev["response"]; ok {
			var resp map[string]json.RawMessage
			if json.Unmarshal(raw, &resp) == nil {
				c := a.object(resp, true)
				if a.IDs != nil && a.IDs.Rewrite(resp) {
					c = true
				}
				a.lastResp = resp
				if c {
					ev["response"] = MustMarshal(resp)
					changed = true
				}
			}
		}
	} else if a.object(ev, true) {
		changed = true
	}
	if !changed {
		return a.text(line)
	}
	return a.text(append(append([]byte("data: "), MustMarshal(ev)...), '\n'))
}

// object reads (and patches) the usage of one answer object; in a stream,
// Messages carries it in message_start's message and in message_delta.
func (a *Answer) object(obj map[string]json.RawMessage, stream bool) bool {
	if a.Dialect == apireq.Messages && stream {
		if raw, ok := obj["message"]; ok {
			var msg map[string]json.RawMessage
			if json.Unmarshal(raw, &msg) == nil && a.object(msg, false) {
				obj["message"] = MustMarshal(msg)
				return true
			}
			return false
		}
	}
	raw, ok := obj["usage"]
	if !ok || apireq.IsNull(raw) {
		return false
	}
	var usage map[string]json.RawMessage
	if json.Unmarshal(raw, &usage) != nil {
		return false
	}
	u := readUsageOf(a.Dialect, usage)
	if a.OnUsage != nil && u.OK {
		a.OnUsage(u)
	}
	if a.NullCached && u.OK {
		if d, ok := usage["prompt_tokens_details"]; !ok || apireq.IsNull(d) {
			return false
		}
		usage["prompt_tokens_details"] = json.RawMessage("null")
		obj["usage"] = MustMarshal(usage)
		return true
	}
	if a.Cached < 0 || !u.OK {
		return false
	}
	patchUsage(a.Dialect, usage, u, a.Cached)
	obj["usage"] = MustMarshal(usage)
	return true
}

// readUsageOf reads a usage object: chat and completions prompt_tokens and
// prompt_tokens_details.cached_tokens; Messages input_tokens plus
// cache_read_input_tokens (the cached part) and cache_creation_input_tokens;
// Responses input_tokens and input_tokens_details.cached_tokens.
func readUsageOf(d apireq.Dialect, usage map[string]json.RawMessage) disagg.Usage {
	num := func(m map[string]json.RawMessage, k string) (int, bool) {
		var v *int
		if raw, ok := m[k]; !ok || json.Unmarshal(raw, &v) != nil || v == nil {
			return 0, false
		}
		return *v, true
	}
	sub := func(k string) map[string]json.RawMessage {
		var m map[string]json.RawMessage
		_ = json.Unmarshal(usage[k], &m)
		return m
	}
	var u disagg.Usage
	switch d {
	case apireq.Messages:
		in, ok := num(usage, "input_tokens")
		read, hasRead := num(usage, "cache_read_input_tokens")
		created, _ := num(usage, "cache_creation_input_tokens")
		u = disagg.Usage{OK: ok, Prompt: in + read + created, Cached: read, HasCached: hasRead}
	case apireq.Responses:
		in, ok := num(usage, "input_tokens")
		cached, has := num(sub("input_tokens_details"), "cached_tokens")
		u = disagg.Usage{OK: ok, Prompt: in, Cached: cached, HasCached: has}
	default:
		in, ok := num(usage, "prompt_tokens")
		cached, has := num(sub("prompt_tokens_details"), "cached_tokens")
		u = disagg.Usage{OK: ok, Prompt: in, Cached: cached, HasCached: has}
	}
	return u
}

// patchUsage writes cached as the usage's cached tokens.
func patchUsage(d apireq.Dialect, usage map[string]json.RawMessage, u disagg.Usage, cached int) {
	set := func(k string, field string) {
		details := map[string]json.RawMessage{}
		if raw, ok := usage[k]; ok && !apireq.IsNull(raw) {
			_ = json.Unmarshal(raw, &details)
		}
		details[field] = json.RawMessage(strconv.Itoa(cached))
		usage[k] = MustMarshal(details)
	}
	switch d {
	case apireq.Messages:
		created := 0
		if raw, ok := usage["cache_creation_input_tokens"]; ok {
			_ = json.Unmarshal(raw, &created)
		}
		usage["cache_read_input_tokens"] = json.RawMessage(strconv.Itoa(cached))
		usage["input_tokens"] = json.RawMessage(strconv.Itoa(max(u.Prompt-cached-created, 0)))
	case apireq.Responses:
		set("input_tokens_details", "cached_tokens")
	default:
		set("prompt_tokens_details", "cached_tokens")
	}
}

// failEvent is what the client reads when the edge cannot finish a stream:
// an error in the API's own streaming shape. Chat and completions: a chunk
// holding an OpenAI error object (the OpenAI SDKs throw on it); Messages:
// Anthropic's `event: error` (the Anthropic SDK throws on it); Responses:
// an `error` event and, when the stream's response is known,
// `response.failed` with that response, status failed and the error (the
// event types of openai-node's ResponseStreamEvent).
func (a *Answer) failEvent(msg string) []byte {
	e := NewError(http.StatusBadGateway, "server_error", "stream_interrupted", "", "%s", msg)
	switch a.Dialect {
	case apireq.Messages:
		return append(append([]byte("event: error\ndata: "), e.JSON(apireq.Messages)...), "\n\n"...)
	case apireq.Responses:
		var b []byte
		a.seq++
		errEv := map[string]any{"type": "error", "code": "server_error", "message": msg, "param": nil, "sequence_number": a.seq}
		b = append(append(append(b, "event: error\ndata: "...), MustMarshal(errEv)...), "\n\n"...)
		if a.lastResp != nil {
			a.seq++
			a.lastResp["status"] = json.RawMessage(`"failed"`)
			a.lastResp["error"] = MustMarshal(map[string]string{"code": "server_error", "message": msg})
			ev := map[string]any{"type": "response.failed", "sequence_number": a.seq, "response": a.lastResp}
			b = append(append(append(b, "event: response.failed\ndata: "...), MustMarshal(ev)...), "\n\n"...)
		}
		return b
	}
	return append(append([]byte("data: "), e.JSON(apireq.Chat)...), "\n\n"...)
}
