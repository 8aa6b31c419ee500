package reliability

import (
	"errors"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
)

func entry(t *testing.T, index uint64, at time.Time, evs ...fsm.Event) fsm.Entry {
	t.Helper()
	props := make([]fsm.Proposal, len(evs))
	for i, ev := range evs {
		props[i] = fsm.Proposal{Event: ev}
		props[i].ID[0], props[i].ID[8] = byte(index), byte(i+1) // distinct, deterministic
		props[i].ID[1] = byte(index >> 8)
	}
	data, err := fsm.EncodeEntry(props)
	if err != nil {
		t.Fatal(err)
	}
	return fsm.Entry{Index: index, Time: at.UnixNano(), Data: data}
}

// A node's clock is never an input to the state: time comes from the
// leader's AppendedAt in each entry. When that time jumps (a leader with a
// wrong clock, or a leader change onto one), the state time never goes
// backwards, LastUsed never decreases, and every replica applying the log
// reaches the same hash.
func TestClockJumpsInTheLogDoNotBreakTheState(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	times := []time.Duration{0, time.Second, -time.Hour, 2 * time.Second, 24 * time.Hour, 3 * time.Second, -48 * time.Hour, 4 * time.Second}
	var log []fsm.Entry
	for i, d := range times {
		idx := uint64(i + 1)
		evs := []fsm.Event{
			fsm.Bind{Fleet: fsm.FleetContext, Key: fmt.Sprintf("k%d", i%3), Instance: "w1"},
			fsm.Touch{Keys: []fsm.FleetKey{{Fleet: fsm.FleetContext, Key: "k0"}}},
		}
		log = append(log, entry(t, idx, base.Add(d), evs...))
	}
	a, b := fsm.NewMachine(), fsm.NewMachine()
	var lastTime, lastUsed int64
	for _, e := range log {
		if _, err := a.Apply(e); err != nil {
			t.Fatal(err)
		}
		st := a.State()
		if st.Time() < lastTime {
			t.Fatalf("state time went backwards at index %d: %d < %d", e.Index, st.Time(), lastTime)
		}
		lastTime = st.Time()
		if k0, ok := st.Lookup(fsm.FleetContext, "k0"); ok {
			if k0.LastUsed < lastUsed {
				t.Fatalf("LastUsed went backwards at index %d", e.Index)
			}
			lastUsed = k0.LastUsed
		}
	}
	// The replica applies the same entries in batches.
	if _, err := b.ApplyBatch(log[:3]); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ApplyBatch(log[3:]); err != nil {
		t.Fatal(err)
	}
	if a.State().Hash() != b.State().Hash() {
		t.Fatal("replicas diverged over a log with clock jumps")
	}
	// An idle-eviction computed from a clock that jumped forward is
	// conditional: it cannot remove a binding used after its cutoff.
	k0, _ := a.State().Lookup(fsm.FleetContext, "k0")
	res, err := a.Apply(entry(t, uint64(len(log)+1), base, fsm.Evict{
		Fleet: fsm.FleetContext, Key: "k0", Reason: fsm.EvictTTL, Epoch: k0.Epoch, IdleBefore: k0.LastUsed,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != fsm.StatusConditionFailed {
		t.Fatalf("TTL evict with a cutoff not after last use: %v, want condition_failed", res[0].Status)
	}
}

// Malformed entries halt the machine without changing the state; unknown
// required events name their type; bad events are rejected with a reason.
func TestBadLogEntriesChangeNothing(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fresh := func() *fsm.Machine {
		m := fsm.NewMachine()
		if _, err := m.Apply(entry(t, 1, at, fsm.Bind{Fleet: fsm.FleetContext, Key: "k", Instance: "w1"})); err != nil {
			t.Fatal(err)
		}
		return m
	}
	good := entry(t, 2, at, fsm.Bind{Fleet: fsm.FleetContext, Key: "k2", Instance: "w1"})
	unknownRequired := append([]byte(nil), good.Data...)
	// Envelope: version, count, 16-byte id, length, then the event's type
	// byte: make it an unknown required type (no optional flag).
	unknownRequired[1+1+16+1] = 0x3e
	cases := []struct {
		name string
		data []byte
		want func(error) bool
	}{
		{"empty entry", nil, func(err error) bool { var de *fsm.DecodeError; return errors.As(err, &de) }},
		{"garbage", []byte("this is not an entry"), func(err error) bool { var de *fsm.DecodeError; return errors.As(err, &de) }},
		{"truncated", good.Data[:len(good.Data)-3], func(err error) bool { var de *fsm.DecodeError; return errors.As(err, &de) }},
		{"trailing bytes", append(append([]byte(nil), good.Data...), 0), func(err error) bool { var de *fsm.DecodeError; return errors.As(err, &de) }},
		{"unknown required event", unknownRequired, func(err error) bool { var ue *fsm.UnknownEventError; return errors.As(err, &ue) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := fresh()
			before := m.State().Hash()
			_, err := m.Apply(fsm.Entry{Index: 2, Time: at.UnixNano(), Data: c.data})
			if err == nil || !c.want(err) {
				t.Fatalf("Apply: %v (%T)", err, err)
			}
			if m.State().Hash() != before {
				t.Fatal("a refused entry changed the state")
			}
			if _, err := m.Apply(good); err == nil {
				t.Fatal("the machine kept applying after a halting entry")
			}
			t.Logf("refused: %v", err)
		})
	}
	// Well-formed but invalid events: rejected with a reason, the entry
	// still applies (the log must not halt on a bad proposal).
	m := fresh()
	res, err := m.Apply(entry(t, 2, at,
		fsm.Bind{Fleet: fsm.FleetContext, Key: "", Instance: "w1"},
		fsm.Bind{Fleet: fsm.Fleet(9), Key: "k", Instance: "w1"},
		fsm.Bind{Fleet: fsm.FleetContext, Key: "k3", Instance: ""},
		fsm.Evict{Fleet: fsm.FleetContext, Key: "k", Reason: 0},
	))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Status != fsm.StatusRejected || r.Reason == "" {
			t.Fatalf("event %d: %v %q, want rejected with a reason", i, r.Status, r.Reason)
		}
	}
	if b, ok := m.State().Lookup(fsm.FleetContext, "k"); !ok || b.Instance != "w1" {
		t.Fatal("rejected events changed an existing binding")
	}
	// Replaying an old index is refused without halting.
	if _, err := m.Apply(entry(t, 1, at, fsm.Bind{Fleet: fsm.FleetContext, Key: "x", Instance: "w1"})); err == nil {
		t.Fatal("an entry at an applied index was accepted")
	}
	if err := m.Halted(); err != nil {
		t.Fatalf("a stale index halted the machine: %v", err)
	}
}

// Random bytes never panic the decoder (the fuzz targets do this longer).
func TestRandomEntriesNeverPanic(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for i := range 2000 {
		b := make([]byte, rng.Intn(64))
		rng.Read(b)
		if i%2 == 0 && len(b) > 0 {
			b[0] = 0x01 // valid envelope version: get past the first check
		}
		m := fsm.NewMachine()
		_, _ = m.Apply(fsm.Entry{Index: 1, Time: 1, Data: b})
	}
}

// (Fleet, Key, Epoch) is documented to name one placement for life, and
// Evict{Epoch} relies on it. A batched entry that binds, evicts and binds
// the same key again gave both placements the entry's index as epoch (the
// linearizability runs saw two instances for one epoch).
// Fixed at fsm feature level 2: each placement's epoch carries its
// position in the entry.
func TestEpochNamesOnePlacement(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := fsm.NewMachine()
	if _, err := m.Apply(entry(t, 1, at, fsm.ClusterFeatures{Level: fsm.FeatureLevelMax})); err != nil {
		t.Fatal(err)
	}
	res, err := m.Apply(entry(t, 2, at,
		fsm.Bind{Fleet: fsm.FleetContext, Key: "k", Instance: "a"},
		fsm.Evict{Fleet: fsm.FleetContext, Key: "k", Reason: fsm.EvictAdmin},
		fsm.Bind{Fleet: fsm.FleetContext, Key: "k", Instance: "b"},
	))
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Binding.Epoch == res[2].Binding.Epoch {
		t.Fatalf("placements on %s and %s share epoch %d", res[0].Binding.Instance, res[2].Binding.Instance, res[0].Binding.Epoch)
	}
	// The eviction meant for the first placement must not remove the second.
	res, err = m.Apply(entry(t, 3, at, fsm.Evict{Fleet: fsm.FleetContext, Key: "k", Reason: fsm.EvictKVEvicted, Epoch: res[0].Binding.Epoch}))
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := m.State().Lookup(fsm.FleetContext, "k"); res[0].Status != fsm.StatusConditionFailed || !ok || b.Instance != "b" {
		t.Fatalf("a stale epoch-conditional evict: status %v, binding %+v %v", res[0].Status, b, ok)
	}
}
