package agents

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/ops/devstack"
)

// The OpenAI Agents SDK with its conversation on the server (the
// Conversations API): runs naming a conversation (conversationId) and runs
// through an OpenAIConversationsSession, against tether dev. The
// conversation's items are the turns in order, and each turn's prompt
// holds the turns before it (the model does not forget earlier turns).
func TestAgentsSDKConversations(t *testing.T) {
	modules := installSDK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := startStack(t, ctx, devstack.Options{Edges: 1, ContextWorkers: 1, GenerationWorkers: 1, Ranks: 2, MutualTLS: true})
	out := runNode(t, ctx, modules, "conversations.mjs", "TETHER_URL="+st.Edges()[0].URL()+"/v1", "TETHER_MODEL="+st.Model(), "NODE_EXTRA_CA_CERTS="+st.CAFile())
	t.Logf("report: %s", out)
	var r struct {
		ConversationID struct {
			ID, RetrievedID, First, Second, Error string
			Items                                 []string
			Metadata                              map[string]string
		} `json:"conversation_id"`
		Session struct {
			ID, First, Second, Error string
			History                  int
		}
		Calls []struct {
			Path   string
			Status int
			Usage  json.RawMessage
		}
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("not the report (%v): %s", err, out)
	}
	c := r.ConversationID
	if c.Error != "" || !strings.HasPrefix(c.ID, "conv_") || c.First == "" || c.Second == "" || c.Metadata["app"] != "tether-test" {
		t.Fatalf("conversationId runs: %+v", c)
	}
	if got := strings.Join(c.Items, " "); got != "message:system message:user message:assistant message:user message:assistant" {
		t.Fatalf("the conversation's items: %s", got)
	}
	if s := r.Session; s.Error != "" || !strings.HasPrefix(s.ID, "conv_") || s.First == "" || s.Second == "" || s.History < 4 {
		t.Fatalf("session runs: %+v", s)
	}
	// Each run's prompt holds the conversation so far: the second run of
	// each way (conversationId, then the session) prompts more than the
	// first.
	var inputs []int
	for _, call := range r.Calls {
		if call.Status != 200 {
			t.Fatalf("call %+v", call)
		}
		if call.Path != "/v1/responses" {
			continue
		}
		var u struct {
			Input int `json:"input_tokens"`
		}
		_ = json.Unmarshal(call.Usage, &u)
		inputs = append(inputs, u.Input)
	}
	if len(inputs) != 4 || inputs[0] < 120 || inputs[1] <= inputs[0] || inputs[2] < 120 || inputs[3] <= inputs[2] {
		t.Errorf("input tokens per run %v: each second run must hold the first", inputs)
	}
}
