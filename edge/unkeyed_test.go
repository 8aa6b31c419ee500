package edge

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tether-project/tether/test/natstest"
)

// TestUnkeyedAgentLoopKeepsInstanceAndRank: an agent loop that sends no
// session key (the OpenAI Agents SDK's default) sends each call's prompt as
// the previous call's plus the answer and a tool result. Every call,
// through either edge, lands on the first call's context instance and rank
// and generation instance and rank: the edges place it where its prefix is
// (KV-aware placement) and the workers run it on the rank holding it. A
// second loop, new, is still spread over the ranks by the policy.
func TestUnkeyedAgentLoopKeepsInstanceAndRank(t *testing.T) {
	ns := natstest.Start(t, nil)
	startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 2, ns.ClientURL(), nil)
	ec.waitInstances(4)
	c := httpClient(t)

	system := "You are a helpful agent. " + longText("agents-sdk", 60)
	turns := []string{"what is the weather in Paris"}
	var first Route
	for call := range 4 {
		te := ec.edge(call % 2)
		body := chatBody(t, system, turns, nil)
		if call > 0 {
			// The other edge places by its KV index: wait until the
			// workers' reports of the previous call reached it.
			blocks, err := PromptBlocks("/v1/chat/completions", chatBody(t, system, turns[:len(turns)-2], nil), testBlockSize)
			if err != nil {
				t.Fatal(err)
			}
			// Both hops: the generation worker's cache holds the
			// prompt too (its KV arrived from the context side).
			waitFor(t, fmt.Sprintf("edge %d to hold call %d's prompt on %s and %s", call%2+1, call, first.ContextInstance, first.GenerationInstance), 30*time.Second, func() bool {
				held := map[string]bool{}
				for _, m := range te.e.Fleet().Index().Match(blocks, time.Now(), nil) {
					if m.Blocks >= len(blocks)-1 && m.Rank >= 0 {
						held[m.Instance] = true
					}
				}
				return held[first.ContextInstance] && held[first.GenerationInstance]
			})
		}
		r := postChat(t, c, te.url(), body, nil)
		if r.status != http.StatusOK {
			t.Fatalf("call %d: %d %s", call+1, r.status, r.body)
		}
		rt, err := ParseRoute(r.header.Get(HeaderRoute))
		if err != nil {
			t.Fatal(err)
		}
		if call == 0 {
			first = rt
		} else if rt.ContextInstance != first.ContextInstance || rt.ContextRank != first.ContextRank ||
			rt.GenerationInstance != first.GenerationInstance || rt.GenerationRank != first.GenerationRank {
			t.Fatalf("call %d routed %s/%s, %s/%s; call 1 %s/%s, %s/%s", call+1, rt.ContextInstance, rt.ContextRank,
				rt.GenerationInstance, rt.GenerationRank, first.ContextInstance, first.ContextRank, first.GenerationInstance, first.GenerationRank)
		}
		m := r.json(t)
		reply := m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
		turns = append(turns, reply, fmt.Sprintf("tool result %d: %s", call, longText(fmt.Sprintf("obs%d", call), 12)))
	}
	// New loops sharing only the system prompt rotate over the ranks.
	ranks := map[string]bool{}
	for i := range 4 {
		r := postChat(t, c, ec.edge(0).url(), chatBody(t, system, []string{fmt.Sprintf("new task %d", i)}, nil), nil)
		rt, err := ParseRoute(r.header.Get(HeaderRoute))
		if err != nil || r.status != http.StatusOK {
			t.Fatalf("new loop %d: %d %v", i, r.status, err)
		}
		ranks[rt.ContextInstance+"/"+rt.ContextRank] = true
	}
	if len(ranks) < 2 {
		t.Fatalf("four new loops all on %v: new conversations must still be spread", ranks)
	}
}
