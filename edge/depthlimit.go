package edge

import (
	"fmt"
	"net/http"

	"github.com/tether-project/tether/routing"
)

// HeaderDepthLimited answers a sub-agent request whose parent was at the
// nesting limit (max_subagent_depth): instead of refusing it, the edge
// routed it as a child of the parent's deepest ancestor within the limit
// (same root, so the same context placement). README, "Sub-agent depth".
const HeaderDepthLimited = "x-tether-subagent-depth-limited"

// depthLimitedValue is `depth=5; limit=4; parent="<ancestor>"`: the depth
// the header asked for, the limit, and the parent the link records.
func depthLimitedValue(id routing.Identity, cfg routing.IdentityConfig) string {
	limit := cfg.MaxDepth
	if limit <= 0 {
		limit = routing.DefaultMaxDepth
	}
	return fmt.Sprintf("depth=%d; limit=%d; parent=%q", id.RequestedDepth, limit, truncate(id.Parent, 200))
}

// handleModel is GET /v1/models/{id}: the served model, or 404 as OpenAI
// answers an unknown one.
func (e *Edge) handleModel(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, http.MethodGet)
		return
	}
	id := r.PathValue("id")
	if id != e.cfg.Model {
		e.metrics.requests.WithLabelValues("models", "404").Inc()
		writeAPIError(w, newAPIError(http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
			"the model %q does not exist (this edge serves %q)", truncate(id, 200), e.cfg.Model))
		return
	}
	writeJSON(w, http.StatusOK, struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}{e.cfg.Model, "model", 0, "tether"})
	e.metrics.requests.WithLabelValues("models", "200").Inc()
}
