package telemetry

import (
	"encoding/json"
	"fmt"
)

// Evictions reports conversation affinity bindings a worker's attention-DP
// scheduler dropped (LRU beyond max_sessions): the edge stops expecting the
// conversation's prefix on that rank's worker.
type Evictions struct {
	V         int        `json:"v"`
	Instance  string     `json:"instance"`
	BootID    uint64     `json:"boot_id"`
	Seq       uint64     `json:"seq"` // eviction message sequence, from 1 per boot
	Evictions []Eviction `json:"evictions"`
}

// Eviction is one dropped binding.
type Eviction struct {
	Rank           int    `json:"rank"`
	ConversationID string `json:"conversation_id"`
	Reason         string `json:"reason,omitempty"` // e.g. "lru"
}

// EncodeEvictions validates e and encodes it as JSON; V is set to Version.
func EncodeEvictions(e Evictions) ([]byte, error) {
	e.V = Version
	if err := e.validate(EvictSubject(e.Instance)); err != nil {
		return nil, err
	}
	return json.Marshal(e)
}

// DecodeEvictions decodes and validates an eviction message received on subject.
func DecodeEvictions(subject string, data []byte) (Evictions, error) {
	s, err := expectSubject(subject, SubjectEvict)
	if err != nil {
		return Evictions{}, err
	}
	var e Evictions
	if err := decodeJSON(subject, data, &e); err != nil {
		return Evictions{}, err
	}
	if e.Instance != s.Instance {
		return Evictions{}, decodeErr(ErrSubjectMismatch, subject, "instance", "payload %q, subject %q", e.Instance, s.Instance)
	}
	if err := e.validate(subject); err != nil {
		return Evictions{}, err
	}
	return e, nil
}

func (e *Evictions) validate(subject string) error {
	if err := ValidInstanceID(e.Instance); err != nil {
		return decodeErr(ErrOutOfRange, subject, "instance", "%v", err)
	}
	if e.BootID == 0 {
		return decodeErr(ErrOutOfRange, subject, "boot_id", "zero")
	}
	if e.Seq == 0 {
		return decodeErr(ErrOutOfRange, subject, "seq", "zero (sequences start at 1)")
	}
	if len(e.Evictions) < 1 || len(e.Evictions) > MaxEvictionsPerMsg {
		return decodeErr(ErrOutOfRange, subject, "evictions", "%d entries (want 1..%d)", len(e.Evictions), MaxEvictionsPerMsg)
	}
	for i, ev := range e.Evictions {
		if ev.Rank < 0 || ev.Rank >= MaxRanks {
			return decodeErr(ErrOutOfRange, subject, fmt.Sprintf("evictions[%d].rank", i), "%d (want 0..%d)", ev.Rank, MaxRanks-1)
		}
		if ev.ConversationID == "" || len(ev.ConversationID) > MaxStringLen {
			return decodeErr(ErrOutOfRange, subject, fmt.Sprintf("evictions[%d].conversation_id", i), "%d bytes (want 1..%d)", len(ev.ConversationID), MaxStringLen)
		}
		if len(ev.Reason) > 64 {
			return decodeErr(ErrOutOfRange, subject, fmt.Sprintf("evictions[%d].reason", i), "%d bytes (max 64)", len(ev.Reason))
		}
	}
	return nil
}
