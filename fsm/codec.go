package fsm

import (
	"fmt"

	"github.com/tether-project/tether/internal/binread"
)

// payloadVersion is the version byte every event payload starts with in this
// build. A later feature level that adds a field appends it and bumps the
// version; decoders read the fields they know and ignore the rest.
const payloadVersion = 1

// EventPayloadVersion is the event payload (schema) version this build
// writes, for `tether version`.
const EventPayloadVersion = payloadVersion

// fieldWriter appends event fields and remembers the first field that does
// not fit the format's limits, so EncodeEvent can name it.
type fieldWriter struct {
	b   []byte
	err error
	ev  EventType
}

func (w *fieldWriter) str(name, s string) {
	if len(s) > MaxFieldBytes && w.err == nil {
		w.err = fmt.Errorf("fsm: encode %v: %s is %d bytes, the limit is %d", w.ev, name, len(s), MaxFieldBytes)
	}
	w.b = appendString(w.b, s)
}

func (w *fieldWriter) u8(v uint8)       { w.b = append(w.b, v) }
func (w *fieldWriter) uvarint(v uint64) { w.b = appendUvarint(w.b, v) }
func (w *fieldWriter) varint(v int64)   { w.b = appendVarint(w.b, v) }
func (w *fieldWriter) boolean(v bool)   { w.b = appendBool(w.b, v) }

func (w *fieldWriter) decision(d *Decision) {
	if w.err == nil {
		w.err = checkDecision(w.ev, d)
	}
	w.b = appendDecision(w.b, d, appendString)
}

// checkDecision reports the first field of d beyond the format's limits.
func checkDecision(ev EventType, d *Decision) error {
	tooLong := func(name, s string) error {
		return fmt.Errorf("fsm: encode %v: %s is %d bytes, the limit is %d", ev, name, len(s), MaxFieldBytes)
	}
	for _, f := range [...]struct{ name, s string }{{"Decision.Edge", d.Edge}, {"Decision.Policy", d.Policy}, {"Decision.RequestID", d.RequestID}} {
		if len(f.s) > MaxFieldBytes {
			return tooLong(f.name, f.s)
		}
	}
	if len(d.Candidates) > MaxCandidates {
		return fmt.Errorf("fsm: encode %v: Decision has %d candidates, the limit is %d", ev, len(d.Candidates), MaxCandidates)
	}
	for i := range d.Candidates {
		if s := d.Candidates[i].Instance; len(s) > MaxFieldBytes {
			return tooLong("Decision.Candidates.Instance", s)
		}
	}
	return nil
}

// EncodeEvent encodes ev as its type byte, a payload version byte and the
// fields in declaration order (layout in DESIGN.md). It fails on a nil or
// foreign event and on fields beyond the format's limits.
func EncodeEvent(ev Event) ([]byte, error) {
	return appendEvent(nil, ev)
}

func appendEvent(dst []byte, ev Event) ([]byte, error) {
	k, ev, err := kindOfEvent(ev)
	if err != nil {
		return nil, err
	}
	w := fieldWriter{b: dst, ev: k.typ}
	w.u8(uint8(k.typ))
	w.u8(payloadVersion)
	k.encode(&w, ev)
	if w.err != nil {
		return nil, w.err
	}
	return w.b, nil
}

// DecodeEvent decodes one event. An event type this build does not know
// returns *UnknownEventError (Index 0); a malformed payload *DecodeError.
func DecodeEvent(b []byte) (Event, error) {
	var r reader
	ev, err := decodeEventAt(&r, b, 0)
	if err != nil {
		return nil, err
	}
	return ev, nil
}

// decodeEventAt decodes an event that starts at byte base of an outer buffer
// (for error offsets), with r as its reader (reset here: a caller decoding
// many events passes the same one, which the per-type decoders make escape).
// It returns (nil, *UnknownEventError) for unknown types.
func decodeEventAt(r *reader, b []byte, base int) (Event, error) {
	*r = reader{binread.Reader{Buf: b, Base: base}}
	t := EventType(r.U8("event type"))
	if r.Failed() {
		return nil, r.decodeErr()
	}
	k := byType[t]
	if k == nil {
		return nil, &UnknownEventError{Type: t}
	}
	version := r.U8("payload version")
	if r.Failed() {
		return nil, r.decodeErr()
	}
	if version == 0 {
		r.Off--
		r.fail("%v payload version 0 is invalid", t)
		return nil, r.decodeErr()
	}
	ev := k.decode(r)
	if r.Failed() {
		return nil, r.decodeErr()
	}
	// A newer payload version appends fields this build does not know; the
	// same version must end exactly where this build's fields end.
	if version == payloadVersion && r.Remaining() != 0 {
		r.fail("%d trailing bytes after the %v v%d payload", r.Remaining(), t, version)
		return nil, r.decodeErr()
	}
	return ev, nil
}

// readDecision decodes a Decision as the log and results write it.
func readDecision(r *reader) Decision {
	return readDecisionWith(r, r.str)
}

// readDecisionWith is the one decoder of a Decision: ref reads the strings a
// snapshot interns (appendDecision's ref). Field labels are constants:
// building them per call would cost an allocation per field on the apply
// path.
func readDecisionWith(r *reader, ref func(what string) string) Decision {
	var d Decision
	d.Edge = ref("Decision.Edge")
	d.Policy = ref("Decision.Policy")
	d.RequestID = r.str("Decision.RequestID")
	at := r.Off
	n := r.Uvarint("Decision.Candidates count")
	if r.Failed() {
		return d
	}
	if n > MaxCandidates {
		r.Off = at
		r.fail("Decision has %d candidates, the limit is %d", n, MaxCandidates)
		return d
	}
	if n > 0 {
		d.Candidates = make([]Candidate, n)
		for i := range d.Candidates {
			c := &d.Candidates[i]
			c.Instance = ref("Decision.Candidates.Instance")
			c.Score = r.Float64LE("Decision.Candidates.Score")
			c.CachedTokens = r.Uint32("Decision.Candidates.CachedTokens")
			c.LoadTokens = r.Uint32("Decision.Candidates.LoadTokens")
		}
	}
	return d
}

// EventKeys lists the bindings an event names, for the archive's per-key
// index. Link names conversations, not bindings, and so returns none (the
// archive indexes Link events by their root separately); so do events
// without keys (InstanceState, InstanceDrain, ClusterFeatures, NodeInfo,
// Settings, Annotation).
func EventKeys(ev Event) []FleetKey {
	k, ev, err := kindOfEvent(ev)
	if err != nil {
		return nil
	}
	return k.keys(ev)
}
