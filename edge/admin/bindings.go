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
	Model          string              `json:"model,omitempty"`
	ModelKey       string              `json:"model_key,omitempty"`
	ConversationID string              `json:"conversation_id"`
	Instance       string              `json:"instance"`
	Epoch          uint64              `json:"epoch"`
	BoundAt        time.Time           `json:"bound_at"`
	LastUsed       time.Time           `json:"last_used"`
	Edge           string              `json:"edge"`
	Policy         string              `json:"policy"`
	RequestID      string              `json:"request_id"`
	Candidates     []fsm.CandidateJSON `json:"candidates"`
	StateIndex     uint64              `json:"state_index"`
	// Rank is the attention-DP rank the worker reported for this
	// placement (RankObserved, feature level 2); absent until reported.
	Rank *uint32 `json:"rank,omitempty"`
}

// HistoryEntry is one element of GET /admin/v1/bindings/{fleet}/{key}/history.
type HistoryEntry struct {
	Index  uint64    `json:"index"`
	Time   time.Time `json:"time"`
	Type   string    `json:"type"`
	Status string    `json:"status"`
	Reason string    `json:"reason,omitempty"`
	// Event is the event's fields as fsm.Describe shows them (a Bind's
	// or Overflow's placement decision under "decision").
	Event any `json:"event,omitempty"`
	// Evicted is set when this entry's apply removed the binding.
	Evicted *EvictedRecord `json:"evicted,omitempty"`
}

// EvictedRecord is a binding removed by an entry's apply.
type EvictedRecord struct {
	Instance string `json:"instance"`
	Epoch    uint64 `json:"epoch"`
	Reason   string `json:"reason"`
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
		Candidates: fsm.DescribeCandidates(b.Decision.Candidates), StateIndex: st.Index(),
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
	out := historyEntries(archive.KeyEvents(recs, fleet, key))
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

// historyEntries is the answer's form of a key's archived events.
func historyEntries(kes []archive.KeyEvent) []HistoryEntry {
	out := make([]HistoryEntry, 0, len(kes))
	for _, ke := range kes {
		h := HistoryEntry{Index: ke.Index, Time: time.Unix(0, ke.Time).UTC()}
		if ke.Err != nil {
			h.Type, h.Reason = "undecodable", ke.Err.Error()
			out = append(out, h)
			continue
		}
		p := ke.Proposal
		h.Type, h.Status, h.Reason = p.Type.String(), ke.Outcome.Status.String(), ke.Outcome.Reason
		h.Event = fsm.Describe(p)
		if ev := ke.Evicted; ev != nil {
			h.Evicted = &EvictedRecord{Instance: ev.Instance, Epoch: ev.Epoch, Reason: ev.Reason.String()}
		}
		out = append(out, h)
	}
	return out
}
