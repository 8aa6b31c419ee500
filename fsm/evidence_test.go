package fsm

import (
	"reflect"
	"strings"
	"testing"
)

// Evidence round-trips, is optional (a build without it skips it) and is
// bounded like a Decision.
func TestEvidenceCodec(t *testing.T) {
	ev := Evidence{Fleet: FleetContext, Key: "k", RequestID: "r-1", Rule: "kv_aware", Candidates: []EvidenceCandidate{
		{Instance: "ctx-1", CachedBlocks: 4, LoadTokens: 300, QueuedRequests: 1, Flags: EvidenceChosen | EvidenceBound},
		{Instance: "ctx-2", Flags: EvidenceBreakerOpen},
	}}
	b, err := EncodeEvent(ev)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeEvent(b)
	if err != nil || !reflect.DeepEqual(back, ev) {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	if !TypeEvidence.Optional() {
		t.Fatal("Evidence must be optional: older builds skip it")
	}
	if keys := EventKeys(ev); len(keys) != 1 || keys[0] != (FleetKey{Fleet: FleetContext, Key: "k"}) {
		t.Fatalf("EventKeys: %v", keys)
	}
	ev.Candidates = make([]EvidenceCandidate, MaxCandidates+1)
	if _, err := EncodeEvent(ev); err == nil || !strings.Contains(err.Error(), "candidates") {
		t.Fatalf("too many candidates: %v", err)
	}
}
