package edge

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
)

// metrics are the edge's tether_edge_* series (fleetview adds the
// telemetry and per-instance ones, cluster the tether_cluster_* ones).
type metrics struct {
	requests          *prometheus.CounterVec
	requestSeconds    *prometheus.HistogramVec
	decisions         *prometheus.CounterVec
	degraded          *prometheus.CounterVec
	telemetryLate     *prometheus.CounterVec
	commitSeconds     prometheus.Histogram
	proposals         *prometheus.CounterVec
	retries           *prometheus.CounterVec
	placementsOpen    prometheus.GaugeFunc
	placements        *prometheus.CounterVec
	speculativeServed *prometheus.CounterVec
	bindSettle        prometheus.Histogram
	placementMsgs     *prometheus.CounterVec
	dispatchMsgs      *prometheus.CounterVec
	strippedHeaders   *prometheus.CounterVec
	touches           prometheus.Counter
	leaderActions     *prometheus.CounterVec
	bindings          prometheus.GaugeFunc
	upstreamErrors    *prometheus.CounterVec
	recorderQueued    prometheus.GaugeFunc
	recorderDropped   *prometheus.CounterVec
	bodyRefused       prometheus.Counter
	bodyInflight      prometheus.GaugeFunc
	routeSeconds      *prometheus.HistogramVec
	routed            routedMetrics
	streamsAborted    *prometheus.CounterVec
	storedResponses   *prometheus.CounterVec
	kvUndecodable     *prometheus.CounterVec
	conversations     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, e *Edge) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_requests_total",
			Help: "HTTP requests by endpoint and status code.",
		}, []string{"endpoint", "status"}),
		requestSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_edge_request_seconds",
			Help:    "Time to the response's end, by endpoint.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}, []string{"endpoint"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_routing_decisions_total",
			Help: "Routing decisions by fleet, placement policy and outcome (sticky, new_bind, overflow, degraded, shed, unbound, refused). " +
				"new_bind: a new key dispatched beside its Bind proposal; degraded: placed or served on this edge's own decision while it " +
				"could not know the committed placement (the log could not commit, or its state was not known current; " +
				"tether_edge_degraded_decisions_total says which); policy pending: " +
				"served on this edge's own Bind proposal before the log answered it.",
		}, []string{"fleet", "policy", "outcome"}),
		degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_degraded_decisions_total",
			Help: "Degraded routing decisions by fleet and cause: log_down (no leader after a failed proposal), state_not_current (not caught up, no leader contact or lagging beyond " +
				"cluster.degraded_placement_window), commit_timeout (commit_first: the Bind's fate unknown by the propose timeout), " +
				"overflow_unrecorded (an overflow could not commit; the key stayed on an instance the views call unhealthy).",
		}, []string{"fleet", "cause"}),
		telemetryLate: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_telemetry_late_decisions_total",
			Help: "Routing decisions by fleet made while no candidate's telemetry was fresh: instances silent past their staleness bound " +
				"(with no failed probe) were counted healthy rather than refusing the request, while this edge heard other instances. " +
				"The decision followed the log as usual; a silence every instance shares is the edge's own and keeps their health.",
		}, []string{"fleet"}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tether_edge_affinity_commit_seconds",
			Help:    "Time to commit a proposal through the affinity log, as the request path sees it.",
			Buckets: []float64{.0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25},
		}),
		proposals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_proposals_total",
			Help: "Affinity-log proposals made by the edge, by event type and result (applied, duplicate, rejected, condition_failed, unavailable, error).",
		}, []string{"type", "result"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_retries_total",
			Help: "Worker hops retried on another instance, by fleet.",
		}, []string{"fleet"}),
		strippedHeaders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_stripped_headers_total",
			Help: "Client-supplied internal or untrusted headers removed at the trust boundary, by header.",
		}, []string{"header"}),
		touches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_edge_touch_batches_total",
			Help: "Touch batches proposed (one per touch_interval with used keys).",
		}),
		leaderActions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_leader_actions_total",
			Help: "Events proposed by the leader's duties, by kind (ttl_evict, kv_evict, instance_state, cluster_features, settings).",
		}, []string{"kind"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_upstream_errors_total",
			Help: "Failed worker hops, by fleet and kind (connect, status_5xx, bad_response, stream_cut, transfer_lost).",
		}, []string{"fleet", "kind"}),
	}
	m.addAnswerMetrics()
	m.bodyRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tether_edge_body_budget_refused_total",
		Help: "Requests refused (429) because max_inflight_body_bytes of request bodies were already held.",
	})
	m.addPlacementMetrics()
	m.addGauges(e)
	m.routeSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "tether_edge_route_seconds",
		Help:    "Time the edge spends placing one hop of a request (the routing decision, the log commit of a new placement included): what routing adds to time to first token, by fleet.",
		Buckets: []float64{.0001, .00025, .0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25, .5, 1},
	}, []string{"fleet"})
	m.routed = newRoutedMetrics()
	m.precreateSeries()
	if reg == nil {
		return m, nil
	}
	if err := m.register(reg, e); err != nil {
		return nil, err
	}
	return m, nil
}

// addAnswerMetrics creates the counters of answers the edge could not
// finish or route by an id, and of background work given up.
func (m *metrics) addAnswerMetrics() {
	m.streamsAborted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_streams_aborted_total",
		Help: "Streams the edge could not finish (the worker's stream ended before its last event): the client got an error event in the API's streaming shape and an aborted connection, by endpoint and fleet.",
	}, []string{"endpoint", "fleet"})
	m.storedResponses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_stored_response_requests_total",
		Help: "Requests naming a stored response (previous_response_id, GET/DELETE/cancel/input_items by id), by outcome (routed: sent to the instance the id names; not_minted, forged, expired, unknown_instance, restarted: answered 404 by the edge; instance_unheard: 503 with Retry-After, the log knows the instance but this edge has not heard it yet).",
	}, []string{"outcome"})
	m.conversations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_conversation_requests_total",
		Help: "Requests naming a conversation (the conversation parameter of /v1/responses, /v1/conversations/{id}...), by outcome (as tether_edge_stored_response_requests_total's; created: a new conversation placed).",
	}, []string{"outcome"})
	m.recorderDropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_recorder_dropped_total",
		Help: "Background events (overflows, links, rank observations, evidence, placements' Binds) given up before the log recorded them, by event type and reason (queue_full: the oldest made room for a new one; attempts: retried too often; closed: the edge stopped).",
	}, []string{"type", "reason"})
	m.kvUndecodable = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_kv_events_undecodable_total",
		Help: "Engine KV cache events this edge read (vLLM/SGLang ZeroMQ publishers, trtllm-serve /kv_cache_events) that did not decode and were skipped, by instance and reason " +
			"(malformed_batch: the whole message; unknown_event: an event type the decoder does not know; malformed_event: a known type whose fields do not decode). " +
			"The rest of the batch applies and the instance's KV index is not reset for them.",
	}, []string{"instance", "reason"})
}

// register registers every metric with reg.
func (m *metrics) register(reg prometheus.Registerer, e *Edge) error {
	for _, c := range []prometheus.Collector{m.routeSeconds, m.routed.requests, m.routed.prefill, &opsCollector{e: e}, m.requests, m.requestSeconds, m.decisions, m.degraded, m.telemetryLate, m.commitSeconds, m.proposals, m.retries,
		m.placementsOpen, m.placements, m.speculativeServed, m.bindSettle, m.placementMsgs, m.dispatchMsgs, m.strippedHeaders, m.touches, m.leaderActions, m.bindings, m.upstreamErrors,
		m.recorderQueued, m.recorderDropped, m.bodyRefused, m.bodyInflight, m.streamsAborted, m.storedResponses, m.kvUndecodable, m.conversations} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("edge: register metrics: %w", err)
		}
	}
	return nil
}

// addPlacementMetrics adds the metrics of this edge's own Bind proposals
// and of the placements the edges tell each other.
func (m *metrics) addPlacementMetrics() {
	m.placements = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_placements_total",
		Help: "This edge's Bind proposals for new keys by the log's answer: won (it created the binding), agreed (another edge's Bind " +
			"won, naming the same instance), lost (another edge's Bind won, naming another instance), rejected (the instance was down), " +
			"dropped (forgotten unanswered: the edge stopped, or too many were in flight).",
	}, []string{"fleet", "result"})
	m.speculativeServed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_speculative_requests_total",
		Help: "Requests served on this edge's own Bind proposal before the log answered it, counted when it answers: on_binding " +
			"(the key's binding is where they went) or off_binding (another edge's Bind won elsewhere, or the instance was rejected).",
	}, []string{"fleet", "result"})
	m.placementMsgs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_placement_messages_total",
		Help: "New placements told to the other edges over NATS (sent), told by them (heard), or refused as malformed (invalid).",
	}, []string{"result"})
	m.dispatchMsgs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_dispatch_messages_total",
		Help: "Requests sent to workers told to the other edges over NATS (sent), told by them (heard), or refused as malformed (invalid).",
	}, []string{"result"})
	m.bindSettle = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "tether_edge_bind_settle_seconds",
		Help: "From a new key's placement to this edge learning its Bind's answer from the log (retries included). " +
			"The other edges agree tether_cluster_apply_lag_seconds after the leader appended it.",
		Buckets: []float64{.0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})
}

// addGauges adds the gauges that read e's state when scraped.
func (m *metrics) addGauges(e *Edge) {
	m.bodyInflight = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_edge_inflight_body_bytes",
		Help: "Request-body bytes held by requests in flight (bounded by max_inflight_body_bytes).",
	}, func() float64 { return float64(e.bodies.InUse()) })
	m.recorderQueued = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_edge_recorder_queued",
		Help: "Background events waiting for the affinity log (bounded; beyond the bound the oldest are dropped).",
	}, func() float64 { return float64(e.recorder.queued()) })
	m.placementsOpen = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_edge_placements_in_flight",
		Help: "This edge's Bind proposals the log has not answered yet (their keys are served where this edge proposed).",
	}, func() float64 { return float64(e.placements.inFlight()) })
	m.bindings = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_edge_bindings",
		Help: "Live bindings in the replicated state (all fleets).",
	}, func() float64 {
		if e.node == nil {
			return 0
		}
		return float64(e.node.State().Len())
	})
}

// precreateSeries creates the series the shipped alerts and dashboards
// divide or alert on, so they read 0 rather than absent on a healthy edge.
func (m *metrics) precreateSeries() {
	for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
		m.decisions.WithLabelValues(f.String(), routing.PolicyShed, outcomeShed)
		m.routeSeconds.WithLabelValues(f.String())
		m.retries.WithLabelValues(f.String())
	}
	for _, t := range []fsm.EventType{fsm.TypeOverflow, fsm.TypeLink, fsm.TypeRankObserved, fsm.TypeBind} {
		for _, reason := range []string{"queue_full", "attempts", "closed"} {
			m.recorderDropped.WithLabelValues(t.String(), reason)
		}
	}
}
