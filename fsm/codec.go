package fsm

import (
	"errors"
	"fmt"
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
	ev, err := derefEvent(ev)
	if err != nil {
		return nil, err
	}
	w := fieldWriter{b: dst, ev: ev.Type()}
	w.u8(uint8(ev.Type()))
	w.u8(payloadVersion)
	switch e := ev.(type) {
	case Bind:
		w.u8(uint8(e.Fleet))
		w.str("Key", e.Key)
		w.str("ConversationID", e.ConversationID)
		w.str("Instance", e.Instance)
		w.decision(&e.Decision)
	case Touch:
		w.uvarint(uint64(len(e.Keys)))
		for _, k := range e.Keys {
			w.u8(uint8(k.Fleet))
			w.str("Keys.Key", k.Key)
		}
		w.uvarint(uint64(len(e.Links)))
		for _, l := range e.Links {
			w.str("Links", l)
		}
	case Evict:
		w.u8(uint8(e.Fleet))
		w.str("Key", e.Key)
		w.u8(uint8(e.Reason))
		w.uvarint(e.Epoch)
		w.varint(e.IdleBefore)
		w.str("Detail", e.Detail)
	case Overflow:
		w.u8(uint8(e.Fleet))
		w.str("Key", e.Key)
		w.str("From", e.From)
		w.str("To", e.To)
		w.u8(uint8(e.Reason))
		w.boolean(e.Rebind)
		w.decision(&e.Decision)
	case InstanceState:
		w.str("Instance", e.Instance)
		w.u8(uint8(e.Fleet))
		w.str("URL", e.URL)
		w.u8(uint8(e.Status))
		w.str("Version", e.Version)
		w.uvarint(uint64(e.FeatureLevel))
		w.uvarint(uint64(e.Ranks))
	case ClusterFeatures:
		w.uvarint(uint64(e.Level))
	case Link:
		w.str("Child", e.Child)
		w.str("Parent", e.Parent)
		w.str("Root", e.Root)
		w.u8(e.Depth)
	case NodeInfo:
		w.str("NodeID", e.NodeID)
		w.str("Version", e.Version)
		w.uvarint(uint64(e.MaxFeatureLevel))
	case Settings:
		w.uvarint(e.MaxBindings)
	case Annotation:
		w.str("Source", e.Source)
		w.str("Text", e.Text)
	case RankObserved:
		w.u8(uint8(e.Fleet))
		w.str("Key", e.Key)
		w.uvarint(e.Epoch)
		w.uvarint(uint64(e.Rank))
	case InstanceDrain:
		w.str("Instance", e.Instance)
		w.boolean(e.Drain)
		w.str("Source", e.Source)
	case Evidence:
		w.u8(uint8(e.Fleet))
		w.str("Key", e.Key)
		w.str("RequestID", e.RequestID)
		w.str("Rule", e.Rule)
		if len(e.Candidates) > MaxCandidates && w.err == nil {
			w.err = fmt.Errorf("fsm: encode %v: %d candidates, the limit is %d", e.Type(), len(e.Candidates), MaxCandidates)
		}
		w.uvarint(uint64(len(e.Candidates)))
		for _, c := range e.Candidates {
			w.str("Candidates.Instance", c.Instance)
			w.uvarint(uint64(c.CachedBlocks))
			w.uvarint(uint64(c.LoadTokens))
			w.uvarint(uint64(c.QueuedRequests))
			w.u8(uint8(c.Flags))
		}
	}
	if w.err != nil {
		return nil, w.err
	}
	return w.b, nil
}

// derefEvent accepts both the value and the pointer form of the event types
// (both satisfy Event) and returns the value form; anything else is an error.
func derefEvent(ev Event) (Event, error) {
	switch e := ev.(type) {
	case nil:
		return nil, errors.New("fsm: encode: nil event")
	case Bind, Touch, Evict, Overflow, InstanceState, ClusterFeatures, Link, NodeInfo, Settings, Annotation, RankObserved, Evidence, InstanceDrain:
		return e, nil
	case *InstanceDrain:
		if e != nil {
			return *e, nil
		}
	case *Evidence:
		if e != nil {
			return *e, nil
		}
	case *Bind:
		if e != nil {
			return *e, nil
		}
	case *Touch:
		if e != nil {
			return *e, nil
		}
	case *Evict:
		if e != nil {
			return *e, nil
		}
	case *Overflow:
		if e != nil {
			return *e, nil
		}
	case *InstanceState:
		if e != nil {
			return *e, nil
		}
	case *ClusterFeatures:
		if e != nil {
			return *e, nil
		}
	case *Link:
		if e != nil {
			return *e, nil
		}
	case *NodeInfo:
		if e != nil {
			return *e, nil
		}
	case *Settings:
		if e != nil {
			return *e, nil
		}
	case *Annotation:
		if e != nil {
			return *e, nil
		}
	case *RankObserved:
		if e != nil {
			return *e, nil
		}
	default:
		return nil, fmt.Errorf("fsm: encode: %T is not an fsm event", ev)
	}
	return nil, fmt.Errorf("fsm: encode: nil %T", ev)
}

// knownType reports whether this build has a decoder for t.
func knownType(t EventType) bool { return t.Level() != 0 }

// DecodeEvent decodes one event. An event type this build does not know
// returns *UnknownEventError (Index 0); a malformed payload *DecodeError.
func DecodeEvent(b []byte) (Event, error) {
	ev, err := decodeEventAt(b, 0)
	if err != nil {
		return nil, err
	}
	return ev, nil
}

// decodeEventAt decodes an event that starts at byte base of an outer buffer
// (for error offsets). It returns (nil, *UnknownEventError) for unknown types.
func decodeEventAt(b []byte, base int) (Event, error) {
	r := reader{buf: b, base: base}
	t := EventType(r.u8("event type"))
	if r.err != nil {
		return nil, r.err
	}
	if !knownType(t) {
		return nil, &UnknownEventError{Type: t}
	}
	version := r.u8("payload version")
	if r.err != nil {
		return nil, r.err
	}
	if version == 0 {
		r.off--
		r.fail("%v payload version 0 is invalid", t)
		return nil, r.err
	}
	var ev Event
	switch t {
	case TypeBind:
		var e Bind
		e.Fleet = Fleet(r.u8("Bind.Fleet"))
		e.Key = r.str("Bind.Key")
		e.ConversationID = r.str("Bind.ConversationID")
		e.Instance = r.str("Bind.Instance")
		e.Decision = readDecision(&r)
		ev = e
	case TypeTouch:
		var e Touch
		if n := r.count("Touch.Keys count", 2); n > 0 {
			e.Keys = make([]FleetKey, n)
			for i := range e.Keys {
				e.Keys[i].Fleet = Fleet(r.u8("Touch.Keys.Fleet"))
				e.Keys[i].Key = r.str("Touch.Keys.Key")
			}
		}
		if n := r.count("Touch.Links count", 1); n > 0 {
			e.Links = make([]string, n)
			for i := range e.Links {
				e.Links[i] = r.str("Touch.Links")
			}
		}
		ev = e
	case TypeEvict:
		var e Evict
		e.Fleet = Fleet(r.u8("Evict.Fleet"))
		e.Key = r.str("Evict.Key")
		e.Reason = EvictReason(r.u8("Evict.Reason"))
		e.Epoch = r.uvarint("Evict.Epoch")
		e.IdleBefore = r.varint("Evict.IdleBefore")
		e.Detail = r.str("Evict.Detail")
		ev = e
	case TypeOverflow:
		var e Overflow
		e.Fleet = Fleet(r.u8("Overflow.Fleet"))
		e.Key = r.str("Overflow.Key")
		e.From = r.str("Overflow.From")
		e.To = r.str("Overflow.To")
		e.Reason = OverflowReason(r.u8("Overflow.Reason"))
		e.Rebind = r.boolean("Overflow.Rebind")
		e.Decision = readDecision(&r)
		ev = e
	case TypeInstanceState:
		var e InstanceState
		e.Instance = r.str("InstanceState.Instance")
		e.Fleet = Fleet(r.u8("InstanceState.Fleet"))
		e.URL = r.str("InstanceState.URL")
		e.Status = InstanceStatus(r.u8("InstanceState.Status"))
		e.Version = r.str("InstanceState.Version")
		e.FeatureLevel = r.uint32v("InstanceState.FeatureLevel")
		e.Ranks = r.uint32v("InstanceState.Ranks")
		ev = e
	case TypeClusterFeatures:
		ev = ClusterFeatures{Level: r.uint32v("ClusterFeatures.Level")}
	case TypeLink:
		var e Link
		e.Child = r.str("Link.Child")
		e.Parent = r.str("Link.Parent")
		e.Root = r.str("Link.Root")
		e.Depth = r.u8("Link.Depth")
		ev = e
	case TypeNodeInfo:
		var e NodeInfo
		e.NodeID = r.str("NodeInfo.NodeID")
		e.Version = r.str("NodeInfo.Version")
		e.MaxFeatureLevel = r.uint32v("NodeInfo.MaxFeatureLevel")
		ev = e
	case TypeSettings:
		ev = Settings{MaxBindings: r.uvarint("Settings.MaxBindings")}
	case TypeAnnotation:
		var e Annotation
		e.Source = r.str("Annotation.Source")
		e.Text = r.str("Annotation.Text")
		ev = e
	case TypeRankObserved:
		var e RankObserved
		e.Fleet = Fleet(r.u8("RankObserved.Fleet"))
		e.Key = r.str("RankObserved.Key")
		e.Epoch = r.uvarint("RankObserved.Epoch")
		e.Rank = r.uint32v("RankObserved.Rank")
		ev = e
	case TypeInstanceDrain:
		var e InstanceDrain
		e.Instance = r.str("InstanceDrain.Instance")
		e.Drain = r.boolean("InstanceDrain.Drain")
		e.Source = r.str("InstanceDrain.Source")
		ev = e
	case TypeEvidence:
		var e Evidence
		e.Fleet = Fleet(r.u8("Evidence.Fleet"))
		e.Key = r.str("Evidence.Key")
		e.RequestID = r.str("Evidence.RequestID")
		e.Rule = r.str("Evidence.Rule")
		at := r.off
		n := r.uvarint("Evidence.Candidates count")
		if r.err == nil && n > MaxCandidates {
			r.off = at
			r.fail("Evidence has %d candidates, the limit is %d", n, MaxCandidates)
		}
		if r.err == nil && n > 0 {
			e.Candidates = make([]EvidenceCandidate, n)
			for i := range e.Candidates {
				c := &e.Candidates[i]
				c.Instance = r.str("Evidence.Candidates.Instance")
				c.CachedBlocks = r.uint32v("Evidence.Candidates.CachedBlocks")
				c.LoadTokens = r.uint32v("Evidence.Candidates.LoadTokens")
				c.QueuedRequests = r.uint32v("Evidence.Candidates.QueuedRequests")
				c.Flags = EvidenceFlags(r.u8("Evidence.Candidates.Flags"))
			}
		}
		ev = e
	}
	if r.err != nil {
		return nil, r.err
	}
	// A newer payload version appends fields this build does not know; the
	// same version must end exactly where this build's fields end.
	if version == payloadVersion && r.remaining() != 0 {
		r.fail("%d trailing bytes after the %v v%d payload", r.remaining(), t, version)
		return nil, r.err
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
	at := r.off
	n := r.uvarint("Decision.Candidates count")
	if r.err != nil {
		return d
	}
	if n > MaxCandidates {
		r.off = at
		r.fail("Decision has %d candidates, the limit is %d", n, MaxCandidates)
		return d
	}
	if n > 0 {
		d.Candidates = make([]Candidate, n)
		for i := range d.Candidates {
			c := &d.Candidates[i]
			c.Instance = ref("Decision.Candidates.Instance")
			c.Score = r.float64v("Decision.Candidates.Score")
			c.CachedTokens = r.uint32v("Decision.Candidates.CachedTokens")
			c.LoadTokens = r.uint32v("Decision.Candidates.LoadTokens")
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
	ev, err := derefEvent(ev)
	if err != nil {
		return nil
	}
	switch e := ev.(type) {
	case Bind:
		return []FleetKey{{Fleet: e.Fleet, Key: e.Key}}
	case Touch:
		if len(e.Keys) == 0 {
			return nil
		}
		return append([]FleetKey(nil), e.Keys...)
	case Evict:
		return []FleetKey{{Fleet: e.Fleet, Key: e.Key}}
	case Overflow:
		return []FleetKey{{Fleet: e.Fleet, Key: e.Key}}
	case RankObserved:
		return []FleetKey{{Fleet: e.Fleet, Key: e.Key}}
	case Evidence:
		return []FleetKey{{Fleet: e.Fleet, Key: e.Key}}
	}
	return nil
}
