// Package admission is the layer in front of an edge's handlers that
// decides whether the edge takes a routed request at all, before its body
// is read: an isolated edge refuses it and every other request bound for a
// worker (503 edge_isolated), a stalled edge refuses it (503
// state_stalled), one saturated by its own work sheds it (429
// edge_overloaded: an adaptive limit on requests in flight that falls while
// the Go scheduler's latency p99 exceeds admission.max_scheduling_latency
// and the edge's own CPU use is at least admission.min_cpu_share of the
// CPUs it may use, and recovers after); and every 503 or 429 leaves with a
// Retry-After. See edge/DESIGN.md "An isolated edge", "A stalled edge" and
// "Load shedding on the edge's own saturation".
package admission

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/observe"
)

// Layer is the admission layer in front of the edge's handlers: it
// decides, for each routed request (POST /v1/..., the inference API),
// whether this edge takes it at all, before any of its body is read:
//
//   - an isolated edge (edge/readiness: no leader known and no worker
//     heard) refuses it, and any other request bound for a worker (by-id
//     reads of stored responses and conversations): 503 edge_isolated with
//     Retry-After, where a routed request would wait on a worker the edge
//     cannot reach;
//   - a stalled edge (edge/readiness: its state stopped following the
//     leader's) refuses it: 503 state_stalled with Retry-After, so the
//     client, or the load balancer that /readyz already took the edge out
//     of, goes to another edge;
//   - an edge saturated by its own work sheds it: 429 edge_overloaded with
//     Retry-After (shedder), before the request's work can crowd out the
//     edge's own Raft traffic.
//
// And for every response, whoever writes it (a handler, a refusal, a
// worker's answer passed through): a 503 or 429 without Retry-After gets
// one (defaultRetryAfter), so a client always knows when to come back.
type Layer struct {
	edge    Edge
	cfg     config.AdmissionConfig
	metrics *observe.Metrics
	shed    *shedder // nil until Start
}

// Edge is what the admission layer asks of the edge, per request (from
// Start on).
type Edge interface {
	// Stalled is why the edge's state stopped following its leader's (""
	// when it has not: edge/readiness).
	Stalled(now time.Time) string
	// Isolated is why the edge is cut off: no leader known and no worker
	// heard ("" when it is not: edge/readiness).
	Isolated(now time.Time) string
	// RetryHint is the Retry-After of a refusal the log causes: about one
	// election.
	RetryHint() time.Duration
	// Now is the edge's clock.
	Now() time.Time
}

// New is the admission layer of edge under the admission section; it
// counts its refusals in tether_edge_requests_total.
func New(edge Edge, cfg config.AdmissionConfig, m *observe.Metrics) *Layer {
	return &Layer{edge: edge, cfg: cfg, metrics: m}
}

// Start creates the shedder (its series registered with reg) and returns
// its loop, which moves the limit until done closes; the edge runs it.
func (l *Layer) Start(reg prometheus.Registerer) (run func(done <-chan struct{}), err error) {
	s, err := newShedder(l.cfg, reg, l.metrics)
	if err != nil {
		return nil, err
	}
	l.shed = s
	return s.run, nil
}

// InFlight is the routed requests admitted and not finished.
func (l *Layer) InFlight() int {
	if l.shed == nil {
		return 0
	}
	l.shed.mu.Lock()
	defer l.shed.mu.Unlock()
	return l.shed.inflight
}

// Wrap puts the layer in front of next.
func (l *Layer) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api.RestoreTLS(r)
		w = &retryAfterWriter{ResponseWriter: w}
		if workerRequest(r) {
			if why := l.edge.Isolated(l.edge.Now()); why != "" {
				l.metrics.Requests.WithLabelValues(api.EndpointLabel(r), "503").Inc()
				ae := api.NewError(http.StatusServiceUnavailable, "server_error", "edge_isolated", "",
					"this edge is cut off from its cluster and its workers (%s): a request would wait on a worker it cannot reach; retry on another edge", why)
				ae.RetryAfter = l.edge.RetryHint()
				ae.Write(w, api.PathDialect(r))
				return
			}
		}
		if !routedRequest(r) {
			next.ServeHTTP(w, r)
			return
		}
		if why := l.edge.Stalled(l.edge.Now()); why != "" {
			l.metrics.Requests.WithLabelValues(api.EndpointLabel(r), "503").Inc()
			ae := api.NewError(http.StatusServiceUnavailable, "server_error", "state_stalled", "",
				"this edge cannot route requests correctly: its copy of the affinity log stopped following the cluster's (%s); retry on another edge", why)
			ae.RetryAfter = l.edge.RetryHint()
			ae.Write(w, api.PathDialect(r))
			return
		}
		if l.shed == nil {
			next.ServeHTTP(w, r)
			return
		}
		release, why := l.shed.admit()
		if release == nil {
			l.metrics.Requests.WithLabelValues(api.EndpointLabel(r), "429").Inc()
			ae := api.NewError(http.StatusTooManyRequests, "rate_limit_error", "edge_overloaded", "",
				"this edge is saturated (%s); retry after %s", why, l.cfg.RetryAfter)
			ae.RetryAfter = l.shed.retryAfter()
			ae.Write(w, api.PathDialect(r))
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

// routedRequest: r is one the edge routes to workers (every POST under
// /v1/ except the model list, which the edge answers itself).
func routedRequest(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") && !strings.HasPrefix(r.URL.Path, "/v1/models")
}

// workerRequest: r goes to a worker (every request under /v1/ but the
// model list): routed requests, and those naming a stored response or a
// conversation, which go to the instance holding it.
func workerRequest(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/v1/") && !strings.HasPrefix(r.URL.Path, "/v1/models")
}

// defaultRetryAfter is the Retry-After of a 503 or 429 that names none:
// about when a worker that just became unhealthy may be healthy again (a
// load report every 100 ms, a probe every second) or an election is over.
const defaultRetryAfter = time.Second

// retryAfterWriter adds Retry-After (and Retry-After-Ms, which the OpenAI
// SDKs read first) to a 503 or 429 written without them.
type retryAfterWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *retryAfterWriter) WriteHeader(status int) {
	if !w.wrote && status >= 200 {
		w.wrote = true
		if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
			h := w.Header()
			if h.Get("Retry-After") == "" {
				h.Set("Retry-After", strconv.Itoa(int(defaultRetryAfter/time.Second)))
				if h.Get("Retry-After-Ms") == "" {
					h.Set("Retry-After-Ms", strconv.FormatInt(defaultRetryAfter.Milliseconds(), 10))
				}
			}
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *retryAfterWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (Flush,
// deadlines).
func (w *retryAfterWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
