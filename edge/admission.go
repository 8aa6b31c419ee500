package edge

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// admission is the layer in front of the edge's handlers that decides, for
// each routed request (POST /v1/..., the inference API), whether this edge
// takes it at all, before any of its body is read:
//
//   - a stalled edge (readiness.go: its state stopped following the
//     leader's) refuses it: 503 state_stalled with Retry-After, so the
//     client, or the load balancer that /readyz already took the edge out
//     of, goes to another edge.
//
// And for every response, whoever writes it (a handler, a refusal, a
// worker's answer passed through): a 503 or 429 without Retry-After gets
// one (defaultRetryAfter), so a client always knows when to come back.
func (e *Edge) admission(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		restoreTLS(r)
		w = &retryAfterWriter{ResponseWriter: w}
		if !routedRequest(r) {
			next.ServeHTTP(w, r)
			return
		}
		if why := e.ready.stalled(e.now()); why != "" {
			e.metrics.requests.WithLabelValues(endpointLabel(r), "503").Inc()
			ae := newAPIError(http.StatusServiceUnavailable, "server_error", "state_stalled", "",
				"this edge cannot route requests correctly: its copy of the affinity log stopped following the cluster's (%s); retry on another edge", why)
			ae.retryAfter = e.retryHint()
			writeAPIError(w, ae)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// routedRequest: r is one the edge routes to workers (every POST under
// /v1/ except the model list, which the edge answers itself).
func routedRequest(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") && !strings.HasPrefix(r.URL.Path, "/v1/models")
}

// endpointLabel is the requests metric's endpoint label for r.
func endpointLabel(r *http.Request) string {
	switch r.URL.Path {
	case "/v1/chat/completions":
		return "chat"
	case "/v1/completions":
		return "completions"
	}
	return "other"
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
