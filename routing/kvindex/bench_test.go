package kvindex

import (
	"fmt"
	"testing"
)

// benchIndex builds a fleet-sized index: 64 instances × 8 ranks. Eight agent
// types each have a 150-block system prompt + tools prefix; every rank holds
// its agent type's prefix and one 400-block conversation after it (about
// 200k distinct blocks). Rank 0 of instance 7 also holds one 2,000-block
// conversation (a long agentic session).
func benchIndex(b *testing.B) (ix *Index, shared, deep []uint64) {
	b.Helper()
	ix = New(Config{})
	var prefixes [8][]uint64
	for a := range prefixes {
		prefixes[a] = chain(uint64(a+1)<<40, 150)
	}
	for i := 0; i < 64; i++ {
		inst := fmt.Sprintf("ctx-%02d", i)
		var evs []RankEvent
		for r := 0; r < 8; r++ {
			agent := (i + r) % 8
			conv := chain(uint64(i*8+r+1)<<20, 400)
			evs = append(evs, RankEvent{Rank: r, Stored: append(append([]uint64{}, prefixes[agent]...), conv...)})
		}
		if _, err := ix.Apply(Batch{Instance: inst, Boot: 1, Seq: 1, Events: evs}); err != nil {
			b.Fatal(err)
		}
	}
	deep = chain(1<<50, 2000)
	if _, err := ix.Apply(Batch{Instance: "ctx-07", Boot: 1, Seq: 2, Events: []RankEvent{{Rank: 0, Stored: deep}}}); err != nil {
		b.Fatal(err)
	}
	// A new 2,000-block prompt of agent type 3: its 150-block prefix is
	// held by every instance (on one rank each), the rest by nobody.
	shared = append(append([]uint64{}, prefixes[3]...), chain(1<<55, 1850)...)
	return ix, shared, deep
}

// BenchmarkMatch measures one longest-prefix match of a 2,000-block prompt
// over 64 instances × 8 ranks: a shared-prefix prompt (walks 150 blocks with
// 64 holders each), the worst case (walks all 2,000 blocks), and an all-cold
// prompt (the fast path: one lookup).
func BenchmarkMatch(b *testing.B) {
	ix, shared, deep := benchIndex(b)
	cold := chain(1<<60, 2000)
	for _, c := range []struct {
		name   string
		prompt []uint64
		want   int
	}{
		{"shared_prefix", shared, 64},
		{"deep_2000", deep, 1},
		{"all_cold", cold, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			var dst []Match
			if dst = ix.Match(c.prompt, t0, dst); len(dst) != c.want {
				b.Fatalf("%d matches, want %d", len(dst), c.want)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				dst = ix.Match(c.prompt, t0, dst)
			}
		})
	}
}

// BenchmarkApply measures applying a batch that stores one 64-block turn.
func BenchmarkApply(b *testing.B) {
	ix := New(Config{})
	seq := uint64(0)
	base := uint64(1)
	b.ReportAllocs()
	for b.Loop() {
		seq++
		blocks := chain(base, 64)
		base += 64
		if _, err := ix.Apply(Batch{Instance: "a", Boot: 1, Seq: seq, Events: []RankEvent{{Rank: int(seq % 8), Stored: blocks}}}); err != nil {
			b.Fatal(err)
		}
		if seq%1024 == 0 { // keep the index bounded
			ix = New(Config{})
			seq = 0
		}
	}
}

// BenchmarkReplaceInstance measures installing a full dump of one instance
// (8 ranks × 550 blocks) into the fleet-sized index: the cost paid once per
// gap or edge start, dominated by the scan that drops the old contents.
func BenchmarkReplaceInstance(b *testing.B) {
	ix, _, _ := benchIndex(b)
	ranks := make([][]uint64, 8)
	for r := range ranks {
		ranks[r] = chain(uint64(900+r)<<20, 550)
	}
	seq := uint64(10)
	b.ReportAllocs()
	for b.Loop() {
		seq++
		if err := ix.ReplaceInstance("ctx-11", 1, seq, ranks); err != nil {
			b.Fatal(err)
		}
	}
}
