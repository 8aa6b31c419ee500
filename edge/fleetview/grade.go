package fleetview

import (
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing/breaker"
	"github.com/tether-project/tether/routing/kvindex"
)

// Placements that grade themselves. For every request placed by the KV
// index, the edge compares what the index said the chosen instance held
// of the prompt (routing.Hop.Predicted) with what the engine's answer says
// it held (usage cached_tokens). The answers feed the instance's cache
// circuit breaker (routing/breaker's index rule: the index's claims not
// confirmed → open, reason index_disagrees, and placement stops crediting
// the instance's cache until they are confirmed again), its accuracy
// figures (Instance.Accuracy, the tether_edge_index_* series, the admin
// API) and, through the edge, the log (fsm.CacheAnswers). Every edge hears
// the others' answers (edge/dispatch, on the dispatch subject) and feeds
// them in as its own: the breakers of all edges see the same answers, so
// an instance is degraded on every edge at once, whichever edges served
// it.

// KVSourceOf is where this edge's KV index learns instance in's cache:
// kv and known are the index's record of it (kvindex.Index.Instance).
func KVSourceOf(in Instance, kv kvindex.InstanceKV, known bool) fsm.KVSource {
	switch {
	case in.EngineEvents:
		return fsm.KVSourceEngineEvents
	case known && kv.Approximate:
		return fsm.KVSourceShadow
	case in.Telemetry && in.KVSource == telemetry.KVSourceEngineEvents:
		return fsm.KVSourceEngineEvents
	case in.Telemetry && in.KVSource == "":
		return fsm.KVSourceTetherWorker
	}
	return fsm.KVSourcePredictionsOnly
}

// Source is where the index learns instance id's cache now.
func (f *View) Source(id string, now time.Time) fsm.KVSource {
	in, ok := f.Instance(id, now)
	if !ok {
		return fsm.KVSourcePredictionsOnly
	}
	kv, known := f.index.Instance(id)
	return KVSourceOf(in, kv, known)
}

// Answer is one engine's answer about its prefix cache, graded against the
// index's claim.
type Answer struct {
	Fleet    fsm.Fleet
	Instance string
	Source   fsm.KVSource
	// BlockSize is the fleet's block size in tokens; PromptTokens,
	// PredictedTokens and CachedTokens the answer's prompt, what the index
	// claimed and what the engine said it held.
	BlockSize                                   int64
	PromptTokens, PredictedTokens, CachedTokens int64
}

// Gradable reports whether a carries evidence: a prompt of at least one
// whole block (a shorter one can neither be claimed nor hit) and sane
// figures. PromptTokens is the engine's count; the claim is in the edge's
// tokens (a tokenizer that disagrees with the engine's shows as error).
func (a Answer) Gradable() bool {
	return a.BlockSize > 0 && a.PromptTokens >= a.BlockSize && a.PredictedTokens >= 0 && a.CachedTokens >= 0 &&
		a.Instance != "" && a.Fleet.Valid()
}

// RecordAnswer grades a: it feeds the instance's breaker and accuracy
// figures. own says this edge served it (its counters count only those;
// the others' answers arrive over NATS). It reports whether a was graded
// (not: nothing to grade, or an instance this view does not know).
func (f *View) RecordAnswer(a Answer, own bool, now time.Time) bool {
	if !a.Gradable() || !f.knows(a.Instance) {
		return false
	}
	cached := min(a.CachedTokens, a.PromptTokens)
	before, _ := f.breakers.Status(a.Instance, now)
	st, err := f.breakers.Grade(a.Instance, a.PredictedTokens, cached, a.BlockSize, now)
	if err != nil {
		return false
	}
	if own {
		f.metrics.countAnswer(a, cached)
	}
	if st != before {
		_, reason := f.breakers.Status(a.Instance, now)
		acc := f.breakers.Accuracy(a.Instance, now)
		f.log.Info("cache circuit breaker changed", "instance", a.Instance, "from", before, "to", st, "reason", reason,
			"source", a.Source, "claims", acc.Claims, "confirmed", acc.Confirmed)
		f.bump()
	}
	return true
}

// knows reports whether id is an instance of this view (an answer another
// edge tells of an instance this one never heard of makes no breaker).
func (f *View) knows(id string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	_, ok := f.byID[id]
	return ok
}

// BreakerWindow is the window of the breakers' figures.
func (f *View) BreakerWindow() time.Duration { return f.cfg.Breaker.Window }

// Accuracy is an instance's graded answers in the breaker's window and
// why its breaker is not closed.
func (f *View) Accuracy(id string, now time.Time) (breaker.Accuracy, breaker.Reason) {
	_, reason := f.breakers.Status(id, now)
	return f.breakers.Accuracy(id, now), reason
}
