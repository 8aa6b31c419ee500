package edge

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is a real OTLP/HTTP endpoint: it accepts POST /v1/traces
// with a protobuf ExportTraceServiceRequest, as a collector does.
type otlpReceiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	requests []*coltracepb.ExportTraceServiceRequest
	bad      []string
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	rcv := &otlpReceiver{}
	rcv.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		rcv.mu.Lock()
		defer rcv.mu.Unlock()
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || err != nil {
			rcv.bad = append(rcv.bad, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			rcv.bad = append(rcv.bad, "undecodable body: "+err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rcv.requests = append(rcv.requests, &req)
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(rcv.srv.Close)
	return rcv
}

// spans returns the names of the received spans and the service.name of
// their resources.
func (rcv *otlpReceiver) spans() (names map[string]int, services map[string]bool, bad []string) {
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	names, services = map[string]int{}, map[string]bool{}
	for _, req := range rcv.requests {
		for _, rs := range req.GetResourceSpans() {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.GetKey() == "service.name" {
					services[kv.GetValue().GetStringValue()] = true
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					names[sp.GetName()]++
				}
			}
		}
	}
	return names, services, append([]string(nil), rcv.bad...)
}

// tracing.exporter otlp: an edge sends its spans as OTLP/HTTP protobuf to
// the configured endpoint (a URL without a path gets /v1/traces); closing
// the edge flushes the batch.
func TestOTLPExporterSendsSpans(t *testing.T) {
	rcv := startOTLPReceiver(t)
	s := startStatic(t, 1, 1, func(c *Config) {
		c.Tracing = TracingConfig{Exporter: "otlp", Endpoint: rcv.srv.URL}
	})
	body := chatBody(t, longText("otlp", 16), []string{"hi"}, nil)
	if r := s.chat(t, body, map[string]string{"x-session-id": "otlp-conv"}); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	s.ec.closeAll() // flushes the span batch
	names, services, bad := rcv.spans()
	if len(bad) > 0 {
		t.Fatalf("the receiver got unexpected requests: %v", bad)
	}
	for _, want := range []string{"tether.edge /v1/chat/completions", "tether.edge route context", "tether.edge context hop", "tether.edge generation hop"} {
		if names[want] == 0 {
			t.Errorf("span %q not received (got %v)", want, names)
		}
	}
	if !services["tether-edge"] {
		t.Errorf("resource service.name: got %v, want tether-edge", services)
	}
}
