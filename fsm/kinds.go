package fsm

import (
	"fmt"
	"time"
)

// kinds is the event-type table: one line per event type, registering its
// name, the feature level that introduced it, its codec, its apply rule, the
// bindings it names and its JSON description. Everything that depends on an
// event's type (EncodeEvent, DecodeEvent, the machine, EventKeys, Describe,
// EventType.String and Level) reads it here, so a new event type is one
// line and its functions.
var kinds = [...]*kind{
	register("Bind", FeatureLevelBase, rules[Bind]{encodeBind, decodeBind, (*txn).bind, bindKeys, describeBind}),
	register("Touch", FeatureLevelBase, rules[Touch]{encodeTouch, decodeTouch, (*txn).touch, touchKeys, describeTouch}),
	register("Evict", FeatureLevelBase, rules[Evict]{encodeEvict, decodeEvict, (*txn).evict, evictKeys, describeEvict}),
	register("Overflow", FeatureLevelBase, rules[Overflow]{encodeOverflow, decodeOverflow, (*txn).overflow, overflowKeys, describeOverflow}),
	register("InstanceState", FeatureLevelBase, rules[InstanceState]{encodeInstanceState, decodeInstanceState, (*txn).instanceState, nil, describeInstanceState}),
	register("ClusterFeatures", FeatureLevelBase, rules[ClusterFeatures]{encodeClusterFeatures, decodeClusterFeatures, (*txn).clusterFeatures, nil, describeClusterFeatures}),
	register("Link", FeatureLevelBase, rules[Link]{encodeLink, decodeLink, (*txn).link, nil, describeLink}),
	register("NodeInfo", FeatureLevelBase, rules[NodeInfo]{encodeNodeInfo, decodeNodeInfo, (*txn).nodeInfo, nil, describeNodeInfo}),
	register("Settings", FeatureLevelBase, rules[Settings]{encodeSettings, decodeSettings, (*txn).settings, nil, describeSettings}),
	register("Annotation", FeatureLevelBase, rules[Annotation]{encodeAnnotation, decodeAnnotation, (*txn).annotation, nil, describeAnnotation}),
	register("RankObserved", FeatureLevelRanks, rules[RankObserved]{encodeRankObserved, decodeRankObserved, (*txn).rankObserved, rankObservedKeys, describeRankObserved}),
	register("InstanceDrain", FeatureLevelDrain, rules[InstanceDrain]{encodeInstanceDrain, decodeInstanceDrain, (*txn).instanceDrain, nil, describeInstanceDrain}),
	// Evidence is optional and has no effect on state, so no level gates it:
	// a node that does not know it skips it and its state is the same.
	register("Evidence", FeatureLevelBase, rules[Evidence]{encodeEvidence, decodeEvidence, (*txn).evidence, evidenceKeys, describeEvidence}),
	// CacheAnswers likewise (answers.go).
	register("CacheAnswers", FeatureLevelBase, rules[CacheAnswers]{encodeCacheAnswers, decodeCacheAnswers, (*txn).cacheAnswers, nil, describeCacheAnswers}),
}

// kind is one row of the table, with the per-type functions behind the
// Event interface.
type kind struct {
	typ   EventType
	name  string
	level uint32
	// value returns ev in its value form when ev is this kind's type or a
	// pointer to it (nil for a nil pointer); ok is false for other types.
	value    func(ev Event) (v Event, ok bool)
	encode   func(w *fieldWriter, ev Event)
	decode   func(r *reader) Event
	apply    func(tx *txn, ev Event) Result
	keys     func(ev Event) []FleetKey
	describe func(ev Event) any
}

// rules are the functions of one event type E, over *E.
type rules[E Event] struct {
	encode   func(*fieldWriter, E)
	decode   func(*reader) E
	apply    func(*txn, E) Result
	keys     func(E) []FleetKey // nil: the event names no binding
	describe func(E) any        // the event's fields as JSON shows them
}

func register[E Event](name string, level uint32, r rules[E]) *kind {
	var zero E
	k := &kind{typ: zero.Type(), name: name, level: level}
	k.value = func(ev Event) (Event, bool) {
		switch e := any(ev).(type) {
		case E:
			return ev, true // already the value form: no new interface value
		case *E:
			if e == nil {
				return nil, true
			}
			return *e, true
		}
		return nil, false
	}
	k.encode = func(w *fieldWriter, ev Event) { r.encode(w, ev.(E)) }
	k.decode = func(rd *reader) Event { return r.decode(rd) }
	k.apply = func(tx *txn, ev Event) Result { return r.apply(tx, ev.(E)) }
	k.keys = func(Event) []FleetKey { return nil }
	if r.keys != nil {
		k.keys = func(ev Event) []FleetKey { return r.keys(ev.(E)) }
	}
	k.describe = func(ev Event) any { return r.describe(ev.(E)) }
	return k
}

// byType indexes kinds by type byte.
var byType = func() (t [256]*kind) {
	for _, k := range kinds {
		if t[k.typ] != nil {
			panic(fmt.Sprintf("fsm: event type 0x%02x registered twice", uint8(k.typ)))
		}
		t[k.typ] = k
	}
	return t
}()

// kindOfEvent finds the kind of ev, value or pointer form, and returns ev in
// its value form.
func kindOfEvent(ev Event) (*kind, Event, error) {
	if ev == nil {
		return nil, nil, fmt.Errorf("fsm: encode: nil event")
	}
	for _, k := range kinds {
		if v, ok := k.value(ev); ok {
			if v == nil {
				return nil, nil, fmt.Errorf("fsm: encode: nil %T", ev)
			}
			return k, v, nil
		}
	}
	return nil, nil, fmt.Errorf("fsm: encode: %T is not an fsm event", ev)
}

// Bind.

func encodeBind(w *fieldWriter, e Bind) {
	w.u8(uint8(e.Fleet))
	w.str("Key", e.Key)
	w.str("ConversationID", e.ConversationID)
	w.str("Instance", e.Instance)
	w.decision(&e.Decision)
}

func decodeBind(r *reader) (e Bind) {
	e.Fleet = Fleet(r.U8("Bind.Fleet"))
	e.Key = r.str("Bind.Key")
	e.ConversationID = r.str("Bind.ConversationID")
	e.Instance = r.str("Bind.Instance")
	e.Decision = readDecision(r)
	return
}

func bindKeys(e Bind) []FleetKey { return []FleetKey{{Fleet: e.Fleet, Key: e.Key}} }

type bindJSON struct {
	Fleet          string       `json:"fleet"`
	Key            string       `json:"key"`
	ConversationID string       `json:"conversation_id"`
	Instance       string       `json:"instance"`
	Decision       DecisionJSON `json:"decision"`
}

func describeBind(e Bind) any {
	return bindJSON{Fleet: e.Fleet.String(), Key: e.Key, ConversationID: e.ConversationID, Instance: e.Instance, Decision: DescribeDecision(e.Decision)}
}

// Touch.

func encodeTouch(w *fieldWriter, e Touch) {
	w.uvarint(uint64(len(e.Keys)))
	for _, k := range e.Keys {
		w.u8(uint8(k.Fleet))
		w.str("Keys.Key", k.Key)
	}
	w.uvarint(uint64(len(e.Links)))
	for _, l := range e.Links {
		w.str("Links", l)
	}
}

func decodeTouch(r *reader) (e Touch) {
	if n := r.count("Touch.Keys count", 2); n > 0 {
		e.Keys = make([]FleetKey, n)
		for i := range e.Keys {
			e.Keys[i].Fleet = Fleet(r.U8("Touch.Keys.Fleet"))
			e.Keys[i].Key = r.str("Touch.Keys.Key")
		}
	}
	if n := r.count("Touch.Links count", 1); n > 0 {
		e.Links = make([]string, n)
		for i := range e.Links {
			e.Links[i] = r.str("Touch.Links")
		}
	}
	return
}

func touchKeys(e Touch) []FleetKey {
	if len(e.Keys) == 0 {
		return nil
	}
	return append([]FleetKey(nil), e.Keys...)
}

type touchJSON struct {
	Keys  []FleetKeyJSON `json:"keys"`
	Links []string       `json:"links"`
}

func describeTouch(e Touch) any {
	t := touchJSON{Keys: make([]FleetKeyJSON, len(e.Keys)), Links: e.Links}
	for i, k := range e.Keys {
		t.Keys[i] = FleetKeyJSON{Fleet: k.Fleet.String(), Key: k.Key}
	}
	if t.Links == nil {
		t.Links = []string{}
	}
	return t
}

// Evict.

func encodeEvict(w *fieldWriter, e Evict) {
	w.u8(uint8(e.Fleet))
	w.str("Key", e.Key)
	w.u8(uint8(e.Reason))
	w.uvarint(e.Epoch)
	w.varint(e.IdleBefore)
	w.str("Detail", e.Detail)
}

func decodeEvict(r *reader) (e Evict) {
	e.Fleet = Fleet(r.U8("Evict.Fleet"))
	e.Key = r.str("Evict.Key")
	e.Reason = EvictReason(r.U8("Evict.Reason"))
	e.Epoch = r.Uvarint("Evict.Epoch")
	e.IdleBefore = r.Varint("Evict.IdleBefore")
	e.Detail = r.str("Evict.Detail")
	return
}

func evictKeys(e Evict) []FleetKey { return []FleetKey{{Fleet: e.Fleet, Key: e.Key}} }

type evictJSON struct {
	Fleet      string `json:"fleet"`
	Key        string `json:"key"`
	Reason     string `json:"reason"`
	Epoch      uint64 `json:"epoch"`
	IdleBefore string `json:"idle_before,omitempty"` // log time, RFC 3339
	Detail     string `json:"detail,omitempty"`
}

func describeEvict(e Evict) any {
	out := evictJSON{Fleet: e.Fleet.String(), Key: e.Key, Reason: e.Reason.String(), Epoch: e.Epoch, Detail: e.Detail}
	if e.IdleBefore != 0 {
		out.IdleBefore = time.Unix(0, e.IdleBefore).UTC().Format(time.RFC3339Nano)
	}
	return out
}

// Overflow.

func encodeOverflow(w *fieldWriter, e Overflow) {
	w.u8(uint8(e.Fleet))
	w.str("Key", e.Key)
	w.str("From", e.From)
	w.str("To", e.To)
	w.u8(uint8(e.Reason))
	w.boolean(e.Rebind)
	w.decision(&e.Decision)
}

func decodeOverflow(r *reader) (e Overflow) {
	e.Fleet = Fleet(r.U8("Overflow.Fleet"))
	e.Key = r.str("Overflow.Key")
	e.From = r.str("Overflow.From")
	e.To = r.str("Overflow.To")
	e.Reason = OverflowReason(r.U8("Overflow.Reason"))
	e.Rebind = r.Bool("Overflow.Rebind")
	e.Decision = readDecision(r)
	return
}

func overflowKeys(e Overflow) []FleetKey { return []FleetKey{{Fleet: e.Fleet, Key: e.Key}} }

type overflowJSON struct {
	Fleet    string       `json:"fleet"`
	Key      string       `json:"key"`
	From     string       `json:"from"`
	To       string       `json:"to"`
	Reason   string       `json:"reason"`
	Rebind   bool         `json:"rebind"`
	Decision DecisionJSON `json:"decision"`
}

func describeOverflow(e Overflow) any {
	return overflowJSON{Fleet: e.Fleet.String(), Key: e.Key, From: e.From, To: e.To, Reason: e.Reason.String(), Rebind: e.Rebind,
		Decision: DescribeDecision(e.Decision)}
}

// InstanceState.

func encodeInstanceState(w *fieldWriter, e InstanceState) {
	w.str("Instance", e.Instance)
	w.u8(uint8(e.Fleet))
	w.str("URL", e.URL)
	w.u8(uint8(e.Status))
	w.str("Version", e.Version)
	w.uvarint(uint64(e.FeatureLevel))
	w.uvarint(uint64(e.Ranks))
}

func decodeInstanceState(r *reader) (e InstanceState) {
	e.Instance = r.str("InstanceState.Instance")
	e.Fleet = Fleet(r.U8("InstanceState.Fleet"))
	e.URL = r.str("InstanceState.URL")
	e.Status = InstanceStatus(r.U8("InstanceState.Status"))
	e.Version = r.str("InstanceState.Version")
	e.FeatureLevel = r.Uint32("InstanceState.FeatureLevel")
	e.Ranks = r.Uint32("InstanceState.Ranks")
	return
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

func describeInstanceState(e InstanceState) any {
	return instanceStateJSON{Instance: e.Instance, Fleet: e.Fleet.String(), URL: e.URL, Status: e.Status.String(), Version: e.Version,
		FeatureLevel: e.FeatureLevel, Ranks: e.Ranks}
}

// ClusterFeatures.

func encodeClusterFeatures(w *fieldWriter, e ClusterFeatures) { w.uvarint(uint64(e.Level)) }

func decodeClusterFeatures(r *reader) (e ClusterFeatures) {
	e.Level = r.Uint32("ClusterFeatures.Level")
	return
}

func describeClusterFeatures(e ClusterFeatures) any {
	return struct {
		Level uint32 `json:"level"`
	}{e.Level}
}

// Link.

func encodeLink(w *fieldWriter, e Link) {
	w.str("Child", e.Child)
	w.str("Parent", e.Parent)
	w.str("Root", e.Root)
	w.u8(e.Depth)
}

func decodeLink(r *reader) (e Link) {
	e.Child = r.str("Link.Child")
	e.Parent = r.str("Link.Parent")
	e.Root = r.str("Link.Root")
	e.Depth = r.U8("Link.Depth")
	return
}

type linkJSON struct {
	Child  string `json:"child"`
	Parent string `json:"parent"`
	Root   string `json:"root"`
	Depth  uint8  `json:"depth"`
}

func describeLink(e Link) any {
	return linkJSON{Child: e.Child, Parent: e.Parent, Root: e.Root, Depth: e.Depth}
}

// NodeInfo.

func encodeNodeInfo(w *fieldWriter, e NodeInfo) {
	w.str("NodeID", e.NodeID)
	w.str("Version", e.Version)
	w.uvarint(uint64(e.MaxFeatureLevel))
}

func decodeNodeInfo(r *reader) (e NodeInfo) {
	e.NodeID = r.str("NodeInfo.NodeID")
	e.Version = r.str("NodeInfo.Version")
	e.MaxFeatureLevel = r.Uint32("NodeInfo.MaxFeatureLevel")
	return
}

type nodeInfoJSON struct {
	NodeID          string `json:"node_id"`
	Version         string `json:"version"`
	MaxFeatureLevel uint32 `json:"max_feature_level"`
}

func describeNodeInfo(e NodeInfo) any {
	return nodeInfoJSON{NodeID: e.NodeID, Version: e.Version, MaxFeatureLevel: e.MaxFeatureLevel}
}

// Settings.

func encodeSettings(w *fieldWriter, e Settings) { w.uvarint(e.MaxBindings) }

func decodeSettings(r *reader) (e Settings) {
	e.MaxBindings = r.Uvarint("Settings.MaxBindings")
	return
}

func describeSettings(e Settings) any {
	return struct {
		MaxBindings uint64 `json:"max_bindings"`
	}{e.MaxBindings}
}

// Annotation.

func encodeAnnotation(w *fieldWriter, e Annotation) {
	w.str("Source", e.Source)
	w.str("Text", e.Text)
}

func decodeAnnotation(r *reader) (e Annotation) {
	e.Source = r.str("Annotation.Source")
	e.Text = r.str("Annotation.Text")
	return
}

func describeAnnotation(e Annotation) any {
	return struct {
		Source string `json:"source"`
		Text   string `json:"text"`
	}{e.Source, e.Text}
}

// RankObserved.

func encodeRankObserved(w *fieldWriter, e RankObserved) {
	w.u8(uint8(e.Fleet))
	w.str("Key", e.Key)
	w.uvarint(e.Epoch)
	w.uvarint(uint64(e.Rank))
}

func decodeRankObserved(r *reader) (e RankObserved) {
	e.Fleet = Fleet(r.U8("RankObserved.Fleet"))
	e.Key = r.str("RankObserved.Key")
	e.Epoch = r.Uvarint("RankObserved.Epoch")
	e.Rank = r.Uint32("RankObserved.Rank")
	return
}

func rankObservedKeys(e RankObserved) []FleetKey { return []FleetKey{{Fleet: e.Fleet, Key: e.Key}} }

type rankObservedJSON struct {
	Fleet string `json:"fleet"`
	Key   string `json:"key"`
	Epoch uint64 `json:"epoch"`
	Rank  uint32 `json:"rank"`
}

func describeRankObserved(e RankObserved) any {
	return rankObservedJSON{Fleet: e.Fleet.String(), Key: e.Key, Epoch: e.Epoch, Rank: e.Rank}
}

// InstanceDrain.

func encodeInstanceDrain(w *fieldWriter, e InstanceDrain) {
	w.str("Instance", e.Instance)
	w.boolean(e.Drain)
	w.str("Source", e.Source)
}

func decodeInstanceDrain(r *reader) (e InstanceDrain) {
	e.Instance = r.str("InstanceDrain.Instance")
	e.Drain = r.Bool("InstanceDrain.Drain")
	e.Source = r.str("InstanceDrain.Source")
	return
}

type instanceDrainJSON struct {
	Instance string `json:"instance"`
	Drain    bool   `json:"drain"`
	Source   string `json:"source"`
}

func describeInstanceDrain(e InstanceDrain) any {
	return instanceDrainJSON{Instance: e.Instance, Drain: e.Drain, Source: e.Source}
}

// Evidence.

func encodeEvidence(w *fieldWriter, e Evidence) {
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

func decodeEvidence(r *reader) (e Evidence) {
	e.Fleet = Fleet(r.U8("Evidence.Fleet"))
	e.Key = r.str("Evidence.Key")
	e.RequestID = r.str("Evidence.RequestID")
	e.Rule = r.str("Evidence.Rule")
	at := r.Off
	n := r.Uvarint("Evidence.Candidates count")
	if r.Failed() {
		return
	}
	if n > MaxCandidates {
		r.Off = at
		r.fail("Evidence has %d candidates, the limit is %d", n, MaxCandidates)
		return
	}
	if n > 0 {
		e.Candidates = make([]EvidenceCandidate, n)
		for i := range e.Candidates {
			c := &e.Candidates[i]
			c.Instance = r.str("Evidence.Candidates.Instance")
			c.CachedBlocks = r.Uint32("Evidence.Candidates.CachedBlocks")
			c.LoadTokens = r.Uint32("Evidence.Candidates.LoadTokens")
			c.QueuedRequests = r.Uint32("Evidence.Candidates.QueuedRequests")
			c.Flags = EvidenceFlags(r.U8("Evidence.Candidates.Flags"))
		}
	}
	return
}

func evidenceKeys(e Evidence) []FleetKey { return []FleetKey{{Fleet: e.Fleet, Key: e.Key}} }

type evidenceEventJSON struct {
	Fleet string `json:"fleet"`
	Key   string `json:"key"`
	EvidenceJSON
}

func describeEvidence(e Evidence) any {
	return evidenceEventJSON{Fleet: e.Fleet.String(), Key: e.Key, EvidenceJSON: DescribeEvidence(e)}
}
