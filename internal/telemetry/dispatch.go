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
//
// Work and Blocks, when set, are the route's entry in the sending edge's
// working sets (the conversation and its prompt's length in KV blocks):
// every edge notes the others' routes in its own (routing's
// Decider.HearRoute), so all weigh what all sent an instance lately.
// Edges that predate the fields ignore them.
//
// A third message carries an engine's answer about its prefix cache
// (Answer set, PromptTokens the answer's prompt): ID 0 (no dispatch has
// it) and Done, so an edge that predates the field takes it for the end
// of a dispatch it never heard and ignores it.
//
// A fourth carries a transition of the sending edge's overload history of
// the instance (Strain set), with ID 0 and Done for the same reason.
type Dispatch struct {
	V            int             `json:"v"`
	Edge         string          `json:"edge"`
	ID           uint64          `json:"id"`
	Fleet        Fleet           `json:"fleet"`
	Instance     string          `json:"instance"`
	PromptTokens int             `json:"prompt_tokens"`
	Done         bool            `json:"done,omitempty"`
	Work         string          `json:"work,omitempty"`
	Blocks       int             `json:"blocks,omitempty"`
	Answer       *DispatchAnswer `json:"answer,omitempty"`
	Strain       *DispatchStrain `json:"strain,omitempty"`
}

// DispatchStrain is a transition of the sending edge's overload history
// (routing/overload): the instance became unable to take its bound keys
// (Overloaded) or able again. Each edge observes only when it routes, so
// with several edges each sees a fraction of the fleet's moments; every
// edge applies the others' transitions as its own observations, and all
// count a strain from when the first of them saw it until one sees it end.
type DispatchStrain struct {
	Overloaded bool `json:"overloaded"`
}

// DispatchAnswer is what the engine's answer said of the prompt's cached
// tokens beside what the sending edge's KV index had claimed the instance
// held (edge/fleetview grade.go): every edge grades the index with every
// edge's answers.
type DispatchAnswer struct {
	// Source is where the sender's index learns the instance's cache
	// (engine_events, tether_worker, shadow, predictions_only).
	Source          string `json:"source"`
	BlockSize       int    `json:"block_size"`
	PredictedTokens int    `json:"predicted_tokens"`
	CachedTokens    int    `json:"cached_tokens"`
}

// MaxDispatchPromptTokens bounds a dispatch's prompt tokens (far above any
// model's context).
const MaxDispatchPromptTokens = 1 << 30

// MaxDispatchWorkBytes bounds a dispatch's Work; an edge leaves a longer
// conversation's out (the others then do not hear that route).
const MaxDispatchWorkBytes = 1024

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
	if len(d.Work) > MaxDispatchWorkBytes {
		return decodeErr(ErrOutOfRange, subject, "work", "%d bytes (want at most %d)", len(d.Work), MaxDispatchWorkBytes)
	}
	if d.Blocks < 0 || d.Blocks > MaxDispatchPromptTokens {
		return decodeErr(ErrOutOfRange, subject, "blocks", "%d (want 0..%d)", d.Blocks, MaxDispatchPromptTokens)
	}
	if d.Strain != nil && (d.ID != 0 || !d.Done || d.Answer != nil) {
		return decodeErr(ErrOutOfRange, subject, "strain", "a strain travels alone with id 0 and done (got id %d, done %v, answer %v)", d.ID, d.Done, d.Answer != nil)
	}
	if a := d.Answer; a != nil {
		switch {
		case d.ID != 0 || !d.Done:
			return decodeErr(ErrOutOfRange, subject, "answer", "an answer travels with id 0 and done (got id %d, done %v)", d.ID, d.Done)
		case a.BlockSize < 1 || a.BlockSize > MaxBlockSize:
			return decodeErr(ErrOutOfRange, subject, "answer.block_size", "%d (want 1..%d)", a.BlockSize, MaxBlockSize)
		case a.PredictedTokens < 0 || a.PredictedTokens > MaxDispatchPromptTokens:
			return decodeErr(ErrOutOfRange, subject, "answer.predicted_tokens", "%d (want 0..%d)", a.PredictedTokens, MaxDispatchPromptTokens)
		case a.CachedTokens < 0 || a.CachedTokens > MaxDispatchPromptTokens:
			return decodeErr(ErrOutOfRange, subject, "answer.cached_tokens", "%d (want 0..%d)", a.CachedTokens, MaxDispatchPromptTokens)
		case len(a.Source) > 32:
			return decodeErr(ErrOutOfRange, subject, "answer.source", "%d bytes (want at most 32)", len(a.Source))
		}
	}
	return nil
}
