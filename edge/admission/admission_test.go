package admission

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/observe"
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

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', 4, 64) }

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// A slow scheduler sheds only while the edge uses its share of the CPUs
// it may use; where the kernel's account is missing, or the CPU test is
// off (a negative min_cpu_share), the latency alone decides.
func TestSlowSchedulerShedsOnlyForOwnCPU(t *testing.T) {
	cfg := config.DefaultAdmissionConfig()
	cfg.MaxSchedulingLatency = 100 * time.Millisecond
	m, err := observe.New(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newShedder(cfg, nil, m)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if rel, _ := s.admit(); rel == nil {
			t.Fatal("refused below the limit")
		}
	}
	busy := window{p99: time.Second, wakeups: 10 * shedMinSamples, hasCPU: true, capacity: 2,
		cpu: procstat.Load{Used: 0.9, Waiting: 9, HasWaiting: true}}
	for range 2 * shedCutEvery {
		s.update(busy)
	}
	if s.limit != float64(cfg.MaxInflight) {
		t.Fatalf("a busy host (CPU share %.2f) cut the limit to %v", busy.share(), s.limit)
	}
	if n := gauge(m.AdmissionSchedOver.WithLabelValues("busy_host")); n != 2*shedCutEvery {
		t.Errorf("busy_host windows %v, want %d", n, 2*shedCutEvery)
	}
	if g := gauge(m.AdmissionCPUShare); g != 0.45 {
		t.Errorf("tether_edge_admission_cpu_share %v, want 0.45", g)
	}
	if g := gauge(m.AdmissionRunDelay); g != 10 {
		t.Errorf("tether_edge_admission_run_delay_per_cpu_second %v, want 10", g)
	}
	// At the share: own load.
	atShare := busy
	atShare.cpu.Used = cfg.MinCPUShare * atShare.capacity
	s.update(atShare)
	if s.limit != 75 {
		t.Fatalf("limit %v at the CPU share bound, want 75", s.limit)
	}
	if _, why := s.admit(); !containsAll(why, "goroutines wait 1s", "uses 50% of its 2 CPUs", "admission.min_cpu_share 50%") {
		t.Errorf("refusal %q", why)
	}
	if n := gauge(m.AdmissionSchedOver.WithLabelValues("own_load")); n != 1 {
		t.Errorf("own_load windows %v, want 1", n)
	}
	// No account of the CPU, or the CPU test off: the latency decides.
	for _, c := range []struct {
		name  string
		share float64
		w     window
	}{
		{"no CPU account", cfg.MinCPUShare, window{p99: time.Second, wakeups: 10 * shedMinSamples}},
		{"min_cpu_share off", -1, busy},
	} {
		c2 := cfg
		c2.MinCPUShare = c.share
		s2, err := newShedder(c2, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		s2.inflight = 100
		s2.update(c.w)
		if s2.limit != 75 {
			t.Errorf("%s: limit %v after a slow window, want 75", c.name, s2.limit)
		}
	}
}

// The window's capacity is GOMAXPROCS, or the cgroup's quota where lower;
// its CPU use and wait span the last shedWindow ticks.
func TestSamplerWindow(t *testing.T) {
	var cpu, wait time.Duration
	s := newSampler()
	s.readCPU = func() (procstat.Sample, error) {
		return procstat.Sample{CPU: cpu, RunDelay: wait, HasRunDelay: true}, nil
	}
	s.maxProcs, s.quota = func() int { return 4 }, 1.5
	t0 := time.Unix(1000, 0)
	if _, ok := s.cpuLoad(t0); ok {
		t.Fatal("a load from one sample")
	}
	for i := 1; i <= 2*shedWindow; i++ {
		cpu += 50 * time.Millisecond  // half a CPU
		wait += 20 * time.Millisecond // a fifth of a thread waiting
		w := s.read(t0.Add(time.Duration(i) * shedTick))
		if !w.hasCPU || w.capacity != 1.5 {
			t.Fatalf("tick %d: %+v, want capacity 1.5 (the quota under GOMAXPROCS 4)", i, w)
		}
		if d := w.cpu.Used - 0.5; d > 1e-9 || d < -1e-9 {
			t.Fatalf("tick %d: used %v, want 0.5", i, w.cpu.Used)
		}
		if d := w.cpu.WaitPerCPU() - 0.4; d > 1e-9 || d < -1e-9 {
			t.Fatalf("tick %d: wait per CPU %v, want 0.4", i, w.cpu.WaitPerCPU())
		}
	}
	if len(s.cpu) != shedWindow+1 {
		t.Errorf("%d samples kept, want %d", len(s.cpu), shedWindow+1)
	}
	s.quota = 0
	if w := s.read(t0.Add(100 * shedTick)); w.capacity != 4 {
		t.Errorf("capacity %v without a quota, want GOMAXPROCS 4", w.capacity)
	}
	s.readCPU = func() (procstat.Sample, error) { return procstat.Sample{}, errors.New("no getrusage") }
	if w := s.read(t0.Add(101 * shedTick)); w.hasCPU || w.share() != 0 {
		t.Errorf("a failed read gave %+v", w)
	}
}
