package fsm

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

type testVal struct {
	tag uint8
	key string
	v   int
}

func (t *testVal) mapKey() (uint8, string) { return t.tag, t.key }

// checkMap compares a pmap with a model and checks that iteration visits
// every entry once, in the same order twice.
func checkMap(t *testing.T, m *pmap[*testVal], model map[string]int) {
	t.Helper()
	if m.len() != len(model) {
		t.Fatalf("len %d, model %d", m.len(), len(model))
	}
	for k, v := range model {
		got, ok := m.get(k[0], k[1:])
		if !ok || got.v != v {
			t.Fatalf("get(%q) = %v %v, want %d", k, got, ok, v)
		}
	}
	seen := map[string]bool{}
	var order []string
	m.each(func(x *testVal) bool {
		k := string(rune(x.tag)) + x.key
		if seen[k] {
			t.Fatalf("iteration visits %q twice", k)
		}
		seen[k] = true
		order = append(order, k)
		return true
	})
	if len(seen) != len(model) {
		t.Fatalf("iteration visited %d of %d", len(seen), len(model))
	}
}

func TestPersistentMapAgainstModel(t *testing.T) {
	for _, mask := range []uint64{^uint64(0), 0xff, 0x3, 0} {
		t.Run(fmt.Sprintf("mask %x", mask), func(t *testing.T) {
			keyHashMask = mask
			defer func() { keyHashMask = ^uint64(0) }()
			seed := uint64(mask) + 7
			rng := rand.New(rand.NewPCG(seed, 1))
			var m pmap[*testVal]
			model := map[string]int{}
			type version struct {
				m     pmap[*testVal]
				model map[string]int
			}
			var versions []version
			owner := newOwner()
			for step := 0; step < 3000; step++ {
				if step%50 == 0 {
					// Publish: keep a frozen copy; later owners must not touch it.
					versions = append(versions, version{m, cloneModel(model)})
					owner = newOwner()
				}
				tag := uint8(rng.IntN(2) + 1)
				key := fmt.Sprintf("k%d", rng.IntN(400))
				mk := string(rune(tag)) + key
				if rng.IntN(3) == 0 {
					_, found := m.delete(owner, tag, key)
					if _, want := model[mk]; found != want {
						t.Fatalf("seed %d step %d: delete found %v, model %v", seed, step, found, want)
					}
					delete(model, mk)
				} else {
					v := rng.IntN(1000)
					_, replaced := m.set(owner, &testVal{tag, key, v})
					if _, want := model[mk]; replaced != want {
						t.Fatalf("seed %d step %d: set replaced %v, model %v", seed, step, replaced, want)
					}
					model[mk] = v
				}
			}
			checkMap(t, &m, model)
			for i := range versions {
				checkMap(t, &versions[i].m, versions[i].model)
			}
			// Deleting everything leaves an empty map.
			for k := range model {
				if _, ok := m.delete(newOwner(), k[0], k[1:]); !ok {
					t.Fatalf("delete %q failed", k)
				}
			}
			if m.len() != 0 || m.root != nil {
				t.Fatalf("emptied map: len %d root %v", m.len(), m.root)
			}
		})
	}
}

func cloneModel(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func TestRecencyTrieAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var tr lruTree
	live := map[uint64]*bindingRec{}
	next := uint64(1)
	type version struct {
		tr   lruTree
		seqs []uint64
	}
	var versions []version
	owner := newOwner()
	sorted := func() []uint64 {
		var s []uint64
		for k := range live {
			s = append(s, k)
		}
		slices.Sort(s)
		return s
	}
	check := func(tr *lruTree, want []uint64) {
		t.Helper()
		var got []uint64
		tr.each(func(r *bindingRec) bool { got = append(got, r.seq); return true })
		if !slices.Equal(got, want) {
			t.Fatalf("order %v, want %v", got, want)
		}
		r, ok := tr.oldest()
		if ok != (len(want) > 0) || (ok && r.seq != want[0]) {
			t.Fatalf("oldest %v %v, want %v", r, ok, want)
		}
	}
	for step := 0; step < 20000; step++ {
		if step%500 == 0 {
			versions = append(versions, version{tr, sorted()})
			owner = newOwner()
		}
		switch {
		case rng.IntN(2) == 0 || len(live) == 0:
			// Jumps make the trie grow in height.
			if rng.IntN(1000) == 0 {
				next += uint64(rng.Int64N(1 << 40))
			}
			r := &bindingRec{seq: next}
			tr.insert(owner, next, r)
			live[next] = r
			next++
		default:
			s := sorted()
			var victim uint64
			if rng.IntN(2) == 0 {
				victim = s[0]
			} else {
				victim = s[rng.IntN(len(s))]
			}
			tr.delete(owner, victim)
			delete(live, victim)
		}
	}
	check(&tr, sorted())
	for _, v := range versions {
		check(&v.tr, v.seqs)
	}
	// Deleting a sequence number that is not there changes nothing.
	tr.delete(newOwner(), next+1<<50)
	check(&tr, sorted())
}

func TestHashKeyStable(t *testing.T) {
	// The trie layout of every replica depends on these values: a change
	// here is a change of the state format.
	cases := []struct {
		tag  uint8
		key  string
		want uint64
	}{
		{0, "", 0x3b11e25ed979a557},
		{1, "conv-1", 0x39627ceedb5d54d0},
		{2, "0f8c7a52-9a1d-4a40-b5f5-3b3f0d9e8c11", 0xdfc1ca99d6e45319},
	}
	for _, c := range cases {
		if got := hashKey(c.tag, c.key); got != c.want {
			t.Errorf("hashKey(%d, %q) = %#x, want %#x", c.tag, c.key, got, c.want)
		}
	}
	if hashKey(1, "a") == hashKey(2, "a") || hashKey(1, "ab") == hashKey(1, "ba") {
		t.Error("hashKey ignores the tag or byte order")
	}
}

func TestBuildPmapMatchesIncremental(t *testing.T) {
	defer func() { keyHashMask = ^uint64(0) }()
	for _, mask := range []uint64{^uint64(0), 0x3ff, 0x1, 0} {
		keyHashMask = mask
		rng := rand.New(rand.NewPCG(mask, 11))
		var inc pmap[*testVal]
		var vals []*testVal
		seen := map[string]bool{}
		owner := newOwner()
		for i := 0; i < 2000; i++ {
			v := &testVal{tag: uint8(1 + rng.IntN(2)), key: fmt.Sprintf("k%d", rng.IntN(5000)), v: i}
			mk := string(rune(v.tag)) + v.key
			if seen[mk] {
				continue
			}
			seen[mk] = true
			inc.set(owner, v)
			vals = append(vals, v)
		}
		built, dup, ok := buildPmap(newOwner(), slices.Clone(vals))
		if !ok {
			t.Fatalf("mask %x: unexpected duplicate %q", mask, dup)
		}
		var a, b []*testVal
		inc.each(func(v *testVal) bool { a = append(a, v); return true })
		built.each(func(v *testVal) bool { b = append(b, v); return true })
		if !slices.Equal(a, b) || built.len() != inc.len() {
			t.Fatalf("mask %x: bulk-built map iterates differently", mask)
		}
		for _, v := range vals {
			if got, ok := built.get(v.tag, v.key); !ok || got != v {
				t.Fatalf("mask %x: bulk-built map misses %q", mask, v.key)
			}
		}
		// The bulk-built map stays a correct persistent map under updates.
		o := newOwner()
		for _, v := range vals[:500] {
			if _, ok := built.delete(o, v.tag, v.key); !ok {
				t.Fatalf("mask %x: delete from bulk-built map failed", mask)
			}
		}
		if built.len() != len(vals)-500 {
			t.Fatalf("mask %x: len %d after deletes", mask, built.len())
		}
		if _, dup, ok := buildPmap(newOwner(), append(slices.Clone(vals), &testVal{tag: vals[7].tag, key: vals[7].key})); ok || dup != vals[7].key {
			t.Fatalf("mask %x: duplicate not reported (%q %v)", mask, dup, ok)
		}
	}
	keyHashMask = ^uint64(0)
}

// Lookup's hand-specialised trie walk agrees with the generic one, also
// through deep paths and full-hash collision nodes.
func TestLookupThroughCollisions(t *testing.T) {
	defer func() { keyHashMask = ^uint64(0) }()
	for _, mask := range []uint64{^uint64(0), 0x7, 0} {
		keyHashMask = mask
		h := newHarness(t)
		for i := 0; i < 300; i++ {
			f := Fleet(1 + i%2)
			h.one(int64(i+1), bindEv(f, fmt.Sprintf("key-%d", i), fmt.Sprintf("inst-%d", i%5)))
		}
		s := h.m.State()
		for i := 0; i < 300; i++ {
			f := Fleet(1 + i%2)
			k := fmt.Sprintf("key-%d", i)
			b, ok := s.Lookup(f, k)
			r, rok := s.bindings.get(uint8(f), k)
			if !ok || !rok || b.Key != k || r.Key != k || b.Instance != fmt.Sprintf("inst-%d", i%5) {
				t.Fatalf("mask %x: Lookup(%v, %q) = %+v %v", mask, f, k, b, ok)
			}
			if _, ok := s.Lookup(3-f, k); ok {
				t.Fatalf("mask %x: %q found in the other fleet", mask, k)
			}
		}
		if _, ok := s.Lookup(FleetContext, "absent"); ok {
			t.Fatalf("mask %x: absent key found", mask)
		}
	}
	keyHashMask = ^uint64(0)
}
