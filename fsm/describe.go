package fsm

import "encoding/hex"

// The JSON shapes of the affinity-log events, one per type (kinds.go),
// shared by the audit's export and explain and the admin API's key history.
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

// FleetKeyJSON names one binding.
type FleetKeyJSON struct {
	Fleet string `json:"fleet"`
	Key   string `json:"key"`
}

// DescribeDecision returns d in its JSON shape.
func DescribeDecision(d Decision) DecisionJSON {
	return DecisionJSON{Edge: d.Edge, Policy: d.Policy, RequestID: d.RequestID, Candidates: DescribeCandidates(d.Candidates)}
}

// DescribeCandidates returns cs in their JSON shape (never nil).
func DescribeCandidates(cs []Candidate) []CandidateJSON {
	out := make([]CandidateJSON, len(cs))
	for i, c := range cs {
		out[i] = CandidateJSON{Instance: c.Instance, Score: c.Score, CachedTokens: c.CachedTokens, LoadTokens: c.LoadTokens}
	}
	return out
}

// EvidenceJSON is what the deciding edge saw when it placed a key.
type EvidenceJSON struct {
	RequestID  string                  `json:"request_id"`
	Rule       string                  `json:"rule"`
	Candidates []EvidenceCandidateJSON `json:"candidates"`
}

// EvidenceCandidateJSON is one instance the placement considered; State
// lists chosen, bound, breaker_open, unhealthy, draining as they applied
// (EvidenceFlags.Names).
type EvidenceCandidateJSON struct {
	Instance       string   `json:"instance"`
	CachedBlocks   uint32   `json:"cached_blocks"`
	LoadTokens     uint32   `json:"load_tokens"`
	QueuedRequests uint32   `json:"queued_requests"`
	State          []string `json:"state"`
}

// DescribeEvidence returns e's rule and candidates in their JSON shape (the
// Evidence event's description adds its fleet and key).
func DescribeEvidence(e Evidence) EvidenceJSON {
	out := EvidenceJSON{RequestID: e.RequestID, Rule: e.Rule, Candidates: make([]EvidenceCandidateJSON, len(e.Candidates))}
	for i, c := range e.Candidates {
		out.Candidates[i] = EvidenceCandidateJSON{Instance: c.Instance, CachedBlocks: c.CachedBlocks, LoadTokens: c.LoadTokens,
			QueuedRequests: c.QueuedRequests, State: c.Flags.Names()}
	}
	return out
}

type unknownJSON struct {
	TypeByte uint8  `json:"type_byte"`
	Optional bool   `json:"optional"`
	Raw      string `json:"raw_hex"`
}

// Describe returns a proposal's event fields in their JSON shape. An event
// this build does not know (Event nil) shows its type byte and raw bytes.
func Describe(p RawProposal) any {
	if p.Event != nil {
		if k, ev, err := kindOfEvent(p.Event); err == nil {
			return k.describe(ev)
		}
	}
	return unknownJSON{TypeByte: uint8(p.Type), Optional: p.Type.Optional(), Raw: hex.EncodeToString(p.Raw)}
}
