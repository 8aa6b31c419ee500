package worker

import (
	"encoding/json"
	"testing"

	"github.com/tether-project/tether/internal/apireq"
)

// FuzzParseRequest: any body either parses into a usable request or yields
// an OpenAI error with a 4xx status; nothing panics, and the body forwarded
// to engines never carries internal fields.
func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), true)
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"stream":true,"stream_options":{"include_usage":true}}`), true)
	f.Add([]byte(`{"model":"m","prompt":[1,2,3],"max_tokens":4}`), false)
	f.Add([]byte(`{"model":"m","prompt":["x"],"disaggregated_params":{"request_type":"context_only","disagg_request_id":7}}`), false)
	f.Add([]byte(`{"model":"m","prompt":"x","disaggregated_params":{"request_type":"generation_only","disagg_request_id":"a","opaque_state":"AAAA"}}`), false)
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":null}],"scheduling_params":{"x":1}}`), true)
	f.Add([]byte(`[]`), true)
	f.Add([]byte(`{"model":1e400}`), false)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		d := apireq.Completions
		if chat {
			d = apireq.Chat
		}
		p, aerr := parseRequest(body, d, requestRules{maxModelLen: 64})
		if aerr != nil {
			if p != nil || aerr.Status < 400 || aerr.Status >= 500 || aerr.Message == "" || aerr.Type == "" {
				t.Fatalf("bad error %+v for %q", aerr, body)
			}
			return
		}
		if len(p.prompt) == 0 || p.maxTokens < 1 || p.maxTokens > 64 || p.model == "" {
			t.Fatalf("accepted unusable request %+v from %q", p, body)
		}
		var fwd map[string]json.RawMessage
		if err := json.Unmarshal(p.sanitizedBody, &fwd); err != nil {
			t.Fatalf("sanitized body is not JSON: %v", err)
		}
		for _, k := range internalBodyFields {
			if _, ok := fwd[k]; ok {
				t.Fatalf("sanitized body keeps %q", k)
			}
		}
	})
}
