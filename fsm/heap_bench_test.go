package fsm

import (
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// BenchmarkLiveHeapPerBinding measures the Go heap a machine's live state
// holds per binding: realistic Binds (UUID keys, 3 candidates in the
// decision) applied in entries of 1,000, heap measured after a GC before
// and after. An edge's RSS was measured at ~2.5 KB per binding
// (RSS also counts the Raft log, the archive's page cache and the
// allocator's slack); its target is ≤ 500 B of live state per binding.
// FSM_BENCH_HEAP_BINDINGS sets the count (default 200,000).
func BenchmarkLiveHeapPerBinding(b *testing.B) {
	n := 200_000
	if v, err := strconv.Atoi(os.Getenv("FSM_BENCH_HEAP_BINDINGS")); err == nil && v > 0 {
		n = v
	}
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		rng := rand.New(rand.NewPCG(7, 7))
		m := NewMachine()
		t0 := int64(1_700_000_000_000_000_000)
		var id uint64
		for index, bound := uint64(1), 0; bound < n; index++ {
			props := make([]Proposal, 0, 1000)
			for j := 0; j < 1000 && bound < n; j++ {
				id++
				var pid ProposalID
				pid[0], pid[8], pid[9], pid[10], pid[11] = 2, byte(id), byte(id>>8), byte(id>>16), byte(id>>24)
				props = append(props, Proposal{ID: pid, Event: benchBind(rng, benchKey(rng))})
				bound++
			}
			data, err := EncodeEntry(props)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := m.Apply(Entry{Index: index, Time: t0 + int64(index)*int64(time.Millisecond), Data: data}); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if m.State().Len() != n {
			b.Fatalf("%d bindings", m.State().Len())
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "heapB/binding")
		runtime.KeepAlive(m)
	}
}
