package apireq

import (
	"encoding/json"
	"math"
)

// samplingParam is a numeric sampling parameter and the range the engine
// accepts, as vLLM checks it (vllm/sampling_params.py
// SamplingParams._verify_args): a value of the wrong type or out of range
// is a 400 there, so it is one here, before any routing.
type samplingParam struct {
	name    string
	integer bool
	ok      func(float64) bool
	want    string // the range, for the message
}

var (
	temperature = samplingParam{"temperature", false, func(v float64) bool { return v >= 0 }, "non-negative"}
	topP        = samplingParam{"top_p", false, func(v float64) bool { return v > 0 && v <= 1 }, "in (0, 1]"}
	topK        = samplingParam{"top_k", true, func(v float64) bool { return v >= -1 }, "-1 or 0 (disabled), or at least 1"}
	minP        = samplingParam{"min_p", false, func(v float64) bool { return v >= 0 && v <= 1 }, "in [0, 1]"}
	presence    = samplingParam{"presence_penalty", false, func(v float64) bool { return v >= -2 && v <= 2 }, "in [-2, 2]"}
	frequency   = samplingParam{"frequency_penalty", false, func(v float64) bool { return v >= -2 && v <= 2 }, "in [-2, 2]"}
	repetition  = samplingParam{"repetition_penalty", false, func(v float64) bool { return v > 0 }, "greater than 0"}
	seed        = samplingParam{"seed", true, func(float64) bool { return true }, ""}
)

// samplingParams are the parameters each dialect has: chat and
// completions OpenAI's and vLLM's extensions, Messages Anthropic's,
// Responses OpenAI's.
var samplingParams = [...][]samplingParam{
	Chat:        {temperature, topP, topK, minP, presence, frequency, repetition, seed},
	Completions: {temperature, topP, topK, minP, presence, frequency, repetition, seed},
	Messages:    {temperature, topP, topK},
	Responses:   {temperature, topP},
}

// checkSampling refuses a sampling parameter that is not a number (an
// integer where the engine wants one) or is out of the engine's range.
func checkSampling(r *Request) *Error {
	if int(r.Dialect) >= len(samplingParams) {
		return nil
	}
	for _, p := range samplingParams[r.Dialect] {
		raw, ok := r.Present(p.name)
		if !ok {
			continue
		}
		var v float64
		if raw[0] == '"' || json.Unmarshal(raw, &v) != nil {
			want := "a number"
			if p.integer {
				want = "an integer"
			}
			return BadRequest("invalid_type", p.name, "invalid type for %q: want %s, got %s", p.name, want, Kind(raw))
		}
		if p.integer && (v != math.Trunc(v) || math.Abs(v) > 1<<63) {
			return BadRequest("invalid_type", p.name, "invalid type for %q: want an integer, got %s", p.name, truncate(string(raw), 40))
		}
		if !p.ok(v) {
			return BadRequest("", p.name, "%s must be %s, got %s", p.name, p.want, truncate(string(raw), 40))
		}
	}
	return nil
}
