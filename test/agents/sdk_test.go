package agents

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/ops/devstack"
)

// Claude Code's and Codex's SDKs through an edge of tether dev (mutual
// TLS, node trusting the CA as README says): the Anthropic SDK's
// messages.create, messages.stream, a tool round trip and countTokens; the
// openai SDK's responses.create, responses.stream chained by
// previous_response_id, responses.retrieve, and a background response
// cancelled.
func TestAnthropicAndOpenAISDKs(t *testing.T) {
	modules := installSDK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := startStack(t, ctx, devstack.Options{Edges: 1, ContextWorkers: 1, GenerationWorkers: 1, Ranks: 2, MutualTLS: true, TimeScale: 0.1})
	out := runNode(t, ctx, modules, "sdk.mjs", "TETHER_BASE="+st.Edges()[0].URL(), "TETHER_MODEL="+st.Model(), "NODE_EXTRA_CA_CERTS="+st.CAFile())
	t.Logf("report: %s", out)
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(out, &raw); err != nil {
		t.Fatalf("not the report (%v): %s", err, out)
	}
	r := map[string]map[string]any{}
	for name, v := range raw {
		if name == "calls" {
			continue
		}
		var c map[string]any
		_ = json.Unmarshal(v, &c)
		if e, ok := c["error"]; ok {
			t.Errorf("%s: %v", name, e)
		}
		r[name] = c
	}
	if t.Failed() {
		return
	}
	num := func(m any, k string) float64 {
		v, _ := m.(map[string]any)[k].(float64)
		return v
	}
	if c := r["messages_create"]; c["type"] != "message" || c["text"] == "" || num(c["usage"], "output_tokens") != 8 {
		t.Errorf("messages.create: %v", c)
	}
	s := r["messages_stream"]
	kinds, _ := json.Marshal(s["kinds"])
	if !strings.Contains(string(kinds), `"message_start","content_block_start","content_block_delta"`) || !strings.HasSuffix(string(kinds), `"message_delta","message_stop"]`) {
		t.Errorf("messages.stream events: %s", kinds)
	}
	// The second call read the first one's system prompt from the cache.
	if s["text"] == "" || num(s["usage"], "cache_read_input_tokens") < 256 {
		t.Errorf("messages.stream: %v (its prompt's system blocks must read as cached)", s)
	}
	if c := r["tool_round_trip"]; c["first_stop"] != "tool_use" || c["tool"] != "get_weather" || c["second_text"] == "" {
		t.Errorf("tool round trip: %v", c)
	}
	if c := r["count_tokens"]; num(c, "input_tokens") < 300 {
		t.Errorf("countTokens: %v", c)
	}
	if c := r["responses"]; c["first_text"] == "" || c["second_previous"] != c["first_id"] || c["retrieved_id"] != c["second_id"] ||
		c["retrieved_text"] != c["second_text"] || num(num2(c["second_usage"], "input_tokens_details"), "cached_tokens") < 256 {
		t.Errorf("responses: %v", c)
	}
	if c := r["background_cancel"]; c["created_status"] != "queued" || c["cancel_status"] != "cancelled" || c["retrieved_status"] != "cancelled" || c["cancelled_id"] != c["id"] {
		t.Errorf("background cancel: %v", c)
	}
}

func num2(m any, k string) any {
	v, _ := m.(map[string]any)[k]
	return v
}

// The OpenAI Agents SDK with its default model (the Responses API), its
// agents naming no model: the SDK asks for its default model name, which
// a stack serves as a name of tether-sim (devstack.DefaultModelAliases);
// a function tool, a structured output, and a handoff whose sub-agent
// carries the parent header, lands on the parent's context instance and
// reports cached tokens there.
func TestAgentsSDKDefaultModel(t *testing.T) {
	modules := installSDK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := startStack(t, ctx, devstack.Options{Edges: 1, ContextWorkers: 2, GenerationWorkers: 1, Ranks: 2, MutualTLS: true})
	out := runNode(t, ctx, modules, "agents_responses.mjs",
		"TETHER_URL="+st.Edges()[0].URL()+"/v1", "TETHER_MODEL=",
		"TETHER_PARENT_HEADER="+devstack.ParentHeader, "NODE_EXTRA_CA_CERTS="+st.CAFile())
	t.Logf("report: %s", out)
	var r report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("not the report (%v): %s", err, out)
	}
	checkAgentsReport(t, r, func(c call) int {
		var u struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		}
		_ = json.Unmarshal(c.RawUsage, &u)
		return u.Details.Cached
	})
	for _, c := range r.Calls {
		if c.Path != "/v1/responses" {
			t.Fatalf("the default model called %s, want /v1/responses", c.Path)
		}
	}
}
