package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/internal/apireq"
)

// Endpoint is how one endpoint's requests are traced and counted.
type Endpoint struct {
	// Label is the endpoint label of tether_edge_requests_total and
	// tether_edge_request_seconds.
	Label string
	// Span is the server span's name.
	Span string
	// Dialect is the shape of the endpoint's error answers.
	Dialect apireq.Dialect
	// Route: the span names the path (http.route) and an answer of 400 or
	// more marks it failed.
	Route bool
}

// Served traces, counts and times the requests of the edge's endpoints.
type Served struct {
	Tracer  trace.Tracer
	Metrics *observe.Metrics
	// NodeID names the edge on every span.
	NodeID string
}

// Serve serves one request of ep with serve: it continues the incoming
// trace context with a server span, answers through a Writer in ep's
// dialect, records the status on the span, counts and times the request,
// and ends by aborting the connection when the answer asked to (a stream
// the edge could not finish: no client reads it as complete).
func (s Served) Serve(w http.ResponseWriter, r *http.Request, ep Endpoint, serve func(ctx context.Context, w http.ResponseWriter, span trace.Span) int) {
	start := time.Now()
	aw := NewWriter(w, ep.Dialect)
	ctx := observe.TraceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	attrs := []attribute.KeyValue{attribute.String("http.request.method", r.Method)}
	if ep.Route {
		attrs = append(attrs, attribute.String("http.route", r.URL.Path))
	}
	attrs = append(attrs, attribute.String("tether.edge", s.NodeID))
	ctx, span := s.Tracer.Start(ctx, ep.Span, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	defer span.End()
	status := serve(ctx, aw, span)
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if ep.Route && status >= 400 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	s.Metrics.Requests.WithLabelValues(ep.Label, strconv.Itoa(status)).Inc()
	s.Metrics.RequestSeconds.WithLabelValues(ep.Label).Observe(time.Since(start).Seconds())
	if aw.Aborted() {
		panic(http.ErrAbortHandler)
	}
}
