package enginekv_test

import (
	"slices"
	"testing"

	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/prefix"
)

// Offloaded tiers are tracked beside the GPU's: the OffloadingConnector's
// token-less BlockStored names GPU block hashes in medium "CPU", a CPU
// removal removes from the CPU tier only, a GPU removal leaves the CPU
// copy, and AllBlocksCleared (the GPU pool's reset) leaves the CPU tier.
func TestMapperOffloadedTier(t *testing.T) {
	const bs = 4
	prompt := toks(3*bs, 500)
	want := prefix.BlockHashes(prompt, bs)
	h := []enginekv.Hash{enginekv.IntHash(1), enginekv.IntHash(2), enginekv.IntHash(3)}
	m := enginekv.NewMapper(bs, 0)
	gpu := m.ApplyTiers(enginekv.Event{Kind: enginekv.Stored, Hashes: h, Tokens: prompt, BlockSize: bs, Medium: ""})
	if !slices.Equal(gpu.Stored, want) || len(gpu.OffloadedStored) != 0 {
		t.Fatalf("GPU store: %+v", gpu)
	}
	// The connector copies the first two blocks to CPU memory.
	cpu := m.ApplyTiers(enginekv.Event{Kind: enginekv.Stored, Hashes: h[:2], BlockSize: bs, Medium: "CPU"})
	if len(cpu.Stored)+len(cpu.Removed) != 0 || !slices.Equal(cpu.OffloadedStored, want[:2]) {
		t.Fatalf("CPU store: %+v", cpu)
	}
	if m.Stats().Offloaded != 2 || m.Stats().Stored != 3 {
		t.Fatalf("stats %+v", m.Stats())
	}
	// The GPU evicts block 1: the CPU copy stays.
	if c := m.ApplyTiers(enginekv.Event{Kind: enginekv.Removed, Hashes: h[:1]}); !slices.Equal(c.Removed, want[:1]) || len(c.OffloadedRemoved) != 0 {
		t.Fatalf("GPU removal: %+v", c)
	}
	// A CPU removal of block 2 leaves the GPU's block 2.
	if c := m.ApplyTiers(enginekv.Event{Kind: enginekv.Removed, Hashes: h[1:2], Medium: "CPU"}); len(c.Removed) != 0 || !slices.Equal(c.OffloadedRemoved, want[1:2]) {
		t.Fatalf("CPU removal: %+v", c)
	}
	// Another medium holding block 1 under its hash, and an unknown hash.
	if c := m.ApplyTiers(enginekv.Event{Kind: enginekv.Stored, Hashes: []enginekv.Hash{h[0], enginekv.IntHash(77)}, Medium: "Disk"}); len(c.OffloadedStored) != 0 {
		t.Fatalf("a key the CPU tier holds is offloaded already: %+v", c)
	}
	if m.Stats().Orphans != 1 {
		t.Fatalf("unknown offloaded hash not counted: %+v", m.Stats())
	}
	// AllBlocksCleared: the GPU tier goes, the offloaded copy of block 1 stays.
	c := m.ApplyTiers(enginekv.Event{Kind: enginekv.Cleared})
	slices.Sort(c.Removed)
	rest := slices.Clone(want[1:])
	slices.Sort(rest)
	if !slices.Equal(c.Removed, rest) || len(c.OffloadedRemoved) != 0 || !slices.Equal(m.OffloadedKeys(), want[:1]) || len(m.Keys()) != 0 {
		t.Fatalf("cleared %+v; offloaded now %x", c, m.OffloadedKeys())
	}
	// Removing block 1 from CPU keeps it offloaded on Disk; from Disk too, gone.
	if c := m.ApplyTiers(enginekv.Event{Kind: enginekv.Removed, Hashes: h[:1], Medium: "CPU"}); len(c.OffloadedRemoved) != 0 {
		t.Fatalf("key still on Disk removed: %+v", c)
	}
	if c := m.ApplyTiers(enginekv.Event{Kind: enginekv.Removed, Hashes: h[:1], Medium: "Disk"}); !slices.Equal(c.OffloadedRemoved, want[:1]) {
		t.Fatalf("last offloaded copy: %+v", c)
	}
	// A reset forgets every tier.
	m.ApplyTiers(enginekv.Event{Kind: enginekv.Stored, Hashes: h[:1], Tokens: prompt[:bs], BlockSize: bs})
	m.ApplyTiers(enginekv.Event{Kind: enginekv.Stored, Hashes: h[:1], BlockSize: bs, Medium: "CPU"})
	if r := m.Clear(); !slices.Equal(r.Removed, want[:1]) || !slices.Equal(r.OffloadedRemoved, want[:1]) || m.Len() != 0 {
		t.Fatalf("reset %+v", r)
	}
}
