package fsm

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func sampleAnswers() CacheAnswers {
	return CacheAnswers{Edge: "edge-1", Answers: []CacheAnswer{
		{Fleet: FleetContext, Instance: "w1", ConversationID: "conv-a", Source: KVSourceEngineEvents, AtUnixMilli: 1_700_000_000_123,
			BlockSize: 16, PromptTokens: 1000, PredictedTokens: 992, CachedTokens: 976, Blocks: 62, Prefix: []uint32{7, 8, 0xffffffff}},
		{Fleet: FleetGeneration, Instance: "w2", Source: KVSourcePredictionsOnly, AtUnixMilli: -5, BlockSize: 64, PromptTokens: 10},
	}}
}

func TestCacheAnswersRoundTrip(t *testing.T) {
	ev := sampleAnswers()
	b, err := EncodeEvent(ev)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeEvent(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ev) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, ev)
	}
	js, err := json.Marshal(Describe(RawProposal{Type: ev.Type(), Event: got, Raw: b}))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"source":"engine_events"`, `"predicted_tokens":992`, `"cached_tokens":976`, `"blocks":62,"prefix":[7,8,4294967295]`,
		`"source":"predictions_only"`, `"prefix":[]`, `"edge":"edge-1"`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("description %s lacks %s", js, want)
		}
	}
	if !TypeCacheAnswers.Optional() || TypeCacheAnswers.String() != "CacheAnswers" {
		t.Errorf("type %v optional %v", TypeCacheAnswers, TypeCacheAnswers.Optional())
	}
}

func TestCacheAnswersRefusesWhatItCannotHold(t *testing.T) {
	ev := CacheAnswers{Answers: make([]CacheAnswer, MaxCacheAnswers+1)}
	if _, err := EncodeEvent(ev); err == nil || !strings.Contains(err.Error(), "answers") {
		t.Fatalf("too many answers: %v", err)
	}
	ev = CacheAnswers{Answers: []CacheAnswer{{Prefix: make([]uint32, MaxAnswerPrefix+1)}}}
	if _, err := EncodeEvent(ev); err == nil || !strings.Contains(err.Error(), "prefix") {
		t.Fatalf("too many fingerprints: %v", err)
	}
	// Every truncation of a valid encoding is an error, never a panic.
	b, err := EncodeEvent(sampleAnswers())
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < len(b); n++ {
		if _, err := DecodeEvent(b[:n]); err == nil {
			t.Fatalf("truncated to %d of %d bytes: decoded", n, len(b))
		}
	}
}

// The event changes no state: a machine applying it has the hash it had.
func TestCacheAnswersChangeNoState(t *testing.T) {
	m := NewMachine()
	data, err := EncodeEntry([]Proposal{{Event: Settings{MaxBindings: 10}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Apply(Entry{Index: 1, Time: 1, Data: data}); err != nil {
		t.Fatal(err)
	}
	data, err = EncodeEntry([]Proposal{{Event: sampleAnswers()}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Apply(Entry{Index: 2, Time: 1, Data: data})
	if err != nil || len(res) != 1 || res[0].Status != StatusApplied {
		t.Fatalf("apply: %v %v", res, err)
	}
	after := m.State()
	// The hash names the index; the rest of the summary is unchanged.
	other := NewMachine()
	data1, _ := EncodeEntry([]Proposal{{Event: Settings{MaxBindings: 10}}})
	if _, err := other.Apply(Entry{Index: 1, Time: 1, Data: data1}); err != nil {
		t.Fatal(err)
	}
	ann, _ := EncodeEntry([]Proposal{{Event: Annotation{Source: "s", Text: "t"}}})
	if _, err := other.Apply(Entry{Index: 2, Time: 1, Data: ann}); err != nil {
		t.Fatal(err)
	}
	if after.Hash() != other.State().Hash() {
		t.Fatal("CacheAnswers changed the state hash (an Annotation at the same index does not)")
	}
}

func TestAnswerPrefixPositions(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want []int
	}{
		{0, nil},
		{1, []int{1}},
		{2, []int{1, 2}},
		{5, []int{1, 2, 3, 4, 5}},
		{13, []int{1, 2, 3, 4, 6, 8, 12, 13}},
		{16, []int{1, 2, 3, 4, 6, 8, 12, 16}},
	} {
		if got := AnswerPrefixPositions(tc.n); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%d blocks: %v, want %v", tc.n, got, tc.want)
		}
	}
	if n := len(AnswerPrefixPositions(1 << 30)); n > MaxAnswerPrefix {
		t.Fatalf("%d positions for 2^30 blocks, over the limit %d", n, MaxAnswerPrefix)
	}
	for _, name := range []string{"engine_events", "tether_worker", "shadow", "predictions_only"} {
		s, err := ParseKVSource(name)
		if err != nil || s.String() != name {
			t.Errorf("%s: %v %v", name, s, err)
		}
	}
	if _, err := ParseKVSource("gossip"); err == nil {
		t.Error("unknown source parsed")
	}
}
