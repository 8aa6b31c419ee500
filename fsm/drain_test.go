package fsm

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func instanceRec(t *testing.T, s *State, id string) Instance {
	t.Helper()
	in, ok := s.Instance(id)
	if !ok {
		t.Fatalf("no record of %s", id)
	}
	return in
}

// An operator's drain is a mark on the instance record that the leader's
// telemetry-driven InstanceState events keep (up, draining, down and up
// again), that evicts nothing and refuses no bind, and that only an
// undrain or the record's removal ends.
func TestInstanceDrainSurvivesInstanceStates(t *testing.T) {
	h := newHarness(t)
	h.one(1, ClusterFeatures{Level: FeatureLevelDrain})
	wantStatus(t, "drain of an unknown instance", h.one(2, InstanceDrain{Instance: "ctx-1", Drain: true}), StatusRejected)
	wantStatus(t, "drain without an id", h.one(3, InstanceDrain{Drain: true}), StatusRejected)
	up := InstanceState{Instance: "ctx-1", Fleet: FleetContext, URL: "http://a", Status: InstanceUp, Version: "v", FeatureLevel: 3, Ranks: 2}
	h.one(4, up)
	h.one(5, bindEv(FleetContext, "k", "ctx-1"))
	before := h.m.State().Hash()

	wantStatus(t, "drain", h.one(10, InstanceDrain{Instance: "ctx-1", Drain: true, Source: "test"}), StatusApplied)
	in := instanceRec(t, h.m.State(), "ctx-1")
	if !in.Drained || in.DrainedSince != 10 || in.Status != InstanceUp || in.TakesNewKeys() {
		t.Fatalf("after the drain: %+v", in)
	}
	if h.m.State().Hash() == before {
		t.Fatal("the drain is not part of the state hash")
	}
	if _, ok := h.m.State().Lookup(FleetContext, "k"); !ok || h.m.State().BindingCount(FleetContext, "ctx-1") != 1 {
		t.Fatal("the drain evicted a binding; its keys move on their next turns")
	}
	// The log does not second-guess a committed placement.
	wantStatus(t, "bind to a drained instance", h.one(11, bindEv(FleetContext, "k2", "ctx-1")), StatusApplied)
	wantStatus(t, "drain again", h.one(12, InstanceDrain{Instance: "ctx-1", Drain: true}), StatusApplied)
	if in := instanceRec(t, h.m.State(), "ctx-1"); in.DrainedSince != 10 {
		t.Fatalf("a second drain moved DrainedSince to %d", in.DrainedSince)
	}

	// What the leader proposes from telemetry leaves the mark alone.
	for i, st := range []InstanceStatus{InstanceUp, InstanceDraining, InstanceDown, InstanceUp} {
		ev := up
		ev.Status, ev.URL = st, "http://b"
		wantStatus(t, st.String(), h.one(int64(20+i), ev), StatusApplied)
		in := instanceRec(t, h.m.State(), "ctx-1")
		if !in.Drained || in.DrainedSince != 10 || in.Status != st || in.URL != "http://b" {
			t.Fatalf("after InstanceState %s: %+v", st, in)
		}
	}

	// An undrain ends the operator's mark only: a worker that reported
	// itself draining stays draining.
	ev := up
	ev.Status = InstanceDraining
	h.one(29, ev)
	wantStatus(t, "undrain", h.one(30, InstanceDrain{Instance: "ctx-1"}), StatusApplied)
	if in := instanceRec(t, h.m.State(), "ctx-1"); in.Drained || in.DrainedSince != 0 || in.Status != InstanceDraining || in.TakesNewKeys() {
		t.Fatalf("after the undrain of a draining worker: %+v", in)
	}
	h.one(31, up)
	if in := instanceRec(t, h.m.State(), "ctx-1"); !in.TakesNewKeys() {
		t.Fatalf("undrained and up: %+v", in)
	}

	// Removal deletes the record and the mark with it: an instance that
	// comes back under the same id is not drained.
	h.one(40, InstanceDrain{Instance: "ctx-1", Drain: true})
	h.one(41, InstanceState{Instance: "ctx-1", Status: InstanceRemoved})
	h.one(42, up)
	if in := instanceRec(t, h.m.State(), "ctx-1"); in.Drained {
		t.Fatalf("a removed instance's drain came back: %+v", in)
	}
}

// Draining and undraining leaves the state as if neither happened (the
// instance digest carries the mark only while it is set), so a level-3
// state without a drain hashes as a level-2 build's would.
func TestUndrainRestoresTheHash(t *testing.T) {
	a, b := newHarness(t), newHarness(t)
	up := InstanceState{Instance: "ctx-1", Fleet: FleetContext, Status: InstanceUp}
	for _, h := range []*harness{a, b} {
		h.one(1, up)
	}
	a.one(2, InstanceDrain{Instance: "ctx-1", Drain: true})
	a.one(3, InstanceDrain{Instance: "ctx-1"})
	b.one(2, Annotation{Source: "t"})
	b.one(3, Annotation{Source: "t"})
	if a.m.State().Hash() != b.m.State().Hash() {
		t.Fatal("drain then undrain left a trace in the state hash")
	}
}

// A drained instance needs snapshot format 3, which keeps the mark and
// its time; a state below level 3 without one is still written as before.
func TestDrainSnapshot(t *testing.T) {
	h := newHarness(t)
	h.one(1, ClusterFeatures{Level: FeatureLevelRanks})
	h.one(2, InstanceState{Instance: "ctx-1", Fleet: FleetContext, Status: InstanceUp})
	h.one(3, InstanceState{Instance: "ctx-2", Fleet: FleetContext, Status: InstanceUp})
	format := func() byte {
		var buf bytes.Buffer
		if err := h.m.State().WriteSnapshot(&buf); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()[len(snapshotMagic)]
	}
	if v := format(); v != 2 {
		t.Fatalf("a level-2 state without drains written in format %d, want 2", v)
	}
	h.one(7, InstanceDrain{Instance: "ctx-2", Drain: true})
	if v := format(); v != 3 {
		t.Fatalf("a state with a drained instance written in format %d, want 3", v)
	}
	var buf bytes.Buffer
	if err := h.m.State().WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	raw := append([]byte(nil), buf.Bytes()...)
	back, err := ReadSnapshot(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if in := instanceRec(t, back, "ctx-2"); !in.Drained || in.DrainedSince != 7 {
		t.Fatalf("restored ctx-2: %+v", in)
	}
	if in := instanceRec(t, back, "ctx-1"); in.Drained {
		t.Fatalf("restored ctx-1: %+v", in)
	}
	if back.Hash() != h.m.State().Hash() {
		t.Fatal("restored hash differs")
	}
	h.one(8, ClusterFeatures{Level: FeatureLevelDrain})
	h.one(9, InstanceDrain{Instance: "ctx-2"})
	if v := format(); v != 3 {
		t.Fatalf("a level-3 state written in format %d, want 3", v)
	}
}

// A machine capped at level 2 behaves as the level-2 release: an
// InstanceDrain halts it with the upgrade message before anything in the
// entry applies, as does ClusterFeatures 3; it refuses a level-3 snapshot.
func TestMachineCappedAtLevel2(t *testing.T) {
	setup := func(t *testing.T) (capped, full *Machine) {
		capped, full = NewMachineWithOptions(Options{MaxFeatureLevel: FeatureLevelRanks}), NewMachine()
		data := plainEntry(t, InstanceState{Instance: "ctx-1", Fleet: FleetContext, Status: InstanceUp})
		for _, m := range []*Machine{capped, full} {
			if _, err := m.Apply(Entry{Index: 1, Time: 1, Data: data}); err != nil {
				t.Fatal(err)
			}
		}
		return capped, full
	}
	t.Run("InstanceDrain", func(t *testing.T) {
		capped, full := setup(t)
		data := plainEntry(t, bindEv(FleetContext, "k", "ctx-1"), InstanceDrain{Instance: "ctx-1", Drain: true})
		before := capped.State()
		_, err := capped.Apply(Entry{Index: 2, Time: 2, Data: data})
		var ue *UnknownEventError
		if !errors.As(err, &ue) || ue.Type != TypeInstanceDrain {
			t.Fatalf("capped machine: %v, want *UnknownEventError for InstanceDrain", err)
		}
		for _, want := range []string{"log entry 2", "InstanceDrain", "feature level 3", "understands feature level 2", "upgrade"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("message %q lacks %q", err, want)
			}
		}
		if capped.State() != before || capped.Halted() == nil {
			t.Fatal("the capped machine changed its state or did not halt")
		}
		if rs, err := full.Apply(Entry{Index: 2, Time: 2, Data: data}); err != nil || rs[1].Status != StatusApplied {
			t.Fatalf("uncapped machine: %v %+v", err, rs)
		}
	})
	t.Run("ClusterFeatures 3", func(t *testing.T) {
		capped, full := setup(t)
		data := plainEntry(t, ClusterFeatures{Level: FeatureLevelDrain}, InstanceDrain{Instance: "ctx-1", Drain: true})
		_, err := capped.Apply(Entry{Index: 2, Time: 2, Data: data})
		var fe *FeatureLevelError
		if !errors.As(err, &fe) || fe.Level != FeatureLevelDrain || fe.NodeLevel != FeatureLevelRanks || capped.Halted() == nil {
			t.Fatalf("capped machine: %v, want *FeatureLevelError (3 over 2)", err)
		}
		if _, err := full.Apply(Entry{Index: 2, Time: 2, Data: data}); err != nil || full.State().FeatureLevel() != FeatureLevelDrain {
			t.Fatalf("uncapped machine: %v, level %d", err, full.State().FeatureLevel())
		}
		var buf bytes.Buffer
		if err := full.State().WriteSnapshot(&buf); err != nil {
			t.Fatal(err)
		}
		if err := NewMachineWithOptions(Options{MaxFeatureLevel: FeatureLevelRanks}).Restore(&buf); err == nil || !strings.Contains(err.Error(), "upgrade") {
			t.Fatalf("capped restore of a level-3 state: %v", err)
		}
	})
}

// Unknown instance flag bits in a format-3 snapshot are refused, not
// ignored.
func TestDrainSnapshotUnknownFlags(t *testing.T) {
	h := newHarness(t)
	h.one(1, ClusterFeatures{Level: FeatureLevelDrain})
	h.one(2, InstanceState{Instance: "i", Fleet: FleetContext, Status: InstanceUp})
	var buf bytes.Buffer
	if err := h.m.State().WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	body, ok := singleChunkBody(buf.Bytes())
	if !ok {
		t.Fatal("not a single-chunk snapshot")
	}
	in := instanceRec(t, h.m.State(), "i")
	rec := appendInstance(nil, &in)
	at := bytes.Index(body, append(rec, 0)) // the record and its flags byte
	if at < 0 {
		t.Fatal("the instance record with its flags byte is not in the snapshot")
	}
	bad := append([]byte(nil), body...)
	bad[at+len(rec)] = 0x80
	_, err := ReadSnapshot(bytes.NewReader(frameSnapshotBodyVersion(bad, snapshotVersion)))
	var se *SnapshotError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "unknown flag bits 0x80") {
		t.Fatalf("ReadSnapshot: %v, want unknown flag bits", err)
	}
}
