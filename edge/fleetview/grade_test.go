package fleetview

import (
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/breaker"
	"github.com/tether-project/tether/test/metricstest"
)

// Refuted claims degrade the instance (its routing view stops crediting
// its cache), with the reason in the snapshot and the metrics; confirmed
// claims bring it back. Only this edge's own answers are counted in its
// counters; heard ones feed the breaker alike.
func TestAnswersGradeTheIndex(t *testing.T) {
	var clk clock
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	f, reg := newFleet(t, Config{Static: []Static{{ID: "w1", URL: "http://127.0.0.1:1", Fleet: fsm.FleetContext}}, BlockSize: 16, Now: clk.now})
	answer := func(predicted, cached int64, own bool) {
		t.Helper()
		a := Answer{Fleet: fsm.FleetContext, Instance: "w1", Source: fsm.KVSourceShadow, BlockSize: 16, PromptTokens: 1000,
			PredictedTokens: predicted, CachedTokens: cached}
		if !f.RecordAnswer(a, own, clk.now()) {
			t.Fatalf("answer %+v not graded", a)
		}
		clk.advance(100 * time.Millisecond)
	}
	for range 5 {
		answer(960, 960, true)
	}
	// The engine lost its cache: refuted claims, half of them heard from
	// other edges.
	for i := range 12 {
		answer(960, 0, i%2 == 0)
	}
	in, _ := f.Instance("w1", clk.now())
	if in.Breaker != breaker.Open || in.BreakerReason != breaker.ReasonIndexDisagrees {
		t.Fatalf("after refuted claims: breaker %v reason %v", in.Breaker, in.BreakerReason)
	}
	if !viewOf(t, f, "w1", clk.now()).CacheDegraded {
		t.Fatal("the routing view still credits the instance's cache")
	}
	if in.Accuracy.Graded != 17 || in.Accuracy.WithinOneBlock != 5 || in.Accuracy.Claims != 17 || in.Accuracy.Confirmed != 5 {
		t.Fatalf("accuracy %+v", in.Accuracy)
	}
	lbl := map[string]string{"instance": "w1", "source": "shadow"}
	if got := metric(t, reg, "tether_edge_index_answers_total", lbl); got != 11 {
		t.Fatalf("own answers counted: %v, want 11 (5 + 6 of 12)", got)
	}
	if got := metricstest.Sum(t, reg, "tether_edge_index_claims_total", map[string]string{"instance": "w1", "result": "refuted"}); got != 6 {
		t.Fatalf("own refuted claims: %v", got)
	}
	if got := metric(t, reg, "tether_edge_index_error_blocks_total", lbl); got != 6*60 {
		t.Fatalf("error blocks: %v, want 360", got)
	}
	if got := metric(t, reg, "tether_edge_instance_cache_degraded", map[string]string{"instance": "w1", "reason": "index_disagrees"}); got != 1 {
		t.Fatalf("degraded gauge: %v", got)
	}
	if got := metric(t, reg, "tether_edge_index_window_answers", map[string]string{"instance": "w1", "source": "predictions_only"}); got != 17 {
		t.Fatalf("window answers gauge (the instance has no index record: predictions only): %v", got)
	}
	// The index agrees again.
	for range 17 {
		answer(320, 320, true)
	}
	if in, _ = f.Instance("w1", clk.now()); in.Breaker != breaker.Closed || in.BreakerReason != breaker.ReasonNone {
		t.Fatalf("after confirmed claims: breaker %v reason %v", in.Breaker, in.BreakerReason)
	}
	if viewOf(t, f, "w1", clk.now()).CacheDegraded {
		t.Fatal("the routing view still does not credit the instance's cache")
	}
	// Prompts shorter than a block and nonsense are not graded.
	for _, a := range []Answer{
		{Fleet: fsm.FleetContext, Instance: "w1", BlockSize: 16, PromptTokens: 15},
		{Fleet: fsm.FleetContext, Instance: "w1", BlockSize: 0, PromptTokens: 100},
		{Fleet: fsm.FleetContext, Instance: "w1", BlockSize: 16, PromptTokens: 100, CachedTokens: -1},
		{Fleet: 0, Instance: "w1", BlockSize: 16, PromptTokens: 100},
		{Fleet: fsm.FleetContext, Instance: "unknown", BlockSize: 16, PromptTokens: 100},
	} {
		if f.RecordAnswer(a, true, clk.now()) {
			t.Errorf("graded %+v", a)
		}
	}
}
