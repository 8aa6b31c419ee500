package fleetview

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tether-project/tether/routing/breaker"
)

// metrics are fleetview's tether_edge_* series. Without a Registerer they
// are created but not exported.
type metrics struct {
	received  *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	kvBatches *prometheus.CounterVec
	dumps     *prometheus.CounterVec
	probes    *prometheus.CounterVec
	scrapes   *prometheus.CounterVec
	linkUp    prometheus.Gauge
	// addressRefused counts failed address verifications (address.go).
	addressRefused prometheus.Counter
	// The answers this edge graded (grade.go).
	answers   *prometheus.CounterVec
	errBlocks *prometheus.CounterVec
	claims    *prometheus.CounterVec
}

// countAnswer counts one of this edge's graded answers.
func (m *metrics) countAnswer(a Answer, cached int64) {
	fleet, src := a.Fleet.String(), a.Source.String()
	diff := a.PredictedTokens - cached
	if diff < 0 {
		diff = -diff
	}
	result := "off"
	if diff <= a.BlockSize {
		result = "within_block"
	}
	m.answers.WithLabelValues(fleet, a.Instance, src, result).Inc()
	m.errBlocks.WithLabelValues(fleet, a.Instance, src).Add(float64(diff) / float64(a.BlockSize))
	if a.PredictedTokens >= a.BlockSize {
		result = "refuted"
		if cached >= a.PredictedTokens-a.BlockSize {
			result = "confirmed"
		}
		m.claims.WithLabelValues(fleet, a.Instance, src, result).Inc()
	}
}

func newMetrics(reg prometheus.Registerer, f *View) (*metrics, error) {
	m := &metrics{
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_telemetry_messages_total",
			Help: "Worker telemetry messages accepted, by kind (load, kv, evict).",
		}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_telemetry_dropped_total",
			Help: "Worker telemetry messages dropped, by kind and reason (version, malformed, range, subject_mismatch, bad_subject; load reports from an address the instance has not proven: address_unverified while it is checked, address_refused after it failed).",
		}, []string{"kind", "reason"}),
		kvBatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_kv_batches_total",
			Help: "KV event batches by index outcome (applied, duplicate, gap, needs_dump).",
		}, []string{"outcome"}),
		dumps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_kv_dumps_total",
			Help: "KV dumps requested from workers, by result (installed, failed, invalid).",
		}, []string{"result"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_probes_total",
			Help: "Readiness probes (static instances without telemetry; every instance during a telemetry outage), by result.",
		}, []string{"result"}),
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_engine_scrapes_total",
			Help: "Scrapes of vLLM and SGLang /metrics for load (docs/engines.md), by result.",
		}, []string{"result"}),
		linkUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_edge_telemetry_link_up",
			Help: "1 while the edge's NATS connection is up (0: telemetry outage, workers judged by probes).",
		}),
	}
	m.addressRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tether_edge_worker_address_refused_total",
		Help: "Worker addresses from load reports that failed verification: the server there did not prove the instance's identity (spiffe://tether/worker/<instance>) or could not be reached; reports giving the instance that address are refused.",
	})
	m.answers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_index_answers_total",
		Help: "Engine answers this edge graded against its KV index's claim for the instance, by where the index learns the instance's cache (source: engine_events, tether_worker, shadow, predictions_only) and result (within_block: the claim was within one block of the engine's cached tokens; off).",
	}, []string{"fleet", "instance", "source", "result"})
	m.errBlocks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_index_error_blocks_total",
		Help: "Sum of |index claim − engine's cached tokens| in blocks over the answers this edge graded (divided by tether_edge_index_answers_total: the mean absolute error).",
	}, []string{"fleet", "instance", "source"})
	m.claims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_index_claims_total",
		Help: "Graded answers for which the KV index claimed at least one cached block, by result (confirmed: the engine held the claim less at most one block; refuted). Refuted claims open the instance's cache circuit breaker (reason index_disagrees).",
	}, []string{"fleet", "instance", "source", "result"})
	m.linkUp.Set(1)
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.received, m.dropped, m.kvBatches, m.dumps, m.probes, m.scrapes, m.linkUp, m.addressRefused,
		m.answers, m.errBlocks, m.claims, &instanceCollector{f: f}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("fleetview: register metrics: %w", err)
		}
	}
	return m, nil
}

var (
	descAge = prometheus.NewDesc("tether_edge_telemetry_age_seconds",
		"Seconds since the instance's last load report (or successful probe); -1 before any.", []string{"fleet", "instance"}, nil)
	descHealthy = prometheus.NewDesc("tether_edge_instance_healthy",
		"1 when the edge considers the instance healthy (fresh telemetry or probe, and not unreachable from this edge).", []string{"fleet", "instance"}, nil)
	descUnreachable = prometheus.NewDesc("tether_edge_instance_unreachable",
		"1 while a connect from this edge to the instance failed and none has succeeded since (within its backoff, or while a probe of it is in flight): no new requests go there from this edge, whatever its telemetry says.", []string{"fleet", "instance"}, nil)
	descHitRate = prometheus.NewDesc("tether_edge_instance_cache_hit_rate",
		"The instance's rolling-window prefix-cache hit rate (0..1) from its last report.", []string{"fleet", "instance"}, nil)
	descQueue = prometheus.NewDesc("tether_edge_instance_queued_requests",
		"Queued requests on the instance as seen by the edge (last report plus dispatched since).", []string{"fleet", "instance"}, nil)
	descBreaker = prometheus.NewDesc("tether_edge_instance_breaker_open",
		"1 while the instance's cache circuit breaker is open.", []string{"fleet", "instance"}, nil)
	descDegraded = prometheus.NewDesc("tether_edge_instance_cache_degraded",
		"1 while the instance's cache circuit breaker is open or half-open, labelled with why it opened (hit_rate: the engine's hit rate fell; index_disagrees: the KV index claimed blocks the engine did not have).", []string{"fleet", "instance", "reason"}, nil)
	descWindowErr = prometheus.NewDesc("tether_edge_index_window_error_blocks",
		"Mean absolute error, in blocks, of the KV index's claims for the instance over the breaker's window (every edge's answers).", []string{"fleet", "instance", "source"}, nil)
	descWindowWithin = prometheus.NewDesc("tether_edge_index_window_within_block",
		"Share (0..1) of the instance's graded answers over the breaker's window whose claim was within one block of the engine's cached tokens.", []string{"fleet", "instance", "source"}, nil)
	descWindowGraded = prometheus.NewDesc("tether_edge_index_window_answers",
		"Graded answers of the instance over the breaker's window (every edge's).", []string{"fleet", "instance", "source"}, nil)
)

// instanceCollector reports per-instance figures computed at scrape time.
type instanceCollector struct{ f *View }

func (c *instanceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAge, descHealthy, descUnreachable, descHitRate, descQueue, descBreaker, descDegraded, descWindowErr, descWindowWithin, descWindowGraded} {
		ch <- d
	}
}

func (c *instanceCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.f.cfg.Now()
	for _, in := range c.f.Instances(now) {
		age := -1.0
		if !in.LastSeen.IsZero() {
			age = now.Sub(in.LastSeen).Seconds()
		}
		fleet := in.Fleet.String()
		b2f := func(b bool) float64 {
			if b {
				return 1
			}
			return 0
		}
		ch <- prometheus.MustNewConstMetric(descAge, prometheus.GaugeValue, age, fleet, in.ID)
		ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, b2f(in.Healthy), fleet, in.ID)
		ch <- prometheus.MustNewConstMetric(descUnreachable, prometheus.GaugeValue, b2f(in.Unreachable), fleet, in.ID)
		ch <- prometheus.MustNewConstMetric(descHitRate, prometheus.GaugeValue, in.HitRate(), fleet, in.ID)
		ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(in.QueuedRequests)+float64(in.PendingRequests), fleet, in.ID)
		ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, b2f(in.Breaker == breaker.Open), fleet, in.ID)
		if in.BreakerReason != breaker.ReasonNone {
			ch <- prometheus.MustNewConstMetric(descDegraded, prometheus.GaugeValue, 1, fleet, in.ID, in.BreakerReason.String())
		}
		if a := in.Accuracy; a.Graded > 0 {
			src := c.f.Source(in.ID, now).String()
			ch <- prometheus.MustNewConstMetric(descWindowErr, prometheus.GaugeValue, a.MeanAbsErrorBlocks, fleet, in.ID, src)
			ch <- prometheus.MustNewConstMetric(descWindowWithin, prometheus.GaugeValue, a.WithinShare(), fleet, in.ID, src)
			ch <- prometheus.MustNewConstMetric(descWindowGraded, prometheus.GaugeValue, float64(a.Graded), fleet, in.ID, src)
		}
	}
}
