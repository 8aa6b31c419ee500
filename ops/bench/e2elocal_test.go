package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/edge"
)

// TestScaleEngineDurationsKeepsTheSimMeaning: a deployment at time scale
// 0.05 must judge idleness, rebinds and TTLs as the sim does in engine time.
// cache_lost_min_idle and touch_interval were once left in wall time, so an
// e2e edge waited 20× the sim's idle time before the cache-lost check.
func TestScaleEngineDurationsKeepsTheSimMeaning(t *testing.T) {
	c := edge.DefaultConfig()
	policyEdgeConfig(PolicyTether, &c)
	want := c
	scaleEngineDurations(&c, 0.05)
	for _, f := range []struct {
		name      string
		got, orig time.Duration
	}{
		{"placement.predict_ttl", c.Placement.PredictTTL, want.Placement.PredictTTL},
		{"placement.overflow.rebind_after", c.Placement.Overflow.RebindAfter, want.Placement.Overflow.RebindAfter},
		{"placement.overflow.cache_lost_min_idle", c.Placement.Overflow.CacheLostMinIdle, want.Placement.Overflow.CacheLostMinIdle},
		{"placement.circuit_breaker.window", c.Placement.Breaker.Window, want.Placement.Breaker.Window},
		{"placement.circuit_breaker.cooldown", c.Placement.Breaker.Cooldown, want.Placement.Breaker.Cooldown},
		{"session_ttl", c.SessionTTL, want.SessionTTL},
		{"touch_interval", c.TouchInterval, want.TouchInterval},
	} {
		if f.orig <= 0 {
			t.Errorf("%s: the default is %v; the test needs a positive default", f.name, f.orig)
			continue
		}
		if exp := max(time.Duration(float64(f.orig)*0.05), time.Millisecond); f.got != exp {
			t.Errorf("%s = %v after scaling %v by 0.05, want %v", f.name, f.got, f.orig, exp)
		}
	}
	// The scaled touch interval must stay below the scaled idle threshold,
	// as the defaults are in engine time (1 s < 5 s).
	if c.TouchInterval >= c.Placement.Overflow.CacheLostMinIdle {
		t.Errorf("touch_interval %v >= cache_lost_min_idle %v after scaling", c.TouchInterval, c.Placement.Overflow.CacheLostMinIdle)
	}
}

// TestE2EMarkdownSaysTTFTIsScaledWallTime: the comparison table puts sim and
// e2e TTFT side by side; at time scale 0.05 the e2e column multiplies every
// wall-clock cost by 20, which the report must say.
func TestE2EMarkdownSaysTTFTIsScaledWallTime(t *testing.T) {
	c := &E2EComparison{Mode: "e2e", TimeScale: 0.05, Policies: []Summary{{Name: "tether"}}}
	md := c.Markdown()
	for _, want := range []string{"wall time ÷ 0.05", "count 20× in engine time", "not across modes"} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
	if md := (&E2EComparison{Mode: "e2e", Policies: []Summary{{Name: "tether"}}}).Markdown(); strings.Contains(md, "not across modes") {
		t.Errorf("without a known time scale the note must be absent:\n%s", md)
	}
}
