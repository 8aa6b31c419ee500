package fsm

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestEveryKindIsComplete checks each row of the event-type table: the
// type's name and level, a round trip through the codec in value and
// pointer form, and a JSON description of its own (not the unknown-type
// shape).
func TestEveryKindIsComplete(t *testing.T) {
	samples := []Event{
		Bind{Fleet: FleetContext, Key: "k", Instance: "i", Decision: Decision{Edge: "e", Candidates: []Candidate{{Instance: "i", Score: 1}}}},
		Touch{Keys: []FleetKey{{Fleet: FleetContext, Key: "k"}}, Links: []string{"c"}},
		Evict{Fleet: FleetContext, Key: "k", Reason: EvictTTL, Epoch: 3, IdleBefore: 7},
		Overflow{Fleet: FleetGeneration, Key: "k", From: "a", To: "b", Reason: OverflowSaturated, Rebind: true},
		InstanceState{Instance: "i", Fleet: FleetContext, Status: InstanceUp, Ranks: 2},
		ClusterFeatures{Level: 2},
		Link{Child: "c", Parent: "p", Root: "p", Depth: 1},
		NodeInfo{NodeID: "n", Version: "v", MaxFeatureLevel: 2},
		Settings{MaxBindings: 10},
		Annotation{Source: "s", Text: "t"},
		RankObserved{Fleet: FleetContext, Key: "k", Epoch: 3, Rank: 1},
		InstanceDrain{Instance: "i", Drain: true, Source: "operator"},
		Evidence{Fleet: FleetContext, Key: "k", RequestID: "r", Rule: "kv_aware", Candidates: []EvidenceCandidate{{Instance: "i", CachedBlocks: 2, Flags: EvidenceChosen}}},
		CacheAnswers{Edge: "e", Answers: []CacheAnswer{{Fleet: FleetContext, Instance: "i", Source: KVSourceShadow, BlockSize: 16, PromptTokens: 40, PredictedTokens: 32, Prefix: []uint32{1, 2}}}},
	}
	if len(samples) != len(kinds) {
		t.Fatalf("%d samples for %d kinds: add a sample for the new event type", len(samples), len(kinds))
	}
	for i, ev := range samples {
		k := kinds[i]
		if k.typ != ev.Type() || k.name != ev.Type().String() || k.level == 0 || ev.Type().Level() != k.level {
			t.Errorf("kind %d: type %v name %q level %d, sample %T", i, k.typ, k.name, k.level, ev)
		}
		b, err := EncodeEvent(ev)
		if err != nil {
			t.Fatalf("%v: %v", k.name, err)
		}
		got, err := DecodeEvent(b)
		if err != nil || got.Type() != ev.Type() {
			t.Fatalf("%v: decode = %v, %v", k.name, got, err)
		}
		if keys := EventKeys(got); len(keys) > 0 && (keys[0].Key != "k" || keys[0].Fleet == 0) {
			t.Errorf("%v: keys %v", k.name, keys)
		}
		js, err := json.Marshal(Describe(RawProposal{Type: ev.Type(), Event: got, Raw: b}))
		if err != nil || strings.Contains(string(js), "type_byte") {
			t.Errorf("%v: described as %s (%v)", k.name, js, err)
		}
	}
}

func TestEncodePointerForms(t *testing.T) {
	b1, err := EncodeEvent(Link{Child: "c", Parent: "p", Root: "p"})
	if err != nil {
		t.Fatal(err)
	}
	b2, err := EncodeEvent(&Link{Child: "c", Parent: "p", Root: "p"})
	if err != nil || string(b1) != string(b2) {
		t.Fatalf("pointer form: %x, %v; value form %x", b2, err, b1)
	}
	var nilLink *Link
	if _, err := EncodeEvent(nilLink); err == nil || !strings.Contains(err.Error(), "nil *fsm.Link") {
		t.Errorf("nil pointer: %v", err)
	}
	if _, err := EncodeEvent(nil); err == nil {
		t.Error("nil event encoded")
	}
	if keys := EventKeys(&RankObserved{Fleet: FleetContext, Key: "k"}); len(keys) != 1 {
		t.Errorf("keys of a pointer event: %v", keys)
	}
}

// Evidence describes its key, rule and candidates, each candidate's flags
// by name; applied, it changes no state.
func TestDescribeEvidence(t *testing.T) {
	ev := Evidence{Fleet: FleetGeneration, Key: "k", RequestID: "r", Rule: "overflow:saturated", Candidates: []EvidenceCandidate{
		{Instance: "a", CachedBlocks: 3, LoadTokens: 40, QueuedRequests: 2, Flags: EvidenceChosen},
		{Instance: "b", Flags: EvidenceBound | EvidenceBreakerOpen},
	}}
	js, err := json.Marshal(Describe(RawProposal{Type: ev.Type(), Event: ev}))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"fleet":"generation","key":"k","request_id":"r","rule":"overflow:saturated","candidates":[` +
		`{"instance":"a","cached_blocks":3,"load_tokens":40,"queued_requests":2,"state":["chosen"]},` +
		`{"instance":"b","cached_blocks":0,"load_tokens":0,"queued_requests":0,"state":["bound","breaker_open"]}]}`
	if string(js) != want {
		t.Errorf("got  %s\nwant %s", js, want)
	}
	if !TypeEvidence.Optional() || TypeEvidence.String() != "Evidence" {
		t.Errorf("type %v optional %v", TypeEvidence, TypeEvidence.Optional())
	}
	var tx txn
	if r := tx.evidence(ev); r.Status != StatusApplied {
		t.Errorf("apply: %+v", r)
	}
}

func TestDescribeUnknownType(t *testing.T) {
	js, _ := json.Marshal(Describe(RawProposal{Type: FlagIgnoreUnknown | 0x7f, Raw: []byte{0xff, 1}}))
	if want := `{"type_byte":255,"optional":true,"raw_hex":"ff01"}`; string(js) != want {
		t.Errorf("got %s, want %s", js, want)
	}
}
