package observe

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tether-project/tether/edge/config"
)

// TracerProvider builds the provider for tracing.exporter when the embedder
// gave none. It returns a shutdown function (nil for none) that flushes
// the spans still batched.
func TracerProvider(cfg config.TracingConfig, nodeID string, out io.Writer) (trace.TracerProvider, func(context.Context) error, error) {
	res := resource.NewSchemaless(attribute.String("service.name", "tether-edge"), attribute.String("service.instance.id", nodeID))
	switch cfg.Exporter {
	case "stdout":
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(&jsonLinesExporter{w: out}), sdktrace.WithResource(res))
		return tp, tp.Shutdown, nil
	case "otlp":
		u, err := config.OTLPTracesURL(cfg.Endpoint)
		if err != nil {
			return nil, nil, fmt.Errorf("tracing.endpoint: %w", err)
		}
		// NewUnstarted + a lazily connecting HTTP client: a collector that
		// is down at startup delays nothing (batches are retried, then
		// dropped, in the background).
		exp := otlptracehttp.NewUnstarted(otlptracehttp.WithEndpointURL(u.String()), otlptracehttp.WithTimeout(10*time.Second))
		if err := exp.Start(context.Background()); err != nil {
			return nil, nil, fmt.Errorf("tracing: otlp exporter: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		return tp, tp.Shutdown, nil
	}
	return noop.NewTracerProvider(), nil, nil
}

// jsonLinesExporter writes one JSON object per span. The otel stdout
// exporter is a separate module this build does not depend on; this is the
// few lines of it tether needs.
type jsonLinesExporter struct {
	mu sync.Mutex
	w  io.Writer
}

type spanJSON struct {
	Name     string            `json:"name"`
	TraceID  string            `json:"trace_id"`
	SpanID   string            `json:"span_id"`
	ParentID string            `json:"parent_id,omitempty"`
	Kind     string            `json:"kind"`
	Start    time.Time         `json:"start"`
	End      time.Time         `json:"end"`
	Status   string            `json:"status,omitempty"`
	Attrs    map[string]string `json:"attributes,omitempty"`
}

func (x *jsonLinesExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	enc := json.NewEncoder(x.w)
	for _, s := range spans {
		j := spanJSON{
			Name: s.Name(), TraceID: s.SpanContext().TraceID().String(), SpanID: s.SpanContext().SpanID().String(),
			Kind: s.SpanKind().String(), Start: s.StartTime(), End: s.EndTime(), Status: s.Status().Code.String(),
		}
		if s.Parent().IsValid() {
			j.ParentID = s.Parent().SpanID().String()
		}
		if attrs := s.Attributes(); len(attrs) > 0 {
			j.Attrs = make(map[string]string, len(attrs))
			for _, kv := range attrs {
				j.Attrs[string(kv.Key)] = kv.Value.Emit()
			}
		}
		if err := enc.Encode(j); err != nil {
			return err
		}
	}
	return nil
}

func (x *jsonLinesExporter) Shutdown(context.Context) error { return nil }

// Span attribute keys of the routing-decision span.
const (
	AttrKeyKind      = attribute.Key("tether.routing_key.kind")
	AttrPolicy       = attribute.Key("tether.policy")
	AttrOutcome      = attribute.Key("tether.outcome")
	AttrCachedTokens = attribute.Key("tether.cached_tokens")
	AttrInstance     = attribute.Key("tether.instance")
	AttrRank         = attribute.Key("tether.rank")
	AttrOverflow     = attribute.Key("tether.overflow_reason")
	AttrFleet        = attribute.Key("tether.fleet")
)

// TraceContext carries the W3C trace context (traceparent) in and out of
// the edge's HTTP requests.
var TraceContext = propagation.TraceContext{}
