package admission

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/observe"
)

const (
	// shedTick is how often the shedder reads the process and moves its
	// limit.
	shedTick = 100 * time.Millisecond
	// shedWindow ticks make the window the percentile and the CPU use are
	// taken over.
	shedWindow = 5
	// shedMinSamples: a window with fewer goroutine wake-ups says nothing
	// (an idle edge on a busy host).
	shedMinSamples = 200
	// shedDecrease and shedIncrease move the limit: down to this share of
	// what is in flight while saturated, up by this share per tick after.
	shedDecrease = 0.75
	shedIncrease = 0.10
	// shedCutEvery: ticks between two cuts of the limit.
	shedCutEvery = 3
)

// shedder is the adaptive limit on routed requests in flight: it falls
// (multiplicatively) while the edge is saturated by its own work (the Go
// scheduler's latency beyond its bound while the edge uses its share of
// the CPUs it may use) and recovers (additively, by a share) once it is
// not.
type shedder struct {
	cfg config.AdmissionConfig

	mu       sync.Mutex
	inflight int
	limit    float64
	sinceCut int    // ticks since the limit was last cut
	why      string // the last saturation's cause

	sampler *sampler // the ticker goroutine only

	mInflight prometheus.Gauge
	mLimit    prometheus.Gauge
	mP99      prometheus.Gauge
	mShed     *prometheus.CounterVec
	m         *observe.Metrics // nil: the own-load series are not kept
}

func newShedder(cfg config.AdmissionConfig, reg prometheus.Registerer, m *observe.Metrics) (*shedder, error) {
	s := &shedder{cfg: cfg, limit: float64(cfg.MaxInflight), sinceCut: shedCutEvery, sampler: newSampler(), m: m}
	s.mInflight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_edge_admission_inflight",
		Help: "Routed requests in progress on this edge (admitted, not finished)."})
	s.mLimit = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_edge_admission_limit",
		Help: "Routed requests this edge admits at once: admission.max_inflight, lowered while the process is saturated by its own work."})
	s.mP99 = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_edge_scheduling_latency_p99_seconds",
		Help: "99th percentile of the time the edge's goroutines waited to run, over the last half second (admission.max_scheduling_latency bounds it)."})
	s.mShed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_admission_shed_total",
		Help: "Routed requests shed with 429 edge_overloaded, by reason: saturated (the adaptive limit), max_inflight."}, []string{"reason"})
	if reg != nil {
		for _, c := range []prometheus.Collector{s.mInflight, s.mLimit, s.mP99, s.mShed} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("edge: register admission metrics: %w", err)
			}
		}
	}
	s.mLimit.Set(s.limit)
	return s, nil
}

// admit takes a slot for one routed request: release frees it; nil and
// the reason when the request is shed.
func (s *shedder) admit() (release func(), why string) {
	s.mu.Lock()
	switch {
	case s.inflight >= s.cfg.MaxInflight:
		s.mu.Unlock()
		s.mShed.WithLabelValues("max_inflight").Inc()
		return nil, fmt.Sprintf("%d requests in progress, admission.max_inflight", s.cfg.MaxInflight)
	case float64(s.inflight) >= s.limit:
		lim, why := int(s.limit), s.why
		s.mu.Unlock()
		s.mShed.WithLabelValues("saturated").Inc()
		return nil, fmt.Sprintf("%s: admitting %d requests at once", why, lim)
	}
	s.inflight++
	n := s.inflight
	s.mu.Unlock()
	s.mInflight.Set(float64(n))
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.inflight--
			n := s.inflight
			s.mu.Unlock()
			s.mInflight.Set(float64(n))
		})
	}, ""
}

// currentLimit is the adaptive limit now.
func (s *shedder) currentLimit() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit
}

// retryAfter is a shed request's Retry-After: admission.retry_after,
// spread over ±50 % so the shed clients do not all come back at once.
func (s *shedder) retryAfter() time.Duration {
	base := s.cfg.RetryAfter
	if base <= 0 {
		return defaultRetryAfter
	}
	return base/2 + time.Duration(rand.Int64N(int64(base)))
}

// run moves the limit every shedTick until done closes.
func (s *shedder) run(done <-chan struct{}) {
	t := time.NewTicker(shedTick)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			s.update(s.sampler.read(now))
		}
	}
}

// saturation is why the window shows the edge saturated by its own work
// ("" when it does not), and whether the scheduler's latency was beyond
// its bound at all.
//
// A goroutine waits to run when the edge has more work than CPUs, or when
// the kernel gives the edge's threads no CPU because other processes hold
// them. Shedding relieves only the first: on a host that neighbours starve
// the wait stays whatever the edge admits. So a slow scheduler sheds only
// while the edge itself uses at least admission.min_cpu_share of the CPUs
// it may use (GOMAXPROCS, or its cgroup's quota); where the kernel's
// account cannot be read, the latency alone decides.
//
// Slow commits are not a cause: with placement off the request path a
// slow commit delays only the other edges' agreement, and on a host that
// other processes starve the commits are slow whatever this edge admits;
// shedding then fails requests and frees nothing.
func (s *shedder) saturation(w window) (why string, slow bool) {
	bound := s.cfg.MaxSchedulingLatency
	if bound <= 0 || w.wakeups < shedMinSamples || w.p99 <= bound {
		return "", false
	}
	why = fmt.Sprintf("goroutines wait %s to run (p99, bound admission.max_scheduling_latency %s)", w.p99.Round(time.Millisecond), bound)
	if s.cfg.MinCPUShare < 0 || !w.hasCPU {
		return why, true
	}
	share := w.share()
	if share < s.cfg.MinCPUShare {
		return "", true
	}
	return fmt.Sprintf("%s while it uses %.0f%% of its %.3g CPUs (bound admission.min_cpu_share %.0f%%)",
		why, 100*share, w.capacity, 100*s.cfg.MinCPUShare), true
}

// update moves the limit given the last window.
func (s *shedder) update(w window) {
	why, slow := s.saturation(w)
	saturated := why != ""
	if s.m != nil {
		if w.hasCPU {
			s.m.AdmissionCPUShare.Set(w.share())
			s.m.AdmissionRunDelay.Set(w.cpu.WaitPerCPU())
		}
		switch {
		case saturated:
			s.m.AdmissionSchedOver.WithLabelValues("own_load").Inc()
		case slow:
			s.m.AdmissionSchedOver.WithLabelValues("busy_host").Inc()
		}
	}
	s.mu.Lock()
	if saturated {
		s.why = why
	}
	s.sinceCut++
	switch {
	case saturated && s.sinceCut >= shedCutEvery:
		// Cut at most every shedCutEvery ticks: the last cut shows in
		// the window only once the requests it kept out would have run.
		s.limit = max(float64(s.cfg.MinInflight), math.Min(s.limit, float64(s.inflight))*shedDecrease)
		s.sinceCut = 0
	case saturated:
	case s.limit < float64(s.cfg.MaxInflight):
		s.limit = math.Min(float64(s.cfg.MaxInflight), s.limit+math.Max(1, s.limit*shedIncrease))
	}
	lim := s.limit
	s.mu.Unlock()
	s.mLimit.Set(lim)
	s.mP99.Set(w.p99.Seconds())
}
