package bench

import (
	"context"
	"testing"
	"time"
)

// sharedPrefixAgents: agents a and b each send one prompt whose first 40
// blocks are a common system prompt, b a minute after a (long past any
// placement prediction's lifetime).
func sharedPrefixAgents() *Workload {
	agent := func(id string, start time.Duration) *Agent {
		var keys []uint64
		for j := range 40 {
			keys = append(keys, namespaceKey(stringHash("system"), int64(j)))
		}
		for j := range 8 {
			keys = append(keys, namespaceKey(stringHash(id), int64(j)))
		}
		return &Agent{ID: id, Start: start, Steps: []Step{{Request: &Request{PromptTokens: 64 * len(keys), OutputTokens: 4, Keys: keys, Blocks: ChainBlocks(keys)}}}}
	}
	return &Workload{Name: "shared-prefix", BlockSize: 64, Agents: []*Agent{agent("a", 0), agent("b", time.Minute)}}
}

// Without KV events a tether edge models the caches of the engines it
// routes to (edge/kvshadow): a new conversation sharing a prefix routed a
// minute earlier goes where that prefix is, through the edge that routed
// it, or through another edge when the edges share their routes.
func TestShadowsCreditAPrefixRoutedLongAgo(t *testing.T) {
	w := sharedPrefixAgents()
	run := func(bThrough int, share Share) (sameInstance bool, cached int) {
		t.Helper()
		cfg := testConfig()
		cfg.Policy, cfg.Instances, cfg.Ranks, cfg.CapacityBlocks, cfg.Edges = PolicyTether, 4, 1, 1000, 2
		cfg.KVEvents, cfg.Share = KVEvents{Mode: KVEventsNone}, share
		cfg.EdgeFor = func(agent string, _ int) int {
			if agent == "b" {
				return bThrough
			}
			return 0
		}
		r, err := Simulate(context.Background(), w, cfg)
		if err != nil {
			t.Fatal(err)
		}
		a, b := instancesOf(r, "a"), instancesOf(r, "b")
		return a[0] == b[0], cachedByCall(r, "b")[0]
	}
	shared := ShippedShare
	shared.Shadows = true
	for _, tc := range []struct {
		name     string
		bThrough int
		share    Share
		want     bool
	}{
		{"the same edge", 0, ShippedShare, true},
		{"another edge, routes shared", 1, shared, true},
		// Each edge's shadow is its own: the other edge places b as a new
		// key away from a's live binding.
		{"another edge, routes not shared", 1, ShippedShare, false},
	} {
		same, cached := run(tc.bThrough, tc.share)
		if same != tc.want || (cached == 40*64) != tc.want {
			t.Errorf("%s: b on a's instance %v with %d cached tokens, want %v (2,560 cached when there)", tc.name, same, cached, tc.want)
		}
	}
}
