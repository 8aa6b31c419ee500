package audit

import (
	"encoding/hex"
	"time"

	"github.com/tether-project/tether/fsm"
)

// JSON shapes of the affinity-log events, shared by export and explain.
// Field names are snake_case and stable: external tools read them.

// DecisionJSON is a placement decision as the log keeps it.
type DecisionJSON struct {
	Edge       string          `json:"edge"`
	Policy     string          `json:"policy"`
	RequestID  string          `json:"request_id"`
	Candidates []CandidateJSON `json:"candidates"`
}

// CandidateJSON is one scored option of a decision.
type CandidateJSON struct {
	Instance     string  `json:"instance"`
	Score        float64 `json:"score"`
	CachedTokens uint32  `json:"cached_tokens"`
	LoadTokens   uint32  `json:"load_tokens"`
}

func decisionJSON(d fsm.Decision) DecisionJSON {
	out := DecisionJSON{Edge: d.Edge, Policy: d.Policy, RequestID: d.RequestID, Candidates: make([]CandidateJSON, len(d.Candidates))}
	for i, c := range d.Candidates {
		out.Candidates[i] = CandidateJSON{Instance: c.Instance, Score: c.Score, CachedTokens: c.CachedTokens, LoadTokens: c.LoadTokens}
	}
	return out
}

// FleetKeyJSON names one binding.
type FleetKeyJSON struct {
	Fleet string `json:"fleet"`
	Key   string `json:"key"`
}

type bindJSON struct {
	Fleet          string       `json:"fleet"`
	Key            string       `json:"key"`
	ConversationID string       `json:"conversation_id"`
	Instance       string       `json:"instance"`
	Decision       DecisionJSON `json:"decision"`
}

type touchJSON struct {
	Keys  []FleetKeyJSON `json:"keys"`
	Links []string       `json:"links"`
}

type evictJSON struct {
	Fleet      string `json:"fleet"`
	Key        string `json:"key"`
	Reason     string `json:"reason"`
	Epoch      uint64 `json:"epoch,omitempty"`
	IdleBefore string `json:"idle_before,omitempty"`
	Detail     string `json:"detail,omitempty"`
}

type overflowJSON struct {
	Fleet    string       `json:"fleet"`
	Key      string       `json:"key"`
	From     string       `json:"from"`
	To       string       `json:"to"`
	Reason   string       `json:"reason"`
	Rebind   bool         `json:"rebind"`
	Decision DecisionJSON `json:"decision"`
}

type instanceStateJSON struct {
	Instance     string `json:"instance"`
	Fleet        string `json:"fleet"`
	URL          string `json:"url"`
	Status       string `json:"status"`
	Version      string `json:"version"`
	FeatureLevel uint32 `json:"feature_level"`
	Ranks        uint32 `json:"ranks"`
}

type instanceDrainJSON struct {
	Instance string `json:"instance"`
	Drain    bool   `json:"drain"`
	Source   string `json:"source"`
}

type linkJSON struct {
	Child  string `json:"child"`
	Parent string `json:"parent"`
	Root   string `json:"root"`
	Depth  uint8  `json:"depth"`
}

type nodeInfoJSON struct {
	NodeID          string `json:"node_id"`
	Version         string `json:"version"`
	MaxFeatureLevel uint32 `json:"max_feature_level"`
}

// EvidenceJSON is what the deciding edge saw when it placed a key.
type EvidenceJSON struct {
	RequestID  string                  `json:"request_id"`
	Rule       string                  `json:"rule"`
	Candidates []EvidenceCandidateJSON `json:"candidates"`
}

// EvidenceCandidateJSON is one instance the placement considered; State
// lists chosen, bound, breaker_open, unhealthy, draining as they applied.
type EvidenceCandidateJSON struct {
	Instance       string   `json:"instance"`
	CachedBlocks   uint32   `json:"cached_blocks"`
	LoadTokens     uint32   `json:"load_tokens"`
	QueuedRequests uint32   `json:"queued_requests"`
	State          []string `json:"state"`
}

func evidenceJSON(e fsm.Evidence) EvidenceJSON {
	out := EvidenceJSON{RequestID: e.RequestID, Rule: e.Rule, Candidates: make([]EvidenceCandidateJSON, len(e.Candidates))}
	for i, c := range e.Candidates {
		out.Candidates[i] = EvidenceCandidateJSON{Instance: c.Instance, CachedBlocks: c.CachedBlocks, LoadTokens: c.LoadTokens, QueuedRequests: c.QueuedRequests, State: c.Flags.Names()}
	}
	return out
}

type rankObservedJSON struct {
	Fleet string `json:"fleet"`
	Key   string `json:"key"`
	Epoch uint64 `json:"epoch"`
	Rank  uint32 `json:"rank"`
}

type unknownJSON struct {
	TypeByte uint8  `json:"type_byte"`
	Optional bool   `json:"optional"`
	Raw      string `json:"raw_hex"`
}

// EventFields returns ev's fields in their JSON shape. A nil event (a type
// this build does not know) shows its type byte and raw bytes.
func EventFields(p fsm.RawProposal) any {
	switch e := p.Event.(type) {
	case fsm.Bind:
		return bindJSON{Fleet: e.Fleet.String(), Key: e.Key, ConversationID: e.ConversationID, Instance: e.Instance, Decision: decisionJSON(e.Decision)}
	case fsm.Touch:
		t := touchJSON{Keys: make([]FleetKeyJSON, len(e.Keys)), Links: e.Links}
		for i, k := range e.Keys {
			t.Keys[i] = FleetKeyJSON{Fleet: k.Fleet.String(), Key: k.Key}
		}
		if t.Links == nil {
			t.Links = []string{}
		}
		return t
	case fsm.Evict:
		out := evictJSON{Fleet: e.Fleet.String(), Key: e.Key, Reason: e.Reason.String(), Epoch: e.Epoch, Detail: e.Detail}
		if e.IdleBefore != 0 {
			out.IdleBefore = time.Unix(0, e.IdleBefore).UTC().Format(time.RFC3339Nano)
		}
		return out
	case fsm.Overflow:
		return overflowJSON{Fleet: e.Fleet.String(), Key: e.Key, From: e.From, To: e.To, Reason: e.Reason.String(), Rebind: e.Rebind, Decision: decisionJSON(e.Decision)}
	case fsm.InstanceState:
		return instanceStateJSON{Instance: e.Instance, Fleet: e.Fleet.String(), URL: e.URL, Status: e.Status.String(), Version: e.Version, FeatureLevel: e.FeatureLevel, Ranks: e.Ranks}
	case fsm.InstanceDrain:
		return instanceDrainJSON{Instance: e.Instance, Drain: e.Drain, Source: e.Source}
	case fsm.ClusterFeatures:
		return struct {
			Level uint32 `json:"level"`
		}{e.Level}
	case fsm.Link:
		return linkJSON{Child: e.Child, Parent: e.Parent, Root: e.Root, Depth: e.Depth}
	case fsm.NodeInfo:
		return nodeInfoJSON{NodeID: e.NodeID, Version: e.Version, MaxFeatureLevel: e.MaxFeatureLevel}
	case fsm.Settings:
		return struct {
			MaxBindings uint64 `json:"max_bindings"`
		}{e.MaxBindings}
	case fsm.Evidence:
		return struct {
			Fleet string `json:"fleet"`
			Key   string `json:"key"`
			EvidenceJSON
		}{e.Fleet.String(), e.Key, evidenceJSON(e)}
	case fsm.RankObserved:
		return rankObservedJSON{Fleet: e.Fleet.String(), Key: e.Key, Epoch: e.Epoch, Rank: e.Rank}
	case fsm.Annotation:
		return struct {
			Source string `json:"source"`
			Text   string `json:"text"`
		}{e.Source, e.Text}
	}
	return unknownJSON{TypeByte: uint8(p.Type), Optional: p.Type.Optional(), Raw: hex.EncodeToString(p.Raw)}
}

// EvictedJSON is one binding an apply removed.
type EvictedJSON struct {
	Fleet    string `json:"fleet"`
	Key      string `json:"key"`
	Instance string `json:"instance"`
	Epoch    uint64 `json:"epoch"`
	Reason   string `json:"reason"`
}

// EffectsJSON is what applying a proposal did, as the archive recorded it.
type EffectsJSON struct {
	Status  string        `json:"status"`
	Reason  string        `json:"reason,omitempty"`
	Evicted []EvictedJSON `json:"evicted"`
}

func evictedJSON(ev []fsm.Evicted) []EvictedJSON {
	out := make([]EvictedJSON, len(ev))
	for i, e := range ev {
		out[i] = EvictedJSON{Fleet: e.Fleet.String(), Key: e.Key, Instance: e.Instance, Epoch: e.Epoch, Reason: e.Reason.String()}
	}
	return out
}

func logTime(ns int64) time.Time { return time.Unix(0, ns).UTC() }
