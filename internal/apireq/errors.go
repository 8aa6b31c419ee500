package apireq

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/tether-project/tether/internal/httpjson"
)

// Error is an API error answer: its HTTP status and the fields of the
// OpenAI error object ({"error": {"message", "type", "param", "code"}}),
// written in the shape of the dialect that was asked (Write).
type Error struct {
	Status  int
	Type    string // OpenAI's type: invalid_request_error, server_error, rate_limit_error, ...
	Code    string // "" is written as null
	Param   string // "" is written as null
	Message string
	// RetryAfter, when set, is sent as Retry-After (whole seconds, rounded
	// up) and Retry-After-Ms (the OpenAI and Anthropic SDKs read the
	// milliseconds first, so a sub-second hint need not round up).
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Message }

// NewError builds an error; code and param may be "".
func NewError(status int, typ, code, param, format string, args ...any) *Error {
	return &Error{Status: status, Type: typ, Code: code, Param: param, Message: fmt.Sprintf(format, args...)}
}

// BadRequest is a 400 invalid_request_error; code "" is invalid_value.
func BadRequest(code, param, format string, args ...any) *Error {
	if code == "" {
		code = "invalid_value"
	}
	return NewError(http.StatusBadRequest, "invalid_request_error", code, param, format, args...)
}

// Missing is a 400 for a required parameter that is absent.
func Missing(param string) *Error {
	return BadRequest("missing_required_parameter", param, "%s is required", param)
}

// openAIBody is the OpenAI error object.
type openAIBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// anthropicBody is the Anthropic error object
// ({"type": "error", "error": {"type", "message"}}).
type anthropicBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// AnthropicType is the Anthropic error type of an HTTP status, as the
// Messages API answers them (invalid_request_error 400,
// authentication_error 401, permission_error 403, not_found_error 404,
// request_too_large 413, rate_limit_error 429, overloaded_error 529,
// api_error for other server errors).
func AnthropicType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == 529:
		return "overloaded_error"
	case status >= 500:
		return "api_error"
	}
	return "invalid_request_error"
}

// MarshalJSON writes e as OpenAI's error object ({"message", "type",
// "param", "code"}, param and code null when empty): an Error embedded in
// a JSON answer is never its Go field names (an edge's answer to a header
// net/http refused read {"Status":0,"Type":…,"RetryAfter":0}).
func (e Error) MarshalJSON() ([]byte, error) {
	var b openAIBody
	b.Error.Message, b.Error.Type = e.Message, e.Type
	if e.Param != "" {
		p := e.Param
		b.Error.Param = &p
	}
	if e.Code != "" {
		c := e.Code
		b.Error.Code = &c
	}
	return json.Marshal(b.Error)
}

// JSON is e's body in dialect d's error shape (Messages: Anthropic's,
// every other dialect: OpenAI's).
func (e *Error) JSON(d Dialect) []byte {
	var v any
	if d == Messages {
		var b anthropicBody
		b.Type = "error"
		b.Error.Type = AnthropicType(e.Status)
		b.Error.Message = e.Message
		v = b
	} else {
		v = struct {
			Error Error `json:"error"`
		}{*e}
	}
	out, _ := json.Marshal(v) // strings and pointers only: cannot fail
	return out
}

// Write sends e with its status in dialect d's error shape.
func (e *Error) Write(w http.ResponseWriter, d Dialect) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((e.RetryAfter+time.Second-1)/time.Second)))
		h.Set("Retry-After-Ms", strconv.FormatInt(e.RetryAfter.Milliseconds(), 10))
	}
	httpjson.Write(w, e.Status, json.RawMessage(e.JSON(d)))
}
