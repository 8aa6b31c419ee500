package disagg

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tether-project/tether/internal/apireq"
)

// TensorRT-LLM's disaggregated protocol, as trtllm-serve's disaggregated
// server speaks it to its context and generation workers
// (tensorrt_llm/serve/openai_disagg_service.py): the context request
// (context_only, a disagg_request_id), the verification of its answer
// (_verify_ctx_response), whether a generation phase follows (_need_gen),
// and the generation request (generation_only, the context's handoff
// passed through). Workers predating the protocol (a top-level
// disaggregated_params with opaque_state) are still understood.

// Disaggregated request ids (disagg_request_id) are TensorRT-LLM global
// ids: llmapi/disagg_utils.py keeps [0, MIN_GLOBAL_ID = 2^40) for a
// worker's local request ids (get_local_request_id) and draws global ids
// from [2^40, 2^63) so the two never collide. An edge's ids are
// trtllmIDFloor | a random 31-bit prefix per edge process << 21 | a 21-bit
// counter: in [2^52, 2^53), above the floor whatever the prefix, unique
// across edges and restarts in practice, and exact in float64-based JSON
// parsers (below 2^53).
const (
	trtllmIDFloor = uint64(1) << 52
	// TRTLLMIDSeqBits are the counter's bits of an edge's ids.
	TRTLLMIDSeqBits = 21
)

// TRTLLMIDBase is an edge process's disaggregated request id prefix from
// 32 random bits; its ids are the base | a counter of TRTLLMIDSeqBits bits.
func TRTLLMIDBase(random uint32) uint64 {
	return trtllmIDFloor | uint64(random&0x7fffffff)<<TRTLLMIDSeqBits
}

// TRTLLMContextFields are the context request's fields: the client's body
// with disaggregated_params {request_type: context_only, disagg_request_id},
// not streamed (stream false, no stream_options).
func TRTLLMContextFields(disaggID uint64) Fields {
	dp := marshal(map[string]any{"request_type": "context_only", "disagg_request_id": disaggID})
	return Fields{Set: map[string]json.RawMessage{"disaggregated_params": dp, "stream": json.RawMessage("false")}, Del: []string{"stream_options"}}
}

// TRTLLMContext is a verified context-phase answer.
type TRTLLMContext struct {
	Raw      map[string]json.RawMessage
	DisaggID uint64
	// Handoff is choices[0].disaggregated_params of the answer, every
	// field as the worker sent it. nil for a worker predating the
	// protocol, whose top-level disaggregated_params (legacy) filled
	// CtxRequestID, OpaqueState and FirstTokens.
	Handoff map[string]json.RawMessage
	// PromptTokenIDs is the answer's prompt_token_ids (nil: absent).
	PromptTokenIDs json.RawMessage
	CtxRequestID   json.RawMessage
	OpaqueState    string
	FirstTokens    json.RawMessage
	Text           string
	Finish         string
	PromptTokens   int
	CachedTokens   int
	HasCached      bool // usage.prompt_tokens_details was there
}

// trtllmAnswer is what a context answer is read as.
type trtllmAnswer struct {
	Choices []struct {
		Message      *struct{ Content *string } `json:"message"`
		Text         *string                    `json:"text"`
		FinishReason *string                    `json:"finish_reason"`
		DP           map[string]json.RawMessage `json:"disaggregated_params"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
	DP             *struct {
		RequestType     string          `json:"request_type"`
		CtxRequestID    json.RawMessage `json:"ctx_request_id"`
		DisaggRequestID json.RawMessage `json:"disagg_request_id"`
		OpaqueState     string          `json:"opaque_state"`
		FirstGenTokens  json.RawMessage `json:"first_gen_tokens"`
	} `json:"disaggregated_params"`
}

// ReadTRTLLMContext parses and checks a context_only answer b the way
// TensorRT-LLM's disaggregated server does (openai_disagg_service.py
// _verify_ctx_response): exactly one choice whose disaggregated_params
// carry a ctx_request_id and our disagg_request_id. A worker predating
// that protocol answers with a top-level disaggregated_params carrying
// opaque_state; it is still understood (rolling upgrades).
func ReadTRTLLMContext(b []byte, disaggID uint64) (*TRTLLMContext, error) {
	res := &TRTLLMContext{DisaggID: disaggID}
	if err := json.Unmarshal(b, &res.Raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	var body trtllmAnswer
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, fmt.Errorf("unexpected shape: %w", err)
	}
	if len(body.Choices) != 1 {
		return nil, fmt.Errorf("%d choices, want 1", len(body.Choices))
	}
	c := body.Choices[0]
	if c.FinishReason != nil {
		res.Finish = *c.FinishReason
	}
	if err := res.readHandoff(&body, disaggID); err != nil {
		return nil, err
	}
	switch {
	case c.Message != nil && c.Message.Content != nil:
		res.Text = *c.Message.Content
	case c.Text != nil:
		res.Text = *c.Text
	}
	if u := body.Usage; u != nil {
		res.PromptTokens = u.PromptTokens
		if u.PromptTokensDetails != nil {
			res.CachedTokens, res.HasCached = u.PromptTokensDetails.CachedTokens, true
		}
	}
	return res, nil
}

// readHandoff checks and keeps the answer's handoff to the generation
// phase, when one is pending.
func (res *TRTLLMContext) readHandoff(body *trtllmAnswer, disaggID uint64) error {
	c := body.Choices[0]
	wantID := strconv.FormatUint(disaggID, 10)
	switch {
	case !FinishPending(res.Finish):
		// The context phase already finished the request (the model
		// stopped on its first token): nothing is handed off, so the
		// worker leaves ctx_request_id and the opaque state null, and the
		// answer is this response (openai_disagg_service.py checks the
		// handoff only when a generation phase is pending, as _need_gen).
	case c.DP != nil:
		dp := c.DP
		if apireq.IsNull(dp["ctx_request_id"]) {
			return errors.New("choices[0].disaggregated_params.ctx_request_id is missing")
		}
		if got := strings.Trim(string(bytes.TrimSpace(dp["disagg_request_id"])), `"`); got != wantID {
			return fmt.Errorf("choices[0].disaggregated_params.disagg_request_id %s, want %d", dp["disagg_request_id"], disaggID)
		}
		res.Handoff = dp
		if !apireq.IsNull(body.PromptTokenIDs) {
			res.PromptTokenIDs = body.PromptTokenIDs
		}
	case body.DP != nil:
		dp := body.DP
		switch {
		case dp.RequestType != "context_only":
			return fmt.Errorf("disaggregated_params.request_type %q, want context_only", dp.RequestType)
		case strings.Trim(string(dp.DisaggRequestID), `"`) != wantID:
			return fmt.Errorf("disaggregated_params.disagg_request_id %s, want %d", dp.DisaggRequestID, disaggID)
		case dp.OpaqueState == "":
			return errors.New("no disaggregated_params.opaque_state")
		}
		res.CtxRequestID, res.OpaqueState, res.FirstTokens = dp.CtxRequestID, dp.OpaqueState, dp.FirstGenTokens
	default:
		return errors.New("no disaggregated_params in choices[0]")
	}
	return nil
}

// NeedsGeneration: as TensorRT-LLM's disaggregated server (_need_gen), the
// generation hop runs when the context phase stopped for length (or is not
// finished); any other finish reason, or a one-token request, makes the
// context answer the answer.
func (res *TRTLLMContext) NeedsGeneration(maxTokens int) bool {
	return maxTokens != 1 && FinishPending(res.Finish)
}

// GenerationFields are the generation request's fields: the context's
// choices[0].disaggregated_params with request_type generation_only and
// our disagg_request_id, every other field passed through untouched, and
// the context's prompt_token_ids (chat, a dialect with a conversation:
// prompt_token_ids; completions: the prompt). It also returns the
// disaggregated_params it sends (what x-trtllm-disagg-auth signs; nil for a
// worker predating the protocol).
func (res *TRTLLMContext) GenerationFields(chat bool) (Fields, map[string]json.RawMessage) {
	id := json.RawMessage(strconv.FormatUint(res.DisaggID, 10))
	if res.Handoff == nil {
		dp := map[string]json.RawMessage{
			"request_type":      json.RawMessage(`"generation_only"`),
			"disagg_request_id": id,
			"opaque_state":      marshal(res.OpaqueState),
		}
		if len(res.CtxRequestID) > 0 {
			dp["ctx_request_id"] = res.CtxRequestID
		}
		if len(res.FirstTokens) > 0 && !apireq.IsNull(res.FirstTokens) {
			dp["first_gen_tokens"] = res.FirstTokens
		}
		return Fields{Set: map[string]json.RawMessage{"disaggregated_params": marshal(dp)}}, nil
	}
	dp := make(map[string]json.RawMessage, len(res.Handoff)+2)
	for k, v := range res.Handoff {
		dp[k] = v
	}
	dp["request_type"] = json.RawMessage(`"generation_only"`)
	dp["disagg_request_id"] = id
	set := map[string]json.RawMessage{"disaggregated_params": marshal(dp)}
	if res.PromptTokenIDs != nil {
		if chat {
			set["prompt_token_ids"] = res.PromptTokenIDs
		} else {
			set["prompt"] = res.PromptTokenIDs
		}
	}
	return Fields{Set: set}, dp
}
