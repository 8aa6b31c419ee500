package worker

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/internal/enginekv"
)

// engineEventsCollector reports, for a proxy reading its upstreams' KV
// cache events (engine.kv_events), what each rank's event source knows and
// what it could not translate into tether block keys.
type engineEventsCollector struct{ s *Server }

var (
	descEngineBlocks = prometheus.NewDesc("tether_worker_engine_kv_blocks",
		"Engine KV blocks mapped to tether block keys, from the upstream's KV events.", []string{"rank"}, nil)
	descEngineSeq = prometheus.NewDesc("tether_worker_engine_kv_event_seq",
		"Sequence number (vLLM/SGLang) or event id (TensorRT-LLM) of the last engine KV event batch applied.", []string{"rank"}, nil)
	descEngineResets = prometheus.NewDesc("tether_worker_engine_kv_resets_total",
		"Times the rank's engine blocks were dropped: engine restart, reconnect, or events lost beyond the replay buffer.", []string{"rank"}, nil)
	descEngineUnmapped = prometheus.NewDesc("tether_worker_engine_kv_unmapped_blocks_total",
		"Engine blocks not announced, by reason (orphan: unknown parent; size_mismatch: block size differs from engine.block_size; "+
			"foreign: LoRA or extra keys; offloaded: non-GPU tier; skipped: other KV cache group; malformed; overflow).", []string{"rank", "reason"}, nil)
)

var descEngineUndecodable = prometheus.NewDesc("tether_worker_engine_kv_events_undecodable_total",
	"Engine KV events that did not decode and were skipped (the rest of their batch applied, the rank not reset), by reason "+
		"(malformed_batch, unknown_event, malformed_event).", []string{"rank", "reason"}, nil)

func (c *engineEventsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEngineBlocks, descEngineSeq, descEngineResets, descEngineUnmapped, descEngineUndecodable} {
		ch <- d
	}
}

func (c *engineEventsCollector) Collect(ch chan<- prometheus.Metric) {
	src, ok := c.s.eng.(interface{ KVEventStatus() []enginekv.RankStatus })
	if !ok {
		return
	}
	for _, st := range src.KVEventStatus() {
		rank := strconv.Itoa(st.Rank)
		ch <- prometheus.MustNewConstMetric(descEngineBlocks, prometheus.GaugeValue, float64(st.Blocks), rank)
		if st.HaveSeq {
			ch <- prometheus.MustNewConstMetric(descEngineSeq, prometheus.GaugeValue, float64(st.LastSeq), rank)
		}
		ch <- prometheus.MustNewConstMetric(descEngineResets, prometheus.CounterValue, float64(st.Resets), rank)
		for _, reason := range []string{enginekv.SkipBatch, enginekv.SkipUnknownEvent, enginekv.SkipMalformedEvent} {
			ch <- prometheus.MustNewConstMetric(descEngineUndecodable, prometheus.CounterValue, float64(st.Undecodable[reason]), rank, reason)
		}
		for _, u := range []struct {
			reason string
			n      uint64
		}{
			{"orphan", st.Stats.Orphans}, {"size_mismatch", st.Stats.SizeMismatch}, {"foreign", st.Stats.Foreign},
			{"offloaded", st.Stats.Offloaded}, {"skipped", st.Stats.Skipped}, {"malformed", st.Stats.Malformed}, {"overflow", st.Stats.Overflow},
		} {
			ch <- prometheus.MustNewConstMetric(descEngineUnmapped, prometheus.CounterValue, float64(u.n), rank, u.reason)
		}
	}
}
