package telemetry

import (
	"encoding/json"
	"fmt"
	"math"
)

// FlowState is one edge's flow control state (edge/flow), published as it
// changes (coalesced) and every heartbeat while it holds any: for each
// model, each flow's (tenant and band) requests queued at that edge, the
// cost it dispatched (decayed, so recent service weighs most) and its
// dispatch rate. Every edge adds the others' figures to its own, so all
// edges order the fleet's queued requests by the same fleet-wide service,
// and estimate a queue's drain from the fleet's rate. A state replaces the
// edge's previous one whole (Seq orders them); it is never a delta, so a
// lost message costs only freshness. Edges publish on their own subject
// (FlowSubject of their node id); workers may not publish there.
type FlowState struct {
	V      int         `json:"v"`
	Edge   string      `json:"edge"`
	Seq    uint64      `json:"seq"`
	Models []FlowModel `json:"models"`
}

// FlowModel is one model's flows at an edge.
type FlowModel struct {
	Model string      `json:"model"`
	Flows []FlowEntry `json:"flows"`
}

// FlowEntry is one flow's figures at an edge.
type FlowEntry struct {
	Tenant string `json:"tenant"`
	Band   string `json:"band"`
	Queued int    `json:"queued"`
	// Served is the cost dispatched, decayed to the state's sending time
	// (exp(-age/τ), τ the flow controller's window).
	Served float64 `json:"served"`
	// Rate is the requests dispatched per second over that window.
	Rate float64 `json:"rate"`
	// LastMilli is the milliseconds, at sending, until the last of its
	// queued requests reaches its bound: by then every request now queued
	// has left (0: none queued).
	LastMilli int64 `json:"last_ms,omitempty"`
}

// Flow state bounds.
const (
	MaxFlowEntries = 1024 // per message, over all models
	MaxTenantLen   = 128
	MaxFlowQueued  = 1 << 24
	MaxFlowFigure  = 1e15
	MaxFlowLastMs  = 3_600_000
	FlowBandInter  = "interactive"
	FlowBandBatch  = "batch"
)

// FlowSubject is where edge publishes its flow state.
func FlowSubject(edge string) string { return subjectPrefix + kindFlow + "." + edge }

// FlowSubjectAll matches every edge's flow state.
const FlowSubjectAll = subjectPrefix + kindFlow + ".*"

// ValidTenant reports whether t can name a tenant: 1..128 bytes of visible
// ASCII (no spaces or control characters).
func ValidTenant(t string) error {
	if t == "" {
		return fmt.Errorf("tenant is empty")
	}
	if len(t) > MaxTenantLen {
		return fmt.Errorf("tenant is %d bytes (max %d)", len(t), MaxTenantLen)
	}
	for i := 0; i < len(t); i++ {
		if c := t[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("tenant: byte %#x at %d not allowed (visible ASCII only)", c, i)
		}
	}
	return nil
}

// EncodeFlowState validates s and encodes it as JSON; V is set to Version.
func EncodeFlowState(s FlowState) ([]byte, error) {
	s.V = Version
	if err := s.validate(FlowSubject(s.Edge)); err != nil {
		return nil, err
	}
	return json.Marshal(s)
}

// DecodeFlowState decodes and validates a flow state received on subject.
func DecodeFlowState(subject string, data []byte) (FlowState, error) {
	sub, err := expectSubject(subject, SubjectFlow)
	if err != nil {
		return FlowState{}, err
	}
	var s FlowState
	if err := decodeJSON(subject, data, &s); err != nil {
		return FlowState{}, err
	}
	if s.Edge != sub.Instance {
		return FlowState{}, decodeErr(ErrSubjectMismatch, subject, "edge", "payload %q, subject %q", s.Edge, sub.Instance)
	}
	if err := s.validate(subject); err != nil {
		return FlowState{}, err
	}
	return s, nil
}

func (s *FlowState) validate(subject string) error {
	if err := ValidInstanceID(s.Edge); err != nil {
		return decodeErr(ErrOutOfRange, subject, "edge", "%v", err)
	}
	n := 0
	for i, m := range s.Models {
		if m.Model == "" || len(m.Model) > MaxStringLen {
			return decodeErr(ErrOutOfRange, subject, fmt.Sprintf("models[%d].model", i), "%d bytes (want 1..%d)", len(m.Model), MaxStringLen)
		}
		if n += len(m.Flows); n > MaxFlowEntries {
			return decodeErr(ErrOutOfRange, subject, fmt.Sprintf("models[%d].flows", i), "more than %d flows", MaxFlowEntries)
		}
		for j, f := range m.Flows {
			if err := f.validate(); err != nil {
				return decodeErr(ErrOutOfRange, subject, fmt.Sprintf("models[%d].flows[%d]", i, j), "%v", err)
			}
		}
	}
	return nil
}

func (f *FlowEntry) validate() error {
	if err := ValidTenant(f.Tenant); err != nil {
		return err
	}
	if f.Band != FlowBandInter && f.Band != FlowBandBatch {
		return fmt.Errorf("band %q (want %s or %s)", f.Band, FlowBandInter, FlowBandBatch)
	}
	if f.Queued < 0 || f.Queued > MaxFlowQueued {
		return fmt.Errorf("queued %d (want 0..%d)", f.Queued, MaxFlowQueued)
	}
	if f.LastMilli < 0 || f.LastMilli > MaxFlowLastMs {
		return fmt.Errorf("last_ms %d (want 0..%d)", f.LastMilli, MaxFlowLastMs)
	}
	for _, v := range []struct {
		name string
		v    float64
	}{{"served", f.Served}, {"rate", f.Rate}} {
		if math.IsNaN(v.v) || v.v < 0 || v.v > MaxFlowFigure {
			return fmt.Errorf("%s %v (want 0..%g)", v.name, v.v, float64(MaxFlowFigure))
		}
	}
	return nil
}
