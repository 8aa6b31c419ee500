package fsm

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// level1Log is a deterministic log that uses only level-1 events.
func level1Log() []Entry {
	rng := rand.New(rand.NewPCG(2026, 11))
	key := func() string { return fmt.Sprintf("conv-%d", rng.IntN(30)) }
	inst := func() string { return fmt.Sprintf("inst-%d", rng.IntN(4)) }
	fleet := func() Fleet { return Fleet(1 + rng.IntN(2)) }
	var out []Entry
	now := int64(1_700_000_000_000_000_000)
	var seq uint64
	for i := 0; i < 400; i++ {
		now += int64(rng.IntN(2_000_000_000))
		var props []Proposal
		for j := 1 + rng.IntN(6); j > 0; j-- {
			var ev Event
			switch p := rng.IntN(100); {
			case p < 35:
				ev = Bind{Fleet: fleet(), Key: key(), ConversationID: key(), Instance: inst(),
					Decision: Decision{Edge: "edge-1", Policy: "least_tokens", RequestID: fmt.Sprint(rng.IntN(1000)),
						Candidates: []Candidate{{Instance: inst(), Score: 0.5, CachedTokens: 7}}}}
			case p < 50:
				ev = Touch{Keys: []FleetKey{{Fleet: fleet(), Key: key()}}, Links: []string{key()}}
			case p < 62:
				ev = Evict{Fleet: fleet(), Key: key(), Reason: EvictTTL, Epoch: uint64(rng.IntN(i + 1))}
			case p < 72:
				ev = Overflow{Fleet: fleet(), Key: key(), From: inst(), To: inst(), Reason: OverflowSaturated, Rebind: true}
			case p < 75:
				ev = InstanceState{Instance: inst(), Fleet: fleet(), Status: InstanceStatus(1 + rng.IntN(4)), URL: "http://x"}
			case p < 85:
				ev = Link{Child: key(), Parent: key(), Root: key(), Depth: 1}
			case p < 88:
				ev = Settings{MaxBindings: uint64(20 + rng.IntN(40))}
			case p < 90:
				ev = ClusterFeatures{Level: 1}
			case p < 93:
				ev = NodeInfo{NodeID: fmt.Sprintf("edge-%d", rng.IntN(3)), Version: "v1", MaxFeatureLevel: 1}
			default:
				ev = Annotation{Source: "t", Text: "n"}
			}
			seq++
			var id ProposalID
			id[0], id[1], id[2] = 9, byte(seq), byte(seq>>8)
			props = append(props, Proposal{ID: id, Event: ev})
		}
		data, err := EncodeEntry(props)
		if err != nil {
			panic(err)
		}
		out = append(out, Entry{Index: uint64(i + 1), Time: now, Data: data})
	}
	return out
}

// A log that never commits level 2 must apply exactly as the level-1
// release applied it: same results, same state hash, byte-identical (format
// version 1) snapshot. Otherwise a rolling upgrade would split the cluster
// and replaying an old archive would disagree with what it recorded. The
// golden values were computed by the release before feature level 2 (the
// fsm package at commit d35e4a9) from the same log.
func TestLevel1LogAppliesAsTheLevel1ReleaseDid(t *testing.T) {
	const (
		wantHash     = "b0e5b275ec85cb66b1ae90dd178cff28aaaa3196b75dda6a4790b2d1d7f4f66c"
		wantSnapshot = "02b455ff60c9d10c8187a3f1668788598685ccb6404d81f526b0b0d2dba1b831"
		wantResults  = "240b3999d739662b5467c0b2bba16432f3955bed41d03d7f818483030059b9d1"
	)
	m := NewMachine()
	res := sha256.New()
	for _, e := range level1Log() {
		rs, err := m.Apply(e)
		if err != nil {
			t.Fatal(err)
		}
		res.Write(EncodeResults(rs))
	}
	var buf bytes.Buffer
	if err := m.State().WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	h := m.State().Hash()
	if got := fmt.Sprintf("%x", h); got != wantHash {
		t.Errorf("state hash %s, the level-1 release computed %s", got, wantHash)
	}
	if got := fmt.Sprintf("%x", sha256.Sum256(buf.Bytes())); got != wantSnapshot {
		t.Errorf("snapshot differs from the level-1 release's (sha256 %s, want %s)", got, wantSnapshot)
	}
	if buf.Bytes()[len(snapshotMagic)] != 1 {
		t.Errorf("a level-1 state was written in snapshot format %d, not 1", buf.Bytes()[len(snapshotMagic)])
	}
	if got := fmt.Sprintf("%x", res.Sum(nil)); got != wantResults {
		t.Errorf("encoded results differ from the level-1 release's (sha256 %s, want %s)", got, wantResults)
	}
}

// At level 2 every placement has its own epoch, even when one entry binds,
// evicts and binds a key again, and the epoch leads back to its index.
func TestEpochsAreUniquePerPlacementAtLevel2(t *testing.T) {
	h := newHarness(t)
	h.one(1, ClusterFeatures{Level: FeatureLevelRanks}) // index 1
	rs := h.apply(10,                                   // index 2
		bindEv(FleetContext, "k", "a"),
		Evict{Fleet: FleetContext, Key: "k", Reason: EvictAdmin},
		bindEv(FleetContext, "k", "b"),
	)
	first, second := rs[0].Binding.Epoch, rs[2].Binding.Epoch
	if first == second {
		t.Fatalf("placements on a and b share epoch %d", first)
	}
	if first != MakeEpoch(2, 0) || second != MakeEpoch(2, 2) {
		t.Fatalf("epochs %d, %d; want MakeEpoch(2, 0) = %d and MakeEpoch(2, 2) = %d", first, second, MakeEpoch(2, 0), MakeEpoch(2, 2))
	}
	if rs[1].Evicted[0].Epoch != first {
		t.Fatalf("the eviction names epoch %d, not the first placement's %d", rs[1].Evicted[0].Epoch, first)
	}
	st := h.m.State()
	for _, e := range []uint64{first, second} {
		if EpochIndex(e) != 2 || st.EpochIndex(e) != 2 {
			t.Fatalf("epoch %d: EpochIndex %d, State.EpochIndex %d, want 2", e, EpochIndex(e), st.EpochIndex(e))
		}
	}
	// An eviction meant for the first placement leaves the second alone.
	wantStatus(t, "stale evict", h.one(20, Evict{Fleet: FleetContext, Key: "k", Reason: EvictKVEvicted, Epoch: first}), StatusConditionFailed)
	if b, ok := h.m.State().Lookup(FleetContext, "k"); !ok || b.Instance != "b" {
		t.Fatalf("binding after a stale evict: %+v %v", b, ok)
	}
	// A rebind gets a new epoch too.
	r := h.one(30, Overflow{Fleet: FleetContext, Key: "k", From: "b", To: "c", Reason: OverflowSaturated, Rebind: true})
	if r.Binding.Epoch != MakeEpoch(h.index, 0) {
		t.Fatalf("rebind epoch %d, want %d", r.Binding.Epoch, MakeEpoch(h.index, 0))
	}
	wantStatus(t, "evict of the current placement", h.one(40, Evict{Fleet: FleetContext, Key: "k", Reason: EvictKVEvicted, Epoch: r.Binding.Epoch}), StatusApplied)
}

// Before level 2 an epoch is the entry's index (what level-1 releases
// did), and State.EpochIndex maps both kinds back across the switch.
func TestEpochIndexAcrossTheLevelSwitch(t *testing.T) {
	h := newHarness(t)
	old := h.one(1, bindEv(FleetContext, "old", "a")).Binding.Epoch // index 1
	if old != 1 {
		t.Fatalf("level-1 epoch %d, want the index 1", old)
	}
	// Index 2 commits level 2 in the middle of the entry: binds before it
	// keep index epochs, binds after it get unique ones.
	rs := h.apply(2, bindEv(FleetContext, "before", "a"), ClusterFeatures{Level: 2}, bindEv(FleetContext, "after", "a"))
	before, after := rs[0].Binding.Epoch, rs[2].Binding.Epoch
	if before != 2 || after != MakeEpoch(2, 2) {
		t.Fatalf("epochs in the switching entry: %d and %d, want 2 and %d", before, after, MakeEpoch(2, 2))
	}
	later := h.one(3, bindEv(FleetContext, "later", "a")).Binding.Epoch // index 3
	st := h.m.State()
	for _, c := range []struct {
		epoch, index uint64
	}{{old, 1}, {before, 2}, {after, 2}, {later, 3}} {
		if got := st.EpochIndex(c.epoch); got != c.index {
			t.Errorf("State.EpochIndex(%d) = %d, want %d", c.epoch, got, c.index)
		}
	}
	// A state from before the switch tells "placed after me" correctly for
	// epochs issued later of either kind.
	h1 := newHarness(t)
	h1.one(1, bindEv(FleetContext, "x", "a"))
	early := h1.m.State()
	for _, e := range []uint64{before, after, later} {
		if early.EpochIndex(e) <= early.Index() {
			t.Errorf("a state at index %d places epoch %d at or before itself", early.Index(), e)
		}
	}
	// The start of unique epochs survives a snapshot.
	var buf bytes.Buffer
	if err := st.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := ReadSnapshot(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if back.EpochIndex(after) != 2 || back.EpochIndex(before) != 2 || back.Hash() != st.Hash() {
		t.Fatal("the restored state maps epochs differently")
	}
}

func TestEntryProposalLimit(t *testing.T) {
	props := make([]Proposal, MaxEntryProposals+1)
	for i := range props {
		props[i] = Proposal{Event: Annotation{}}
	}
	if _, err := EncodeEntry(props); err == nil || !strings.Contains(err.Error(), "65535") {
		t.Fatalf("EncodeEntry of %d proposals: %v", len(props), err)
	}
	data, err := EncodeEntry(props[:MaxEntryProposals])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeEntry(data); err != nil {
		t.Fatalf("decode of %d proposals: %v", MaxEntryProposals, err)
	}
	// Hand-made envelope claiming one more.
	over := append([]byte{entryVersion}, appendUvarint(nil, MaxEntryProposals+1)...)
	for range MaxEntryProposals + 1 {
		over = append(over, make([]byte, proposalIDBytes)...)
		over = append(over, 2, byte(TypeAnnotation), 1)
	}
	var de *DecodeError
	if _, err := DecodeEntry(over); !errors.As(err, &de) || !strings.Contains(err.Error(), "limit per entry") {
		t.Fatalf("decode of %d proposals: %v", MaxEntryProposals+1, err)
	}
}

func TestRankObserved(t *testing.T) {
	h := newHarness(t)
	h.one(1, ClusterFeatures{Level: 2})
	epoch := h.one(10, bindEv(FleetContext, "k", "a")).Binding.Epoch
	h.one(20, bindEv(FleetContext, "other", "a")) // more recently used than k
	hashBefore := h.m.State().Hash()

	r := h.one(30, RankObserved{Fleet: FleetContext, Key: "k", Epoch: epoch, Rank: 0})
	wantStatus(t, "rank", r, StatusApplied)
	b, _ := h.m.State().Lookup(FleetContext, "k")
	if !b.HasRank || b.Rank != 0 || !r.Binding.HasRank {
		t.Fatalf("rank 0 not recorded: %+v (result %+v)", b, r.Binding)
	}
	if b.LastUsed != 10 {
		t.Fatalf("a rank observation counted as a use: LastUsed %d", b.LastUsed)
	}
	if idle := h.m.State().IdleBindings(1<<62, 1); len(idle) != 1 || idle[0].Key != "k" {
		t.Fatalf("a rank observation changed the recency order: least recently used %+v", idle)
	}
	if h.m.State().Hash() == hashBefore {
		t.Fatal("the rank is not part of the state hash")
	}
	r = h.one(31, RankObserved{Fleet: FleetContext, Key: "k", Epoch: epoch, Rank: 3})
	if b, _ := h.m.State().Lookup(FleetContext, "k"); b.Rank != 3 || r.Binding.Rank != 3 {
		t.Fatalf("rank not updated: %+v", b)
	}

	wantStatus(t, "stale epoch", h.one(40, RankObserved{Fleet: FleetContext, Key: "k", Epoch: epoch + 1, Rank: 1}), StatusConditionFailed)
	wantStatus(t, "unbound key", h.one(41, RankObserved{Fleet: FleetContext, Key: "nope", Epoch: epoch, Rank: 1}), StatusConditionFailed)
	wantStatus(t, "epoch 0", h.one(42, RankObserved{Fleet: FleetContext, Key: "k", Rank: 1}), StatusRejected)
	wantStatus(t, "bad fleet", h.one(43, RankObserved{Fleet: 9, Key: "k", Epoch: epoch, Rank: 1}), StatusRejected)
	wantStatus(t, "empty key", h.one(44, RankObserved{Fleet: FleetContext, Epoch: epoch, Rank: 1}), StatusRejected)
	if b, _ := h.m.State().Lookup(FleetContext, "k"); b.Rank != 3 {
		t.Fatalf("a refused rank observation changed the rank: %+v", b)
	}

	// Results carry the rank between nodes.
	back, err := DecodeResults(EncodeResults([]Result{r}))
	if err != nil || !back[0].Binding.HasRank || back[0].Binding.Rank != 3 {
		t.Fatalf("results round trip: %+v %v", back, err)
	}

	// Snapshots keep it (format 2), and the hash checks it.
	var buf bytes.Buffer
	if err := h.m.State().WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	if v := buf.Bytes()[len(snapshotMagic)]; v != 2 {
		t.Fatalf("a state with ranks written in snapshot format %d", v)
	}
	restored, err := ReadSnapshot(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := restored.Lookup(FleetContext, "k"); !b.HasRank || b.Rank != 3 || restored.Hash() != h.m.State().Hash() {
		t.Fatalf("restored binding %+v", b)
	}

	// A rebind is a new placement: its rank is unknown until observed.
	r = h.one(50, Overflow{Fleet: FleetContext, Key: "k", From: "a", To: "b", Reason: OverflowSaturated, Rebind: true})
	if r.Binding.HasRank {
		t.Fatalf("the rebind kept the old placement's rank: %+v", r.Binding)
	}
	wantStatus(t, "old placement's rank", h.one(51, RankObserved{Fleet: FleetContext, Key: "k", Epoch: epoch, Rank: 1}), StatusConditionFailed)
	// Evicting ranked bindings leaves nothing that needs format 2 except
	// the level itself.
	h.one(60, Evict{Fleet: FleetContext, Key: "k", Reason: EvictAdmin})
	if h.m.State().ranked != 0 {
		t.Fatalf("ranked count %d after the ranked binding left", h.m.State().ranked)
	}
}

// A machine capped at level 1 behaves as the level-1 release: a RankObserved
// (level 2) halts it with the upgrade message, before anything in the entry
// applies; so does a ClusterFeatures committing level 2; an uncapped
// machine applies both.
func TestMachineCappedAtLevel1(t *testing.T) {
	if NewMachineWithOptions(Options{}).MaxFeatureLevel() != FeatureLevelMax ||
		NewMachineWithOptions(Options{MaxFeatureLevel: 99}).MaxFeatureLevel() != FeatureLevelMax {
		t.Fatal("the default cap is not FeatureLevelMax")
	}
	setup := func(t *testing.T) (capped, full *Machine) {
		capped, full = NewMachineWithOptions(Options{MaxFeatureLevel: 1}), NewMachine()
		data := plainEntry(t, bindEv(FleetContext, "k", "a"))
		for _, m := range []*Machine{capped, full} {
			if _, err := m.Apply(Entry{Index: 1, Time: 1, Data: data}); err != nil {
				t.Fatal(err)
			}
		}
		return capped, full
	}
	t.Run("RankObserved", func(t *testing.T) {
		capped, full := setup(t)
		data := plainEntry(t, bindEv(FleetContext, "k2", "a"), RankObserved{Fleet: FleetContext, Key: "k", Epoch: 1, Rank: 2})
		before := capped.State()
		_, err := capped.Apply(Entry{Index: 2, Time: 2, Data: data})
		var ue *UnknownEventError
		if !errors.As(err, &ue) || ue.Type != TypeRankObserved || ue.Index != 2 {
			t.Fatalf("capped machine: %v, want *UnknownEventError for RankObserved at 2", err)
		}
		for _, want := range []string{"log entry 2", "RankObserved", "feature level 2", "understands feature level 1", "upgrade"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("message %q lacks %q", err, want)
			}
		}
		if capped.State() != before || capped.Halted() == nil {
			t.Fatal("the capped machine changed its state or did not halt")
		}
		rs, err := full.Apply(Entry{Index: 2, Time: 2, Data: data})
		if err != nil || rs[1].Status != StatusApplied {
			t.Fatalf("uncapped machine: %v %+v", err, rs)
		}
	})
	t.Run("optional event above the cap is skipped", func(t *testing.T) {
		capped, _ := setup(t)
		// An optional type known only at a higher level would be skipped;
		// Annotation is level 1, so it still applies.
		rs, err := capped.Apply(Entry{Index: 2, Time: 2, Data: plainEntry(t, Annotation{Source: "s"})})
		if err != nil || rs[0].Status != StatusApplied || capped.Skipped() != 0 {
			t.Fatalf("%v %+v", err, rs)
		}
	})
	t.Run("ClusterFeatures 2", func(t *testing.T) {
		capped, full := setup(t)
		data := plainEntry(t, ClusterFeatures{Level: 2})
		_, err := capped.Apply(Entry{Index: 2, Time: 2, Data: data})
		var fe *FeatureLevelError
		if !errors.As(err, &fe) || fe.Level != 2 || fe.NodeLevel != 1 || capped.Halted() == nil || capped.State().FeatureLevel() != 0 {
			t.Fatalf("capped machine: %v (halted %v, level %d)", err, capped.Halted(), capped.State().FeatureLevel())
		}
		if !strings.Contains(err.Error(), "upgrade") {
			t.Fatalf("message %q does not ask for an upgrade", err)
		}
		if _, err := full.Apply(Entry{Index: 2, Time: 2, Data: data}); err != nil || full.State().FeatureLevel() != 2 {
			t.Fatalf("uncapped machine: %v, level %d", err, full.State().FeatureLevel())
		}
		// Neither does a capped machine restore a level-2 state.
		var buf bytes.Buffer
		if err := full.State().WriteSnapshot(&buf); err != nil {
			t.Fatal(err)
		}
		if err := NewMachineWithOptions(Options{MaxFeatureLevel: 1}).Restore(&buf); err == nil || !strings.Contains(err.Error(), "upgrade") {
			t.Fatalf("capped restore of a level-2 state: %v", err)
		}
	})
	t.Run("ClusterFeatures above this build", func(t *testing.T) {
		_, full := setup(t)
		_, err := full.Apply(Entry{Index: 2, Time: 2, Data: plainEntry(t, ClusterFeatures{Level: FeatureLevelMax + 1})})
		var fe *FeatureLevelError
		if !errors.As(err, &fe) || full.Halted() == nil {
			t.Fatalf("ClusterFeatures{%d}: %v", FeatureLevelMax+1, err)
		}
	})
}

// A level-1 release reads results without ranks: the rank flag appears
// only when a binding has one.
func TestResultsWithoutRankKeepTheLevel1Layout(t *testing.T) {
	r := Result{Status: StatusApplied, Found: true, Created: true, Binding: Binding{Fleet: FleetContext, Key: "k", Instance: "i", Epoch: 5}}
	enc := EncodeResults([]Result{r})
	if flags := enc[4]; flags&4 != 0 { // version, count, status, reason length 0, flags
		t.Fatalf("flags 0x%02x carry the rank bit for a binding without rank", flags)
	}
	r.Binding.HasRank, r.Binding.Rank = true, 7
	enc = EncodeResults([]Result{r})
	back, err := DecodeResults(enc)
	if err != nil || back[0].Binding.Rank != 7 || !back[0].Binding.HasRank {
		t.Fatalf("%+v %v", back, err)
	}
	// The rank bit without a binding is corrupt.
	bad := EncodeResults([]Result{{Status: StatusApplied}})
	bad[4] |= 4
	if _, err := DecodeResults(bad); err == nil {
		t.Fatal("rank flag without a binding accepted")
	}
}

// plainEntry encodes events as one entry with zero (never deduplicated)
// proposal ids.
func plainEntry(t *testing.T, evs ...Event) []byte {
	t.Helper()
	props := make([]Proposal, len(evs))
	for i, ev := range evs {
		props[i] = Proposal{Event: ev}
	}
	data, err := EncodeEntry(props)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// ApplyBatchHashed gives the hash of the state at each entry of a batch:
// the same hash a machine applying the entries one by one publishes.
func TestApplyBatchHashed(t *testing.T) {
	log := level1Log()[:60]
	one := NewMachine()
	var want [][32]byte
	for _, e := range log {
		if _, err := one.Apply(e); err != nil {
			t.Fatal(err)
		}
		want = append(want, one.State().Hash())
	}
	batched := NewMachine()
	var got [][32]byte
	for i := 0; i < len(log); i += 7 {
		rs, hs, err := batched.ApplyBatchHashed(log[i:min(i+7, len(log))])
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) != len(rs) {
			t.Fatalf("%d hashes for %d entries", len(hs), len(rs))
		}
		got = append(got, hs...)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entry %d (index %d): hash %x, applying one by one gives %x", i, log[i].Index, got[i][:8], want[i][:8])
		}
	}
	// A halting entry: hashes for the entries before it only.
	m := NewMachine()
	bad := Entry{Index: 3, Time: 3, Data: []byte{0x7f}}
	rs, hs, err := m.ApplyBatchHashed([]Entry{log[0], log[1], bad})
	if err == nil || len(rs) != 2 || len(hs) != 2 || hs[1] != want[1] {
		t.Fatalf("halting batch: %d results, %d hashes, %v", len(rs), len(hs), err)
	}
}
