package kvindex

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Unix(1_700_000_000, 0)

// chain returns n distinct non-zero block hashes starting at base.
func chain(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i) + 1
	}
	return out
}

func matchMap(ms []Match) map[string]Match {
	out := make(map[string]Match, len(ms))
	for _, m := range ms {
		out[m.Instance] = m
	}
	return out
}

func mustApply(t *testing.T, ix *Index, b Batch, want Outcome) {
	t.Helper()
	got, err := ix.Apply(b)
	if err != nil {
		t.Fatalf("apply %s seq %d: %v", b.Instance, b.Seq, err)
	}
	if got != want {
		t.Fatalf("apply %s seq %d: outcome %v, want %v", b.Instance, b.Seq, got, want)
	}
}

func TestMatchLongestContiguousPrefixPerRank(t *testing.T) {
	ix := New(Config{})
	prompt := chain(100, 10)
	mustApply(t, ix, Batch{Instance: "a", Boot: 7, Seq: 1, Events: []RankEvent{
		{Rank: 0, Stored: prompt},
		{Rank: 1, Stored: prompt[:5]},
	}}, Applied)
	// b's rank 0 has a hole at block 3: only the first 3 count.
	hole := append(append([]uint64{}, prompt[:3]...), prompt[4:7]...)
	mustApply(t, ix, Batch{Instance: "b", Boot: 9, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: hole}}}, Applied)
	// c holds only later blocks: no first block, no match.
	mustApply(t, ix, Batch{Instance: "c", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 2, Stored: prompt[1:]}}}, Applied)

	got := matchMap(ix.Match(prompt, t0, nil))
	want := map[string]Match{
		"a": {Instance: "a", Blocks: 10, Rank: 0},
		"b": {Instance: "b", Blocks: 3, Rank: 0},
	}
	if len(got) != len(want) {
		t.Fatalf("matches %v, want %v", got, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: got %+v, want %+v", id, got[id], w)
		}
	}
	// A prompt diverging after block 4 matches 5 blocks on a (both ranks).
	div := append(append([]uint64{}, prompt[:5]...), chain(9000, 5)...)
	if m := matchMap(ix.Match(div, t0, nil))["a"]; m.Blocks != 5 || m.Rank != 0 {
		t.Errorf("diverging prompt on a: %+v, want 5 blocks on rank 0 (lower rank wins ties)", m)
	}
}

func TestAllColdFastPath(t *testing.T) {
	ix := New(Config{})
	prompt := chain(0, 50)
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: prompt[1:]}}}, Applied)
	if ms := ix.Match(prompt, t0, nil); len(ms) != 0 {
		t.Fatalf("nobody holds block 0: want no matches, got %v", ms)
	}
	if ms := ix.Match(nil, t0, nil); len(ms) != 0 {
		t.Fatalf("empty prompt: got %v", ms)
	}
}

func TestRemovedBlocksStopMatching(t *testing.T) {
	ix := New(Config{})
	prompt := chain(0, 8)
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: prompt}}}, Applied)
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 2, Events: []RankEvent{{Rank: 0, Removed: prompt[6:]}}}, Applied)
	if m := matchMap(ix.Match(prompt, t0, nil))["a"]; m.Blocks != 6 {
		t.Fatalf("after removing blocks 6-7: %d blocks, want 6", m.Blocks)
	}
	// Removal precedes storage within one event: re-storing works.
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 3, Events: []RankEvent{{Rank: 0, Removed: prompt, Stored: prompt}}}, Applied)
	if m := matchMap(ix.Match(prompt, t0, nil))["a"]; m.Blocks != 8 {
		t.Fatalf("remove-then-store: %d blocks, want 8", m.Blocks)
	}
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 4, Events: []RankEvent{{Rank: 0, Removed: prompt}}}, Applied)
	if st := ix.Stats(); st.Blocks != 0 || st.HolderBlocks != 0 || st.Sets != 0 {
		t.Fatalf("everything removed: stats %+v", st)
	}
}

func TestSequenceGapMarksStaleUntilDump(t *testing.T) {
	ix := New(Config{})
	p1, p2 := chain(0, 4), chain(1000, 4)
	mustApply(t, ix, Batch{Instance: "a", Boot: 5, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: p1}}}, Applied)
	mustApply(t, ix, Batch{Instance: "a", Boot: 5, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: p2}}}, Duplicate)
	if ix.Stale("a") {
		t.Fatal("in-sequence instance reported stale")
	}
	mustApply(t, ix, Batch{Instance: "a", Boot: 5, Seq: 3, Events: []RankEvent{{Rank: 0, Stored: p2}}}, Gap)
	if !ix.Stale("a") {
		t.Fatal("gap did not mark the instance stale")
	}
	if ms := ix.Match(p1, t0, nil); len(ms) != 0 {
		t.Fatalf("stale instance still matched: %v", ms)
	}
	mustApply(t, ix, Batch{Instance: "a", Boot: 5, Seq: 4, Events: []RankEvent{{Rank: 0, Stored: p2}}}, NeedsDump)
	if ms := ix.Match(p2, t0, nil); len(ms) != 0 {
		t.Fatalf("batch applied to a stale instance: %v", ms)
	}
	// The dump reflects everything up to seq 4: p2 on rank 1 only.
	if err := ix.ReplaceInstance("a", 5, 4, [][]uint64{nil, p2}); err != nil {
		t.Fatal(err)
	}
	if ix.Stale("a") {
		t.Fatal("dump did not resync the instance")
	}
	if ms := ix.Match(p1, t0, nil); len(ms) != 0 {
		t.Fatalf("dump did not replace old contents: %v", ms)
	}
	if m := matchMap(ix.Match(p2, t0, nil))["a"]; m.Blocks != 4 || m.Rank != 1 {
		t.Fatalf("dump contents: %+v", m)
	}
	mustApply(t, ix, Batch{Instance: "a", Boot: 5, Seq: 4}, Duplicate)
	mustApply(t, ix, Batch{Instance: "a", Boot: 5, Seq: 5, Events: []RankEvent{{Rank: 0, Stored: p1}}}, Applied)
	if m := matchMap(ix.Match(p1, t0, nil))["a"]; m.Blocks != 4 {
		t.Fatalf("batch after dump: %+v", m)
	}
	// An older dump than what the instance reflects is ignored.
	if err := ix.ReplaceInstance("a", 5, 3, nil); err != nil {
		t.Fatal(err)
	}
	if m := matchMap(ix.Match(p1, t0, nil))["a"]; m.Blocks != 4 {
		t.Fatalf("old dump replaced newer contents: %+v", m)
	}
}

func TestFirstSeenMidStreamNeedsDump(t *testing.T) {
	ix := New(Config{})
	mustApply(t, ix, Batch{Instance: "a", Boot: 3, Seq: 17, Events: []RankEvent{{Rank: 0, Stored: chain(0, 2)}}}, NeedsDump)
	if !ix.Stale("a") || !ix.Stale("never-seen") {
		t.Fatal("instance without a baseline must be stale")
	}
}

func TestRestartClearsOldBoot(t *testing.T) {
	ix := New(Config{})
	p := chain(0, 4)
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: p}}}, Applied)
	mustApply(t, ix, Batch{Instance: "a", Boot: 2, Seq: 1}, Applied)
	if ms := ix.Match(p, t0, nil); len(ms) != 0 {
		t.Fatalf("restarted worker's old blocks still matched: %v", ms)
	}
	mustApply(t, ix, Batch{Instance: "a", Boot: 2, Seq: 2, Events: []RankEvent{{Rank: 0, Stored: p}}}, Applied)
	// A restart joined mid-stream: old contents dropped, stale.
	mustApply(t, ix, Batch{Instance: "a", Boot: 3, Seq: 9}, NeedsDump)
	if ms := ix.Match(p, t0, nil); len(ms) != 0 || !ix.Stale("a") {
		t.Fatalf("mid-stream restart: matches %v stale %v", ms, ix.Stale("a"))
	}
}

func TestInvalidInputIsRejectedAndMarksStale(t *testing.T) {
	ix := New(Config{})
	p := chain(0, 3)
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: p}}}, Applied)
	cases := []Batch{
		{Instance: "a", Boot: 1, Seq: 2, Events: []RankEvent{{Rank: 0, Stored: []uint64{0}}}},
		{Instance: "a", Boot: 1, Seq: 2, Events: []RankEvent{{Rank: -1, Stored: p}}},
		{Instance: "a", Boot: 1, Seq: 2, Events: []RankEvent{{Rank: MaxRanks, Stored: p}}},
		{Instance: "", Boot: 1, Seq: 1},
	}
	for _, b := range cases {
		if _, err := ix.Apply(b); !errors.Is(err, ErrInvalid) {
			t.Errorf("batch %+v: err %v, want ErrInvalid", b, err)
		}
	}
	if !ix.Stale("a") {
		t.Fatal("an unappliable batch must leave the instance stale")
	}
	if err := ix.ReplaceInstance("a", 1, 5, [][]uint64{{1, 0}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("dump with zero hash: %v", err)
	}
	if err := ix.ReplaceInstance("", 1, 5, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("dump without instance: %v", err)
	}
}

func TestPredictionsCountUntilTTL(t *testing.T) {
	ix := New(Config{PredictTTL: 2 * time.Second})
	p := chain(0, 20)
	ix.Predict("a", p, t0)
	got := matchMap(ix.Match(p, t0.Add(time.Second), nil))
	if m := got["a"]; m.Blocks != 20 || m.Rank != -1 {
		t.Fatalf("prediction within TTL: %+v", m)
	}
	if ms := ix.Match(p, t0.Add(2*time.Second), nil); len(ms) != 0 {
		t.Fatalf("prediction past TTL still matched: %v", ms)
	}
	// A later prediction of the same blocks keeps them alive.
	ix.Predict("a", p[:5], t0.Add(time.Second))
	if n := ix.Expire(t0.Add(2 * time.Second)); n != 1 {
		t.Fatalf("expired %d records, want 1", n)
	}
	if m := matchMap(ix.Match(p, t0.Add(2500*time.Millisecond), nil))["a"]; m.Blocks != 5 {
		t.Fatalf("refreshed prediction: %+v", m)
	}
	ix.Expire(t0.Add(time.Hour))
	if st := ix.Stats(); st.Blocks != 0 || st.Predictions != 0 || st.Sets != 0 {
		t.Fatalf("expired predictions not freed: %+v", st)
	}
	// Disabled predictions record nothing.
	off := New(Config{PredictTTL: -1})
	off.Predict("a", p, t0)
	if ms := off.Match(p, t0, nil); len(ms) != 0 {
		t.Fatalf("disabled predictions matched: %v", ms)
	}
}

func TestPredictionAndStoredCombine(t *testing.T) {
	ix := New(Config{})
	p := chain(0, 10)
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 3, Stored: p[:4]}}}, Applied)
	ix.Predict("a", p[:4], t0)
	if m := matchMap(ix.Match(p, t0, nil))["a"]; m.Blocks != 4 || m.Rank != 3 {
		t.Fatalf("equal stored and predicted: %+v, want the real rank", m)
	}
	ix.Predict("a", p, t0)
	if m := matchMap(ix.Match(p, t0, nil))["a"]; m.Blocks != 10 || m.Rank != -1 {
		t.Fatalf("longer prediction: %+v", m)
	}
	// Predictions survive a gap (they are this edge's own knowledge).
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 5}, Gap)
	if m := matchMap(ix.Match(p, t0, nil))["a"]; m.Blocks != 10 {
		t.Fatalf("prediction lost on gap: %+v", m)
	}
}

func TestRemoveInstanceFreesSlots(t *testing.T) {
	ix := New(Config{})
	p := chain(0, 5)
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: p}}}, Applied)
	ix.Predict("a", p, t0)
	ix.RemoveInstance("a")
	if st := ix.Stats(); st.Blocks != 0 || st.Instances != 0 || st.HolderBlocks != 0 {
		t.Fatalf("after remove: %+v", st)
	}
	// The freed slot is reused without leaking a's blocks.
	mustApply(t, ix, Batch{Instance: "b", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: p[:2]}}}, Applied)
	got := matchMap(ix.Match(p, t0, nil))
	if len(got) != 1 || got["b"].Blocks != 2 {
		t.Fatalf("after slot reuse: %v", got)
	}
	ix.Expire(t0.Add(time.Hour)) // a's old prediction record must not disturb b
	if got := matchMap(ix.Match(p, t0, nil)); got["b"].Blocks != 2 {
		t.Fatalf("after expiring a's record: %v", got)
	}
	ix.RemoveInstance("never-seen")
}

// reference is a naive model of the index: per holder, the set of blocks.
type reference struct {
	stored map[string]map[int]map[uint64]bool // instance → rank → blocks
	preds  map[string]map[uint64]int64        // instance → block → expiry
}

func (r *reference) match(prompt []uint64, now int64) map[string]Match {
	out := map[string]Match{}
	consider := func(inst string, rank int, has func(uint64) bool) {
		n := 0
		for n < len(prompt) && has(prompt[n]) {
			n++
		}
		if n == 0 {
			return
		}
		cur, ok := out[inst]
		if !ok || n > cur.Blocks || (n == cur.Blocks && betterRank(rank, cur.Rank)) {
			out[inst] = Match{Instance: inst, Blocks: n, Rank: rank}
		}
	}
	for inst, ranks := range r.stored {
		for rank, set := range ranks {
			consider(inst, rank, func(h uint64) bool { return set[h] })
		}
	}
	for inst, set := range r.preds {
		consider(inst, -1, func(h uint64) bool { return set[h] > now })
	}
	return out
}

// TestMatchAgreesWithReference drives the index and a naive model with the
// same random operations (many holders per block, so entries switch to the
// bitset form) and compares every match.
func TestMatchAgreesWithReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// A tree of prompts: 6 shared roots of 30 blocks, each extended by
	// conversation-specific blocks.
	var prompts [][]uint64
	for r := 0; r < 6; r++ {
		root := chain(uint64(r)*1_000_000, 30)
		for c := 0; c < 8; c++ {
			p := append(append([]uint64{}, root...), chain(uint64(r)*1_000_000+uint64(c+1)*10_000, 40)...)
			prompts = append(prompts, p)
		}
	}
	ix := New(Config{PredictTTL: 3 * time.Second})
	ref := &reference{stored: map[string]map[int]map[uint64]bool{}, preds: map[string]map[uint64]int64{}}
	insts := []string{"i0", "i1", "i2", "i3", "i4", "i5", "i6", "i7", "i8", "i9"}
	seq := map[string]uint64{}
	now := t0
	for step := 0; step < 3000; step++ {
		inst := insts[rng.IntN(len(insts))]
		prompt := prompts[rng.IntN(len(prompts))]
		cut := 1 + rng.IntN(len(prompt))
		switch op := rng.IntN(10); {
		case op < 5: // store a prefix on a rank
			rank := rng.IntN(8)
			seq[inst]++
			mustApply(t, ix, Batch{Instance: inst, Boot: 1, Seq: seq[inst], Events: []RankEvent{{Rank: rank, Stored: prompt[:cut]}}}, Applied)
			if ref.stored[inst] == nil {
				ref.stored[inst] = map[int]map[uint64]bool{}
			}
			if ref.stored[inst][rank] == nil {
				ref.stored[inst][rank] = map[uint64]bool{}
			}
			for _, h := range prompt[:cut] {
				ref.stored[inst][rank][h] = true
			}
		case op < 8: // evict a random tail (or a hole) from a rank
			rank := rng.IntN(8)
			from := rng.IntN(cut)
			seq[inst]++
			mustApply(t, ix, Batch{Instance: inst, Boot: 1, Seq: seq[inst], Events: []RankEvent{{Rank: rank, Removed: prompt[from:cut]}}}, Applied)
			for _, h := range prompt[from:cut] {
				delete(ref.stored[inst][rank], h)
			}
		case op < 9:
			ix.Predict(inst, prompt[:cut], now)
			if ref.preds[inst] == nil {
				ref.preds[inst] = map[uint64]int64{}
			}
			exp := now.Add(3 * time.Second).UnixNano()
			for _, h := range prompt[:cut] {
				ref.preds[inst][h] = max(ref.preds[inst][h], exp)
			}
		default:
			now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
			if rng.IntN(2) == 0 {
				ix.Expire(now)
			}
		}
		q := prompts[rng.IntN(len(prompts))]
		got := matchMap(ix.Match(q, now, nil))
		want := ref.match(q, now.UnixNano())
		if len(got) != len(want) {
			t.Fatalf("step %d: got %d matches %v, want %d %v", step, len(got), sorted(got), len(want), sorted(want))
		}
		for id, w := range want {
			if got[id] != w {
				t.Fatalf("step %d: %s got %+v, want %+v", step, id, got[id], w)
			}
		}
		// Holds agrees with the model on a block of the query.
		blk := q[rng.IntN(len(q))]
		for _, id := range insts {
			want := ref.preds[id][blk] > now.UnixNano()
			for _, set := range ref.stored[id] {
				want = want || set[blk]
			}
			if held, _ := ix.Holds(id, -1, blk, now); held != want {
				t.Fatalf("step %d: Holds(%s, %x) = %v, want %v", step, id, blk, held, want)
			}
		}
	}
	// Everything the index allocated is released again.
	ix.Expire(now.Add(time.Hour))
	st := ix.Stats()
	if st.Sets > st.Blocks || st.Sets == 0 {
		t.Fatalf("interned sets %d for %d blocks", st.Sets, st.Blocks)
	}
	for _, inst := range insts {
		ix.RemoveInstance(inst)
	}
	if st := ix.Stats(); st.Blocks != 0 || st.Sets != 0 || st.HolderBlocks != 0 || st.Instances != 0 {
		t.Fatalf("after removing every instance: %+v", st)
	}
}

func sorted(m map[string]Match) []Match {
	out := make([]Match, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Instance < out[j].Instance })
	return out
}

func TestConcurrentMatchAndApply(t *testing.T) {
	ix := New(Config{})
	p := chain(0, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for s := uint64(1); s <= 200; s++ {
			ev := RankEvent{Rank: int(s % 4), Stored: p[:s%64+1]}
			if s%3 == 0 {
				ev = RankEvent{Rank: int(s % 4), Removed: p[s%64:]}
			}
			if _, err := ix.Apply(Batch{Instance: "a", Boot: 1, Seq: s, Events: []RankEvent{ev}}); err != nil {
				t.Error(err)
				return
			}
			ix.Predict("b", p[:s%64+1], t0)
		}
	}()
	var buf []Match
	for i := 0; i < 500; i++ {
		buf = ix.Match(p, t0, buf)
		for _, m := range buf {
			if m.Blocks < 1 || m.Blocks > len(p) {
				t.Fatalf("impossible match %+v", m)
			}
		}
	}
	<-done
}

func TestHoldsReportsSync(t *testing.T) {
	ix := New(Config{})
	prompt := chain(100, 10)
	if held, synced := ix.Holds("a", -1, prompt[0], t0); held || synced {
		t.Fatalf("unknown instance: held %v synced %v", held, synced)
	}
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: prompt[:4]}, {Rank: 3, Stored: prompt[:7]}}}, Applied)
	if held, synced := ix.Holds("a", -1, prompt[6], t0); !held || !synced {
		t.Fatalf("block 6 (rank 3): held %v synced %v, want both", held, synced)
	}
	if held, synced := ix.Holds("a", -1, prompt[7], t0); held || !synced {
		t.Fatalf("block 7: held %v synced %v, want not held, synced", held, synced)
	}
	// A gap makes the instance stale: its answers are no evidence.
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 5, Events: []RankEvent{{Rank: 0, Removed: prompt[:1]}}}, Gap)
	if _, synced := ix.Holds("a", -1, prompt[0], t0); synced {
		t.Fatal("an instance with a sequence gap reported synced")
	}
	// Predictions count until they expire.
	ix.Predict("b", prompt[:3], t0)
	if held, synced := ix.Holds("b", -1, prompt[2], t0); !held || synced {
		t.Fatalf("predicted block: held %v synced %v, want held, not synced", held, synced)
	}
	if held, _ := ix.Holds("b", -1, prompt[2], t0.Add(time.Hour)); held {
		t.Fatal("an expired prediction still holds")
	}
}

func TestHoldsOnOneRank(t *testing.T) {
	ix := New(Config{})
	t0 := time.Unix(1_700_000_000, 0)
	if _, err := ix.Apply(Batch{Instance: "a", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 3, Stored: []uint64{11, 12}}}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rank int
		want bool
	}{{-1, true}, {3, true}, {0, false}, {7, false}} {
		if held, synced := ix.Holds("a", c.rank, 12, t0); held != c.want || !synced {
			t.Errorf("Holds(a, rank %d, 12) = %v, %v; want %v, true", c.rank, held, synced, c.want)
		}
	}
	// A prediction counts on every rank: it is the prompt routed there.
	ix.Predict("a", []uint64{21}, t0)
	if held, _ := ix.Holds("a", 0, 21, t0); !held {
		t.Error("a live prediction is not held on rank 0")
	}
}

// HeldByOther answers for every instance but one: stored on any rank or
// tier, or a live prediction.
func TestHeldByOther(t *testing.T) {
	ix := New(Config{})
	prompt := chain(300, 8)
	if ix.HeldByOther("a", prompt[0], t0) {
		t.Fatal("an unknown block is held")
	}
	mustApply(t, ix, Batch{Instance: "a", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 2, Stored: prompt}}}, Applied)
	if ix.HeldByOther("a", prompt[5], t0) {
		t.Fatal("a block only a holds is held by another")
	}
	if !ix.HeldByOther("b", prompt[5], t0) {
		t.Fatal("a's block is not held by an instance other than b")
	}
	// Enough other holders that c's slot is past the bitset's first word.
	for i := range 70 {
		mustApply(t, ix, Batch{Instance: fmt.Sprintf("f%d", i), Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 0, Stored: chain(uint64(1000+10*i), 2)}}}, Applied)
	}
	mustApply(t, ix, Batch{Instance: "c", Boot: 1, Seq: 1, Events: []RankEvent{{Rank: 7, Stored: prompt[:3]}}}, Applied)
	if !ix.HeldByOther("a", prompt[2], t0) || ix.HeldByOther("a", prompt[3], t0) {
		t.Fatal("c's rank 7 holds blocks 0-2 only")
	}
	ix.Predict("d", prompt[:6], t0)
	if !ix.HeldByOther("a", prompt[5], t0) {
		t.Fatal("d's live prediction does not count")
	}
	if ix.HeldByOther("a", prompt[5], t0.Add(time.Hour)) {
		t.Fatal("d's expired prediction still counts")
	}
	// Whatever HeldByOther says no to, Match finds no other instance
	// holding that deep.
	for depth := range prompt {
		other := 0
		for _, m := range ix.Match(prompt, t0, nil) {
			if m.Instance != "a" {
				other = max(other, m.Blocks, m.Offloaded)
			}
		}
		if other > depth && !ix.HeldByOther("a", prompt[depth], t0) {
			t.Fatalf("depth %d: another instance holds %d blocks, HeldByOther says no", depth, other)
		}
	}
}
