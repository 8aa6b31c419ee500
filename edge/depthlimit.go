package edge

import (
	"fmt"

	"github.com/tether-project/tether/internal/httpjson"
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
	return fmt.Sprintf("depth=%d; limit=%d; parent=%q", id.RequestedDepth, limit, httpjson.Clip(id.Parent, 200))
}
