package telemetry

import "encoding/json"

// Dispatch is one request an edge sent to a worker instance, published as
// it is sent, and again with Done when the request ended. The other edges
// count it in the instance's load (a queued request with its prompt tokens)
// until the instance's next load report, which then includes it, or until
// it ended: every edge's view of a worker's load holds what all edges
// dispatched since the report, not only its own. ID, unique per edge,
// pairs the two messages. Edges publish on their own subject
// (DispatchSubject of their node id); workers may not publish there.
type Dispatch struct {
	V            int    `json:"v"`
	Edge         string `json:"edge"`
	ID           uint64 `json:"id"`
	Fleet        Fleet  `json:"fleet"`
	Instance     string `json:"instance"`
	PromptTokens int    `json:"prompt_tokens"`
	Done         bool   `json:"done,omitempty"`
}

// MaxDispatchPromptTokens bounds a dispatch's prompt tokens (far above any
// model's context).
const MaxDispatchPromptTokens = 1 << 30

// DispatchSubject is where edge publishes its dispatches.
func DispatchSubject(edge string) string { return subjectPrefix + kindDispatch + "." + edge }

// DispatchSubjectAll matches every edge's dispatches.
const DispatchSubjectAll = subjectPrefix + kindDispatch + ".*"

// EncodeDispatch validates d and encodes it as JSON; V is set to Version.
func EncodeDispatch(d Dispatch) ([]byte, error) {
	d.V = Version
	if err := d.validate(DispatchSubject(d.Edge)); err != nil {
		return nil, err
	}
	return json.Marshal(d)
}

// DecodeDispatch decodes and validates a dispatch received on subject.
func DecodeDispatch(subject string, data []byte) (Dispatch, error) {
	s, err := expectSubject(subject, SubjectDispatch)
	if err != nil {
		return Dispatch{}, err
	}
	var d Dispatch
	if err := decodeJSON(subject, data, &d); err != nil {
		return Dispatch{}, err
	}
	if d.Edge != s.Instance {
		return Dispatch{}, decodeErr(ErrSubjectMismatch, subject, "edge", "payload %q, subject %q", d.Edge, s.Instance)
	}
	if err := d.validate(subject); err != nil {
		return Dispatch{}, err
	}
	return d, nil
}

func (d *Dispatch) validate(subject string) error {
	if err := ValidInstanceID(d.Edge); err != nil {
		return decodeErr(ErrOutOfRange, subject, "edge", "%v", err)
	}
	if !d.Fleet.Valid() {
		return decodeErr(ErrOutOfRange, subject, "fleet", "%q (want context or generation)", d.Fleet)
	}
	if err := ValidInstanceID(d.Instance); err != nil {
		return decodeErr(ErrOutOfRange, subject, "instance", "%v", err)
	}
	if d.PromptTokens < 0 || d.PromptTokens > MaxDispatchPromptTokens {
		return decodeErr(ErrOutOfRange, subject, "prompt_tokens", "%d (want 0..%d)", d.PromptTokens, MaxDispatchPromptTokens)
	}
	return nil
}
