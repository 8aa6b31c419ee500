package edge

import (
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/readiness"
	"github.com/tether-project/tether/fsm"
)

// readinessEdge is the edge as its readiness reads it (readiness.Edge).
type readinessEdge struct{ e *Edge }

func (r readinessEdge) Node() *cluster.Node                  { return r.e.node }
func (r readinessEdge) Fleet() *fleetview.View               { return r.e.fleet }
func (r readinessEdge) Now() time.Time                       { return r.e.now() }
func (r readinessEdge) ModelsUnready(now time.Time) []string { return r.e.router.ModelsUnready(now) }

// readinessConfig is what the configuration says of the edge's readiness:
// the startup grace, the fleets served and the instances wanted per fleet
// at startup (num_instances, summed over the models).
func (e *Edge) readinessConfig() readiness.Config {
	rc := readiness.Config{StartupGrace: e.cfg.Telemetry.StartupGrace, ServedFleets: e.cfg.ServedFleets()}
	for _, m := range e.catalogue.Models() {
		for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
			rc.NumInstances[f] += m.Cfg.Servers(f).NumInstances
		}
	}
	return rc
}

// admissionEdge is the edge as its admission layer reads it
// (admission.Edge).
type admissionEdge struct{ e *Edge }

func (a admissionEdge) Stalled(now time.Time) string { return a.e.ready.Stalled(now) }
func (a admissionEdge) RetryHint() time.Duration     { return a.e.router.RetryHint() }
func (a admissionEdge) Now() time.Time               { return a.e.now() }

// routeEdge is the edge as its router reads it (route.Edge).
type routeEdge struct{ e *Edge }

func (r routeEdge) Node() *cluster.Node              { return r.e.node }
func (r routeEdge) Fleet() *fleetview.View           { return r.e.fleet }
func (r routeEdge) InStartupGate(now time.Time) bool { return r.e.ready.InStartupGate(now) }
