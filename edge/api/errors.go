package api

import (
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/internal/apireq"
)

// Error is an API error answer (internal/apireq), written in the shape of
// the endpoint's dialect.
type Error = apireq.Error

// NewError is an error answer with status, type, code and param.
func NewError(status int, typ, code, param, format string, args ...any) *Error {
	return apireq.NewError(status, typ, code, param, format, args...)
}

// BadRequest is a 400 invalid_request_error.
func BadRequest(code, param, format string, args ...any) *Error {
	return apireq.BadRequest(code, param, format, args...)
}

// WriteError writes e in the shape of the dialect of the endpoint w serves
// (a Writer; OpenAI's when w is not one).
func WriteError(w http.ResponseWriter, e *Error) {
	e.Write(w, DialectOf(w))
}

// MethodNotAllowed answers 405 naming the allowed methods.
func MethodNotAllowed(w http.ResponseWriter, r *http.Request, allowed ...string) {
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	WriteError(w, NewError(http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "",
		"method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allowed, ", ")))
}

// StatusClientClosed is recorded (never sent) when the client went away.
const StatusClientClosed = 499

// Fail writes aerr, notes it on the request's span and returns its status.
func Fail(w http.ResponseWriter, span trace.Span, aerr *Error) int {
	span.SetAttributes(attribute.String("tether.error", aerr.Message))
	WriteError(w, aerr)
	return aerr.Status
}
