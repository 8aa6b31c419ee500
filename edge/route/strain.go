package route

import (
	"time"

	"github.com/tether-project/tether/routing"
)

// The overload history (routing/overload: since when each instance has
// been unable to take its bound keys; overflow.rebind_after reads it) is
// fed by the views this edge builds, which it builds when it routes: with N
// edges each sees about an Nth of the fleet's moments, starts a strain's
// clock late and misses the moments it ended. So each edge tells the
// others every transition of its history (on the dispatch subject,
// internal/telemetry DispatchStrain) and applies theirs as its own
// observations: every edge counts a strain from when the first edge saw it
// until one sees it end, as one edge routing every request would. The
// trace replay measured it (BENCHMARKS.md, "Sharing edge state").

// observeStrain records this edge's verdict on v at now and tells the
// other edges when it is a transition.
func (e *Router) observeStrain(v *routing.InstanceView, overloaded bool, now time.Time) {
	if e.overload.Observe(v.ID, overloaded, now) {
		e.edge.TellStrain(v.Fleet, v.ID, overloaded)
	}
}

// OverloadedSince is since when this edge has counted instance unable to
// take its bound keys (ok false: it does not).
func (e *Router) OverloadedSince(instance string) (time.Time, bool) {
	return e.overload.OverloadedSince(instance)
}

// HearStrain applies another edge's transition of instance's overload
// history as this edge's own observation (it is not told again).
func (e *Router) HearStrain(instance string, overloaded bool) {
	e.overload.Observe(instance, overloaded, e.now())
}
