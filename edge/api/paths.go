package api

import (
	"net/http"
	"strings"

	"github.com/tether-project/tether/internal/apireq"
)

// CountTokensPath is the Messages API's token count.
const CountTokensPath = "/v1/messages/count_tokens"

// DialectOfPath is the dialect of a create endpoint (count_tokens:
// Messages).
func DialectOfPath(path string) (apireq.Dialect, bool) {
	switch strings.TrimSuffix(path, "/") {
	case "/v1/chat/completions":
		return apireq.Chat, true
	case "/v1/completions":
		return apireq.Completions, true
	case "/v1/messages", CountTokensPath:
		return apireq.Messages, true
	case "/v1/responses":
		return apireq.Responses, true
	}
	return 0, false
}

// PassThroughHeaders are the client's headers an engine reads that the
// edge forwards on every hop: the Anthropic API version and beta flags
// (vLLM and SGLang accept and ignore them; an engine that reads them gets
// what the client sent).
func PassThroughHeaders(d apireq.Dialect, h http.Header) http.Header {
	if d != apireq.Messages {
		return nil
	}
	var out http.Header
	for _, k := range []string{"Anthropic-Version", "Anthropic-Beta"} {
		if v := h.Values(k); len(v) > 0 {
			if out == nil {
				out = http.Header{}
			}
			out[k] = append([]string(nil), v...)
		}
	}
	return out
}

// EndpointLabel is the requests metric's endpoint label for r
// (tether_edge_requests_total{endpoint}).
func EndpointLabel(r *http.Request) string {
	if d, ok := DialectOfPath(r.URL.Path); ok {
		return d.String()
	}
	if strings.HasPrefix(r.URL.Path, "/v1/responses/") {
		return "responses_by_id"
	}
	return "other"
}

// PathDialect is the API whose error shape a refusal of r takes (a
// Messages client reads Anthropic's; every other path OpenAI's).
func PathDialect(r *http.Request) apireq.Dialect {
	if d, ok := DialectOfPath(r.URL.Path); ok {
		return d
	}
	return apireq.Chat
}
