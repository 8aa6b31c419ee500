package fsm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// benchKey is a UUID-shaped 36-byte conversation id.
func benchKey(rng *rand.Rand) string {
	a, b := rng.Uint64(), rng.Uint64()
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", uint32(a), uint16(a>>32), uint16(a>>48), uint16(b), b>>16&0xffffffffffff)
}

func benchBind(rng *rand.Rand, key string) Bind {
	inst := func() string { return fmt.Sprintf("ctx-%02d.pool-a.svc:8000", rng.IntN(64)) }
	chosen := inst()
	return Bind{
		Fleet: FleetContext, Key: key, ConversationID: key, Instance: chosen,
		Decision: Decision{
			Edge: fmt.Sprintf("edge-%d", rng.IntN(3)), Policy: "least_tokens", RequestID: benchKey(rng),
			Candidates: []Candidate{
				{Instance: chosen, Score: rng.Float64(), CachedTokens: uint32(rng.IntN(100000)), LoadTokens: uint32(rng.IntN(50000))},
				{Instance: inst(), Score: rng.Float64(), CachedTokens: uint32(rng.IntN(100000)), LoadTokens: uint32(rng.IntN(50000))},
				{Instance: inst(), Score: rng.Float64(), CachedTokens: uint32(rng.IntN(100000)), LoadTokens: uint32(rng.IntN(50000))},
			},
		},
	}
}

// bigState is a machine holding a million realistic bindings, built once
// per benchmark binary run (building it is itself a bind-throughput run).
var bigState struct {
	once sync.Once
	m    *Machine
	keys []string
}

// bigStateBindings is a million, the published target's size;
// FSM_BENCH_BINDINGS overrides it for quick profiling runs.
var bigStateBindings = func() int {
	if n, err := strconv.Atoi(os.Getenv("FSM_BENCH_BINDINGS")); err == nil && n > 0 {
		return n
	}
	return 1_000_000
}()

func bigMachine(b *testing.B) (*Machine, []string) {
	bigState.once.Do(func() {
		rng := rand.New(rand.NewPCG(42, 42))
		m := NewMachine()
		keys := make([]string, 0, bigStateBindings)
		var id uint64
		t0 := int64(1_700_000_000_000_000_000)
		for index := uint64(1); len(keys) < bigStateBindings; index++ {
			props := make([]Proposal, 0, 1000)
			for j := 0; j < 1000 && len(keys) < bigStateBindings; j++ {
				k := benchKey(rng)
				keys = append(keys, k)
				id++
				var pid ProposalID
				pid[0], pid[8], pid[9], pid[10] = 1, byte(id), byte(id>>8), byte(id>>16)
				pid[11] = byte(id >> 24)
				props = append(props, Proposal{ID: pid, Event: benchBind(rng, k)})
			}
			data, err := EncodeEntry(props)
			if err != nil {
				panic(err)
			}
			if _, err := m.Apply(Entry{Index: index, Time: t0 + int64(index)*int64(time.Millisecond), Data: data}); err != nil {
				panic(err)
			}
		}
		rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		bigState.m, bigState.keys = m, keys
	})
	if bigState.m.State().Len() != bigStateBindings {
		b.Fatalf("big state holds %d bindings", bigState.m.State().Len())
	}
	return bigState.m, bigState.keys
}

// BenchmarkStickyLookup: a lookup of an existing binding among 1,000,000
// (random keys, so the trie is mostly out of cache). Target ≤ 200 ns, 0 allocs.
func BenchmarkStickyLookup(b *testing.B) {
	m, keys := bigMachine(b)
	benchLookup(b, m.State(), hotKeys(keys))
}

// BenchmarkStickyLookupHotSet: a million bindings, lookups spread over the
// 8,192 conversations that are active right now (the realistic case: most
// bindings are idle), so the paths to them stay in cache.
func BenchmarkStickyLookupHotSet(b *testing.B) {
	m, keys := bigMachine(b)
	benchLookup(b, m.State(), hotKeys(keys[:8192]))
}

func benchLookup(b *testing.B, s *State, keys []string) {
	b.ReportAllocs()
	c0 := processCPU()
	b.ResetTimer()
	found := 0
	for i, j := 0, 0; i < b.N; i++ {
		if _, ok := s.Lookup(FleetContext, keys[j]); ok { // keys are shuffled: a random walk over all of them
			found++
		}
		if j++; j == len(keys) {
			j = 0
		}
	}
	b.StopTimer()
	if found != b.N {
		b.Fatalf("found %d of %d", found, b.N)
	}
	b.ReportMetric(float64(processCPU()-c0)/float64(b.N), "cpu-ns/op")
}

// processCPU is the CPU time this process has used (user + system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// hotKeys copies the (shuffled) keys into one contiguous string, walked in
// order: a request's key was just parsed and is in cache, so the benchmark
// should not charge a cache miss for reading it.
func hotKeys(keys []string) []string {
	var sb strings.Builder
	for _, k := range keys {
		sb.WriteString(k)
	}
	all := sb.String()
	out := make([]string, len(keys))
	at := 0
	for i, k := range keys {
		out[i] = all[at : at+len(k)]
		at += len(k)
	}
	return out
}

// BenchmarkStickyLookupGoMap is the floor of this machine: the same
// lookups in Go's built-in map[string]*Binding (no persistence, no
// concurrent snapshots). It calibrates BenchmarkStickyLookup's figure.
func BenchmarkStickyLookupGoMap(b *testing.B) {
	m, keys := bigMachine(b)
	index := make(map[string]*Binding, len(keys))
	m.State().ForEachBinding(func(x Binding) bool {
		index[strings.Clone(x.Key)] = &x
		return true
	})
	keys = hotKeys(keys)
	b.ReportAllocs()
	b.ResetTimer()
	found := 0
	for i, j := 0, 0; i < b.N; i++ {
		if x := index[keys[j]]; x != nil && x.Fleet == FleetContext {
			found++
		}
		if j++; j == len(keys) {
			j = 0
		}
	}
	if found != b.N {
		b.Fatalf("found %d of %d", found, b.N)
	}
}

// BenchmarkSnapshotRestore writes and reads back a snapshot of a million
// bindings. Targets: ≤ 3 s each, ≤ 300 encoded bytes per binding.
func BenchmarkSnapshotRestore(b *testing.B) {
	m, _ := bigMachine(b)
	s := m.State()
	var buf bytes.Buffer
	buf.Grow(300 << 20)
	var snapSecs, restoreSecs, snapCPU, restoreCPU float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		buf.Reset()
		t0, c0 := time.Now(), processCPU()
		if err := s.WriteSnapshot(&buf); err != nil {
			b.Fatal(err)
		}
		t1, c1 := time.Now(), processCPU()
		r, err := ReadSnapshot(bytes.NewReader(buf.Bytes()))
		if err != nil {
			b.Fatal(err)
		}
		t2, c2 := time.Now(), processCPU()
		if r.Len() != s.Len() {
			b.Fatalf("restored %d bindings of %d", r.Len(), s.Len())
		}
		snapSecs += t1.Sub(t0).Seconds()
		restoreSecs += t2.Sub(t1).Seconds()
		snapCPU += (c1 - c0).Seconds()
		restoreCPU += (c2 - c1).Seconds()
	}
	b.ReportMetric(snapSecs/float64(b.N), "snapshot-s")
	b.ReportMetric(restoreSecs/float64(b.N), "restore-s")
	// CPU seconds of the whole process (GC workers included): on a shared
	// machine wall time also counts time spent waiting for a core.
	b.ReportMetric(snapCPU/float64(b.N), "snapshot-cpu-s")
	b.ReportMetric(restoreCPU/float64(b.N), "restore-cpu-s")
	b.ReportMetric(float64(buf.Len())/float64(s.Len()), "B/binding")
}

// BenchmarkApplyBind applies entries of 64 new bindings each to a machine
// that already holds a million (at capacity, so every bind also evicts the
// least recently used binding). Reports binds/s.
func BenchmarkApplyBind(b *testing.B) {
	benchApplyBind(b, true)
}

// BenchmarkApplyBindEmpty is the same from an empty state (no evictions).
func BenchmarkApplyBindEmpty(b *testing.B) {
	benchApplyBind(b, false)
}

func benchApplyBind(b *testing.B, full bool) {
	const batch = 64
	rng := rand.New(rand.NewPCG(7, 7))
	entries := make([][]byte, b.N)
	var id uint64 = 1 << 40
	for i := range entries {
		props := make([]Proposal, batch)
		for j := range props {
			id++
			var pid ProposalID
			pid[0], pid[1], pid[2], pid[3], pid[4], pid[5] = 2, byte(id), byte(id>>8), byte(id>>16), byte(id>>24), byte(id>>32)
			props[j] = Proposal{ID: pid, Event: benchBind(rng, benchKey(rng))}
		}
		data, err := EncodeEntry(props)
		if err != nil {
			b.Fatal(err)
		}
		entries[i] = data
	}
	var m *Machine
	if full {
		big, _ := bigMachine(b)
		m = NewMachine()
		m.state.Store(big.State()) // share the immutable state; the big machine is untouched
	} else {
		m = NewMachine()
	}
	start := m.State()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range entries {
		if _, err := m.Apply(Entry{Index: start.Index() + uint64(i) + 1, Time: start.Time() + int64(i+1)*1000, Data: entries[i]}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "binds/s")
}

// BenchmarkApplyTouch: entries touching 64 random existing keys among a million.
func BenchmarkApplyTouch(b *testing.B) {
	big, keys := bigMachine(b)
	m := NewMachine()
	m.state.Store(big.State())
	start := m.State()
	rng := rand.New(rand.NewPCG(9, 9))
	entries := make([][]byte, b.N)
	for i := range entries {
		var t Touch
		for j := 0; j < 64; j++ {
			t.Keys = append(t.Keys, FleetKey{FleetContext, keys[rng.IntN(len(keys))]})
		}
		data, err := EncodeEntry([]Proposal{{Event: t}})
		if err != nil {
			b.Fatal(err)
		}
		entries[i] = data
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range entries {
		if _, err := m.Apply(Entry{Index: start.Index() + uint64(i) + 1, Time: start.Time() + int64(i+1)*1000, Data: entries[i]}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*64)/b.Elapsed().Seconds(), "touches/s")
}

// BenchmarkInstanceDown: one instance of 64 goes down at a million bindings
// (a scan of the recency order and ~15,600 evictions in one apply).
func BenchmarkInstanceDown(b *testing.B) {
	big, _ := bigMachine(b)
	data, err := EncodeEntry([]Proposal{{Event: InstanceState{Instance: "ctx-07.pool-a.svc:8000", Fleet: FleetContext, Status: InstanceDown}}})
	if err != nil {
		b.Fatal(err)
	}
	start := big.State()
	evicted := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m := NewMachine()
		m.state.Store(start)
		rs, err := m.Apply(Entry{Index: start.Index() + 1, Time: start.Time() + 1, Data: data})
		if err != nil {
			b.Fatal(err)
		}
		evicted = len(rs[0].Evicted)
	}
	b.ReportMetric(float64(evicted), "evicted")
}

// BenchmarkHash: Hash() at a million bindings (the record part is incremental).
func BenchmarkHash(b *testing.B) {
	big, _ := bigMachine(b)
	s := big.State()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = s.Hash()
	}
}
