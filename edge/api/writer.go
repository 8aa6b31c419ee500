package api

import (
	"net/http"
	"time"

	"github.com/tether-project/tether/internal/apireq"
)

// Writer is the response writer of one API request: it knows the
// endpoint's dialect (errors are written in its shape) and whether the
// answer must end by aborting the connection (a stream the edge could not
// finish: the client must not read a clean end).
type Writer struct {
	http.ResponseWriter
	dialect apireq.Dialect
	aborted bool
}

// NewWriter is w answering an endpoint of dialect d.
func NewWriter(w http.ResponseWriter, d apireq.Dialect) *Writer {
	return &Writer{ResponseWriter: w, dialect: d}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Aborted reports whether the answer must end by aborting the connection
// (AbortStream).
func (w *Writer) Aborted() bool { return w.aborted }

// DialectOf is the dialect of the endpoint w answers (OpenAI's chat when w
// is not a Writer).
func DialectOf(w http.ResponseWriter) apireq.Dialect {
	if a, ok := w.(*Writer); ok {
		return a.dialect
	}
	return apireq.Chat
}

// AbortStream marks w's connection for an abort once the handler has
// recorded its metrics (the handler then panics with http.ErrAbortHandler:
// net/http closes the connection without the chunked terminator).
func AbortStream(w http.ResponseWriter) {
	if a, ok := w.(*Writer); ok {
		a.aborted = true
	}
}

// DeadlineWriter moves the connection's write deadline write_timeout ahead
// before every write: the limit is on a stalled client, not on a long
// generation or stream (http.Server.WriteTimeout alone would count the
// time spent waiting for the workers).
type DeadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

// NewDeadlineWriter is w with each write's deadline d ahead.
func NewDeadlineWriter(w http.ResponseWriter, d time.Duration) *DeadlineWriter {
	return &DeadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: d}
}

func (w *DeadlineWriter) WriteHeader(status int) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	w.ResponseWriter.WriteHeader(status)
}

func (w *DeadlineWriter) Write(b []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (Flush).
func (w *DeadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
