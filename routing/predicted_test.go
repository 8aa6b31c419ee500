package routing

import (
	"context"
	"testing"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/kvindex"
)

// The hop carries what the index held of the prompt on the chosen instance
// before this request's own prediction: on a new placement and on a sticky
// turn alike, for the engine's answer to grade.
func TestHopCarriesTheIndexClaim(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Type = RouterConversation
	cfg.BlockSize = 4
	router, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t)
	r.router = router
	ix := kvindex.New(kvindex.Config{})
	r.d.Index = ix
	blocks := make([]uint64, 16)
	for i := range blocks {
		blocks[i] = uint64(1000 + i)
	}
	// "b" holds the first 10 blocks (a baseline, then stored events).
	if _, err := ix.Apply(kvindex.Batch{Instance: "b", Boot: 1, Seq: 1, Events: []kvindex.RankEvent{{Rank: 0, Stored: blocks[:10]}}}); err != nil {
		t.Fatal(err)
	}
	rq := Request{Fleet: fsm.FleetContext, Key: "conv", ConversationID: "conv", RequestID: "conv#1", Edge: "e1", Now: tDecide,
		PromptTokens: 62, Blocks: blocks, Spread: SpreadFor("conv#1")}
	h, fail := r.d.Decide(context.Background(), r.router, rq, nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if h.Instance != "b" || !h.HasPrediction || h.Predicted != 40 {
		t.Fatalf("placement: %s, prediction %v %d (want b, 10 blocks = 40 tokens)", h.Instance, h.HasPrediction, h.Predicted)
	}
	// The sticky turn: the first request's own prediction now covers the
	// whole prompt (62 tokens, capped at the prompt), and that is what the
	// index claims before the second request predicts it again.
	rq.RequestID = "conv#2"
	again, fail := r.d.Decide(context.Background(), r.router, rq, nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if again.Outcome != OutcomeSticky || !again.HasPrediction || again.Predicted != 62 || again.Cached != 0 {
		t.Fatalf("sticky: %+v", again)
	}

	// A router that does not read the index makes no claim.
	cfg.Type = RouterLoadBalancing
	lb, err := NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rq.Key, rq.ConversationID, rq.RequestID = "", "", "unkeyed#1"
	u, fail := r.d.Decide(context.Background(), lb, rq, nil)
	if fail != nil {
		t.Fatal(fail)
	}
	if u.HasPrediction || u.Predicted != 0 {
		t.Fatalf("load balancing: prediction %v %d", u.HasPrediction, u.Predicted)
	}
}
