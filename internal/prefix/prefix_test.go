package prefix

import (
	"slices"
	"strings"
	"testing"
)

func TestTokenizeSplitsOnWhiteSpace(t *testing.T) {
	got := Tokenize("  hello\tworld\nhello  ")
	if len(got) != 3 {
		t.Fatalf("want 3 tokens, got %d", len(got))
	}
	if got[0] != got[2] || got[0] == got[1] {
		t.Fatalf("equal words must give equal ids and different words different ids: %v", got)
	}
	if n := CountTokens("  hello\tworld\nhello  "); n != 3 {
		t.Fatalf("CountTokens = %d, want 3", n)
	}
	if len(Tokenize("")) != 0 || len(Tokenize(" \n\t")) != 0 {
		t.Fatal("blank text must give no tokens")
	}
}

func TestTokenizeInvalidUTF8DoesNotFail(t *testing.T) {
	got := Tokenize("a \xff\xfe b")
	if len(got) != 3 {
		t.Fatalf("want 3 tokens for invalid UTF-8 input, got %d", len(got))
	}
}

func TestTokenIDsAreStable(t *testing.T) {
	// Pinned: edges and workers of different versions must agree.
	if got := Tokenize("tether")[0]; got != 0x296847d9 {
		t.Fatalf("token id of %q = %#x, want 0x296847d9 (changing it breaks mixed-version fleets)", "tether", got)
	}
	got := BlockHashes(Tokenize("a b c d"), 2)
	if len(got) != 2 || got[0] != 0xa10f64ad6985463e || got[1] != 0x2634b485dae5435f {
		t.Fatalf("block hashes = %#x, want the pinned values", got)
	}
	want := Tokenize("tether")[0]
	if Tokenize("x tether")[1] != want {
		t.Fatal("a word's id must not depend on its position")
	}
}

func TestBlockHashesChainAndIgnorePartialBlock(t *testing.T) {
	a := Tokenize(strings.Repeat("a b c d ", 40)) // 160 tokens
	h := BlockHashes(a, 64)
	if len(h) != 2 {
		t.Fatalf("160 tokens at block size 64: want 2 full blocks, got %d", len(h))
	}
	// Same second block content after a different first block: different hash.
	b := append(Tokenize(strings.Repeat("z ", 64)), a[64:128]...)
	hb := BlockHashes(b, 64)
	if hb[1] == h[1] {
		t.Fatal("block hash must depend on the blocks before it")
	}
	// Shared prefix gives shared hashes.
	c := append(append([]uint32{}, a[:128]...), Tokenize("different tail words")...)
	hc := BlockHashes(c, 64)
	if hc[0] != h[0] || hc[1] != h[1] {
		t.Fatal("equal prefixes must give equal block hashes")
	}
}

func TestRenderChatSharesPrefixAcrossTurns(t *testing.T) {
	turn1 := []Message{{"system", "you are helpful"}, {"user", "hi"}}
	turn2 := append(append([]Message{}, turn1...), Message{"assistant", "hello"}, Message{"user", "more"})
	p1, p2 := Tokenize(RenderChat(turn1)), Tokenize(RenderChat(turn2))
	for i := range p1 {
		if p1[i] != p2[i] {
			t.Fatalf("turn 2 must extend turn 1's tokens; differs at %d", i)
		}
	}
}

func BenchmarkBlockHashes2000(b *testing.B) {
	toks := make([]uint32, 2000*64)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = BlockHashes(toks, 64)
	}
}

// A prompt's keys under an adapter share nothing with the base model's or
// another adapter's, and the base model's are BlockHashes'.
func TestAdapterBlockHashesAreTheAdaptersOwn(t *testing.T) {
	toks := Tokenize(strings.Repeat("a b c d e f g h ", 32))
	base := BlockHashes(toks, 16)
	if got := AdapterBlockHashes("", toks, 16); !slices.Equal(got, base) {
		t.Fatal("no adapter: want BlockHashes")
	}
	a, b := AdapterBlockHashes("agent-a", toks, 16), AdapterBlockHashes("agent-b", toks, 16)
	seen := map[uint64]string{}
	for name, hs := range map[string][]uint64{"base": base, "a": a, "b": b} {
		if len(hs) != len(base) {
			t.Fatalf("%s: %d blocks", name, len(hs))
		}
		for _, h := range hs {
			if prev, dup := seen[h]; dup && prev != name {
				t.Fatalf("block key %x is both %s's and %s's", h, prev, name)
			}
			seen[h] = name
		}
	}
	if !slices.Equal(AdapterBlockHashes("agent-a", toks, 16), a) {
		t.Fatal("not deterministic")
	}
}

// An adapter's seed is part of every block key an edge and a worker compute
// for its prompts: its value must never change.
func TestAdapterSeedIsStable(t *testing.T) {
	for name, want := range map[string]uint64{"": 0, "a": 0x10e91edc00a96c16, "sql-lora": 0xd796efd8732bb71e} {
		if got := AdapterSeed(name); got != want {
			t.Errorf("AdapterSeed(%q) = %#x, want %#x", name, got, want)
		}
	}
}
