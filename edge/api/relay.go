package api

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/fsm"
)

// MaxUpstreamBody bounds a non-streaming worker response the edge reads.
const MaxUpstreamBody = 64 << 20

// UpstreamAnswer is a worker's non-success answer passed to the client.
type UpstreamAnswer struct {
	Status int
	Header http.Header
	Body   []byte
}

// Write passes the answer to the client and returns its status.
func (u *UpstreamAnswer) Write(w http.ResponseWriter) int {
	ct := u.Header.Get("Content-Type")
	if ct == "" {
		ct = "application/json"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(u.Status)
	_, _ = w.Write(u.Body)
	return u.Status
}

// Relayer passes workers' 200 answers to clients, counting the streams it
// cannot finish (tether_edge_upstream_errors_total{kind="stream_cut"},
// tether_edge_streams_aborted_total) and logging them.
type Relayer struct {
	Metrics *observe.Metrics
	Log     *slog.Logger
}

// Copy writes a worker's 200 answer to the client through ans (fleet and
// instance: where it comes from; endpoint: the metric's label). A stream
// that ends before its last event (the worker died, the connection broke)
// ends with an error event in the dialect's shape and an aborted
// connection: never a clean end a client would take for a model that
// stopped.
func (rl Relayer) Copy(w http.ResponseWriter, resp *http.Response, ans *Answer, stream bool, fleet fsm.Fleet, endpoint, instance string, span trace.Span) int {
	if !stream {
		b, err := io.ReadAll(io.LimitReader(resp.Body, MaxUpstreamBody))
		if err != nil {
			return Fail(w, span, NewError(http.StatusBadGateway, "server_error", "upstream_read_failed", "",
				"reading the response of %s: %v", instance, err))
		}
		b = ans.Body(b)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
		return http.StatusOK
	}
	h := w.Header()
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		ct = "text/event-stream"
	}
	h.Set("Content-Type", ct)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	atBoundary := true // the last line written ended an event
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			// (A partial last line is dropped: half an event is no event.)
			line = ans.Line(line)
			atBoundary = len(bytes.TrimSpace(line)) == 0
			if _, werr := w.Write(line); werr != nil {
				return StatusClientClosed
			}
			if len(bytes.TrimSpace(line)) == 0 {
				if rc.Flush() != nil {
					return StatusClientClosed
				}
			}
		}
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) && ans.terminal {
			_ = rc.Flush()
			return http.StatusOK
		}
		cause := "the stream ended before its last event"
		if !errors.Is(err, io.EOF) {
			cause = "the stream broke: " + err.Error()
		}
		msg := fmt.Sprintf("%s instance %s did not finish the response: %s", fleet, instance, cause)
		span.SetAttributes(attribute.String("tether.error", "stream cut: "+cause))
		rl.Metrics.UpstreamErrors.WithLabelValues(fleet.String(), "stream_cut").Inc()
		rl.Metrics.StreamsAborted.WithLabelValues(endpoint, fleet.String()).Inc()
		rl.Log.Warn("aborting a stream the worker did not finish", "instance", instance, "cause", cause)
		if !atBoundary {
			_, _ = w.Write([]byte("\n")) // the error is an event of its own
		}
		_, _ = w.Write(ans.failEvent(msg))
		_ = rc.Flush()
		AbortStream(w)
		return http.StatusBadGateway
	}
}
