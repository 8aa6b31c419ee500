package admin

import (
	"net/http"
	"time"

	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/breaker"
	"github.com/tether-project/tether/routing/kvindex"
)

// InstanceWorkingSet is an instance's working set as this edge knows it
// (routing/workset: its own routes and those the other edges told it).
type InstanceWorkingSet struct {
	Conversations int   `json:"conversations"`
	Blocks        int64 `json:"blocks"`
}

// InstanceInfo is one element of GET /admin/v1/instances.
type InstanceInfo struct {
	ID    string `json:"id"`
	Fleet string `json:"fleet"`
	// Model is the model the instance serves (configured, else reported).
	Model     string `json:"model,omitempty"`
	URL       string `json:"url"`
	LogStatus string `json:"log_status"` // "" when the log has no record
	Healthy   bool   `json:"healthy"`
	// Draining: the instance takes no new conversations (its worker
	// reported it is shutting down, the log records it draining, or an
	// operator drained it).
	Draining bool `json:"draining"`
	// Drained: an operator drained it (POST .../drain, `tether operator
	// instance drain`): its bound conversations move on their next turns.
	// DrainedSince is the log time of that drain.
	Drained            bool       `json:"drained"`
	DrainedSince       *time.Time `json:"drained_since,omitempty"`
	Static             bool       `json:"static"`
	Telemetry          bool       `json:"telemetry"`
	TelemetryAgeSecond *float64   `json:"telemetry_age_seconds"`
	Version            string     `json:"version"`
	FeatureLevel       int        `json:"feature_level"`
	VerifiesHints      bool       `json:"verifies_hints"`
	Ranks              int        `json:"ranks"`
	QueuedRequests     int        `json:"queued_requests"`
	ActiveRequests     int        `json:"active_requests"`
	ActivePromptTokens int64      `json:"active_prompt_tokens"`
	// PrefillTokens: the prefill the instance reported still to compute
	// (queued prompts' uncached part and running prefills' rest; absent
	// when its worker does not report it).
	PrefillTokens *int64  `json:"prefill_tokens,omitempty"`
	HitRate       float64 `json:"hit_rate"`
	Breaker       string  `json:"breaker"`
	// Degraded: the instance's cache circuit breaker is open, so placement
	// does not credit its cache; BreakerReason says why it opened while it
	// is open or half-open (hit_rate: its hit rate fell; index_disagrees:
	// the KV index claimed blocks the engine did not have).
	Degraded      bool   `json:"degraded"`
	BreakerReason string `json:"breaker_reason,omitempty"`
	// IndexAccuracy grades the KV index's claims for the instance against
	// the engines' answers (every edge's) over the breaker's window.
	IndexAccuracy IndexAccuracy `json:"index_accuracy"`
	Bindings      int           `json:"bindings"`
	// WorkingSet is what placement's eviction charge weighs the instance's
	// cache holding: the conversations the edges sent it within the
	// working-set window and their prompts' KV blocks.
	WorkingSet InstanceWorkingSet `json:"working_set"`
	KVStale    bool               `json:"kv_stale"`
	// TelemetryStale: the edge's NATS link is (or just was) down; the
	// load figures are from before and health comes from probes.
	TelemetryStale bool `json:"telemetry_stale"`
	// Unreachable: a connect from this edge to the instance failed and
	// none has succeeded since (within its backoff, or while a probe of it
	// is in flight): healthy is false and no new request goes there from
	// this edge. UnreachableSince is the first failed connect of the run
	// (kept, with ConnectFailures and LastConnectError, until a connection
	// is made), UnreachableUntil when the backoff ends.
	Unreachable      bool       `json:"unreachable"`
	UnreachableSince *time.Time `json:"unreachable_since,omitempty"`
	UnreachableUntil *time.Time `json:"unreachable_until,omitempty"`
	ConnectFailures  int        `json:"connect_failures,omitempty"`
	LastConnectError string     `json:"last_connect_error,omitempty"`
	// OverloadedSince: since when this edge (with what the other edges
	// told it) has counted the instance unable to take its bound keys;
	// overflow.rebind_after counts from here.
	OverloadedSince *time.Time `json:"overloaded_since,omitempty"`
	// KV is what this edge's KV index holds for the instance.
	KV InstanceKV `json:"kv"`
	// LoRA is what this edge knows of the instance's LoRA adapters (the
	// engine's report and the adapters this edge sent there lately).
	LoRA *InstanceLoRA `json:"lora,omitempty"`
}

// InstanceLoRA is an instance's LoRA adapters as routing sees them.
type InstanceLoRA struct {
	MaxLoRAs int      `json:"max_loras"`
	Loaded   []string `json:"loaded"`
	Full     bool     `json:"full"`
}

// Sources of an instance's KV knowledge (InstanceKV.Source).
const (
	// KVSourceEngineEvents: the engine's own KV events, translated by a
	// tether worker proxy (engine.kv_events).
	KVSourceEngineEvents = "engine_events"
	// KVSourceTetherWorker: a tether worker's simulated engine.
	KVSourceTetherWorker = "tether_worker"
	// KVSourceShadow: the edge's shadow of a static engine's cache
	// (edge/kvshadow), approximate.
	KVSourceShadow = "shadow"
	// KVSourcePredictionsOnly: nothing but this edge's short-lived
	// predictions of the prompts it routed there.
	KVSourcePredictionsOnly = "predictions_only"
)

// InstanceKV is the KV index's knowledge of one instance.
type InstanceKV struct {
	Source string `json:"source"`
	// Approximate: the blocks are a model (the shadow), so the cache-lost
	// rule never reads their absence as eviction.
	Approximate bool `json:"approximate"`
	// Blocks: stored blocks the index holds, over all ranks
	// (predictions not counted).
	Blocks int64    `json:"blocks"`
	Ranks  []RankKV `json:"ranks"`
	// OffloadedBlocks: blocks the index holds in the ranks' offloaded
	// tiers (engine KV events of a medium other than the GPU), over all
	// ranks; omitted when none.
	OffloadedBlocks int64 `json:"offloaded_blocks,omitempty"`
	// LastSeq is the sequence number of the last event batch (or dump)
	// applied; 0 when none.
	LastSeq uint64 `json:"last_seq"`
}

// IndexAccuracy is an instance's graded answers: for each request placed
// by the KV index, what the index claimed the instance held of the prompt
// against the engine's cached tokens.
type IndexAccuracy struct {
	// Source is where the index learns the instance's cache (as KV.Source).
	Source string `json:"source"`
	// WindowSeconds is the breaker's window the figures cover.
	WindowSeconds float64 `json:"window_seconds"`
	Answers       int     `json:"answers"`
	// WithinOneBlock: share of the answers whose claim was within one
	// block of the engine's figure; MeanAbsErrorBlocks their mean error.
	WithinOneBlock     float64 `json:"within_one_block"`
	MeanAbsErrorBlocks float64 `json:"mean_abs_error_blocks"`
	// Claims: the breaker's last claims (answers the index claimed at
	// least one block for) in the window, ConfirmedClaims of them held by
	// the engine.
	Claims          int `json:"claims"`
	ConfirmedClaims int `json:"confirmed_claims"`
}

// RankKV is one rank's stored blocks in the KV index.
type RankKV struct {
	Rank   int   `json:"rank"`
	Blocks int64 `json:"blocks"`
}

// kvInfo describes what the index knows of an instance, and from where.
func kvInfo(kv kvindex.InstanceKV, known bool, in fleetview.Instance) InstanceKV {
	out := InstanceKV{Source: fleetview.KVSourceOf(in, kv, known).String(), Ranks: []RankKV{}}
	if !known {
		return out
	}
	out.Approximate, out.LastSeq = kv.Approximate, kv.Seq
	for r, n := range kv.RankBlocks {
		out.Ranks = append(out.Ranks, RankKV{Rank: r, Blocks: n})
		out.Blocks += n
	}
	for _, n := range kv.OffloadedRankBlocks {
		out.OffloadedBlocks += n
	}
	return out
}

// reachability fills what the edge's connects taught it of in.
func (info *InstanceInfo) reachability(in fleetview.Instance) {
	info.Unreachable, info.ConnectFailures, info.LastConnectError = in.Unreachable, in.ConnectFailures, in.LastConnectError
	if !in.UnreachableSince.IsZero() {
		since, until := in.UnreachableSince, in.UnreachableUntil
		info.UnreachableSince, info.UnreachableUntil = &since, &until
	}
}

// kvStale reports whether the edge lacks an instance's KV state: the index
// has no trusted baseline for it and the instance may hold blocks. A
// healthy instance whose report says its cache is empty (an idle worker
// that never stored a block, so never sent a KV event) lacks nothing.
func kvStale(indexStale bool, in fleetview.Instance) bool {
	return indexStale && !(in.Telemetry && !in.TelemetryStale && in.KVUsedBlocks == 0)
}

func (a *API) instances(w http.ResponseWriter, r *http.Request) int {
	now := a.edge.Now()
	st := a.edge.Node().State()
	out := []InstanceInfo{}
	seen := map[string]bool{}
	for _, in := range a.edge.Fleet().Instances(now) {
		seen[in.ID] = true
		info := InstanceInfo{
			ID: in.ID, Fleet: in.Fleet.String(), URL: in.URL, Healthy: in.Healthy, Draining: in.Draining, Static: in.Static,
			Telemetry: in.Telemetry, TelemetryStale: in.TelemetryStale, Version: in.Version, FeatureLevel: in.FeatureLevel, VerifiesHints: in.VerifiesHints,
			Ranks: in.Ranks, QueuedRequests: in.QueuedRequests + int(in.PendingRequests), ActiveRequests: in.ActiveRequests,
			ActivePromptTokens: in.ActivePromptTokens, HitRate: in.HitRate(), Breaker: in.Breaker.String(),
			Bindings: st.BindingCount(in.Fleet, in.ID), KVStale: kvStale(a.edge.Fleet().Index().Stale(in.ID), in),
		}
		if in.PrefillReported {
			info.PrefillTokens = &in.PrefillTokens
		}
		info.WorkingSet.Conversations, info.WorkingSet.Blocks = a.edge.WorkingSet(in.Fleet, in.ID, now)
		if info.Model = in.Served; info.Model == "" {
			info.Model = in.Model
		}
		if l := in.LoRA; l != nil {
			info.LoRA = &InstanceLoRA{MaxLoRAs: l.MaxLoRAs, Loaded: append([]string{}, l.Loaded...), Full: l.Full}
		}
		kv, known := a.edge.Fleet().Index().Instance(in.ID)
		info.KV = kvInfo(kv, known, in)
		info.Degraded, info.BreakerReason = in.Breaker == breaker.Open, in.BreakerReason.String()
		acc := in.Accuracy
		info.IndexAccuracy = IndexAccuracy{Source: info.KV.Source, WindowSeconds: a.edge.Fleet().BreakerWindow().Seconds(), Answers: acc.Graded,
			WithinOneBlock: acc.WithinShare(), MeanAbsErrorBlocks: acc.MeanAbsErrorBlocks, Claims: acc.Claims, ConfirmedClaims: acc.Confirmed}
		if !in.LastSeen.IsZero() {
			age := now.Sub(in.LastSeen).Seconds()
			info.TelemetryAgeSecond = &age
		}
		info.reachability(in)
		if since, ok := a.edge.OverloadedSince(in.ID); ok {
			info.OverloadedSince = &since
		}
		if rec, ok := st.Instance(in.ID); ok {
			info.LogStatus = rec.Status.String()
			info.Draining = info.Draining || rec.Status == fsm.InstanceDraining || rec.Drained
			info.Drained, info.DrainedSince = rec.Drained, drainedSince(rec)
		}
		out = append(out, info)
	}
	for _, rec := range st.Instances() {
		if !seen[rec.ID] {
			out = append(out, InstanceInfo{ID: rec.ID, Fleet: rec.Fleet.String(), URL: rec.URL, LogStatus: rec.Status.String(),
				Draining: rec.Status == fsm.InstanceDraining || rec.Drained, Drained: rec.Drained, DrainedSince: drainedSince(rec),
				Version: rec.Version, FeatureLevel: int(rec.FeatureLevel), Ranks: int(rec.Ranks), Breaker: "closed",
				Bindings: st.BindingCount(rec.Fleet, rec.ID), KV: kvInfo(kvindex.InstanceKV{}, false, fleetview.Instance{}),
				IndexAccuracy: IndexAccuracy{Source: fsm.KVSourcePredictionsOnly.String()}})
		}
	}
	writeJSON(w, http.StatusOK, struct {
		Instances []InstanceInfo `json:"instances"`
	}{out})
	return http.StatusOK
}
