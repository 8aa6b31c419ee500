package bench

import (
	"context"
	"slices"
	"testing"

	"github.com/tether-project/tether/internal/prefix"
)

// A small LoRA run: tether loads adapters less often than the LoRA-blind
// tether, and keeps more of the cache than least_loaded. Every request's
// blocks are its adapter's.
func TestLoRABenchSmall(t *testing.T) {
	w := LoRAWorkload(LoRAOptions{AgentsPerType: 3, Seed: 1})
	w.WalkRequests(func(a *Agent, r *Request) {
		if r.Adapter == "" || !slices.Equal(r.Blocks, prefix.AdapterBlockHashes(r.Adapter, prefix.Tokenize(prefix.RenderChat(r.Messages)), w.BlockSize)) {
			t.Fatalf("%s: adapter %q, blocks not the adapter's", a.ID, r.Adapter)
		}
	})
	rs, err := RunLoRABench(context.Background(), LoRABenchConfig{Workload: LoRAOptions{AgentsPerType: 3}, Seeds: []uint64{1},
		LoRAPolicies: []LoRAPolicy{LoRATether, LoRABlind, LoRALeastLoaded}})
	if err != nil {
		t.Fatal(err)
	}
	tether, blind, least := rs[0], rs[1], rs[2]
	if !(tether.LoadsPer1k[0] < blind.LoadsPer1k[0]) || !(tether.HitRate[0] > least.HitRate[0]) {
		t.Fatalf("loads per 1,000: tether %v, blind %v; hit rate tether %v, least_loaded %v",
			tether.LoadsPer1k, blind.LoadsPer1k, tether.HitRate, least.HitRate)
	}
}
