package archive

import (
	"testing"

	"github.com/tether-project/tether/fsm"
)

func TestKeyEvents(t *testing.T) {
	k := fsm.FleetKey{Fleet: fsm.FleetContext, Key: "k"}
	recs := []Record{
		{Index: 1, Time: 10, Data: entry(t, fsm.Bind{Fleet: k.Fleet, Key: k.Key, Instance: "a"}, fsm.Bind{Fleet: k.Fleet, Key: "other", Instance: "a"}),
			Outcomes: []Outcome{{Status: fsm.StatusApplied, Epoch: 1}, {Status: fsm.StatusApplied}}},
		// An instance going down evicts the key without naming it.
		{Index: 2, Time: 20, Data: entry(t, fsm.InstanceState{Instance: "a", Fleet: fsm.FleetContext, Status: fsm.InstanceDown}),
			Outcomes: []Outcome{{Status: fsm.StatusApplied, Evicted: []fsm.Evicted{
				{Fleet: k.Fleet, Key: "other", Instance: "a"}, {Fleet: k.Fleet, Key: k.Key, Instance: "a", Epoch: 1}}}}},
		{Index: 3, Time: 30, Data: []byte{9, 9}},
		// The generation fleet's key of the same name is another binding.
		{Index: 4, Time: 40, Data: entry(t, fsm.Touch{Keys: []fsm.FleetKey{{Fleet: fsm.FleetGeneration, Key: k.Key}}})},
	}
	got := KeyEvents(recs, k.Fleet, k.Key)
	if len(got) != 3 {
		t.Fatalf("%d events, want 3: %+v", len(got), got)
	}
	if e := got[0]; e.Index != 1 || !e.Names || e.Evicted != nil || e.Outcome.Epoch != 1 || e.Proposal.Type != fsm.TypeBind {
		t.Errorf("bind: %+v", e)
	}
	if e := got[1]; e.Index != 2 || e.Names || e.Evicted == nil || e.Evicted.Key != k.Key || e.Time != 20 {
		t.Errorf("eviction as an effect: %+v", e)
	}
	if e := got[2]; e.Index != 3 || e.Err == nil {
		t.Errorf("undecodable record: %+v", e)
	}
}
