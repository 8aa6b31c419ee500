package edge

import (
	"net/http"
	"strings"
)

// admission is the layer in front of the edge's handlers that decides, for
// each routed request (POST /v1/..., the inference API), whether this edge
// takes it at all, before any of its body is read:
//
//   - a stalled edge (readiness.go: its state stopped following the
//     leader's) refuses it: 503 state_stalled with Retry-After, so the
//     client, or the load balancer that /readyz already took the edge out
//     of, goes to another edge.
func (e *Edge) admission(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
