package kvcache

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tether-project/tether/internal/prefix"
)

// chain returns n distinct chained hashes derived from seed, as a prompt's
// block hashes would be.
func chain(seed uint32, n int) []uint64 {
	toks := make([]uint32, n*4)
	for i := range toks {
		toks[i] = seed*1_000_003 + uint32(i)
	}
	return prefix.BlockHashes(toks, 4)
}

func TestMatchCountsLeadingResidentBlocksWithoutSideEffects(t *testing.T) {
	c := New(10)
	a := chain(1, 4)
	if n := c.Match(a); n != 0 {
		t.Fatalf("empty cache Match = %d, want 0", n)
	}
	if _, _, _, err := c.Acquire(a[:3]); err != nil {
		t.Fatal(err)
	}
	c.Release(a[:3])
	if n := c.Match(a); n != 3 {
		t.Fatalf("Match = %d, want 3 (first three resident)", n)
	}
	// A gap stops the match even if later blocks are resident.
	gapped := []uint64{a[0], 12345, a[2]}
	if n := c.Match(gapped); n != 1 {
		t.Fatalf("Match with a gap = %d, want 1", n)
	}
	if c.Used() != 3 || c.Referenced() != 0 {
		t.Fatalf("Used/Referenced = %d/%d, want 3/0", c.Used(), c.Referenced())
	}
}

func TestAcquireReportsHitsStoredAndRemoved(t *testing.T) {
	c := New(6)
	a := chain(1, 4)
	hit, stored, removed, err := c.Acquire(a)
	if err != nil || hit != 0 || !slices.Equal(stored, a) || removed != nil {
		t.Fatalf("first Acquire = %d %v %v %v, want 0 hits, all stored, none removed", hit, stored, removed, err)
	}
	c.Release(a)

	// A longer request sharing the first 3 blocks.
	b := append(slices.Clone(a[:3]), chain(2, 3)...)
	hit, stored, removed, err = c.Acquire(b)
	if err != nil {
		t.Fatal(err)
	}
	if hit != 3 {
		t.Fatalf("hitBlocks = %d, want 3", hit)
	}
	if !slices.Equal(stored, b[3:]) {
		t.Fatalf("stored = %v, want %v", stored, b[3:])
	}
	// 4 resident + 3 new = 7 > 6: one eviction, and only a[3] is unreferenced.
	if !slices.Equal(removed, []uint64{a[3]}) {
		t.Fatalf("removed = %v, want [a3]", removed)
	}
	if c.Evictions() != 1 || c.Used() != 6 || c.Referenced() != 6 {
		t.Fatalf("Evictions/Used/Referenced = %d/%d/%d, want 1/6/6", c.Evictions(), c.Used(), c.Referenced())
	}
}

func TestReferencedBlocksAreNeverEvictedAndNoSpaceChangesNothing(t *testing.T) {
	c := New(4)
	a := chain(1, 3)
	if _, _, _, err := c.Acquire(a); err != nil {
		t.Fatal(err)
	}
	idle := chain(9, 1)
	if _, _, _, err := c.Acquire(idle); err != nil {
		t.Fatal(err)
	}
	c.Release(idle)

	b := chain(2, 2) // needs 2 blocks: only idle's 1 block can be freed
	hit, stored, removed, err := c.Acquire(b)
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("err = %v, want ErrNoSpace", err)
	}
	if hit != 0 || stored != nil || removed != nil {
		t.Fatalf("failed Acquire reported %d %v %v, want nothing", hit, stored, removed)
	}
	if c.Used() != 4 || c.Referenced() != 3 || c.Evictions() != 0 || !c.Contains(idle[0]) {
		t.Fatalf("failed Acquire changed the cache: used %d referenced %d evictions %d", c.Used(), c.Referenced(), c.Evictions())
	}
	for _, h := range b {
		if c.Contains(h) {
			t.Fatal("failed Acquire left a block behind")
		}
	}
	// A request reusing its own unreferenced blocks counts them as not
	// evictable: idle + 1 new needs 1 free block, and there is none.
	if _, _, _, err := c.Acquire([]uint64{idle[0], 777}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("err = %v, want ErrNoSpace (own block cannot be evicted for itself)", err)
	}
	c.Release(a)
	if _, _, removed, err := c.Acquire(b); err != nil || len(removed) != 2 {
		t.Fatalf("after release: removed %v err %v, want 2 evictions and success", removed, err)
	}
}

func TestEvictionTakesChainTailsFirstSoPrefixesSurvive(t *testing.T) {
	c := New(8)
	a := chain(1, 4)
	b := chain(2, 4)
	for _, h := range [][]uint64{a, b} {
		if _, _, _, err := c.Acquire(h); err != nil {
			t.Fatal(err)
		}
	}
	c.Release(a) // a is older than b
	c.Release(b)
	_, _, removed, err := c.Acquire(chain(3, 2))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []uint64{a[3], a[2]}) {
		t.Fatalf("removed = %v, want a's last two blocks, tail first", removed)
	}
	if n := c.Match(a); n != 2 {
		t.Fatalf("Match(a) = %d after losing its tail, want 2", n)
	}
	if n := c.Match(b); n != 4 {
		t.Fatalf("Match(b) = %d, want 4 (more recent)", n)
	}
}

func TestMatchDoesNotRefreshRecency(t *testing.T) {
	c := New(2)
	a, b := chain(1, 1), chain(2, 1)
	for _, h := range [][]uint64{a, b} {
		if _, _, _, err := c.Acquire(h); err != nil {
			t.Fatal(err)
		}
		c.Release(h)
	}
	c.Match(a) // must not make a younger than b
	_, _, removed, err := c.Acquire(chain(3, 1))
	if err != nil || !slices.Equal(removed, a) {
		t.Fatalf("removed = %v err %v, want a (oldest)", removed, err)
	}
}

func TestReleaseIgnoresUnknownAndOverRelease(t *testing.T) {
	c := New(4)
	a := chain(1, 2)
	if _, _, _, err := c.Acquire(a); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.Acquire(a); err != nil { // two requests share a
		t.Fatal(err)
	}
	c.Release(a)
	if c.Referenced() != 2 {
		t.Fatalf("Referenced = %d after one of two releases, want 2", c.Referenced())
	}
	c.Release(a)
	c.Release(a)
	c.Release([]uint64{42})
	if c.Referenced() != 0 || c.Used() != 2 {
		t.Fatalf("Referenced/Used = %d/%d, want 0/2", c.Referenced(), c.Used())
	}
}

func TestZeroCapacityRejectsEverything(t *testing.T) {
	c := New(-5)
	if c.Capacity() != 0 {
		t.Fatalf("Capacity = %d, want 0", c.Capacity())
	}
	if _, _, _, err := c.Acquire(chain(1, 1)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("err = %v, want ErrNoSpace", err)
	}
	if hit, _, _, err := c.Acquire(nil); hit != 0 || err != nil {
		t.Fatalf("empty Acquire = %d, %v", hit, err)
	}
}

// model is a slow, obviously-correct reference of the cache's semantics.
type model struct {
	capacity  int
	refs      map[uint64]int // resident blocks
	lru       []uint64       // unreferenced blocks, most recent first
	evictions int64
}

func (m *model) lruRemove(h uint64) {
	if i := slices.Index(m.lru, h); i >= 0 {
		m.lru = slices.Delete(m.lru, i, i+1)
	}
}

func (m *model) acquire(hashes []uint64) (int, []uint64, []uint64, bool) {
	hit := len(hashes)
	missing := 0
	own := map[uint64]bool{}
	for i, h := range hashes {
		r, ok := m.refs[h]
		if !ok {
			if hit == len(hashes) {
				hit = i
			}
			missing++
		} else if r == 0 {
			own[h] = true
		}
	}
	if missing > m.capacity-len(m.refs)+len(m.lru)-len(own) {
		return 0, nil, nil, false
	}
	var stored, removed []uint64
	inserted := map[uint64]bool{}
	for _, h := range hashes {
		if r, ok := m.refs[h]; ok {
			if r == 0 {
				m.lruRemove(h)
			}
			m.refs[h] = r + 1
		}
	}
	for _, h := range hashes {
		if _, ok := m.refs[h]; ok {
			if inserted[h] { // a repeat of a block inserted by this call
				m.refs[h]++
			}
			continue
		}
		inserted[h] = true
		if len(m.refs) >= m.capacity {
			old := m.lru[len(m.lru)-1]
			m.lru = m.lru[:len(m.lru)-1]
			delete(m.refs, old)
			removed = append(removed, old)
			m.evictions++
		}
		m.refs[h] = 1
		stored = append(stored, h)
	}
	return hit, stored, removed, true
}

func (m *model) release(hashes []uint64) {
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if r, ok := m.refs[h]; ok && r > 0 {
			m.refs[h] = r - 1
			if r == 1 {
				m.lru = append([]uint64{h}, m.lru...)
			}
		}
	}
}

// TestMatchesReferenceModel drives the cache and the reference model with the
// same random (seeded) sequence of requests sharing prefixes.
func TestMatchesReferenceModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const capacity = 40
	c := New(capacity)
	m := &model{capacity: capacity, refs: map[uint64]int{}}
	prompts := make([][]uint64, 12)
	for i := range prompts {
		// Prompts share prefixes with a few "system prompts".
		base := chain(uint32(i%3), 6)
		n := rng.IntN(6) + 1
		prompts[i] = append(base[:n:n], chain(uint32(100+i), rng.IntN(10))...)
	}
	// Repeated hashes within one call (not a chain, but must stay consistent).
	d := chain(200, 2)
	prompts = append(prompts, []uint64{d[0], d[1], d[0]}, []uint64{prompts[0][0], d[1], prompts[0][0]})
	var running [][]uint64
	for step := 0; step < 5000; step++ {
		if len(running) > 0 && (rng.IntN(2) == 0 || len(running) > 4) {
			i := rng.IntN(len(running))
			c.Release(running[i])
			m.release(running[i])
			running = slices.Delete(running, i, i+1)
			continue
		}
		p := prompts[rng.IntN(len(prompts))]
		if n := c.Match(p); n != func() int {
			for i, h := range p {
				if _, ok := m.refs[h]; !ok {
					return i
				}
			}
			return len(p)
		}() {
			t.Fatalf("step %d: Match = %d disagrees with the model", step, n)
		}
		hit, stored, removed, err := c.Acquire(p)
		mhit, mstored, mremoved, ok := m.acquire(p)
		if (err == nil) != ok {
			t.Fatalf("step %d: Acquire err %v, model ok %v", step, err, ok)
		}
		if err != nil {
			continue
		}
		if hit != mhit || !slices.Equal(stored, mstored) || !slices.Equal(removed, mremoved) {
			t.Fatalf("step %d: got %d %v %v, model %d %v %v", step, hit, stored, removed, mhit, mstored, mremoved)
		}
		running = append(running, p)
		if c.Used() != len(m.refs) || c.Evictions() != m.evictions || c.Used() > capacity {
			t.Fatalf("step %d: used %d evictions %d, model %d %d", step, c.Used(), c.Evictions(), len(m.refs), m.evictions)
		}
	}
	if m.evictions == 0 {
		t.Fatal("the sequence never evicted: the test exercises nothing")
	}
}

func TestHashTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	tab := newHashTable(0)
	ref := map[uint64]int32{}
	for i := 0; i < 200_000; i++ {
		// Small key space so inserts, removes and probe-run wrap-around mix.
		k := uint64(rng.IntN(3000))
		switch rng.IntN(3) {
		case 0, 1:
			if _, ok := ref[k]; !ok {
				tab.put(k, int32(i))
				ref[k] = int32(i)
			}
		case 2:
			tab.remove(k)
			delete(ref, k)
		}
		if tab.count != len(ref) {
			t.Fatalf("op %d: count %d, want %d", i, tab.count, len(ref))
		}
	}
	for k := uint64(0); k < 3000; k++ {
		v, ok := tab.get(k)
		rv, rok := ref[k]
		if ok != rok || v != rv {
			t.Fatalf("key %d: got %d %v, want %d %v", k, v, ok, rv, rok)
		}
	}
}

// BenchmarkPrefixMatch matches a 2,000-block prompt (128k tokens at block
// size 64) that is fully resident in a 16,384-block cache.
func BenchmarkPrefixMatch(b *testing.B) {
	c := New(16384)
	for i := 0; i < 7; i++ {
		h := chain(uint32(1000+i), 2000)
		if _, _, _, err := c.Acquire(h); err != nil {
			b.Fatal(err)
		}
		c.Release(h)
	}
	p := chain(1006, 2000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if c.Match(p) != 2000 {
			b.Fatal("prompt not resident")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/match")
}

// BenchmarkAcquireRelease runs a request of 100 resident + 20 new blocks
// against a full cache (600 blocks, 64 rotating requests need 1,380), so
// every call also evicts 20 blocks.
func BenchmarkAcquireRelease(b *testing.B) {
	c := New(600)
	sys := chain(1, 100)
	for i := 0; i < 40; i++ {
		h := append(slices.Clone(sys), chain(uint32(10+i), 20)...)
		if _, _, _, err := c.Acquire(h); err != nil {
			b.Fatal(err)
		}
		c.Release(h)
	}
	reqs := make([][]uint64, 64)
	for i := range reqs {
		reqs[i] = append(slices.Clone(sys), chain(uint32(100+i), 20)...)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := reqs[i%len(reqs)]
		if _, _, _, err := c.Acquire(r); err != nil {
			b.Fatal(err)
		}
		c.Release(r)
	}
}
