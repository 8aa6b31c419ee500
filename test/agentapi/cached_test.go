package agentapi

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/tether-project/tether/ops/devstack"
)

// One conversation, three ways a client sends it through the edges of
// tether dev, each turn through the next edge: a Responses chain
// (previous_response_id, the instructions sent again each turn), a
// stateless Codex-style conversation (store: false, the whole input each
// turn, prompt_cache_key) and chat completions (a session header). Their
// prompts are the same turn after turn — the chain keeps the first turn's
// role: system input item, as OpenAI carries input items over — and each
// finds the same cached_tokens turn after turn, within one 64-token block.
// (Each way has words of its own, so none reads another's cache.)
func TestSameConversationSameCachedTokens(t *testing.T) {
	st := startStack(t, devstack.Options{Edges: 3})
	e := st.Edges()
	model := st.Model()
	const turns = 5
	type figures struct{ prompt, cached []int }
	instructions := func(w string) string { return "You are agent " + w + ". " + words(w+"-instr", 150) }
	system := func(w string) string { return "Project rules " + w + ". " + words(w+"-rule", 90) }
	user := func(w string, turn int) string {
		return fmt.Sprintf("turn %d: %s", turn, words(fmt.Sprintf("%s-q%d", w, turn), 37))
	}
	usageOf := func(b []byte) (int, int) {
		var o struct {
			Usage struct {
				Input   int `json:"input_tokens"`
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"input_tokens_details"`
			}
		}
		decode(t, b, &o)
		return o.Usage.Input, o.Usage.Details.Cached
	}

	// A Responses chain.
	var chain figures
	prev := ""
	for turn := range turns {
		input := []any{}
		if turn == 0 {
			input = append(input, map[string]any{"type": "message", "role": "system", "content": system("a")})
		}
		input = append(input, map[string]any{"type": "message", "role": "user", "content": user("a", turn)})
		body := map[string]any{"model": model, "instructions": instructions("a"), "input": input, "max_output_tokens": 8}
		if prev != "" {
			body["previous_response_id"] = prev
		}
		r := do(t, "POST", e[turn%3].URL()+"/v1/responses", body, nil)
		if r.status != 200 {
			t.Fatalf("chain turn %d: %d %s", turn, r.status, r.body)
		}
		var o respObj
		decode(t, r.body, &o)
		prev = o.ID
		p, c := usageOf(r.body)
		chain.prompt, chain.cached = append(chain.prompt, p), append(chain.cached, c)
	}

	// Stateless, Codex-style.
	var stateless figures
	input := []any{map[string]any{"type": "message", "role": "system", "content": system("b")}}
	for turn := range turns {
		input = append(input, map[string]any{"type": "message", "role": "user", "content": user("b", turn)})
		r := do(t, "POST", e[turn%3].URL()+"/v1/responses", map[string]any{"model": model, "instructions": instructions("b"), "input": input,
			"store": false, "prompt_cache_key": "codex-thread-b", "max_output_tokens": 8}, nil)
		if r.status != 200 {
			t.Fatalf("stateless turn %d: %d %s", turn, r.status, r.body)
		}
		var o respObj
		decode(t, r.body, &o)
		for _, it := range o.OutputRaw {
			input = append(input, it)
		}
		p, c := usageOf(r.body)
		stateless.prompt, stateless.cached = append(stateless.prompt, p), append(stateless.cached, c)
	}

	// Chat completions.
	var chat figures
	msgs := []any{map[string]any{"role": "system", "content": instructions("c")}, map[string]any{"role": "system", "content": system("c")}}
	for turn := range turns {
		msgs = append(msgs, map[string]any{"role": "user", "content": user("c", turn)})
		r := do(t, "POST", e[turn%3].URL()+"/v1/chat/completions", map[string]any{"model": model, "messages": msgs, "max_tokens": 8},
			map[string]string{"x-session-id": "chat-thread-c"})
		if r.status != 200 {
			t.Fatalf("chat turn %d: %d %s", turn, r.status, r.body)
		}
		var o struct {
			Choices []struct {
				Message json.RawMessage `json:"message"`
			}
			Usage struct {
				Prompt  int `json:"prompt_tokens"`
				Details *struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
		}
		decode(t, r.body, &o)
		msgs = append(msgs, o.Choices[0].Message)
		cached := 0
		if o.Usage.Details != nil {
			cached = o.Usage.Details.Cached
		}
		chat.prompt, chat.cached = append(chat.prompt, o.Usage.Prompt), append(chat.cached, cached)
	}

	t.Logf("FIGURES prompt/cached tokens per turn: chain %v/%v, stateless %v/%v, chat %v/%v",
		chain.prompt, chain.cached, stateless.prompt, stateless.cached, chat.prompt, chat.cached)
	for turn := range turns {
		if chain.prompt[turn] != stateless.prompt[turn] || chat.prompt[turn] != stateless.prompt[turn] {
			t.Errorf("turn %d: prompt tokens chain %d, stateless %d, chat %d: the same conversation must prompt alike", turn, chain.prompt[turn], stateless.prompt[turn], chat.prompt[turn])
		}
		for _, f := range []struct {
			name   string
			cached int
		}{{"chain", chain.cached[turn]}, {"chat", chat.cached[turn]}} {
			if d := f.cached - stateless.cached[turn]; d > 64 || d < -64 {
				t.Errorf("turn %d: %s found %d cached tokens, stateless %d (more than one block apart)", turn, f.name, f.cached, stateless.cached[turn])
			}
		}
		if turn > 0 && stateless.cached[turn] < stateless.prompt[turn-1]-64 {
			t.Errorf("turn %d: %d cached tokens, the turn before prompted %d: the conversation lost its cache", turn, stateless.cached[turn], stateless.prompt[turn-1])
		}
	}
}
