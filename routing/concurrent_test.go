package routing

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/breaker"
	"github.com/tether-project/tether/routing/kvindex"
	"github.com/tether-project/tether/routing/overload"
)

// TestConcurrentDecisions runs decisions from several goroutines while the
// edge-side feeders (KV batches, predictions, breaker samples, overload
// observations) write, as the edge does; run with -race.
func TestConcurrentDecisions(t *testing.T) {
	r := mustRouter(t, thresholds)
	ix := kvindex.New(kvindex.Config{})
	tracker := overload.NewTracker()
	breakers, err := breaker.NewSet(breaker.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	vs := idle("ctx-a", "ctx-b", "ctx-c", "ctx-d")
	vs[1].QueuedRequests = 9 // saturated: overflows
	views := mustViews(t, vs)
	prompt := blocks(5, 64)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the edge's telemetry/KV subscriber
		defer wg.Done()
		for s := uint64(1); s <= 200; s++ {
			inst := fmt.Sprintf("ctx-%c", 'a'+rune(s%4))
			if _, err := ix.Apply(kvindex.Batch{Instance: inst, Boot: 1, Seq: (s + 3) / 4, Events: []kvindex.RankEvent{{Rank: int(s % 8), Stored: prompt[:s%64+1]}}}); err != nil {
				t.Error(err)
				return
			}
			now := t0.Add(time.Duration(s) * time.Millisecond)
			tracker.Observe(inst, s%3 == 0, now)
			if _, err := breakers.Record(inst, 1000, int64(s%1000), now); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				in := Inputs{Views: views, Prefix: ix, Overload: tracker}
				req := Request{Fleet: fsm.FleetContext, Key: fmt.Sprintf("g%d-k%d", g, i), Blocks: prompt, Now: now}
				rt, err := r.place(req, in)
				if err != nil || rt.Instance == "" {
					t.Errorf("place: %+v %v", rt, err)
					return
				}
				ix.Predict(rt.Instance, prompt, now)
				b := fsm.Binding{Fleet: fsm.FleetContext, Key: req.Key, Instance: "ctx-b"}
				if rt, err := r.stayOrMove(req, b, in); err != nil || rt.Action != actionOverflow || rt.Instance == "ctx-b" {
					t.Errorf("route bound: %+v %v", rt, err)
					return
				}
				_ = breakers.Open("ctx-a", now)
			}
		}()
	}
	wg.Wait()
}
