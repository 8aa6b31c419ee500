package disagg

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/httpjson"
)

// maxStreamPeek bounds what the edge reads of a decode stream before the
// first generated event (a role chunk is a few hundred bytes).
const maxStreamPeek = 64 << 10

// ErrStreamFailed is a decode stream that failed before its first token.
var ErrStreamFailed = errors.New("the decode stream failed before its first token")

// PeekStream reads a decode's SSE stream up to its first generated event.
// An error event (both engines stream a failed request as 200 with
// {"error": ...}, vLLM after the role chunk; an agent API's error events,
// agentEvents) or the stream's end before
// any token means the decode failed before the client saw anything, so the
// handoff can still be retried; what was read is put back in front of the
// body for the relay.
func PeekStream(resp *http.Response) error {
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	var buf bytes.Buffer
	for buf.Len() < maxStreamPeek {
		line, err := br.ReadBytes('\n')
		buf.Write(line)
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if bytes.Equal(data, []byte("[DONE]")) {
				break
			}
			switch streamEvent(data) {
			case eventError:
				return fmt.Errorf("%w: %s", ErrStreamFailed, httpjson.Clip(string(data), 300))
			case eventOutput:
				resp.Body = readCloser{io.MultiReader(&buf, br), resp.Body}
				return nil
			}
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrStreamFailed, err)
		}
	}
	resp.Body = readCloser{io.MultiReader(&buf, br), resp.Body}
	return nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

const (
	eventOther = iota
	eventOutput
	eventError
)

// agentEvents classify the agent APIs' stream events by type: an error
// (Messages' error event, vllm/entrypoints/anthropic/serving.py
// message_stream_converter; the Responses API's error and
// response.failed), or output (a content delta, the message's end; an
// output item's delta, the response's end). Other types (message_start,
// content_block_start, response.created, response.in_progress, ...) carry
// none.
var agentEvents = map[string]int{
	"error": eventError, "response.failed": eventError,
	"content_block_delta": eventOutput, "message_delta": eventOutput, "message_stop": eventOutput,
	"response.output_text.delta": eventOutput, "response.function_call_arguments.delta": eventOutput,
	"response.reasoning_text.delta": eventOutput, "response.completed": eventOutput, "response.incomplete": eventOutput,
}

// streamEvent classifies one SSE data payload: an error, an event carrying
// output (content, text, tool calls, a finish reason or the usage), or
// another (a role chunk).
func streamEvent(data []byte) int {
	var ev struct {
		Type    string          `json:"type"`
		Error   json.RawMessage `json:"error"`
		Object  string          `json:"object"`
		Usage   json.RawMessage `json:"usage"`
		Choices []struct {
			Text         string          `json:"text"`
			FinishReason json.RawMessage `json:"finish_reason"`
			Delta        *struct {
				Content   *string         `json:"content"`
				ToolCalls json.RawMessage `json:"tool_calls"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return eventOther
	}
	if !apireq.IsNull(ev.Error) || ev.Object == "error" {
		return eventError
	}
	if k, ok := agentEvents[ev.Type]; ok {
		return k
	}
	if !apireq.IsNull(ev.Usage) {
		return eventOutput
	}
	for _, c := range ev.Choices {
		if c.Text != "" || !apireq.IsNull(c.FinishReason) {
			return eventOutput
		}
		if d := c.Delta; d != nil && ((d.Content != nil && *d.Content != "") || (!apireq.IsNull(d.ToolCalls) && string(d.ToolCalls) != "[]")) {
			return eventOutput
		}
	}
	return eventOther
}
