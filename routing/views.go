package routing

import (
	"fmt"
	"sort"

	"github.com/tether-project/tether/fsm"
)

// InstanceView is what an edge knows about one worker instance at decision
// time: its log record (fleet, URL, draining) merged with its latest
// telemetry (load, cache figures) and the edge's own circuit breaker. The
// edge fills it; routing only reads it. Figures are per-instance totals over
// the instance's ranks.
type InstanceView struct {
	ID    string
	Fleet fsm.Fleet
	URL   string
	// Healthy: the log has it up or draining and its telemetry is fresh.
	Healthy bool
	// Silent: not healthy only because its telemetry is late — it
	// reported before and nothing since says it failed (no failed probe
	// or hop, the log has it up). When every candidate of a fleet is
	// silent while the edge hears other instances (a silence the edge
	// itself shares keeps them healthy: edge/fleetview), a soft-affinity
	// request is placed among them rather than refused (decide.go: wake).
	Silent bool
	// Unreachable: this edge's last connect to it failed and none has
	// succeeded since (edge/fleetview reach.go); Healthy and Silent are
	// false. Not woken, and a detour the log cannot record is refused at
	// once rather than sent there (decide.go: unrecorded): the hop would
	// only wait out a connect to fail.
	Unreachable bool
	// Draining: takes no new keys (the worker reported it is shutting
	// down, or an operator drained it).
	Draining bool
	// Drained: an operator drained it (the log's Instance.Drained; Draining
	// is set too): each key bound to it moves on its next turn (stayOrMove,
	// overflow reason drained).
	Drained bool
	Ranks   int

	QueuedRequests int
	ActiveRequests int
	// QueuedPrefillTokens: prompt tokens waiting for prefill, including
	// requests this edge dispatched since the instance's last report (so
	// a burst does not all land on one instance before telemetry
	// catches up).
	QueuedPrefillTokens int64
	// ActivePromptTokens: prompt tokens of requests being decoded.
	ActivePromptTokens int64
	// PrefillTokens: the prefill the instance reported it has still to
	// compute for the requests it admitted — the uncached part of its
	// queued prompts and the rest of its running prefills — when
	// PrefillReported (a worker of telemetry feature level 2). The
	// backlog reads it in place of its estimate from request counts.
	PrefillTokens   int64
	PrefillReported bool
	KVUsedBlocks    int64
	KVTotalBlocks   int64
	// HitRate: the worker's rolling-window prefix-cache hit rate (0..1),
	// informational; the edge's breaker decides CacheDegraded.
	HitRate float64
	// CacheDegraded: the instance's cache circuit breaker is open.
	CacheDegraded bool
	// VerifiesHints: the worker verifies signed sub-agent hints.
	VerifiesHints bool
	Version       string
	// Model is the model the instance serves (its configured model, else
	// the one its telemetry reports): an edge serving several models
	// routes each one's requests to its own instances.
	Model string
	// LoRA is what the instance holds of its model's LoRA adapters (nil:
	// nothing is known; routing/lora.go).
	LoRA *LoRAView
}

// Views is an immutable snapshot of instance views, indexed by id and by
// fleet. The edge rebuilds it when telemetry or the log changes and swaps it
// in atomically; routing functions take it as input.
type Views struct {
	all   []InstanceView // sorted by (fleet, id)
	byID  map[string]int
	fleet [3][2]int // fleet → [start, end) in all
}

// NewViews copies views into a snapshot. Ids must be non-empty and unique
// and fleets valid.
func NewViews(views []InstanceView) (*Views, error) {
	v := &Views{all: append([]InstanceView(nil), views...), byID: make(map[string]int, len(views))}
	for i := range v.all {
		iv := &v.all[i]
		if iv.ID == "" {
			return nil, fmt.Errorf("routing: instance view %d: empty id", i)
		}
		if !iv.Fleet.Valid() {
			return nil, fmt.Errorf("routing: instance view %s: invalid fleet %v", iv.ID, iv.Fleet)
		}
	}
	sort.Slice(v.all, func(i, j int) bool {
		if v.all[i].Fleet != v.all[j].Fleet {
			return v.all[i].Fleet < v.all[j].Fleet
		}
		return v.all[i].ID < v.all[j].ID
	})
	for i := range v.all {
		id := v.all[i].ID
		if _, dup := v.byID[id]; dup {
			return nil, fmt.Errorf("routing: instance view %s: duplicate id", id)
		}
		v.byID[id] = i
		f := v.all[i].Fleet
		if v.fleet[f][1] == 0 {
			v.fleet[f][0] = i
		}
		v.fleet[f][1] = i + 1
	}
	return v, nil
}

// Lookup returns the view of instance id. The pointer is into the snapshot:
// read-only.
func (v *Views) Lookup(id string) (*InstanceView, bool) {
	if v == nil {
		return nil, false
	}
	i, ok := v.byID[id]
	if !ok {
		return nil, false
	}
	return &v.all[i], true
}

// Fleet returns the views of fleet f, sorted by id. Read-only.
func (v *Views) Fleet(f fsm.Fleet) []InstanceView {
	if v == nil || !f.Valid() {
		return nil
	}
	r := v.fleet[f]
	return v.all[r[0]:r[1]]
}

// Len is the number of views.
func (v *Views) Len() int {
	if v == nil {
		return 0
	}
	return len(v.all)
}
