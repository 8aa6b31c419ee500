// Package observe is what an edge tells its operators: every tether_edge_*
// series but the fleet view's (Metrics, created and registered in one place
// and counted by the package whose work each measures), the series read at
// scrape time (the ops collector: active conversations and sub-agents per
// instance, Raft term, commit and apply lag, servers by suffrage, the data
// directory's free space), and tracing (the tracer provider of
// tracing.exporter, the span attribute keys). It reads the edge through
// Source; it decides nothing.
package observe

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
)

// Metrics are the edge's tether_edge_* series (fleetview adds the
// telemetry and per-instance ones, cluster the tether_cluster_* ones), each
// counted by the package whose work it measures.
type Metrics struct {
	Requests          *prometheus.CounterVec
	RequestSeconds    *prometheus.HistogramVec
	Decisions         *prometheus.CounterVec
	Degraded          *prometheus.CounterVec
	TelemetryLate     *prometheus.CounterVec
	CommitSeconds     prometheus.Histogram
	Proposals         *prometheus.CounterVec
	Retries           *prometheus.CounterVec
	PlacementsOpen    prometheus.GaugeFunc
	Placements        *prometheus.CounterVec
	SpeculativeServed *prometheus.CounterVec
	BindSettle        prometheus.Histogram
	PlacementMsgs     *prometheus.CounterVec
	DispatchMsgs      *prometheus.CounterVec
	StrippedHeaders   *prometheus.CounterVec
	Touches           prometheus.Counter
	LeaderActions     *prometheus.CounterVec
	Bindings          prometheus.GaugeFunc
	UpstreamErrors    *prometheus.CounterVec
	RecorderQueued    prometheus.GaugeFunc
	RecorderDropped   *prometheus.CounterVec
	BodyRefused       prometheus.Counter
	BodyInflight      prometheus.GaugeFunc
	RouteSeconds      *prometheus.HistogramVec
	Routed            RoutedMetrics
	StreamsAborted    *prometheus.CounterVec
	StoredResponses   *prometheus.CounterVec
	KVUndecodable     *prometheus.CounterVec
	Conversations     *prometheus.CounterVec
	// The catalogue's series: requests by model and adapter, LoRA
	// placements and runtime loads.
	ModelRequests  *prometheus.CounterVec
	LoRAPlacements *prometheus.CounterVec
	LoRALoads      *prometheus.CounterVec
	// Admission's own-load signals (edge/admission): the edge's CPU use
	// against the CPUs it may use, and its threads' run-queue wait per
	// CPU-second it used.
	AdmissionCPUShare  prometheus.Gauge
	AdmissionRunDelay  prometheus.Gauge
	AdmissionSchedOver *prometheus.CounterVec
	// Flow control's series (edge/flow).
	Flow FlowMetrics
}

// Source is what the series read of the edge when scraped.
type Source interface {
	// Node is the edge's cluster node (nil before the edge opens it).
	Node() *cluster.Node
	// DataDir is the edge's data directory (cluster.data_dir).
	DataDir() string
	// InflightBodyBytes is the request-body bytes requests hold now.
	InflightBodyBytes() int64
	// RecorderQueued is the background events waiting for the log.
	RecorderQueued() int
	// PlacementsInFlight is this edge's Bind proposals the log has not
	// answered yet.
	PlacementsInFlight() int
}

// New creates the series and registers them with reg (none when reg is
// nil); the gauges and the ops collector read src when scraped.
func New(reg prometheus.Registerer, src Source) (*Metrics, error) {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_requests_total",
			Help: "HTTP requests by endpoint and status code.",
		}, []string{"endpoint", "status"}),
		RequestSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_edge_request_seconds",
			Help:    "Time to the response's end, by endpoint.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}, []string{"endpoint"}),
		CommitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tether_edge_affinity_commit_seconds",
			Help:    "Time to commit a proposal through the affinity log, as the request path sees it.",
			Buckets: []float64{.0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25},
		}),
		Proposals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_proposals_total",
			Help: "Affinity-log proposals made by the edge, by event type and result (applied, duplicate, rejected, condition_failed, unavailable, error).",
		}, []string{"type", "result"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_retries_total",
			Help: "Worker hops retried on another instance, by fleet.",
		}, []string{"fleet"}),
		StrippedHeaders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_stripped_headers_total",
			Help: "Client-supplied internal or untrusted headers removed at the trust boundary, by header.",
		}, []string{"header"}),
		Touches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_edge_touch_batches_total",
			Help: "Touch batches proposed (one per touch_interval with used keys).",
		}),
		LeaderActions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_leader_actions_total",
			Help: "Events proposed by the leader's duties, by kind (ttl_evict, kv_evict, instance_state, cluster_features, settings).",
		}, []string{"kind"}),
		UpstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_upstream_errors_total",
			Help: "Failed worker hops, by fleet and kind (connect, status_5xx, bad_response, stream_cut, transfer_lost).",
		}, []string{"fleet", "kind"}),
	}
	m.addDecisionMetrics()
	m.addAnswerMetrics()
	m.BodyRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tether_edge_body_budget_refused_total",
		Help: "Requests refused (429) because max_inflight_body_bytes of request bodies were already held.",
	})
	m.addPlacementMetrics()
	m.addGauges(src)
	m.RouteSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "tether_edge_route_seconds",
		Help:    "Time the edge spends placing one hop of a request (the routing decision, the log commit of a new placement included): what routing adds to time to first token, by fleet.",
		Buckets: []float64{.0001, .00025, .0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25, .5, 1},
	}, []string{"fleet"})
	m.Routed = newRoutedMetrics()
	m.addCatalogueMetrics()
	m.addAdmissionMetrics()
	m.Flow = newFlowMetrics()
	m.precreateSeries()
	if reg == nil {
		return m, nil
	}
	if err := m.register(reg, src); err != nil {
		return nil, err
	}
	if err := m.registerCatalogue(reg); err != nil {
		return nil, err
	}
	for _, c := range []prometheus.Collector{m.AdmissionCPUShare, m.AdmissionRunDelay, m.AdmissionSchedOver} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("edge: metrics: %w", err)
		}
	}
	if err := m.registerFlow(reg); err != nil {
		return nil, err
	}
	return m, nil
}

// addAdmissionMetrics creates the series of the admission layer's
// own-load test (edge/admission; its limit and in-flight gauges are its
// own).
func (m *Metrics) addAdmissionMetrics() {
	m.AdmissionCPUShare = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tether_edge_admission_cpu_share",
		Help: "CPU time the edge used over the last half second, as a share of the CPUs it may use (GOMAXPROCS, or its cgroup's CPU quota if lower); admission.min_cpu_share is the bound.",
	})
	m.AdmissionRunDelay = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tether_edge_admission_run_delay_per_cpu_second",
		Help: "Seconds the edge's threads waited on the kernel's run queues per CPU-second they ran, over the last half second (high: other processes hold the CPUs; Linux only).",
	})
	m.AdmissionSchedOver = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_admission_slow_scheduling_windows_total",
		Help: "Admission windows whose scheduling latency p99 exceeded admission.max_scheduling_latency, by verdict: own_load (the limit was cut) or busy_host (the edge's own CPU use under admission.min_cpu_share: not shed).",
	}, []string{"verdict"})
	for _, v := range []string{"own_load", "busy_host"} {
		m.AdmissionSchedOver.WithLabelValues(v)
	}
}

// addCatalogueMetrics creates the per-model and LoRA series.
func (m *Metrics) addCatalogueMetrics() {
	m.ModelRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_model_requests_total",
		Help: "Inference requests by model, LoRA adapter (\"\" for the base model) and status code.",
	}, []string{"model", "adapter", "status"})
	m.LoRAPlacements = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_lora_placements_total",
		Help: "LoRA requests placed, by model, adapter, fleet and whether the chosen instance was believed to hold the adapter (loaded=true) or had to load it.",
	}, []string{"model", "adapter", "fleet", "loaded"})
	m.LoRALoads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_lora_runtime_loads_total",
		Help: "POST /v1/load_lora_adapter calls the edge made (lora.runtime_load), by model, adapter and result (loaded, already_loaded, failed).",
	}, []string{"model", "adapter", "result"})
}

// registerCatalogue registers the catalogue's series.
func (m *Metrics) registerCatalogue(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.ModelRequests, m.LoRAPlacements, m.LoRALoads} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("edge: metrics: %w", err)
		}
	}
	return nil
}

// addDecisionMetrics creates the counters of routing decisions: by
// outcome, degraded by cause, and made while telemetry was late.
func (m *Metrics) addDecisionMetrics() {
	m.Decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_routing_decisions_total",
		Help: "Routing decisions by fleet, placement policy and outcome (sticky, new_bind, overflow, degraded, shed, unbound, refused). " +
			"new_bind: a new key dispatched beside its Bind proposal; degraded: placed or served on this edge's own decision while it " +
			"could not know the committed placement (the log could not commit, or its state was not known current; " +
			"tether_edge_degraded_decisions_total says which); policy pending: " +
			"served on this edge's own Bind proposal before the log answered it.",
	}, []string{"fleet", "policy", "outcome"})
	m.Degraded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_degraded_decisions_total",
		Help: "Degraded routing decisions by fleet and cause: log_down (no leader after a failed proposal), state_not_current (not caught up, no leader contact or lagging beyond " +
			"cluster.degraded_placement_window), commit_timeout (commit_first: the Bind's fate unknown by the propose timeout), " +
			"overflow_unrecorded (an overflow could not commit; the key stayed on an instance the views call unhealthy).",
	}, []string{"fleet", "cause"})
	m.TelemetryLate = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_telemetry_late_decisions_total",
		Help: "Routing decisions by fleet made while no candidate's telemetry was fresh: instances silent past their staleness bound " +
			"(with no failed probe) were counted healthy rather than refusing the request, while this edge heard other instances. " +
			"The decision followed the log as usual; a silence every instance shares is the edge's own and keeps their health.",
	}, []string{"fleet"})
}

// addAnswerMetrics creates the counters of answers the edge could not
// finish or route by an id, and of background work given up.
func (m *Metrics) addAnswerMetrics() {
	m.StreamsAborted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_streams_aborted_total",
		Help: "Streams the edge could not finish (the worker's stream ended before its last event): the client got an error event in the API's streaming shape and an aborted connection, by endpoint and fleet.",
	}, []string{"endpoint", "fleet"})
	m.StoredResponses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_stored_response_requests_total",
		Help: "Requests naming a stored response (previous_response_id, GET/DELETE/cancel/input_items by id), by outcome (routed: sent to the instance the id names; not_minted, forged, expired, unknown_instance, restarted: answered 404 by the edge; instance_unheard: 503 with Retry-After, the log knows the instance but this edge has not heard it yet).",
	}, []string{"outcome"})
	m.Conversations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_conversation_requests_total",
		Help: "Requests naming a conversation (the conversation parameter of /v1/responses, /v1/conversations/{id}...), by outcome (as tether_edge_stored_response_requests_total's; created: a new conversation placed).",
	}, []string{"outcome"})
	m.RecorderDropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_recorder_dropped_total",
		Help: "Background events (overflows, links, rank observations, evidence, placements' Binds) given up before the log recorded them, by event type and reason (queue_full: the oldest made room for a new one; attempts: retried too often; closed: the edge stopped).",
	}, []string{"type", "reason"})
	m.KVUndecodable = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_kv_events_undecodable_total",
		Help: "Engine KV cache events this edge read (vLLM/SGLang ZeroMQ publishers, trtllm-serve /kv_cache_events) that did not decode and were skipped, by instance and reason " +
			"(malformed_batch: the whole message; unknown_event: an event type the decoder does not know; malformed_event: a known type whose fields do not decode). " +
			"The rest of the batch applies and the instance's KV index is not reset for them.",
	}, []string{"instance", "reason"})
}

// register registers every metric with reg.
func (m *Metrics) register(reg prometheus.Registerer, src Source) error {
	for _, c := range []prometheus.Collector{m.RouteSeconds, m.Routed.Requests, m.Routed.Prefill, &opsCollector{src: src}, m.Requests, m.RequestSeconds, m.Decisions, m.Degraded, m.TelemetryLate, m.CommitSeconds, m.Proposals, m.Retries,
		m.PlacementsOpen, m.Placements, m.SpeculativeServed, m.BindSettle, m.PlacementMsgs, m.DispatchMsgs, m.StrippedHeaders, m.Touches, m.LeaderActions, m.Bindings, m.UpstreamErrors,
		m.RecorderQueued, m.RecorderDropped, m.BodyRefused, m.BodyInflight, m.StreamsAborted, m.StoredResponses, m.KVUndecodable, m.Conversations} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("edge: register metrics: %w", err)
		}
	}
	return nil
}

// addPlacementMetrics adds the metrics of this edge's own Bind proposals
// and of the placements the edges tell each other.
func (m *Metrics) addPlacementMetrics() {
	m.Placements = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_placements_total",
		Help: "This edge's Bind proposals for new keys by the log's answer: won (it created the binding), agreed (another edge's Bind " +
			"won, naming the same instance), lost (another edge's Bind won, naming another instance), rejected (the instance was down), " +
			"dropped (forgotten unanswered: the edge stopped, or too many were in flight).",
	}, []string{"fleet", "result"})
	m.SpeculativeServed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_speculative_requests_total",
		Help: "Requests served on this edge's own Bind proposal before the log answered it, counted when it answers: on_binding " +
			"(the key's binding is where they went) or off_binding (another edge's Bind won elsewhere, or the instance was rejected).",
	}, []string{"fleet", "result"})
	m.PlacementMsgs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_placement_messages_total",
		Help: "New placements told to the other edges over NATS (sent; dropped when the edge's publish queue was full or NATS not connected), told by them (heard), or refused as malformed (invalid).",
	}, []string{"result"})
	m.DispatchMsgs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_dispatch_messages_total",
		Help: "Requests sent to workers told to the other edges over NATS (sent; dropped when the edge's publish queue was full or NATS not connected), told by them (heard), or refused as malformed (invalid).",
	}, []string{"result"})
	m.BindSettle = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "tether_edge_bind_settle_seconds",
		Help: "From a new key's placement to this edge learning its Bind's answer from the log (retries included). " +
			"The other edges agree tether_cluster_apply_lag_seconds after the leader appended it.",
		Buckets: []float64{.0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})
}

// addGauges adds the gauges that read src when scraped.
func (m *Metrics) addGauges(src Source) {
	m.BodyInflight = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_edge_inflight_body_bytes",
		Help: "Request-body bytes held by requests in flight (bounded by max_inflight_body_bytes).",
	}, func() float64 { return float64(src.InflightBodyBytes()) })
	m.RecorderQueued = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_edge_recorder_queued",
		Help: "Background events waiting for the affinity log (bounded; beyond the bound the oldest are dropped).",
	}, func() float64 { return float64(src.RecorderQueued()) })
	m.PlacementsOpen = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_edge_placements_in_flight",
		Help: "This edge's Bind proposals the log has not answered yet (their keys are served where this edge proposed).",
	}, func() float64 { return float64(src.PlacementsInFlight()) })
	m.Bindings = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_edge_bindings",
		Help: "Live bindings in the replicated state (all fleets).",
	}, func() float64 {
		n := src.Node()
		if n == nil {
			return 0
		}
		return float64(n.State().Len())
	})
}

// precreateSeries creates the series the shipped alerts and dashboards
// divide or alert on, so they read 0 rather than absent on a healthy edge.
func (m *Metrics) precreateSeries() {
	for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
		m.Decisions.WithLabelValues(f.String(), routing.PolicyShed, routing.OutcomeShed)
		m.RouteSeconds.WithLabelValues(f.String())
		m.Retries.WithLabelValues(f.String())
	}
	for _, t := range []fsm.EventType{fsm.TypeOverflow, fsm.TypeLink, fsm.TypeRankObserved, fsm.TypeBind} {
		for _, reason := range []string{"queue_full", "attempts", "closed"} {
			m.RecorderDropped.WithLabelValues(t.String(), reason)
		}
	}
}
