package admin

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// namespace is the routing-key namespace of model: "" for the first.
func (a *API) namespace(model string) (string, bool) {
	for i, m := range a.opts.Models {
		if m == model {
			if i == 0 {
				return "", true
			}
			return m, true
		}
	}
	return "", len(a.opts.Models) == 0
}

// modelOf splits a routing key into its model and the key within it
// ("", "" with one model).
func (a *API) modelOf(key string) (model, modelKey string) {
	if len(a.opts.Models) < 2 {
		return "", ""
	}
	ns, k := fsm.SplitModelKey(key)
	if ns == "" {
		ns = a.opts.Models[0]
	}
	return ns, k
}

// BindingInfo is GET /admin/v1/bindings/{fleet}/{key}.
type BindingInfo struct {
	Fleet string `json:"fleet"`
	Key   string `json:"key"`
	// Model is the model whose fleets the key belongs to ("" with one
	// model), ModelKey the key within it (Key without the namespace).
	Model          string         `json:"model,omitempty"`
	ModelKey       string         `json:"model_key,omitempty"`
	ConversationID string         `json:"conversation_id"`
	Instance       string         `json:"instance"`
	Epoch          uint64         `json:"epoch"`
	BoundAt        time.Time      `json:"bound_at"`
	LastUsed       time.Time      `json:"last_used"`
	Edge           string         `json:"edge"`
	Policy         string         `json:"policy"`
	RequestID      string         `json:"request_id"`
	Candidates     []CandidateRow `json:"candidates"`
	StateIndex     uint64         `json:"state_index"`
	// Rank is the attention-DP rank the worker reported for this
	// placement (RankObserved, feature level 2); absent until reported.
	Rank *uint32 `json:"rank,omitempty"`
}

// CandidateRow is one scored option of a placement.
type CandidateRow struct {
	Instance     string  `json:"instance"`
	Score        float64 `json:"score"`
	CachedTokens uint32  `json:"cached_tokens"`
	LoadTokens   uint32  `json:"load_tokens"`
}

// HistoryEntry is one element of GET /admin/v1/bindings/{fleet}/{key}/history.
type HistoryEntry struct {
	Index    uint64          `json:"index"`
	Time     time.Time       `json:"time"`
	Type     string          `json:"type"`
	Status   string          `json:"status"`
	Reason   string          `json:"reason,omitempty"`
	Event    map[string]any  `json:"event,omitempty"`
	Decision *DecisionRecord `json:"decision,omitempty"`
	// Evicted is set when this entry's apply removed the binding.
	Evicted *EvictedRecord `json:"evicted,omitempty"`
}

// DecisionRecord is a placement decision as the log keeps it.
type DecisionRecord struct {
	Edge       string         `json:"edge"`
	Policy     string         `json:"policy"`
	RequestID  string         `json:"request_id"`
	Candidates []CandidateRow `json:"candidates"`
}

// EvictedRecord is a binding removed by an entry's apply.
type EvictedRecord struct {
	Instance string `json:"instance"`
	Epoch    uint64 `json:"epoch"`
	Reason   string `json:"reason"`
}

func decisionRecord(d fsm.Decision) *DecisionRecord {
	out := &DecisionRecord{Edge: d.Edge, Policy: d.Policy, RequestID: d.RequestID, Candidates: candidateRows(d.Candidates)}
	return out
}

func candidateRows(cs []fsm.Candidate) []CandidateRow {
	out := make([]CandidateRow, len(cs))
	for i, c := range cs {
		out[i] = CandidateRow{Instance: c.Instance, Score: c.Score, CachedTokens: c.CachedTokens, LoadTokens: c.LoadTokens}
	}
	return out
}

func (a *API) binding(w http.ResponseWriter, r *http.Request, rest string) int {
	history := false
	if p, ok := strings.CutSuffix(rest, "/history"); ok {
		rest, history = p, true
	}
	fleetStr, keyEsc, ok := strings.Cut(rest, "/")
	if !ok || keyEsc == "" {
		return Error(w, http.StatusBadRequest, "invalid_path", "want /admin/v1/bindings/{fleet}/{key} (key URL-escaped)")
	}
	fleet, err := fsm.ParseFleet(fleetStr)
	if err != nil {
		return Error(w, http.StatusBadRequest, "invalid_fleet", "%v", err)
	}
	key, err := url.PathUnescape(keyEsc)
	if err != nil {
		return Error(w, http.StatusBadRequest, "invalid_key", "key %q is not URL-escaped correctly: %v", keyEsc, err)
	}
	if model := r.URL.Query().Get("model"); model != "" {
		ns, ok := a.namespace(model)
		if !ok {
			return Error(w, http.StatusNotFound, "model_not_found", "model %q is not one of this edge's models %q", truncate(model, 200), a.opts.Models)
		}
		key = fsm.ModelKey(ns, key)
	}
	if history {
		return a.history(w, r, fleet, key)
	}
	st := a.edge.Node().State()
	b, ok := st.Lookup(fleet, key)
	if !ok {
		return Error(w, http.StatusNotFound, "binding_not_found", "no %s binding for key %q (state index %d)", fleet, key, st.Index())
	}
	info := BindingInfo{
		Fleet: fleet.String(), Key: b.Key, ConversationID: b.ConversationID, Instance: b.Instance, Epoch: b.Epoch,
		BoundAt: time.Unix(0, b.BoundAt).UTC(), LastUsed: time.Unix(0, b.LastUsed).UTC(),
		Edge: b.Decision.Edge, Policy: b.Decision.Policy, RequestID: b.Decision.RequestID,
		Candidates: candidateRows(b.Decision.Candidates), StateIndex: st.Index(),
	}
	if b.HasRank {
		rank := b.Rank
		info.Rank = &rank
	}
	info.Model, info.ModelKey = a.modelOf(b.Key)
	writeJSON(w, http.StatusOK, info)
	return http.StatusOK
}

func (a *API) history(w http.ResponseWriter, r *http.Request, fleet fsm.Fleet, key string) int {
	// The archive is written just after apply: let it catch up with the
	// state this node serves, so history agrees with the binding endpoint.
	idx := a.edge.Node().State().Index()
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	behind := a.edge.Node().WaitArchived(ctx, idx) != nil
	cancel()
	recs, err := a.edge.Node().Archive().History(fleet, key)
	if err != nil {
		return Error(w, http.StatusInternalServerError, "archive_error", "reading the archive: %v", err)
	}
	out := []HistoryEntry{}
	for _, rec := range recs {
		out = append(out, historyEntries(rec, fleet, key)...)
	}
	writeJSON(w, http.StatusOK, struct {
		Fleet  string         `json:"fleet"`
		Key    string         `json:"key"`
		Events []HistoryEntry `json:"events"`
		// ArchiveBehind: the archive had not caught up with state index
		// StateIndex within 2 s; the newest events may be missing.
		ArchiveBehind bool   `json:"archive_behind,omitempty"`
		StateIndex    uint64 `json:"state_index"`
	}{fleet.String(), key, out, behind, idx})
	return http.StatusOK
}

// historyEntries extracts the events of one archive record that concern
// (fleet, key): events naming it, and proposals whose apply evicted it.
func historyEntries(rec archive.Record, fleet fsm.Fleet, key string) []HistoryEntry {
	props, err := rec.Proposals()
	if err != nil {
		return []HistoryEntry{{Index: rec.Index, Time: time.Unix(0, rec.Time).UTC(), Type: "undecodable", Reason: err.Error()}}
	}
	var out []HistoryEntry
	for i, p := range props {
		var outcome archive.Outcome
		if i < len(rec.Outcomes) {
			outcome = rec.Outcomes[i]
		}
		names := false
		if p.Event != nil {
			for _, k := range fsm.EventKeys(p.Event) {
				if k.Fleet == fleet && k.Key == key {
					names = true
				}
			}
		}
		var evicted *EvictedRecord
		for _, ev := range outcome.Evicted {
			if ev.Fleet == fleet && ev.Key == key {
				evicted = &EvictedRecord{Instance: ev.Instance, Epoch: ev.Epoch, Reason: ev.Reason.String()}
			}
		}
		if !names && evicted == nil {
			continue
		}
		h := HistoryEntry{Index: rec.Index, Time: time.Unix(0, rec.Time).UTC(), Type: p.Type.String(),
			Status: outcome.Status.String(), Reason: outcome.Reason, Evicted: evicted}
		switch ev := p.Event.(type) {
		case fsm.Bind:
			h.Event = map[string]any{"instance": ev.Instance, "conversation_id": ev.ConversationID}
			h.Decision = decisionRecord(ev.Decision)
		case fsm.Overflow:
			h.Event = map[string]any{"from": ev.From, "to": ev.To, "reason": ev.Reason.String(), "rebind": ev.Rebind}
			h.Decision = decisionRecord(ev.Decision)
		case fsm.Evict:
			h.Event = map[string]any{"reason": ev.Reason.String(), "epoch": ev.Epoch, "idle_before": ev.IdleBefore, "detail": ev.Detail}
		case fsm.InstanceState:
			h.Event = map[string]any{"instance": ev.Instance, "status": ev.Status.String()}
		case fsm.Touch:
			h.Event = map[string]any{"keys": len(ev.Keys)}
		case fsm.RankObserved:
			h.Event = map[string]any{"rank": ev.Rank, "epoch": ev.Epoch}
		case fsm.Evidence:
			cands := make([]map[string]any, len(ev.Candidates))
			for i, c := range ev.Candidates {
				cands[i] = map[string]any{"instance": c.Instance, "cached_blocks": c.CachedBlocks, "load_tokens": c.LoadTokens,
					"queued_requests": c.QueuedRequests, "state": c.Flags.Names()}
			}
			h.Event = map[string]any{"request_id": ev.RequestID, "rule": ev.Rule, "candidates": cands}
		}
		out = append(out, h)
	}
	return out
}
