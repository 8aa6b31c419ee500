package dispatch

import (
	"testing"

	"github.com/tether-project/tether/internal/telemetry"
)

// Another edge's dispatch is counted once (repeats ignored) and released
// when its end is heard; the dispatches remembered stay bounded when ends
// are never heard.
func TestHeardDispatchesReleasedAndBounded(t *testing.T) {
	var s dispatchShare
	s.heard = map[heardDispatch]func(){}
	counted, released := 0, 0
	note := func(string, int) func() { counted++; return func() { released++ } }
	d := telemetry.Dispatch{Edge: "edge-2", ID: 1, Fleet: telemetry.FleetContext, Instance: "ctx-0", PromptTokens: 10}
	s.hear(d, note)
	s.hear(d, note)
	d.Done = true
	s.hear(d, note)
	s.hear(d, note)
	if counted != 1 || released != 1 || len(s.heard) != 0 {
		t.Fatalf("counted %d, released %d, remembered %d; want 1, 1, 0", counted, released, len(s.heard))
	}
	for i := range 3 * maxHeardDispatches {
		s.hear(telemetry.Dispatch{Edge: "edge-3", ID: uint64(i), Fleet: telemetry.FleetContext, Instance: "ctx-1"}, note)
		if i%2 == 0 {
			s.hear(telemetry.Dispatch{Edge: "edge-3", ID: uint64(i), Done: true}, note)
		}
	}
	if len(s.heard) > maxHeardDispatches || len(s.order) > 2*maxHeardDispatches {
		t.Fatalf("%d dispatches remembered, %d in order; bound %d", len(s.heard), len(s.order), maxHeardDispatches)
	}
}
