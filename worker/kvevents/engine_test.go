package kvevents

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/engine"
	"github.com/tether-project/tether/worker/engine/sim"
)

// keySet applies KV events to a set of keys.
type keySet struct {
	mu   sync.Mutex
	keys map[uint64]bool
}

func (s *keySet) apply(ev engine.KVEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[uint64]bool{}
	}
	for _, h := range ev.Removed {
		delete(s.keys, h)
	}
	for _, h := range ev.Stored {
		s.keys[h] = true
	}
}

func (s *keySet) snapshot() map[uint64]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.keys)
}

// The simulated engine publishing vLLM-format events, read back by a
// Source, gives exactly the keys the engine reports natively, evictions
// included.
func TestSimEngineSpeaksVLLMEvents(t *testing.T) {
	const bs = 4
	cfg := sim.DefaultConfig()
	cfg.BlockSize, cfg.CapacityBlocks, cfg.TimeScale = bs, 12, 0
	inner, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := NewEngine(inner, bs, []*Publisher{pub})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	var native, viaEvents keySet
	eng.SetKVEventSink(native.apply)
	src, err := enginekv.Start(enginekv.Config{Format: enginekv.FormatVLLM, Endpoints: []string{pub.Endpoint()}, ReplayEndpoints: []string{pub.ReplayEndpoint()}, Ranks: 1, BlockSize: bs}, func(k enginekv.RankKeys) {
		viaEvents.apply(engine.KVEvent{Rank: k.Rank, Stored: k.Stored, Removed: k.Removed})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	run := func(text string) {
		t.Helper()
		req := engine.Request{ID: text[:8], Prompt: prefix.Tokenize(text), MaxTokens: 1}
		if _, err := eng.Run(context.Background(), req, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Shared prefixes, then enough distinct prompts to evict (12 blocks).
	sys := strings.Repeat("system prompt words ", 4)
	for i := range 6 {
		run(sys + fmt.Sprintf("user question %d with a few more words here", i))
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		a, b := native.snapshot(), viaEvents.snapshot()
		if len(a) > 0 && maps.Equal(a, b) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys via vLLM events (%d) never matched the native ones (%d); source %+v", len(b), len(a), src.Status())
		}
		pub.Publish(enginekv.Batch{DPRank: -1}) // the slow joiner: makes the consumer replay what it missed
		time.Sleep(20 * time.Millisecond)
	}
	if n := eng.Unknown(); n != 0 {
		t.Fatalf("%d stored blocks had no known tokens", n)
	}
	if st := src.Status()[0].Stats; st.Removed == 0 || st.Orphans != 0 {
		t.Fatalf("want evictions and no orphans: %+v", st)
	}
}
