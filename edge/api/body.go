package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/bodybudget"
)

// MustMarshal is v as JSON (null if it cannot be: only maps of raw JSON
// and plain values are marshalled here).
func MustMarshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		// Only maps of raw JSON and plain values are marshalled here.
		return json.RawMessage("null")
	}
	return b
}

// appendJSONString appends s as a JSON string (keys of a decoded object:
// any valid UTF-8, escaped as encoding/json would).
func appendJSONString(b []byte, s string) []byte {
	simple := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 || c == '<' || c == '>' || c == '&' {
			simple = false
			break
		}
	}
	if simple {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	return append(b, MustMarshal(s)...)
}

// internalBodyFields never come from a client: the edge owns
// disaggregation and the affinity hint (docs/subagent-routing.md: "the internal affinity
// field is excluded from the serialized request body").
var internalBodyFields = []string{"disaggregated_params", "subagent_affinity_id", "subagent_affinity_auth"}

// Parse validates an inference body sent to path with the request model
// workers share (internal/apireq: the path's dialect; count_tokens is a
// Messages body without max_tokens) and removes the internal fields no
// client may send from its Top.
func Parse(body []byte, path string) (*apireq.Request, *Error) {
	var p *apireq.Request
	var aerr *Error
	if strings.TrimSuffix(path, "/") == CountTokensPath {
		p, aerr = apireq.ParseCountTokens(body)
	} else {
		d, _ := DialectOfPath(path)
		p, aerr = apireq.Parse(d, body)
	}
	if aerr != nil {
		return nil, aerr
	}
	stripInternal(p.Top)
	return p, nil
}

// stripInternal removes the internal fields from a body's top level.
func stripInternal(top map[string]json.RawMessage) {
	for _, k := range internalBodyFields {
		delete(top, k)
	}
	if raw, ok := top["scheduling_params"]; ok && !apireq.IsNull(raw) {
		// The affinity id may also hide in scheduling_params: drop it there.
		var sp map[string]json.RawMessage
		if json.Unmarshal(raw, &sp) == nil {
			if _, ok := sp["subagent_affinity_id"]; ok {
				delete(sp, "subagent_affinity_id")
				top["scheduling_params"] = MustMarshal(sp)
			}
		}
	}
}

// HopBody is the request body for one hop: the client's body top with
// fields set or removed. Values are copied as the decoder validated them
// (no re-encoding: the prompt is the bulk of the body and is written once).
func HopBody(top, set map[string]json.RawMessage, del ...string) []byte {
	n := 2
	for k, v := range top {
		n += len(k) + len(v) + 4
	}
	for k, v := range set {
		n += len(k) + len(v) + 4
	}
	b := make([]byte, 0, n+16)
	b = append(b, '{')
	first := true
	write := func(k string, v json.RawMessage) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, k)
		b = append(b, ':')
		b = append(b, v...)
	}
outer:
	for k, v := range top {
		if _, replaced := set[k]; replaced {
			continue
		}
		for _, d := range del {
			if k == d {
				continue outer
			}
		}
		write(k, v)
	}
	for k, v := range set {
		write(k, v)
	}
	return append(b, '}')
}

// ReadBody reads at most limit bytes of r's body (max_body_bytes: 413
// beyond), held against budget (max_inflight_body_bytes) until release:
// 429 with Retry-After when the budget is exhausted, counted in refused.
func ReadBody(r *http.Request, budget *bodybudget.Budget, limit int64, refused prometheus.Counter) (body []byte, release func(), aerr *Error) {
	body, release, err := budget.Read(r.Body, r.ContentLength, limit)
	switch {
	case err == nil:
		return body, release, nil
	case errors.Is(err, bodybudget.ErrTooLarge):
		if r.ContentLength > limit {
			return nil, nil, NewError(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
				"request body of %d bytes exceeds the limit of %d bytes (max_body_bytes)", r.ContentLength, limit)
		}
		return nil, nil, NewError(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
			"request body exceeds the limit of %d bytes (max_body_bytes)", limit)
	case errors.Is(err, bodybudget.ErrExceeded):
		refused.Inc()
		aerr := NewError(http.StatusTooManyRequests, "rate_limit_error", "request_body_budget_exhausted", "",
			"this edge holds its limit of %d request-body bytes in flight (max_inflight_body_bytes); retry after 1s", budget.Limit())
		aerr.RetryAfter = time.Second
		return nil, nil, aerr
	}
	return nil, nil, BadRequest("", "", "reading the request body: %v", err)
}
