// Package admission is the layer in front of an edge's handlers that
// decides whether the edge takes a routed request at all, before its body
// is read: an isolated edge refuses it and every other request bound for a
// worker (503 edge_isolated), a stalled edge refuses it (503
// state_stalled), a saturated one sheds it (429 edge_overloaded: an
// adaptive limit on requests in flight that falls while the Go scheduler's
// latency p99 exceeds admission.max_scheduling_latency and recovers after);
// and every 503 or 429 leaves with a Retry-After. See edge/DESIGN.md "An
// isolated edge", "A stalled edge" and "Load shedding on the edge's own
// saturation".
package admission

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/observe"
)

// Layer is the admission layer in front of the edge's handlers: it
// decides, for each routed request (POST /v1/..., the inference API),
// whether this edge takes it at all, before any of its body is read:
//
//   - an isolated edge (edge/readiness: no leader known and no worker
//     heard) refuses it, and any other request bound for a worker (by-id
//     reads of stored responses and conversations): 503 edge_isolated with
//     Retry-After, where a routed request would wait on a worker the edge
//     cannot reach;
//   - a stalled edge (edge/readiness: its state stopped following the
//     leader's) refuses it: 503 state_stalled with Retry-After, so the
//     client, or the load balancer that /readyz already took the edge out
//     of, goes to another edge;
//   - a saturated edge sheds it: 429 edge_overloaded with Retry-After
//     (shedder, below), before the request's work can crowd out the edge's
//     own Raft traffic.
//
// And for every response, whoever writes it (a handler, a refusal, a
// worker's answer passed through): a 503 or 429 without Retry-After gets
// one (defaultRetryAfter), so a client always knows when to come back.
type Layer struct {
	edge    Edge
	cfg     config.AdmissionConfig
	metrics *observe.Metrics
	shed    *shedder // nil until Start
}

// Edge is what the admission layer asks of the edge, per request (from
// Start on).
type Edge interface {
	// Stalled is why the edge's state stopped following its leader's (""
	// when it has not: edge/readiness).
	Stalled(now time.Time) string
	// Isolated is why the edge is cut off: no leader known and no worker
	// heard ("" when it is not: edge/readiness).
	Isolated(now time.Time) string
	// RetryHint is the Retry-After of a refusal the log causes: about one
	// election.
	RetryHint() time.Duration
	// Now is the edge's clock.
	Now() time.Time
}

// New is the admission layer of edge under the admission section; it
// counts its refusals in tether_edge_requests_total.
func New(edge Edge, cfg config.AdmissionConfig, m *observe.Metrics) *Layer {
	return &Layer{edge: edge, cfg: cfg, metrics: m}
}

// Start creates the shedder (its series registered with reg) and returns
// its loop, which moves the limit until done closes; the edge runs it.
func (l *Layer) Start(reg prometheus.Registerer) (run func(done <-chan struct{}), err error) {
	s, err := newShedder(l.cfg, reg)
	if err != nil {
		return nil, err
	}
	l.shed = s
	return s.run, nil
}

// InFlight is the routed requests admitted and not finished.
func (l *Layer) InFlight() int {
	if l.shed == nil {
		return 0
	}
	l.shed.mu.Lock()
	defer l.shed.mu.Unlock()
	return l.shed.inflight
}

// Wrap puts the layer in front of next.
func (l *Layer) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api.RestoreTLS(r)
		w = &retryAfterWriter{ResponseWriter: w}
		if workerRequest(r) {
			if why := l.edge.Isolated(l.edge.Now()); why != "" {
				l.metrics.Requests.WithLabelValues(api.EndpointLabel(r), "503").Inc()
				ae := api.NewError(http.StatusServiceUnavailable, "server_error", "edge_isolated", "",
					"this edge is cut off from its cluster and its workers (%s): a request would wait on a worker it cannot reach; retry on another edge", why)
				ae.RetryAfter = l.edge.RetryHint()
				ae.Write(w, api.PathDialect(r))
				return
			}
		}
		if !routedRequest(r) {
			next.ServeHTTP(w, r)
			return
		}
		if why := l.edge.Stalled(l.edge.Now()); why != "" {
			l.metrics.Requests.WithLabelValues(api.EndpointLabel(r), "503").Inc()
			ae := api.NewError(http.StatusServiceUnavailable, "server_error", "state_stalled", "",
				"this edge cannot route requests correctly: its copy of the affinity log stopped following the cluster's (%s); retry on another edge", why)
			ae.RetryAfter = l.edge.RetryHint()
			ae.Write(w, api.PathDialect(r))
			return
		}
		if l.shed == nil {
			next.ServeHTTP(w, r)
			return
		}
		release, why := l.shed.admit()
		if release == nil {
			l.metrics.Requests.WithLabelValues(api.EndpointLabel(r), "429").Inc()
			ae := api.NewError(http.StatusTooManyRequests, "rate_limit_error", "edge_overloaded", "",
				"this edge is saturated (%s); retry after %s", why, l.cfg.RetryAfter)
			ae.RetryAfter = l.shed.retryAfter()
			ae.Write(w, api.PathDialect(r))
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

// routedRequest: r is one the edge routes to workers (every POST under
// /v1/ except the model list, which the edge answers itself).
func routedRequest(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") && !strings.HasPrefix(r.URL.Path, "/v1/models")
}

// workerRequest: r goes to a worker (every request under /v1/ but the
// model list): routed requests, and those naming a stored response or a
// conversation, which go to the instance holding it.
func workerRequest(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/v1/") && !strings.HasPrefix(r.URL.Path, "/v1/models")
}

// defaultRetryAfter is the Retry-After of a 503 or 429 that names none:
// about when a worker that just became unhealthy may be healthy again (a
// load report every 100 ms, a probe every second) or an election is over.
const defaultRetryAfter = time.Second

// retryAfterWriter adds Retry-After (and Retry-After-Ms, which the OpenAI
// SDKs read first) to a 503 or 429 written without them.
type retryAfterWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *retryAfterWriter) WriteHeader(status int) {
	if !w.wrote && status >= 200 {
		w.wrote = true
		if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
			h := w.Header()
			if h.Get("Retry-After") == "" {
				h.Set("Retry-After", strconv.Itoa(int(defaultRetryAfter/time.Second)))
				if h.Get("Retry-After-Ms") == "" {
					h.Set("Retry-After-Ms", strconv.FormatInt(defaultRetryAfter.Milliseconds(), 10))
				}
			}
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *retryAfterWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (Flush,
// deadlines).
func (w *retryAfterWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

const (
	// shedTick is how often the shedder reads the scheduler's latencies
	// and moves its limit.
	shedTick = 100 * time.Millisecond
	// shedWindow ticks make the window the percentile is taken over.
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
// (multiplicatively) while the Go scheduler's latency is beyond the bound
// and recovers (additively, by a share) once it is back.
type shedder struct {
	cfg config.AdmissionConfig

	mu       sync.Mutex
	inflight int
	limit    float64
	p99      time.Duration // the last window's scheduling latency percentile
	sinceCut int           // ticks since the limit was last cut
	why      string        // the last saturation's cause

	// runtime/metrics state (the ticker goroutine only)
	sample  []rtmetrics.Sample
	prev    []uint64
	window  [][]uint64
	buckets []float64

	mInflight prometheus.Gauge
	mLimit    prometheus.Gauge
	mP99      prometheus.Gauge
	mShed     *prometheus.CounterVec
}

func newShedder(cfg config.AdmissionConfig, reg prometheus.Registerer) (*shedder, error) {
	s := &shedder{cfg: cfg, limit: float64(cfg.MaxInflight), sinceCut: shedCutEvery,
		sample: []rtmetrics.Sample{{Name: "/sched/latencies:seconds"}}}
	s.mInflight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_edge_admission_inflight",
		Help: "Routed requests in progress on this edge (admitted, not finished)."})
	s.mLimit = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_edge_admission_limit",
		Help: "Routed requests this edge admits at once: admission.max_inflight, lowered while the process is saturated."})
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
		case <-t.C:
		}
		s.tick()
	}
}

func (s *shedder) tick() {
	p99, n := s.schedulingLatency()
	s.update(p99, n)
}

// update moves the limit given the window's scheduling latency p99 (over
// n wake-ups).
//
// Slow commits are not a cause: with placement off the request path a
// slow commit delays only the other edges' agreement, and on a host that
// other processes starve the commits are slow whatever this edge admits;
// shedding then fails requests and frees nothing.
func (s *shedder) update(p99 time.Duration, n uint64) {
	why := ""
	if s.cfg.MaxSchedulingLatency > 0 && n >= shedMinSamples && p99 > s.cfg.MaxSchedulingLatency {
		why = fmt.Sprintf("goroutines wait %s to run (p99, bound admission.max_scheduling_latency %s)", p99.Round(time.Millisecond), s.cfg.MaxSchedulingLatency)
	}
	saturated := why != ""
	s.mu.Lock()
	s.p99 = p99
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
	s.mP99.Set(p99.Seconds())
}

// schedulingLatency reads the runtime's scheduling latency histogram and
// returns the 99th percentile over the last shedWindow ticks, and how many
// wake-ups it saw.
func (s *shedder) schedulingLatency() (time.Duration, uint64) {
	rtmetrics.Read(s.sample)
	if s.sample[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return 0, 0
	}
	h := s.sample[0].Value.Float64Histogram()
	if s.prev == nil {
		s.prev = append([]uint64(nil), h.Counts...)
		s.buckets = append([]float64(nil), h.Buckets...)
		return 0, 0
	}
	delta := make([]uint64, len(h.Counts))
	for i, c := range h.Counts {
		if i < len(s.prev) && c >= s.prev[i] {
			delta[i] = c - s.prev[i]
		}
	}
	s.prev = append(s.prev[:0], h.Counts...)
	s.window = append(s.window, delta)
	if len(s.window) > shedWindow {
		s.window = s.window[1:]
	}
	sum := make([]uint64, len(delta))
	var total uint64
	for _, d := range s.window {
		for i, c := range d {
			sum[i] += c
			total += c
		}
	}
	if total == 0 {
		return 0, 0
	}
	want := uint64(math.Ceil(0.99 * float64(total)))
	var acc uint64
	for i, c := range sum {
		acc += c
		if acc >= want {
			// The bucket's upper bound (Buckets has one more edge than
			// Counts); the last is +Inf: report its lower bound.
			ub := s.buckets[i+1]
			if math.IsInf(ub, 1) {
				ub = s.buckets[i]
			}
			return time.Duration(ub * float64(time.Second)), total
		}
	}
	return 0, total
}
