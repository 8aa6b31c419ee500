package worker

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/tether-project/tether/test/workertest"
)

// New conversations sharing a long system prompt: with kv_aware rank
// placement each one after the first lands on the rank that holds the
// prompt and is served from its cache; with least_tokens they spread over
// the ranks and miss (the scenario of docs/ARCHITECTURE.md's rank
// placement, reproduced here on one 4-rank worker).
func TestKVAwareRankPlacementFindsTheSharedPrompt(t *testing.T) {
	system := longPrompt("shared system prompt", 150)
	hits := map[string]int{}
	for _, placement := range []string{"least_tokens", "kv_aware"} {
		cfg := testConfig("w0")
		cfg.Ranks = 4
		cfg.ADP.AttentionDP.NewConvPlacement = placement
		s := workertest.Start(t, New, cfg)
		c := testClient(t)
		for i := 0; i < 4; i++ {
			body := `{"model":"test-model","max_tokens":1,"messages":[{"role":"system","content":` + strconv.Quote(system) +
				`},{"role":"user","content":` + strconv.Quote(fmt.Sprintf("question %d", i)) + `}]}`
			r := post(t, c, s.URL()+"/v1/chat/completions", body, map[string]string{"x-session-id": fmt.Sprintf("conv-%d", i)})
			if r.status != 200 {
				t.Fatalf("%s: status %d: %s", placement, r.status, r.body)
			}
			_, _, cached := usageOf(t, r.json(t))
			if i > 0 {
				hits[placement] += cached
			}
			if placement == "kv_aware" && i > 0 && cached == 0 {
				t.Fatalf("kv_aware: conversation %d on rank %s missed the shared system prompt", i, r.header.Get(HeaderADPRank))
			}
		}
	}
	if hits["kv_aware"] <= hits["least_tokens"] {
		t.Fatalf("cached tokens of conversations 2-4: kv_aware %d, least_tokens %d", hits["kv_aware"], hits["least_tokens"])
	}
}
