package agentapi

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tether-project/tether/internal/respid"
	"github.com/tether-project/tether/ops/devstack"
)

// conversationAcrossEdges creates a conversation through edge 1, continues
// it with Responses requests through edge 2 (one streamed), and reads it
// and its items through edge 3: every request naming it reaches the
// instance the id names, each turn's prompt holds the turns before, and
// every answer names the client's id.
func conversationAcrossEdges(t *testing.T, st *devstack.Stack) {
	t.Helper()
	e := st.Edges()
	model := st.Model()
	r := do(t, "POST", e[0].URL()+"/v1/conversations", map[string]any{"metadata": map[string]string{"agent": "travel"},
		"items": []any{map[string]any{"type": "message", "role": "system", "content": "You are a travel agent. " + words("rule", 100)}}}, nil)
	var conv struct {
		ID, Object string
	}
	decode(t, r.body, &conv)
	id, err := respid.DecodeConversation(conv.ID)
	if r.status != 200 || conv.Object != "conversation" || !strings.HasPrefix(conv.ID, respid.ConversationPrefix) || err != nil {
		t.Fatalf("create through edge 1: %d %s (%v)", r.status, r.body, err)
	}
	var inputs []int
	for turn, stream := range []bool{false, true, false} {
		r = do(t, "POST", e[1].URL()+"/v1/responses", map[string]any{"model": model, "conversation": conv.ID, "stream": stream,
			"input": "turn " + words("q", 10+turn), "max_output_tokens": 8}, nil)
		if r.status != 200 {
			t.Fatalf("turn %d through edge 2: %d %s", turn, r.status, r.body)
		}
		served := answeredBy(t, r)
		if served != id.Instance {
			t.Fatalf("turn %d served by %s; the conversation is on %s", turn, served, id.Instance)
		}
		body := r.body
		if stream {
			evs := events(t, r.body)
			body, _ = json.Marshal(evs[len(evs)-1].data["response"])
		}
		var o struct {
			Conversation struct{ ID string }
			Usage        struct {
				Input int `json:"input_tokens"`
			}
		}
		decode(t, body, &o)
		if o.Conversation.ID != conv.ID || strings.Contains(string(r.body), id.Upstream) {
			t.Fatalf("turn %d names %q (the worker's id %s must not show): %s", turn, o.Conversation.ID, id.Upstream, body)
		}
		inputs = append(inputs, o.Usage.Input)
	}
	if inputs[0] < 100 || inputs[1] <= inputs[0]+8 || inputs[2] <= inputs[1]+8 {
		t.Fatalf("input tokens per turn %v: each turn's prompt must hold the conversation so far", inputs)
	}
	r = do(t, "GET", e[2].URL()+"/v1/conversations/"+conv.ID, nil, nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"id":"`+conv.ID+`"`) || !strings.Contains(string(r.body), `"agent":"travel"`) {
		t.Fatalf("GET through edge 3: %d %s", r.status, r.body)
	}
	r = do(t, "GET", e[2].URL()+"/v1/conversations/"+conv.ID+"/items?order=asc&limit=100", nil, nil)
	var items struct {
		Data []struct {
			Type, Role string
		}
		HasMore bool `json:"has_more"`
	}
	decode(t, r.body, &items)
	var roles []string
	for _, it := range items.Data {
		roles = append(roles, it.Role)
	}
	if r.status != 200 || strings.Join(roles, " ") != "system user assistant user assistant user assistant" || items.HasMore {
		t.Fatalf("items through edge 3: %d %s", r.status, r.body)
	}
	r = do(t, "DELETE", e[0].URL()+"/v1/conversations/"+conv.ID, nil, nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"object":"conversation.deleted"`) {
		t.Fatalf("DELETE through edge 1: %d %s", r.status, r.body)
	}
	for _, n := range e {
		if r := do(t, "GET", n.URL()+"/v1/conversations/"+conv.ID, nil, nil); r.status != 404 || !strings.Contains(string(r.body), "Conversation with id '"+conv.ID+"' not found.") {
			t.Fatalf("GET after delete via %s: %d %s", n.ID, r.status, r.body)
		}
	}
}

// The Conversations API through three edges of tether dev, on tether's
// simulated workers.
func TestConversationsAcrossEdges(t *testing.T) {
	conversationAcrossEdges(t, startStack(t, devstack.Options{Edges: 3}))
}

// The same on one aggregated fleet (tether dev --generation-workers 0):
// the context worker that answers holds the conversation.
func TestConversationsAcrossEdgesOnAnAggregatedFleet(t *testing.T) {
	conversationAcrossEdges(t, startStack(t, devstack.Options{Edges: 3, Aggregated: true}))
}

// answeredBy is the instance that answered r: the generation hop's, or the one
// hop of an aggregated fleet ("context=ctx-1/0; generation=-").
func answeredBy(t *testing.T, r reply) string {
	t.Helper()
	ctxInst, genInst := route(t, r)
	if genInst == "-" {
		return ctxInst
	}
	return genInst
}

// The same through proxy workers in front of engines that serve no
// Conversations API (tether dev --engine-events vllm): the proxy holds the
// conversation and sends its engine the whole input.
func TestConversationsAcrossEdgesThroughProxyWorkers(t *testing.T) {
	conversationAcrossEdges(t, startStack(t, devstack.Options{Edges: 3, EngineEvents: devstack.EngineEventsVLLM, Ranks: 2}))
}
