package edge

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/httpjson"
)

// The HTTP API's mux and the edge's accessors.

// NATSURL is the embedded NATS server's client URL ("" when not embedded).
func (e *Edge) NATSURL() string {
	if e.nats.srv != nil {
		return e.nats.srv.ClientURL()
	}
	return ""
}

// Addr is the HTTP listen address (host:port).
func (e *Edge) Addr() string {
	if e.http.ln == nil {
		return ""
	}
	return e.http.ln.Addr().String()
}

// Node is the edge's cluster node (read-only use).
func (e *Edge) Node() *cluster.Node { return e.node }

// Fleet is the edge's view of the workers.
func (e *Edge) Fleet() *fleetview.View { return e.fleet }

// Registry is the edge's metrics registry.
func (e *Edge) Registry() *prometheus.Registry { return e.registry }

// Handler is the edge's HTTP API: the OpenAI endpoints, health, metrics
// and the admin API.
func (e *Edge) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, d := range []apireq.Dialect{apireq.Chat, apireq.Completions, apireq.Messages, apireq.Responses} {
		mux.HandleFunc(d.Path(), func(w http.ResponseWriter, r *http.Request) { e.handleInference(w, r, d) })
	}
	mux.HandleFunc(api.CountTokensPath, func(w http.ResponseWriter, r *http.Request) { e.handleInference(w, r, apireq.Messages) })
	mux.HandleFunc("/v1/responses/", e.stored.ServeByID)
	mux.HandleFunc("/v1/conversations", e.stored.ServeConversations)
	mux.HandleFunc("/v1/conversations/", e.stored.ServeConversations)
	mux.HandleFunc("/v1/models", e.catalogue.ServeModels)
	mux.HandleFunc("/v1/models/{id...}", e.catalogue.ServeModel)
	mux.HandleFunc("/healthz", e.handleHealth)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) { e.ready.ServeHTTP(w, r) })
	mux.Handle("/metrics", e.metricsHandler())
	mux.Handle(admin.Prefix, e.adminAPI())
	return e.admission.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				e.log.Error("handler panic", "path", r.URL.Path, "panic", v)
				api.WriteError(w, api.NewError(http.StatusInternalServerError, "server_error", "internal_error", "", "internal error"))
			}
		}()
		if _, pattern := mux.Handler(r); pattern == "" {
			e.metrics.Requests.WithLabelValues("other", "404").Inc()
			api.WriteError(w, api.NewError(http.StatusNotFound, "invalid_request_error", "unknown_url", "",
				"unknown path %s %s (the edge serves POST /v1/chat/completions, /v1/completions, /v1/messages, /v1/messages/count_tokens, /v1/responses, GET/DELETE /v1/responses/{id}, /v1/conversations[/{id}[/items[/{item_id}]]], GET /v1/models, /healthz, /readyz, /metrics, /admin/v1/...)",
				r.Method, httpjson.Clip(r.URL.Path, 200)))
			return
		}
		mux.ServeHTTP(w, r)
	}))
}

// metricsHandler serves /metrics, behind the admin token when
// metrics_access is admin_token (docs/security.md).
func (e *Edge) metricsHandler() http.Handler {
	h := promhttp.HandlerFor(e.registry, promhttp.HandlerOpts{})
	if e.cfg.MetricsAccess != config.MetricsAdminToken {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !admin.Authorized(r, e.cfg.AdminToken) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tether-metrics"`)
			admin.Error(w, http.StatusUnauthorized, "unauthorized", "/metrics needs Authorization: Bearer <admin_token> (metrics_access: admin_token)")
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (e *Edge) handleHealth(w http.ResponseWriter, r *http.Request) {
	httpjson.Write(w, http.StatusOK, map[string]string{"status": "ok"})
}

// URL is the edge's base URL (https://host:port with TLS), "" before
// Start.
func (e *Edge) URL() string {
	if e.http.ln == nil {
		return ""
	}
	return e.tls.Scheme() + "://" + e.http.ln.Addr().String()
}

// TLSMode is the transport security the edge runs: mutual or plaintext.
func (e *Edge) TLSMode() string {
	if e.cfg.TLS.Mutual() {
		return TLSModeMutual
	}
	return TLSModePlaintext
}

// BackgroundPending is how many background events (overflows, links, rank
// observations, evidence), used keys and links of the touch batch, engines'
// answers not yet batched, and own placements' Binds this edge has not yet
// seen through the log: queued or being proposed. Tests wait for 0 before
// they take a quiet log's index.
func (e *Edge) BackgroundPending() int {
	return e.recorder.Pending() + e.recorder.PendingAnswers() + e.touches.Pending() + e.placements.InFlight()
}
