package edge

import (
	"net/http"
	"strconv"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/edge/fleetview"
)

// adminAPI is the admin API (edge/admin) over this edge, counted in
// tether_edge_requests_total{endpoint="admin"}.
func (e *Edge) adminAPI() http.Handler {
	return admin.New(adminEdge{e}, admin.Options{
		Token:   e.cfg.AdminToken,
		NodeID:  e.nodeID,
		DataDir: e.cfg.Cluster.DataDir,
		Models:  e.catalogue.Names(),
		Answered: func(status int) {
			e.metrics.Requests.WithLabelValues("admin", strconv.Itoa(status)).Inc()
		},
	})
}

// adminEdge is the edge as the admin API sees it (admin.Edge). A separate
// type keeps Now and DegradedPending out of Edge's own API.
type adminEdge struct{ e *Edge }

var _ admin.Edge = adminEdge{}

func (a adminEdge) Node() *cluster.Node    { return a.e.node }
func (a adminEdge) Fleet() *fleetview.View { return a.e.fleet }
func (a adminEdge) Now() time.Time         { return a.e.now() }
func (a adminEdge) DegradedPending() int   { return a.e.placements.InFlight() }
