package fleetview

import (
	"testing"
	"time"

	"github.com/tether-project/tether/internal/telemetry"
)

// Another edge's dispatch counts as queued on its instance until it ends or
// the next load report absorbs it; an unknown instance is left alone.
func TestHeardDispatchCountsUntilTheNextReport(t *testing.T) {
	f, _, nc, clk := clockedFleet(t)
	publishLoad(t, nc, report("w1", telemetry.FleetContext, 1, 1, 0))
	waitFor(t, "registration", 5*time.Second, func() bool { _, ok := f.Instance("w1", clk.now()); return ok })
	base := f.Views(clk.now(), nil)[0].QueuedRequests

	ended := f.NoteHeardDispatch("w1", 700)
	f.NoteHeardDispatch("w1", 300)
	f.NoteHeardDispatch("unknown", 100)()
	vs := f.Views(clk.now(), nil)
	if len(vs) != 1 || vs[0].QueuedRequests != base+2 || vs[0].QueuedPrefillTokens != 1000 {
		t.Fatalf("after two heard dispatches: %+v (report's queued %d)", vs, base)
	}
	ended()
	ended()
	if v := f.Views(clk.now(), nil)[0]; v.QueuedRequests != base+1 || v.QueuedPrefillTokens != 300 {
		t.Fatalf("after one heard dispatch ended: queued %d, prefill %d", v.QueuedRequests, v.QueuedPrefillTokens)
	}
	publishLoad(t, nc, report("w1", telemetry.FleetContext, 1, 2, 0))
	waitFor(t, "the next report absorbing the heard dispatches", 5*time.Second, func() bool {
		v := f.Views(clk.now(), nil)[0]
		return v.QueuedRequests == base && v.QueuedPrefillTokens == 0
	})
}
