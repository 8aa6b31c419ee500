// Package disagg is the engines' own disaggregation protocols, as an edge
// speaks them: trtllm-serve's context and generation requests (TensorRT-LLM's
// disaggregated server protocol) and the prefill/decode handoffs of a vLLM
// or SGLang split — the fields each hop's request sets and removes, the
// reading and checking of a context or prefill answer, the first events of
// a decode's stream, and the usage a prefill reports. edge/dispatch drives
// the flows (placement, retries, relaying); this package holds what crosses
// the wire. See DESIGN.md.
package disagg

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/tether-project/tether/internal/apireq"
)

// HeaderDataParallelRank pins a request to one data-parallel rank of a vLLM
// or SGLang server. Both read it case-insensitively and parse it as an
// integer (vLLM: serving's _get_data_parallel_rank, a non-integer is
// ignored and its own balancer picks; SGLang: serving_base's
// extract_routed_dp_rank_from_header, a non-integer is a 400); a rank
// outside [0, data-parallel size) is refused with 400 by both.
const HeaderDataParallelRank = "X-Data-Parallel-Rank"

// Header is a hop's headers: the id both hops of one handoff share
// (vLLM's X-Request-Id, which the toy proxy sends to both servers) and the
// data-parallel rank (-1: none).
func Header(requestID string, rank int) http.Header {
	hdr := make(http.Header, 4)
	hdr.Set("Content-Type", "application/json")
	hdr.Set("X-Request-Id", requestID)
	if rank >= 0 {
		hdr.Set(HeaderDataParallelRank, strconv.Itoa(rank))
	}
	return hdr
}

// Fields are what a hop's body sets on, and removes from, the client's
// body.
type Fields struct {
	Set map[string]json.RawMessage
	Del []string
}

// Dialect is what the split needs to know of one API (a request path):
// how to ask a prefill server for the prompt's prefill alone, and how to
// read a non-streamed answer. Chat and completions share openAIDialect;
// the Messages and Responses APIs have theirs (agentapis.go).
type Dialect interface {
	// PrefillFields are the fields set on, and removed from, the
	// client's body top for a request that produces one token, not
	// streamed.
	PrefillFields(top map[string]json.RawMessage) Fields
	// ReadAnswer reads a non-streamed answer.
	ReadAnswer(b []byte) (*Answer, error)
	// Agent reports an API the engine converts to chat itself (Messages,
	// Responses): a prefill's answer in it is never the client's (the
	// edge renders no stream of it), and a pending prefill answer without
	// a handoff is a release whose API predates the handoff, not a
	// misconfigured server.
	Agent() bool
}

var dialects = map[string]Dialect{
	"/v1/chat/completions": openAIDialect{},
	"/v1/completions":      openAIDialect{},
	"/v1/messages":         messagesDialect{},
	"/v1/responses":        responsesDialect{},
}

// DialectOf is the dialect of request path (false: the split has none).
func DialectOf(path string) (Dialect, bool) {
	d, ok := dialects[path]
	return d, ok
}

// Answer is a non-streamed answer as the split reads it.
type Answer struct {
	Raw          map[string]json.RawMessage
	Choices      int
	Finish, Text string
	Usage        Usage
}

// openAIDialect is chat completions and completions.
type openAIDialect struct{}

// PrefillFields: the request as the client sent it, for one token and not
// streamed (toy_proxy_server.py send_request_to_service: max_tokens 1,
// max_completion_tokens 1 when given, stream false, no stream_options;
// min_tokens and min_completion_tokens, which a one-token request cannot
// honour, left out).
func (openAIDialect) PrefillFields(top map[string]json.RawMessage) Fields {
	set := map[string]json.RawMessage{"max_tokens": json.RawMessage("1"), "stream": json.RawMessage("false")}
	if _, ok := top["max_completion_tokens"]; ok {
		set["max_completion_tokens"] = json.RawMessage("1")
	}
	return Fields{Set: set, Del: []string{"stream_options", "min_tokens", "min_completion_tokens"}}
}

func (openAIDialect) Agent() bool { return false }

func (openAIDialect) ReadAnswer(b []byte) (*Answer, error) {
	a := &Answer{}
	if err := json.Unmarshal(b, &a.Raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	var body struct {
		Choices []struct {
			Message      *struct{ Content *string } `json:"message"`
			Text         *string                    `json:"text"`
			FinishReason *string                    `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, fmt.Errorf("unexpected shape: %w", err)
	}
	a.Choices = len(body.Choices)
	if len(body.Choices) > 0 {
		c := body.Choices[0]
		if c.FinishReason != nil {
			a.Finish = *c.FinishReason
		}
		switch {
		case c.Message != nil && c.Message.Content != nil:
			a.Text = *c.Message.Content
		case c.Text != nil:
			a.Text = *c.Text
		}
	}
	a.Usage = ReadUsage(b)
	return a, nil
}

// Usage is what an answer's usage says of its prompt.
type Usage struct {
	OK             bool
	Prompt, Cached int
	HasCached      bool // the usage reported cached tokens
}

// ReadUsage reads a chat or completions answer's usage.
func ReadUsage(b []byte) Usage {
	var v struct {
		Usage *struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails *struct {
				CachedTokens *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(b, &v) != nil || v.Usage == nil {
		return Usage{}
	}
	u := Usage{OK: true, Prompt: v.Usage.PromptTokens}
	if d := v.Usage.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		u.Cached, u.HasCached = *d.CachedTokens, true
	}
	return u
}

// FinishPending: a prefill (context phase) that ended with this finish
// reason leaves the request to a decode (generation phase):
// TensorRT-LLM's "length" and "not_finished".
func FinishPending(finish string) bool { return finish == "length" || finish == "not_finished" }

// Batch is the number of prompts a request generates for (n > 1, or a
// completions prompt that is a list of prompts); 0 for one. top is the
// request's body, d its dialect.
func Batch(top map[string]json.RawMessage, d apireq.Dialect) int {
	var n int
	if raw, ok := top["n"]; ok && json.Unmarshal(raw, &n) == nil && n > 1 {
		return n
	}
	if d != apireq.Completions {
		return 0
	}
	var prompts []json.RawMessage
	if raw, ok := top["prompt"]; ok && json.Unmarshal(raw, &prompts) == nil && len(prompts) > 0 {
		// A list of token ids is one prompt; a list of strings or of
		// token-id lists is a batch.
		if b := bytes.TrimSpace(prompts[0]); len(b) > 0 && (b[0] == '"' || b[0] == '[') {
			return len(prompts)
		}
	}
	return 0
}

// marshal encodes the values this package builds (maps of raw JSON and
// plain values), which cannot fail; null if one ever did.
func marshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		return json.RawMessage("null")
	}
	return b
}
