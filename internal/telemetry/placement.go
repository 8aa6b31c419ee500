package telemetry

import "encoding/json"

// Placement is a new key an edge placed, published the moment it
// dispatches the key's first request beside its Bind proposal. The other
// edges follow it for the key's requests that reach them before their
// replica of the affinity log has the key's binding, instead of placing
// the key again; the log's first committed Bind still decides. Edges
// publish on their own subject (PlacementSubject of their node id); workers
// may not publish there.
type Placement struct {
	V              int    `json:"v"`
	Edge           string `json:"edge"`
	Fleet          Fleet  `json:"fleet"`
	Key            string `json:"key"`
	ConversationID string `json:"conversation_id,omitempty"`
	Instance       string `json:"instance"`
	RequestID      string `json:"request_id,omitempty"`
}

// PlacementSubject is where edge publishes its placements.
func PlacementSubject(edge string) string { return subjectPrefix + kindPlacement + "." + edge }

// PlacementSubjectAll matches every edge's placements.
const PlacementSubjectAll = subjectPrefix + kindPlacement + ".*"

// EncodePlacement validates p and encodes it as JSON; V is set to Version.
func EncodePlacement(p Placement) ([]byte, error) {
	p.V = Version
	if err := p.validate(PlacementSubject(p.Edge)); err != nil {
		return nil, err
	}
	return json.Marshal(p)
}

// DecodePlacement decodes and validates a placement received on subject.
func DecodePlacement(subject string, data []byte) (Placement, error) {
	s, err := expectSubject(subject, SubjectPlacement)
	if err != nil {
		return Placement{}, err
	}
	var p Placement
	if err := decodeJSON(subject, data, &p); err != nil {
		return Placement{}, err
	}
	if p.Edge != s.Instance {
		return Placement{}, decodeErr(ErrSubjectMismatch, subject, "edge", "payload %q, subject %q", p.Edge, s.Instance)
	}
	if err := p.validate(subject); err != nil {
		return Placement{}, err
	}
	return p, nil
}

func (p *Placement) validate(subject string) error {
	if err := ValidInstanceID(p.Edge); err != nil {
		return decodeErr(ErrOutOfRange, subject, "edge", "%v", err)
	}
	if !p.Fleet.Valid() {
		return decodeErr(ErrOutOfRange, subject, "fleet", "%q (want context or generation)", p.Fleet)
	}
	if p.Key == "" || len(p.Key) > MaxStringLen {
		return decodeErr(ErrOutOfRange, subject, "key", "%d bytes (want 1..%d)", len(p.Key), MaxStringLen)
	}
	if len(p.ConversationID) > MaxStringLen {
		return decodeErr(ErrOutOfRange, subject, "conversation_id", "%d bytes (max %d)", len(p.ConversationID), MaxStringLen)
	}
	if err := ValidInstanceID(p.Instance); err != nil {
		return decodeErr(ErrOutOfRange, subject, "instance", "%v", err)
	}
	if len(p.RequestID) > MaxStringLen {
		return decodeErr(ErrOutOfRange, subject, "request_id", "%d bytes (max %d)", len(p.RequestID), MaxStringLen)
	}
	return nil
}
