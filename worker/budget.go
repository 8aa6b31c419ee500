package worker

import (
	"encoding/json"
	"net/http"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/worker/engine"
)

// The token budget of a request, as vLLM decides it: max tokens may be
// anything that fits the model's context with the prompt
// (vllm/renderers/params.py TokenizeParams: max_output_tokens above
// max_model_len, then a prompt longer than max_model_len −
// max_output_tokens, are VLLMValidationErrors, which
// vllm/entrypoints/utils.py create_error_response answers with 400); a
// request without max tokens may run to max_model_len − prompt, or a
// generation config's default when smaller (get_max_tokens there).

// budget is the request's max tokens: the client's, checked against the
// context length, or the default. 0 when nothing is generated (a token
// count) or the engine decides (no context length here, no default).
func (r requestRules) budget(req *apireq.Request, prompt int) (int, *apiError) {
	if req.CountTokens {
		return 0, nil
	}
	limit := r.maxModelLen
	if limit == 0 {
		if req.MaxTokens > 0 {
			return req.MaxTokens, nil
		}
		return r.defaultMax, nil
	}
	if req.MaxTokens > 0 {
		name := maxTokensParam(req)
		if req.MaxTokens > limit {
			return 0, newAPIError(http.StatusBadRequest, "invalid_request_error", "", name,
				"%s=%d cannot be greater than max_model_len=%d. Please request fewer output tokens.", name, req.MaxTokens, limit)
		}
		if prompt > limit-req.MaxTokens {
			return 0, contextExceeded(limit, req.MaxTokens, prompt)
		}
		return req.MaxTokens, nil
	}
	if prompt > limit {
		return 0, contextExceeded(limit, 0, prompt)
	}
	n := limit - prompt
	if n < 1 {
		// vLLM's SamplingParams refuses the max_tokens 0 left over.
		return 0, badRequest("max_tokens", "max_tokens must be at least 1, got 0.")
	}
	if r.defaultMax > 0 {
		n = min(n, r.defaultMax)
	}
	return n, nil
}

// maxTokensParam is the name the client gave its max tokens under:
// max_output_tokens (Responses), max_completion_tokens when a chat or
// completions request used it, else max_tokens (vLLM's chat protocol
// build_tok_params names the one given).
func maxTokensParam(req *apireq.Request) string {
	switch {
	case req.Dialect == apireq.Responses:
		return "max_output_tokens"
	case req.Dialect == apireq.Messages:
		return "max_tokens"
	}
	if _, ok := req.Present("max_completion_tokens"); ok {
		return "max_completion_tokens"
	}
	return "max_tokens"
}

// contextExceeded is vLLM's refusal of a prompt that does not fit the
// context with the output asked for (TokenizeParams' token length check,
// parameter input_tokens), with OpenAI's code for it.
func contextExceeded(limit, out, prompt int) *apiError {
	return newAPIError(http.StatusBadRequest, "invalid_request_error", "context_length_exceeded", "input_tokens",
		"This model's maximum context length is %d tokens. However, you requested %d output tokens and your prompt contains %d input tokens, for a total of %d tokens. Please reduce the length of the input prompt or the number of requested output tokens.",
		limit, out, prompt, prompt+out)
}

// vllmSampling reads vLLM's sampling extensions that shape the simulated
// answer's length, in any dialect's body: ignore_eos (free text runs to
// max tokens) and min_tokens (no stop before them), checked as vLLM's
// SamplingParams checks them.
func vllmSampling(top map[string]json.RawMessage, o *engine.OutputOptions, maxTokens int) *apiError {
	if raw, ok := present(top, "ignore_eos"); ok {
		if json.Unmarshal(raw, &o.IgnoreEOS) != nil {
			return badRequest("ignore_eos", "ignore_eos must be a boolean, got %s", truncate(string(raw), 40))
		}
	}
	raw, ok := present(top, "min_tokens")
	if !ok {
		return nil
	}
	var n int64
	if json.Unmarshal(raw, &n) != nil {
		return badRequest("min_tokens", "min_tokens must be an integer, got %s", truncate(string(raw), 40))
	}
	if n < 0 {
		return badRequest("min_tokens", "min_tokens must be greater than or equal to 0, got %d.", n)
	}
	if maxTokens > 0 && n > int64(maxTokens) {
		return badRequest("min_tokens", "min_tokens must be less than or equal to max_tokens=%d, got %d.", maxTokens, n)
	}
	o.MinTokens = int(n)
	return nil
}
