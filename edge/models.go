package edge

import (
	"fmt"
	"net/http"
	"time"

	"github.com/tether-project/tether/edge/fleetview"
)

// catalogueEdge is the edge as its catalogue reads it (catalog.Edge).
type catalogueEdge struct{ e *Edge }

func (c catalogueEdge) Fleet() *fleetview.View { return c.e.fleet }
func (c catalogueEdge) Client() *http.Client   { return c.e.client }
func (c catalogueEdge) Now() time.Time         { return c.e.now() }

// modelsUnready is /readyz's check of a catalogue of several models:
// each has a healthy instance in each fleet it serves.
func (e *Edge) modelsUnready(now time.Time) []string {
	if len(e.catalogue.Models()) == 1 {
		return nil
	}
	var reasons []string
	for _, m := range e.catalogue.Models() {
		vs := e.views(m, now, nil)
		for _, f := range m.Cfg.ServedFleets() {
			healthy := false
			for _, v := range vs.Fleet(f) {
				healthy = healthy || v.Healthy
			}
			if !healthy {
				reasons = append(reasons, fmt.Sprintf("no healthy %s instance of model %s", f, m.Name))
			}
		}
	}
	return reasons
}
