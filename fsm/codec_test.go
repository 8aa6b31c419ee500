package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

func sampleDecision() Decision {
	return Decision{
		Edge: "edge-1", Policy: "least_tokens", RequestID: "req-7f3a",
		Candidates: []Candidate{
			{Instance: "ctx-0", Score: 0.93, CachedTokens: 12000, LoadTokens: 300},
			{Instance: "ctx-1", Score: -1.5, CachedTokens: 0, LoadTokens: math.MaxUint32},
			{Instance: "ctx-2", Score: math.Inf(1)},
		},
	}
}

// codecCases covers every event type, with full, empty and maximum-size fields.
func codecCases() []struct {
	name string
	ev   Event
} {
	maxStr := strings.Repeat("k", MaxFieldBytes)
	maxCands := make([]Candidate, MaxCandidates)
	for i := range maxCands {
		maxCands[i] = Candidate{Instance: strings.Repeat("i", 200), Score: math.MaxFloat64, CachedTokens: math.MaxUint32, LoadTokens: math.MaxUint32}
	}
	return []struct {
		name string
		ev   Event
	}{
		{"bind", Bind{Fleet: FleetContext, Key: "conv-1", ConversationID: "conv-1", Instance: "ctx-0", Decision: sampleDecision()}},
		{"bind empty decision", Bind{Fleet: FleetGeneration, Key: "k", Instance: "gen-3"}},
		{"bind max fields", Bind{Fleet: FleetContext, Key: maxStr, ConversationID: maxStr, Instance: maxStr,
			Decision: Decision{Edge: maxStr, Policy: maxStr, RequestID: maxStr, Candidates: maxCands}}},
		{"touch", Touch{Keys: []FleetKey{{FleetContext, "a"}, {FleetGeneration, "b"}}, Links: []string{"child-1", "child-2"}}},
		{"touch empty", Touch{}},
		{"touch links only", Touch{Links: []string{"c"}}},
		{"evict", Evict{Fleet: FleetContext, Key: "a", Reason: EvictTTL, Epoch: math.MaxUint64, IdleBefore: math.MinInt64, Detail: "idle 15m"}},
		{"evict unconditional", Evict{Fleet: FleetGeneration, Key: "a", Reason: EvictAdmin}},
		{"evict max idle", Evict{Fleet: FleetGeneration, Key: "a", Reason: EvictAdmin, IdleBefore: math.MaxInt64}},
		{"overflow rebind", Overflow{Fleet: FleetContext, Key: "a", From: "ctx-0", To: "ctx-1", Reason: OverflowSaturated, Rebind: true, Decision: sampleDecision()}},
		{"overflow plain", Overflow{Fleet: FleetGeneration, Key: "a", From: "g0", To: "g1", Reason: OverflowCircuitOpen}},
		{"instance state", InstanceState{Instance: "ctx-0", Fleet: FleetContext, URL: "http://127.0.0.1:9000", Status: InstanceDraining, Version: "v1.2.3", FeatureLevel: 1, Ranks: 8}},
		{"instance state max", InstanceState{Instance: "x", Status: InstanceUp, FeatureLevel: math.MaxUint32, Ranks: math.MaxUint32}},
		{"cluster features", ClusterFeatures{Level: 1}},
		{"cluster features zero", ClusterFeatures{}},
		{"link", Link{Child: "child-a", Parent: "parent-1", Root: "parent-1", Depth: 1}},
		{"link max depth", Link{Child: "c", Parent: "p", Root: "r", Depth: 255}},
		{"node info", NodeInfo{NodeID: "edge-1", Version: "v0.1.0", MaxFeatureLevel: FeatureLevelMax}},
		{"settings", Settings{MaxBindings: 1_000_000}},
		{"settings max", Settings{MaxBindings: math.MaxUint64}},
		{"annotation", Annotation{Source: "operator", Text: "degraded: nats down"}},
		{"annotation empty", Annotation{}},
		{"rank observed", RankObserved{Fleet: FleetContext, Key: "conv-1", Epoch: MakeEpoch(7, 3), Rank: 5}},
		{"rank observed max", RankObserved{Fleet: FleetGeneration, Key: "k", Epoch: math.MaxUint64, Rank: math.MaxUint32}},
		{"instance drain", InstanceDrain{Instance: "ctx-0", Drain: true, Source: "admin via edge-1"}},
		{"instance undrain", InstanceDrain{Instance: "ctx-0"}},
	}
}

func TestEventRoundTrip(t *testing.T) {
	for _, tc := range codecCases() {
		t.Run(tc.name, func(t *testing.T) {
			b, err := EncodeEvent(tc.ev)
			if err != nil {
				t.Fatalf("EncodeEvent: %v", err)
			}
			if EventType(b[0]) != tc.ev.Type() || b[1] != payloadVersion {
				t.Fatalf("header = %#x %d, want type %#x version %d", b[0], b[1], uint8(tc.ev.Type()), payloadVersion)
			}
			got, err := DecodeEvent(b)
			if err != nil {
				t.Fatalf("DecodeEvent: %v", err)
			}
			if !reflect.DeepEqual(normalizeEvent(got), normalizeEvent(tc.ev)) {
				t.Fatalf("round trip mismatch:\n got %+v\nwant %+v", got, tc.ev)
			}
			// The pointer form encodes identically.
			pb, err := EncodeEvent(pointerTo(tc.ev))
			if err != nil || !bytes.Equal(pb, b) {
				t.Fatalf("pointer form encodes differently (err %v)", err)
			}
			// Every strict prefix is an error, never a panic.
			for cut := 0; cut < len(b); cut += 1 + len(b)/200 {
				if _, err := DecodeEvent(b[:cut]); err == nil {
					t.Fatalf("prefix of %d/%d bytes decoded without error", cut, len(b))
				}
			}
			// Trailing bytes at the same version are corruption.
			var de *DecodeError
			if _, err := DecodeEvent(append(append([]byte{}, b...), 0)); !errors.As(err, &de) {
				t.Fatalf("trailing byte: err = %v, want *DecodeError", err)
			}
		})
	}
}

// normalizeEvent maps nil and empty slices to the same value so DeepEqual
// compares content.
func normalizeEvent(ev Event) Event {
	switch e := ev.(type) {
	case Bind:
		if len(e.Decision.Candidates) == 0 {
			e.Decision.Candidates = nil
		}
		return e
	case Overflow:
		if len(e.Decision.Candidates) == 0 {
			e.Decision.Candidates = nil
		}
		return e
	case Touch:
		if len(e.Keys) == 0 {
			e.Keys = nil
		}
		if len(e.Links) == 0 {
			e.Links = nil
		}
		return e
	}
	return ev
}

func pointerTo(ev Event) Event {
	v := reflect.New(reflect.TypeOf(ev))
	v.Elem().Set(reflect.ValueOf(ev))
	return v.Interface().(Event)
}

func TestEncodeEventRejectsOversizeAndForeign(t *testing.T) {
	tooLong := strings.Repeat("x", MaxFieldBytes+1)
	if _, err := EncodeEvent(Bind{Fleet: FleetContext, Key: tooLong, Instance: "i"}); err == nil || !strings.Contains(err.Error(), "Key") {
		t.Fatalf("oversize key: err = %v, want one naming Key", err)
	}
	cands := make([]Candidate, MaxCandidates+1)
	if _, err := EncodeEvent(Bind{Fleet: FleetContext, Key: "k", Instance: "i", Decision: Decision{Candidates: cands}}); err == nil || !strings.Contains(err.Error(), "candidates") {
		t.Fatalf("too many candidates: err = %v", err)
	}
	if _, err := EncodeEvent(nil); err == nil {
		t.Fatal("nil event encoded")
	}
	if _, err := EncodeEvent((*Bind)(nil)); err == nil {
		t.Fatal("nil *Bind encoded")
	}
	if _, err := EncodeEvent(foreignEvent{}); err == nil || !strings.Contains(err.Error(), "foreignEvent") {
		t.Fatalf("foreign event: err = %v", err)
	}
}

type foreignEvent struct{}

func (foreignEvent) Type() EventType { return 0x33 }

func TestDecodeEventErrors(t *testing.T) {
	var de *DecodeError
	if _, err := DecodeEvent(nil); !errors.As(err, &de) {
		t.Fatalf("empty input: err = %v, want *DecodeError", err)
	}
	var ue *UnknownEventError
	if _, err := DecodeEvent([]byte{0x0c, 1}); !errors.As(err, &ue) || ue.Type != 0x0c || ue.Index != 0 {
		t.Fatalf("unknown type: err = %v, want *UnknownEventError{0x0c, 0}", err)
	}
	if _, err := DecodeEvent([]byte{byte(TypeSettings), 0, 5}); !errors.As(err, &de) || !strings.Contains(err.Error(), "version 0") {
		t.Fatalf("version 0: err = %v", err)
	}
	// A string length beyond the limit is refused before any allocation.
	huge := appendUvarint([]byte{byte(TypeAnnotation), 1}, MaxFieldBytes+1)
	if _, err := DecodeEvent(huge); !errors.As(err, &de) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversize length: err = %v", err)
	}
	// A candidate count beyond MaxCandidates.
	b := []byte{byte(TypeBind), 1, 1, 1, 'k', 0, 1, 'i', 0, 0, 0, MaxCandidates + 1}
	if _, err := DecodeEvent(b); !errors.As(err, &de) || !strings.Contains(err.Error(), "candidates") {
		t.Fatalf("too many candidates: err = %v", err)
	}
	// A touch key count larger than the input could hold.
	b = appendUvarint([]byte{byte(TypeTouch), 1}, 1<<40)
	if _, err := DecodeEvent(b); !errors.As(err, &de) || !strings.Contains(err.Error(), "count") {
		t.Fatalf("huge count: err = %v", err)
	}
	// A boolean that is neither 0 nor 1.
	ob, _ := EncodeEvent(Overflow{Fleet: FleetContext, Key: "k", From: "a", To: "b", Reason: OverflowSaturated})
	ob[2+1+2+2+2+1] = 7
	if _, err := DecodeEvent(ob); !errors.As(err, &de) || !strings.Contains(err.Error(), "boolean") {
		t.Fatalf("bad boolean: err = %v", err)
	}
}

func TestUnknownEventErrorMessage(t *testing.T) {
	msg := (&UnknownEventError{Type: 0x0c, Index: 42}).Error()
	for _, want := range []string{"log entry 42", "0x0c", fmt.Sprintf("feature level %d", FeatureLevelMax), "upgrade"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not mention %q", msg, want)
		}
	}
}

// A newer payload version with fields appended decodes into the known fields.
func TestForwardCompatibleHigherVersion(t *testing.T) {
	for _, tc := range codecCases() {
		b, err := EncodeEvent(tc.ev)
		if err != nil {
			t.Fatal(err)
		}
		newer := append([]byte{}, b...)
		newer[1] = payloadVersion + 1
		newer = appendString(newer, "a field added at a later feature level")
		newer = appendUvarint(newer, 123456)
		got, err := DecodeEvent(newer)
		if err != nil {
			t.Fatalf("%s: newer version: %v", tc.name, err)
		}
		if !reflect.DeepEqual(normalizeEvent(got), normalizeEvent(tc.ev)) {
			t.Fatalf("%s: newer version decoded to %+v, want %+v", tc.name, got, tc.ev)
		}
	}
}

func TestEntryRoundTrip(t *testing.T) {
	var props []Proposal
	for i, tc := range codecCases() {
		props = append(props, Proposal{ID: ProposalID{byte(i), 0xAB}, Event: tc.ev})
	}
	data, err := EncodeEntry(props)
	if err != nil {
		t.Fatal(err)
	}
	// Splice in an unknown optional and an unknown required event.
	data = appendRawProposal(t, data, ProposalID{0xEE}, []byte{0x80 | 0x33, 1, 9, 9})
	data = appendRawProposal(t, data, ProposalID{0xEF}, []byte{0x33, 1})
	raws, err := DecodeEntry(data)
	if err != nil {
		t.Fatalf("DecodeEntry: %v", err)
	}
	if len(raws) != len(props)+2 {
		t.Fatalf("decoded %d proposals, want %d", len(raws), len(props)+2)
	}
	for i, p := range props {
		if raws[i].ID != p.ID || raws[i].Type != p.Event.Type() {
			t.Fatalf("proposal %d: id/type mismatch", i)
		}
		if !reflect.DeepEqual(normalizeEvent(raws[i].Event), normalizeEvent(p.Event)) {
			t.Fatalf("proposal %d: event mismatch", i)
		}
		enc, _ := EncodeEvent(p.Event)
		if !bytes.Equal(raws[i].Raw, enc) {
			t.Fatalf("proposal %d: Raw is not the encoded event", i)
		}
	}
	for _, u := range raws[len(props):] {
		if u.Event != nil || u.Type&0x7f != 0x33 || len(u.Raw) == 0 {
			t.Fatalf("unknown proposal decoded as %+v", u)
		}
	}
	// Truncations and corruptions are errors, not panics.
	for cut := 0; cut < len(data); cut += 1 + len(data)/300 {
		if _, err := DecodeEntry(data[:cut]); err == nil {
			t.Fatalf("prefix %d/%d decoded without error", cut, len(data))
		}
	}
	var de *DecodeError
	if _, err := DecodeEntry(append(append([]byte{}, data...), 1)); !errors.As(err, &de) {
		t.Fatalf("trailing bytes: err = %v", err)
	}
	if _, err := DecodeEntry([]byte{9, 0}); !errors.As(err, &de) || !strings.Contains(err.Error(), "envelope version 9") {
		t.Fatalf("bad version: err = %v", err)
	}
}

// appendRawProposal adds an already encoded event to an encoded entry,
// fixing up the count (which must stay a one-byte varint here).
func appendRawProposal(t *testing.T, entry []byte, id ProposalID, ev []byte) []byte {
	t.Helper()
	if entry[1] >= 0x7f {
		t.Fatal("test entry too large for the one-byte count fix-up")
	}
	out := append([]byte{}, entry...)
	out[1]++
	out = append(out, id[:]...)
	out = appendUvarint(out, uint64(len(ev)))
	return append(out, ev...)
}

func TestDecodeGarbageNeverPanics(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 512)
	for i := 0; i < 20000; i++ {
		n := rng.IntN(len(buf))
		for j := 0; j < n; j++ {
			buf[j] = byte(rng.Uint32())
		}
		if rng.IntN(2) == 0 && n > 1 {
			buf[0] = entryVersion
		}
		_, _ = DecodeEntry(buf[:n])
		_, _ = DecodeEvent(buf[:n])
		_, _ = DecodeResults(buf[:n])
	}
}

func TestResultsRoundTrip(t *testing.T) {
	rs := []Result{
		{Status: StatusApplied, Created: true, Found: true, Binding: Binding{
			Fleet: FleetContext, Key: "k", ConversationID: "c", Instance: "ctx-1", Epoch: 9,
			BoundAt: -5, LastUsed: 1 << 60, Decision: sampleDecision()},
			Evicted: []Evicted{{Fleet: FleetGeneration, Key: "old", Instance: "g", Epoch: 3, Reason: EvictCapacity}}},
		{Status: StatusRejected, Reason: `instance "ctx-9" is down`},
		{Status: StatusDuplicate},
		{Status: StatusSkipped},
	}
	got, err := DecodeResults(EncodeResults(rs))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rs) {
		t.Fatalf("results round trip:\n got %+v\nwant %+v", got, rs)
	}
	if got, err := DecodeResults(EncodeResults(nil)); err != nil || len(got) != 0 {
		t.Fatalf("empty results: %v %v", got, err)
	}
	enc := EncodeResults(rs)
	for cut := 0; cut < len(enc); cut++ {
		if _, err := DecodeResults(enc[:cut]); err == nil {
			t.Fatalf("results prefix %d/%d decoded", cut, len(enc))
		}
	}
}

func TestEventKeys(t *testing.T) {
	cases := []struct {
		ev   Event
		want []FleetKey
	}{
		{Bind{Fleet: FleetContext, Key: "a"}, []FleetKey{{FleetContext, "a"}}},
		{&Evict{Fleet: FleetGeneration, Key: "b"}, []FleetKey{{FleetGeneration, "b"}}},
		{Overflow{Fleet: FleetContext, Key: "c"}, []FleetKey{{FleetContext, "c"}}},
		{Touch{Keys: []FleetKey{{FleetContext, "x"}, {FleetGeneration, "y"}}, Links: []string{"z"}}, []FleetKey{{FleetContext, "x"}, {FleetGeneration, "y"}}},
		{Link{Child: "c", Parent: "p", Root: "p"}, nil},
		{Settings{MaxBindings: 3}, nil},
		{nil, nil},
	}
	for _, tc := range cases {
		if got := EventKeys(tc.ev); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("EventKeys(%#v) = %v, want %v", tc.ev, got, tc.want)
		}
	}
}
