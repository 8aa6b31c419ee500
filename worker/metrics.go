package worker

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tether-project/tether/internal/telemetry"
)

// metrics are the worker's Prometheus metrics, in a registry of its own so
// several workers can run in one process (tether dev, tests).
type metrics struct {
	registry     *prometheus.Registry
	requests     *prometheus.CounterVec   // endpoint, status
	duration     *prometheus.HistogramVec // endpoint, phase
	hints        *prometheus.CounterVec   // outcome
	hintFailures *prometheus.CounterVec   // reason
	promptTokens *prometheus.CounterVec   // rank
	cachedTokens *prometheus.CounterVec   // rank
	publishes    *prometheus.CounterVec   // kind, result

	responsesEvicted     prometheus.Counter
	conversationsEvicted prometheus.Counter
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_worker_requests_total",
			Help: "HTTP requests by endpoint and status (499: the client went away).",
		}, []string{"endpoint", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_worker_request_duration_seconds",
			Help:    "Time from request arrival to the end of the response, for requests that ran.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"endpoint", "phase"}),
		hints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_worker_hint_verifications_total",
			Help: "Requests carrying sub-agent affinity headers, by outcome (verified, ignored, or a failure reason).",
		}, []string{"outcome"}),
		hintFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_worker_hint_verification_failures_total",
			Help: "Requests rejected because their sub-agent affinity signature was missing, malformed or invalid.",
		}, []string{"reason"}),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_worker_prompt_tokens_total",
			Help: "Prompt tokens of completed requests (cache lookups), per ADP rank.",
		}, []string{"rank"}),
		cachedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_worker_cached_tokens_total",
			Help: "Prompt tokens served from the rank's prefix cache (cache hits), per ADP rank.",
		}, []string{"rank"}),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_worker_telemetry_messages_total",
			Help: "Telemetry messages by kind (load, kv, evict, kvdump) and result (ok, error).",
		}, []string{"kind", "result"}),
	}
	// Pre-create the labels dashboards alert on, so they read 0 not absent.
	for _, r := range []string{hintMissing, hintMalformed, hintInvalid} {
		m.hintFailures.WithLabelValues(r)
	}
	for r := 0; r < s.ranks; r++ {
		m.promptTokens.WithLabelValues(strconv.Itoa(r))
		m.cachedTokens.WithLabelValues(strconv.Itoa(r))
	}
	m.responsesEvicted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tether_worker_stored_responses_evicted_total",
		Help: "Stored Responses API responses evicted to keep responses_store_entries and responses_store_bytes.",
	})
	m.registry.MustRegister(m.responsesEvicted, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_worker_stored_responses",
		Help: "Responses API responses this worker process holds (a request naming one must reach this process).",
	}, func() float64 {
		if s.responses == nil {
			return 0
		}
		n, _ := s.responses.stats()
		return float64(n)
	}))
	m.conversationsEvicted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tether_worker_conversations_evicted_total",
		Help: "Conversations API conversations evicted to keep responses_store_entries and responses_store_bytes.",
	})
	m.registry.MustRegister(m.conversationsEvicted, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_worker_conversations",
		Help: "Conversations this worker process holds (a request naming one must reach this process).",
	}, func() float64 {
		if s.conversations == nil {
			return 0
		}
		n, _ := s.conversations.stats()
		return float64(n)
	}))
	m.registry.MustRegister(m.requests, m.duration, m.hints, m.hintFailures, m.promptTokens, m.cachedTokens, m.publishes,
		&rankCollector{s: s},
		&engineEventsCollector{s: s},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// rankCollector reports the per-rank figures at scrape time from the same
// snapshot the telemetry load report uses.
type rankCollector struct{ s *Server }

var (
	descQueued     = prometheus.NewDesc("tether_worker_rank_queued_requests", "Requests waiting on the rank.", []string{"rank"}, nil)
	descActive     = prometheus.NewDesc("tether_worker_rank_active_requests", "Requests running on the rank.", []string{"rank"}, nil)
	descTokens     = prometheus.NewDesc("tether_worker_rank_active_prompt_tokens", "Prompt tokens of placed, unfinished requests on the rank.", []string{"rank"}, nil)
	descKVUsed     = prometheus.NewDesc("tether_worker_rank_kv_blocks_used", "KV cache blocks in use on the rank.", []string{"rank"}, nil)
	descKVTotal    = prometheus.NewDesc("tether_worker_rank_kv_blocks_total", "KV cache blocks on the rank.", []string{"rank"}, nil)
	descLookup     = prometheus.NewDesc("tether_worker_rank_window_lookup_tokens", "Prompt tokens looked up in the rank's cache over the rolling window.", []string{"rank"}, nil)
	descHit        = prometheus.NewDesc("tether_worker_rank_window_hit_tokens", "Prompt tokens found in the rank's cache over the rolling window.", []string{"rank"}, nil)
	descOverflows  = prometheus.NewDesc("tether_worker_rank_overflows_total", "Requests placed on the rank because their home rank was saturated.", []string{"rank"}, nil)
	descEvictions  = prometheus.NewDesc("tether_worker_rank_kv_block_evictions_total", "KV blocks evicted from the rank's cache.", []string{"rank"}, nil)
	descConvEvicts = prometheus.NewDesc("tether_worker_rank_conversation_evictions_total", "Conversation affinity bindings to the rank evicted beyond max_sessions.", []string{"rank"}, nil)
)

func (c *rankCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueued, descActive, descTokens, descKVUsed, descKVTotal, descLookup, descHit, descOverflows, descEvictions, descConvEvicts} {
		ch <- d
	}
}

func (c *rankCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.s.rankLoads() {
		rank := strconv.Itoa(r.Rank)
		gauge := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), rank)
		}
		counter := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), rank)
		}
		gauge(descQueued, r.QueuedRequests)
		gauge(descActive, r.ActiveRequests)
		gauge(descTokens, r.ActivePromptTokens)
		gauge(descKVUsed, r.KVBlocksUsed)
		gauge(descKVTotal, r.KVBlocksTotal)
		gauge(descLookup, r.WindowLookupTokens)
		gauge(descHit, r.WindowHitTokens)
		counter(descOverflows, r.Overflows)
		counter(descEvictions, r.Evictions)
		counter(descConvEvicts, c.s.convEvictions[r.Rank].Load())
	}
}

// rankLoads merges the scheduler's accounting with the engine's figures:
// prompt-token load is the scheduler's (what placement decides by, counting
// requests placed but not yet running); request counts, KV use and cache
// figures are the engine's. Values are clamped into telemetry's bounds so a
// misbehaving engine cannot make every report undecodable.
func (s *Server) rankLoads() []telemetry.RankLoad {
	loads := s.sched.Loads()
	stats := s.eng.Stats()
	out := make([]telemetry.RankLoad, s.ranks)
	for r := range out {
		rl := telemetry.RankLoad{Rank: r, Overflows: s.overflows[r].Load()}
		if r < len(loads) {
			rl.ActivePromptTokens = int64(loads[r].PromptTokens)
			rl.ActiveRequests = int64(loads[r].Active)
			rl.QueuedRequests = int64(loads[r].Queued)
		}
		if r < len(stats) {
			st := stats[r]
			// The engine knows which started requests actually wait
			// (e.g. the simulator's FIFO prefill): prefer its split.
			// Requests placed but not yet handed to the engine stay queued.
			if st.ActiveRequests+st.QueuedRequests > 0 {
				rl.ActiveRequests = int64(st.ActiveRequests)
				rl.QueuedRequests += int64(st.QueuedRequests)
			}
			rl.PrefillTokens = int64(st.PrefillTokens)
			rl.KVBlocksUsed = int64(st.KVBlocksUsed)
			rl.KVBlocksTotal = int64(st.KVBlocksTotal)
			rl.WindowLookupTokens = st.WindowLookupTokens
			rl.WindowHitTokens = st.WindowHitTokens
			rl.Evictions = st.Evictions
			rl.LoRAAdapters, rl.LoRARunning = st.LoRAAdapters, st.LoRARunning
		}
		clampRank(&rl)
		out[r] = rl
	}
	return out
}

func clampRank(r *telemetry.RankLoad) {
	clamp := func(v *int64, hi int64) { *v = min(max(*v, 0), hi) }
	clamp(&r.ActivePromptTokens, telemetry.MaxTokens)
	clamp(&r.ActiveRequests, telemetry.MaxRequestsPerRank)
	clamp(&r.QueuedRequests, telemetry.MaxRequestsPerRank)
	clamp(&r.PrefillTokens, telemetry.MaxTokens)
	clamp(&r.KVBlocksTotal, telemetry.MaxBlocks)
	clamp(&r.KVBlocksUsed, r.KVBlocksTotal)
	clamp(&r.WindowLookupTokens, telemetry.MaxCounter)
	clamp(&r.WindowHitTokens, r.WindowLookupTokens)
	clamp(&r.Overflows, telemetry.MaxCounter)
	clamp(&r.Evictions, telemetry.MaxCounter)
}
