package admission

import (
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/internal/procstat"
)

// The adaptive limit falls while the process is saturated (scheduling
// latency beyond the bound) and recovers after; requests beyond it are
// refused, never below the floor.
func TestShedderLimitFollowsSaturation(t *testing.T) {
	cfg := config.DefaultAdmissionConfig()
	cfg.MaxSchedulingLatency = 100 * time.Millisecond
	s, err := newShedder(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var releases []func()
	for range 100 {
		rel, why := s.admit()
		if rel == nil {
			t.Fatalf("refused below the limit: %s", why)
		}
		releases = append(releases, rel)
	}
	// Saturated: cut to 3/4 of what is in flight, at most every
	// shedCutEvery ticks.
	s.update(own(200*time.Millisecond, 10*shedMinSamples))
	if got := s.limit; got != 75 {
		t.Fatalf("limit after a saturated tick %v, want 75", got)
	}
	if rel, why := s.admit(); rel != nil || !strings.Contains(why, "goroutines wait") {
		t.Fatalf("admitted beyond the limit (why %q)", why)
	}
	s.update(own(200*time.Millisecond, 10*shedMinSamples))
	if s.limit != 75 {
		t.Fatalf("cut again within %d ticks: %v", shedCutEvery, s.limit)
	}
	// Few wake-ups say nothing, nor does a wait within the bound.
	for range shedCutEvery {
		s.update(own(200*time.Millisecond, shedMinSamples-1))
	}
	if s.limit != 75+7.5+8.25+9.075 {
		t.Fatalf("limit %v after unsaturated ticks", s.limit)
	}
	s.update(own(cfg.MaxSchedulingLatency, 10*shedMinSamples))
	if s.limit <= 75+7.5+8.25+9.075 {
		t.Fatalf("a wait at the bound cut the limit: %v", s.limit)
	}
	// The floor.
	for range 100 {
		s.update(own(time.Second, 10*shedMinSamples))
	}
	if s.limit != float64(cfg.MinInflight) {
		t.Fatalf("limit %v, want the floor %d", s.limit, cfg.MinInflight)
	}
	for _, r := range releases {
		r()
		r() // idempotent
	}
	if s.inflight != 0 {
		t.Fatalf("in flight %d after every release", s.inflight)
	}
	// Recovery to max_inflight.
	for range 200 {
		s.update(own(time.Millisecond, 10*shedMinSamples))
	}
	if s.limit != float64(cfg.MaxInflight) {
		t.Fatalf("limit %v after recovery, want %d", s.limit, cfg.MaxInflight)
	}
	if d := s.retryAfter(); d < cfg.RetryAfter/2 || d >= cfg.RetryAfter*3/2 {
		t.Errorf("Retry-After %s outside ±50 %% of %s", d, cfg.RetryAfter)
	}
}

// own is a window of the edge's own load: the scheduler's latency p99 over
// n wake-ups while the edge uses every CPU it may.
func own(p99 time.Duration, n uint64) window {
	return window{p99: p99, wakeups: n, hasCPU: true, capacity: 2, cpu: procstat.Load{Used: 2}}
}
