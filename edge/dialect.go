package edge

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/tether-project/tether/internal/apireq"
)

// apiWriter is the response writer of one API request: it knows the
// endpoint's dialect (errors are written in its shape) and whether the
// answer must end by aborting the connection (a stream the edge could not
// finish: the client must not read a clean end).
type apiWriter struct {
	http.ResponseWriter
	dialect apireq.Dialect
	aborted bool
}

// Unwrap lets http.ResponseController reach the connection.
func (w *apiWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func dialectOf(w http.ResponseWriter) apireq.Dialect {
	if a, ok := w.(*apiWriter); ok {
		return a.dialect
	}
	return apireq.Chat
}

// abortStream marks w's connection for an abort once the handler has
// recorded its metrics (handleInference panics with http.ErrAbortHandler:
// net/http then closes the connection without the chunked terminator).
func abortStream(w http.ResponseWriter) {
	if a, ok := w.(*apiWriter); ok {
		a.aborted = true
	}
}

// answer reads and rewrites a worker's answer on its way to the client, in
// the request's dialect: the usage it reports (for the breaker and the
// shadow), the context phase's cached tokens written into it, Responses
// ids minted (stored.go), and whether a stream reached its last event.
type answer struct {
	d apireq.Dialect
	// cached >= 0 replaces the usage's cached tokens (after a context hop
	// the prefill worker's figure is the one that counts).
	cached int
	// nullCached: the context phase reported no cached tokens, so the
	// answer reports none either (prompt_tokens_details null): the
	// generation worker's figure counts the tokens it received.
	nullCached bool
	// ids rewrites Responses ids (nil: none to rewrite).
	ids *responseIDs
	// onUsage receives each usage the answer reports.
	onUsage func(usageFigures)

	// stream state
	event    string // the current SSE event's name
	terminal bool   // the stream's last event went by
	seq      int64  // the last sequence_number seen (Responses)
	lastResp map[string]json.RawMessage
}

// body rewrites a whole (non-streamed) answer.
func (a *answer) body(b []byte) []byte {
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil {
		return b
	}
	changed := a.object(top, false)
	if a.ids != nil && a.ids.rewrite(top) {
		changed = true
	}
	if !changed {
		return a.ids.text(b)
	}
	out := mustMarshal(top)
	if bytes.HasSuffix(b, []byte("\n")) {
		out = append(out, '\n') // as the worker ended it
	}
	return a.ids.text(out)
}

// line rewrites one line of an SSE stream.
func (a *answer) line(line []byte) []byte {
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
	switch a.d {
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
	needResp := a.d == apireq.Responses
	if !needUsage && !needResp {
		return line
	}
	var ev map[string]json.RawMessage
	if json.Unmarshal(data, &ev) != nil {
		return line
	}
	changed := false
	if a.d == apireq.Responses {
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
				if a.ids != nil && a.ids.rewrite(resp) {
					c = true
				}
				a.lastResp = resp
				if c {
					ev["response"] = mustMarshal(resp)
					changed = true
				}
			}
		}
	} else if a.object(ev, true) {
		changed = true
	}
	if !changed {
		return a.ids.text(line)
	}
	return a.ids.text(append(append([]byte("data: "), mustMarshal(ev)...), '\n'))
}

// object reads (and patches) the usage of one answer object; in a stream,
// Messages carries it in message_start's message and in message_delta.
func (a *answer) object(obj map[string]json.RawMessage, stream bool) bool {
	if a.d == apireq.Messages && stream {
		if raw, ok := obj["message"]; ok {
			var msg map[string]json.RawMessage
			if json.Unmarshal(raw, &msg) == nil && a.object(msg, false) {
				obj["message"] = mustMarshal(msg)
				return true
			}
			return false
		}
	}
	raw, ok := obj["usage"]
	if !ok || isNull(raw) {
		return false
	}
	var usage map[string]json.RawMessage
	if json.Unmarshal(raw, &usage) != nil {
		return false
	}
	u := readUsageOf(a.d, usage)
	if a.onUsage != nil && u.OK {
		a.onUsage(u)
	}
	if a.nullCached && u.OK {
		if d, ok := usage["prompt_tokens_details"]; !ok || isNull(d) {
			return false
		}
		usage["prompt_tokens_details"] = json.RawMessage("null")
		obj["usage"] = mustMarshal(usage)
		return true
	}
	if a.cached < 0 || !u.OK {
		return false
	}
	patchUsage(a.d, usage, u, a.cached)
	obj["usage"] = mustMarshal(usage)
	return true
}

// readUsageOf reads a usage object: chat and completions prompt_tokens and
// prompt_tokens_details.cached_tokens; Messages input_tokens plus
// cache_read_input_tokens (the cached part) and cache_creation_input_tokens;
// Responses input_tokens and input_tokens_details.cached_tokens.
func readUsageOf(d apireq.Dialect, usage map[string]json.RawMessage) usageFigures {
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
	var u usageFigures
	switch d {
	case apireq.Messages:
		in, ok := num(usage, "input_tokens")
		read, hasRead := num(usage, "cache_read_input_tokens")
		created, _ := num(usage, "cache_creation_input_tokens")
		u = usageFigures{OK: ok, Prompt: in + read + created, Cached: read, HasCached: hasRead}
	case apireq.Responses:
		in, ok := num(usage, "input_tokens")
		cached, has := num(sub("input_tokens_details"), "cached_tokens")
		u = usageFigures{OK: ok, Prompt: in, Cached: cached, HasCached: has}
	default:
		in, ok := num(usage, "prompt_tokens")
		cached, has := num(sub("prompt_tokens_details"), "cached_tokens")
		u = usageFigures{OK: ok, Prompt: in, Cached: cached, HasCached: has}
	}
	return u
}

// patchUsage writes cached as the usage's cached tokens.
func patchUsage(d apireq.Dialect, usage map[string]json.RawMessage, u usageFigures, cached int) {
	set := func(k string, field string) {
		details := map[string]json.RawMessage{}
		if raw, ok := usage[k]; ok && !isNull(raw) {
			_ = json.Unmarshal(raw, &details)
		}
		details[field] = json.RawMessage(strconv.Itoa(cached))
		usage[k] = mustMarshal(details)
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
func (a *answer) failEvent(msg string) []byte {
	e := newAPIError(http.StatusBadGateway, "server_error", "stream_interrupted", "", "%s", msg)
	switch a.d {
	case apireq.Messages:
		return append(append([]byte("event: error\ndata: "), e.JSON(apireq.Messages)...), "\n\n"...)
	case apireq.Responses:
		var b []byte
		a.seq++
		errEv := map[string]any{"type": "error", "code": "server_error", "message": msg, "param": nil, "sequence_number": a.seq}
		b = append(append(append(b, "event: error\ndata: "...), mustMarshal(errEv)...), "\n\n"...)
		if a.lastResp != nil {
			a.seq++
			a.lastResp["status"] = json.RawMessage(`"failed"`)
			a.lastResp["error"] = mustMarshal(map[string]string{"code": "server_error", "message": msg})
			ev := map[string]any{"type": "response.failed", "sequence_number": a.seq, "response": a.lastResp}
			b = append(append(append(b, "event: response.failed\ndata: "...), mustMarshal(ev)...), "\n\n"...)
		}
		return b
	}
	return append(append([]byte("data: "), e.JSON(apireq.Chat)...), "\n\n"...)
}
