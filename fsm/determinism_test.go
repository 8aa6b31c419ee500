package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// randomLog builds n encoded entries of random proposals over a small key
// space, so binds collide, evictions race touches, instances go down under
// live bindings, ids repeat and capacity bites.
func randomLog(seed uint64, n int) []Entry {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	key := func() string { return fmt.Sprintf("conv-%d", rng.IntN(40)) }
	inst := func() string { return fmt.Sprintf("inst-%d", rng.IntN(4)) }
	fleet := func() Fleet { return Fleet(1 + rng.IntN(2)) }
	var ids []ProposalID
	var out []Entry
	now := int64(1_700_000_000_000_000_000)
	for i := 0; i < n; i++ {
		// Mostly forward, sometimes a leader clock jump backwards.
		now += int64(rng.IntN(3_000_000_000)) - 300_000_000
		var props []Proposal
		for j := 1 + rng.IntN(6); j > 0; j-- {
			var ev Event
			switch p := rng.IntN(100); {
			case p < 30:
				ev = Bind{Fleet: fleet(), Key: key(), ConversationID: key(), Instance: inst(),
					Decision: Decision{Edge: "edge-" + fmt.Sprint(rng.IntN(3)), Policy: "least_tokens", RequestID: fmt.Sprintf("r%d", rng.Uint32()),
						Candidates: []Candidate{{Instance: inst(), Score: rng.Float64(), CachedTokens: rng.Uint32()}}}}
			case p < 50:
				ks := make([]FleetKey, rng.IntN(5))
				for k := range ks {
					ks[k] = FleetKey{fleet(), key()}
				}
				ev = Touch{Keys: ks, Links: []string{key()}}
			case p < 58:
				ev = Evict{Fleet: fleet(), Key: key(), Reason: EvictReason(1 + rng.IntN(5)), Epoch: uint64(rng.IntN(3)) * uint64(rng.IntN(i+1)),
					IdleBefore: []int64{0, now - 5_000_000_000, now + 1}[rng.IntN(3)]}
			case p < 72:
				ev = Overflow{Fleet: fleet(), Key: key(), From: inst(), To: inst(), Reason: OverflowReason(1 + rng.IntN(3)), Rebind: rng.IntN(2) == 0}
			case p < 74:
				ev = InstanceState{Instance: inst(), Fleet: fleet(), Status: []InstanceStatus{InstanceUp, InstanceUp, InstanceUp, InstanceUp, InstanceDraining, InstanceDown, InstanceRemoved}[rng.IntN(7)], URL: "http://x", Ranks: uint32(rng.IntN(8))}
			case p < 86:
				ev = Link{Child: key(), Parent: key(), Root: key(), Depth: 1}
			case p < 89:
				ev = Settings{MaxBindings: uint64(20 + rng.IntN(60))}
			case p < 90:
				ev = ClusterFeatures{Level: uint32(rng.IntN(int(FeatureLevelMax) + 1))}
			case p < 92:
				// Epochs of either kind, so some match a live placement.
				epoch := uint64(rng.IntN(i + 2))
				if rng.IntN(2) == 0 {
					epoch = MakeEpoch(epoch, rng.IntN(3))
				}
				ev = RankObserved{Fleet: fleet(), Key: key(), Epoch: epoch, Rank: uint32(rng.IntN(4))}
			case p < 93:
				ev = InstanceDrain{Instance: inst(), Drain: rng.IntN(3) != 0, Source: "test"}
			case p < 95:
				ev = NodeInfo{NodeID: fmt.Sprintf("edge-%d", rng.IntN(3)), Version: fmt.Sprintf("v%d", rng.IntN(2)), MaxFeatureLevel: 1}
			default:
				ev = Annotation{Source: "test", Text: "note"}
			}
			var id ProposalID
			if len(ids) > 0 && rng.IntN(10) == 0 {
				id = ids[rng.IntN(len(ids))] // a retry
			} else if rng.IntN(20) != 0 {
				binary.BigEndian.PutUint64(id[:8], rng.Uint64())
				ids = append(ids, id)
			}
			props = append(props, Proposal{ID: id, Event: ev})
		}
		data, err := EncodeEntry(props)
		if err != nil {
			panic(err)
		}
		if rng.IntN(30) == 0 { // an unknown optional event from a newer node
			data = appendUnknownOptional(data)
		}
		out = append(out, Entry{Index: uint64(i + 1), Time: now, Data: data})
	}
	return out
}

func appendUnknownOptional(entry []byte) []byte {
	props, _ := DecodeEntry(entry)
	b := []byte{entryVersion}
	b = appendUvarint(b, uint64(len(props)+1))
	for _, p := range props {
		b = append(b, p.ID[:]...)
		b = appendUvarint(b, uint64(len(p.Raw)))
		b = append(b, p.Raw...)
	}
	b = append(b, make([]byte, proposalIDBytes)...)
	ev := []byte{byte(FlagIgnoreUnknown | 0x41), 1, 7}
	b = appendUvarint(b, uint64(len(ev)))
	return append(b, ev...)
}

// checkInvariants cross-checks the state's structures against each other.
func checkInvariants(t *testing.T, s *State) {
	t.Helper()
	n := 0
	prev := int64(-1 << 63)
	counts := map[string]int{}
	s.ForEachBinding(func(b Binding) bool {
		n++
		if b.LastUsed < prev {
			t.Fatalf("index %d: recency order broken at %q", s.Index(), b.Key)
		}
		prev = b.LastUsed
		got, ok := s.Lookup(b.Fleet, b.Key)
		if !ok || got.Epoch != b.Epoch || got.Instance != b.Instance {
			t.Fatalf("index %d: ForEachBinding yields %v/%q that Lookup does not find", s.Index(), b.Fleet, b.Key)
		}
		counts[b.Fleet.String()+"/"+b.Instance]++
		return true
	})
	if n != s.Len() {
		t.Fatalf("index %d: ForEachBinding saw %d, Len %d", s.Index(), n, s.Len())
	}
	if uint64(n) > s.MaxBindings() {
		t.Fatalf("index %d: %d bindings over capacity %d", s.Index(), n, s.MaxBindings())
	}
	for k, c := range counts {
		f, inst, _ := strings.Cut(k, "/")
		fl, _ := ParseFleet(f)
		if s.BindingCount(fl, inst) != c {
			t.Fatalf("index %d: BindingCount(%s) = %d, scan says %d", s.Index(), k, s.BindingCount(fl, inst), c)
		}
	}
}

func TestDeterminismRandomLogs(t *testing.T) {
	seeds := []uint64{1, 2, 3, uint64(time.Now().UnixNano())}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			log := randomLog(seed, 400)
			a, b := NewMachine(), NewMachine()
			snapAt := 1 + int(seed%uint64(len(log)-1))
			var snap bytes.Buffer
			hashes := make([][32]byte, len(log))
			for i, e := range log {
				if _, err := a.Apply(e); err != nil {
					t.Fatalf("seed %d: machine a, entry %d: %v", seed, e.Index, err)
				}
				if _, err := b.Apply(e); err != nil {
					t.Fatalf("seed %d: machine b, entry %d: %v", seed, e.Index, err)
				}
				ha, hb := a.State().Hash(), b.State().Hash()
				if ha != hb {
					t.Fatalf("seed %d: hashes differ at index %d", seed, e.Index)
				}
				hashes[i] = ha
				if i%25 == 0 {
					checkInvariants(t, a.State())
				}
				if i+1 == snapAt {
					if err := a.State().WriteSnapshot(&snap); err != nil {
						t.Fatal(err)
					}
				}
			}
			checkInvariants(t, a.State())
			if a.Skipped() == 0 {
				t.Logf("seed %d: no optional events skipped", seed)
			}
			// A machine restored at snapAt and fed the rest matches at every index.
			c := NewMachine()
			if err := c.Restore(&snap); err != nil {
				t.Fatalf("seed %d: restore: %v", seed, err)
			}
			if c.State().Hash() != hashes[snapAt-1] {
				t.Fatalf("seed %d: restored hash differs at index %d", seed, snapAt)
			}
			for i := snapAt; i < len(log); i++ {
				if _, err := c.Apply(log[i]); err != nil {
					t.Fatal(err)
				}
				if c.State().Hash() != hashes[i] {
					t.Fatalf("seed %d: restored machine diverges at index %d", seed, log[i].Index)
				}
			}
			if !reflect.DeepEqual(c.State().Counters(), a.State().Counters()) {
				t.Fatalf("seed %d: counters differ after restore", seed)
			}
			// Batch application reaches the same hashes as one-by-one.
			d := NewMachine()
			for i := 0; i < len(log); i += 7 {
				end := min(i+7, len(log))
				if _, err := d.ApplyBatch(log[i:end]); err != nil {
					t.Fatal(err)
				}
				if d.State().Hash() != hashes[end-1] {
					t.Fatalf("seed %d: batched machine diverges at index %d", seed, end)
				}
			}
		})
	}
}

func TestHashDiffersWhenStateDiffers(t *testing.T) {
	build := func(instance string, extra ...Event) *State {
		h := newHarness(t)
		h.nextID = 100 // same ids in both
		h.apply(10, bindEv(FleetContext, "a", "i0"), bindEv(FleetContext, "b", instance))
		for _, ev := range extra {
			h.one(20, ev)
		}
		return h.m.State()
	}
	base := build("i1")
	if build("i1").Hash() != base.Hash() {
		t.Fatal("equal states hash differently")
	}
	if build("i2").Hash() == base.Hash() {
		t.Fatal("a binding's instance changed, the hash did not")
	}
	x, y := build("i1", Touch{Keys: []FleetKey{{FleetContext, "a"}}}), build("i1", Touch{Keys: []FleetKey{{FleetContext, "b"}}})
	if x.Hash() == y.Hash() {
		t.Fatal("a different LastUsed did not change the hash")
	}
	if build("i1", Settings{MaxBindings: 5}).Hash() == build("i1", Settings{MaxBindings: 6}).Hash() {
		t.Fatal("MaxBindings not in the hash")
	}
	if build("i1", Link{Child: "c", Parent: "a", Root: "a"}).Hash() == build("i1", Link{Child: "c", Parent: "b", Root: "b"}).Hash() {
		t.Fatal("links not in the hash")
	}
	if build("i1", ClusterFeatures{Level: 1}).Hash() == build("i1", ClusterFeatures{Level: 2}).Hash() {
		t.Fatal("feature level not in the hash")
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	m := NewMachine()
	for _, e := range randomLog(99, 300) {
		if _, err := m.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	s := m.State()
	var buf bytes.Buffer
	if err := s.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	r, err := ReadSnapshot(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if r.Hash() != s.Hash() || r.Index() != s.Index() || r.Time() != s.Time() || r.Len() != s.Len() ||
		r.FeatureLevel() != s.FeatureLevel() || r.MaxBindings() != s.MaxBindings() {
		t.Fatal("restored state differs")
	}
	var want, got []Binding
	s.ForEachBinding(func(b Binding) bool { want = append(want, b); return true })
	r.ForEachBinding(func(b Binding) bool { got = append(got, b); return true })
	if !reflect.DeepEqual(normalizeBindings(got), normalizeBindings(want)) {
		t.Fatal("restored bindings differ (content or recency order)")
	}
	if !reflect.DeepEqual(r.Instances(), s.Instances()) || !reflect.DeepEqual(r.Edges(), s.Edges()) || !reflect.DeepEqual(r.Counters(), s.Counters()) {
		t.Fatal("restored instances, nodes or counters differ")
	}
	for _, b := range want {
		if r.BindingCount(b.Fleet, b.Instance) != s.BindingCount(b.Fleet, b.Instance) {
			t.Fatal("restored per-instance counts differ")
		}
		if l, ok := s.Link(b.Key); ok {
			if rl, rok := r.Link(b.Key); !rok || rl != l {
				t.Fatal("restored link differs")
			}
		}
		if !reflect.DeepEqual(r.Children(b.Key), s.Children(b.Key)) {
			t.Fatal("restored children differ")
		}
	}
	// Writing the restored state gives the same bytes.
	var again bytes.Buffer
	if err := r.WriteSnapshot(&again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), buf.Bytes()) {
		t.Fatal("snapshot of the restored state differs")
	}
	// The empty state round-trips too.
	var empty bytes.Buffer
	if err := NewMachine().State().WriteSnapshot(&empty); err != nil {
		t.Fatal(err)
	}
	if e, err := ReadSnapshot(&empty); err != nil || e.Len() != 0 || e.Hash() != NewMachine().State().Hash() {
		t.Fatalf("empty snapshot: %v", err)
	}
}

func normalizeBindings(bs []Binding) []Binding {
	for i := range bs {
		if len(bs[i].Decision.Candidates) == 0 {
			bs[i].Decision.Candidates = nil
		}
	}
	return bs
}

func TestReadSnapshotRejectsDamage(t *testing.T) {
	m := NewMachine()
	for _, e := range randomLog(5, 200) {
		if _, err := m.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if err := m.State().WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	var se *SnapshotError
	for cut := 0; cut < len(data); cut += 1 + len(data)/400 {
		_, err := ReadSnapshot(bytes.NewReader(data[:cut]))
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "truncated") {
			t.Fatalf("cut at %d/%d: err = %v, want a truncation SnapshotError", cut, len(data), err)
		}
	}
	rng := rand.New(rand.NewPCG(8, 9))
	for i := 0; i < 300; i++ {
		bad := bytes.Clone(data)
		bad[rng.IntN(len(bad))] ^= byte(1 + rng.IntN(255))
		if _, err := ReadSnapshot(bytes.NewReader(bad)); err == nil {
			t.Fatalf("flipped byte accepted (iteration %d)", i)
		}
	}
	newer := bytes.Clone(data)
	newer[len(snapshotMagic)] = snapshotVersion + 1
	if _, err := ReadSnapshot(bytes.NewReader(newer)); err == nil || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("newer version: %v", err)
	}
	if _, err := ReadSnapshot(strings.NewReader("NOTASNAPxxxxxxxx")); err == nil || !strings.Contains(err.Error(), "not a tether") {
		t.Fatalf("bad magic: %v", err)
	}
	if _, err := ReadSnapshot(io.MultiReader(bytes.NewReader(data[:40]), errReader{})); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("read error not reported: %v", err)
	}
	m2 := NewMachine()
	if err := m2.Restore(bytes.NewReader(data[:len(data)/2])); err == nil || m2.State().Index() != 0 {
		t.Fatal("a failed restore replaced the state")
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

// Readers look up keys while the writer applies; under -race this checks
// that published states are never written.
func TestConcurrentReadersDuringApply(t *testing.T) {
	log := randomLog(11, 600)
	m := NewMachine()
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			lastIndex := uint64(0)
			for i := 0; !stop.Load(); i++ {
				s := m.State()
				if s.Index() < lastIndex {
					errs <- fmt.Errorf("reader %d: index went back from %d to %d", r, lastIndex, s.Index())
					return
				}
				lastIndex = s.Index()
				key := fmt.Sprintf("conv-%d", i%60)
				b1, ok1 := s.Lookup(FleetContext, key)
				b2, ok2 := s.Lookup(FleetContext, key)
				if ok1 != ok2 || b1.Epoch != b2.Epoch || b1.LastUsed != b2.LastUsed {
					errs <- fmt.Errorf("reader %d: a published state changed under it", r)
					return
				}
				if i%50 == 0 {
					_ = s.Hash()
					_ = s.IdleBindings(s.Time(), 5)
					_ = s.Instances()
				}
			}
		}(r)
	}
	for _, e := range log {
		if _, err := m.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// A snapshot written while the machine keeps applying describes exactly the
// state it was taken from.
func TestSnapshotWhileApplying(t *testing.T) {
	log := randomLog(21, 400)
	m := NewMachine()
	for _, e := range log[:200] {
		if _, err := m.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	s := m.State()
	want := s.Hash()
	done := make(chan error, 1)
	var buf bytes.Buffer
	go func() { done <- s.WriteSnapshot(&buf) }()
	for _, e := range log[200:] {
		if _, err := m.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r, err := ReadSnapshot(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if r.Hash() != want || s.Hash() != want {
		t.Fatal("snapshot taken during apply does not match its state")
	}
}

type failingWriter struct{ after int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.after -= len(p); w.after < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

func TestWriteSnapshotReportsWriterError(t *testing.T) {
	m := NewMachine()
	for _, e := range randomLog(3, 100) {
		if _, err := m.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	for _, after := range []int{0, 5, 100} {
		if err := m.State().WriteSnapshot(&failingWriter{after: after}); err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Fatalf("writer failing after %d bytes: err = %v", after, err)
		}
	}
}
