package edge

import (
	"net/http"
	"time"

	"github.com/tether-project/tether/edge/fleetview"
)

// catalogueEdge is the edge as its catalogue reads it (catalog.Edge).
type catalogueEdge struct{ e *Edge }

func (c catalogueEdge) Fleet() *fleetview.View { return c.e.fleet }
func (c catalogueEdge) Client() *http.Client   { return c.e.client }
func (c catalogueEdge) Now() time.Time         { return c.e.now() }
