package tokenize

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
)

// agentChat is a coding agent's conversation of about n Qwen3 tokens: a
// system prompt, tools, and turns of user text, tool calls and tool
// output (code).
func agentChat(turns int) []map[string]any {
	msgs := []map[string]any{{"role": "system", "content": strings.Repeat("You are a careful coding agent working in the tether repository. Read before you write; run the package's tests. ", 20)}}
	for i := range turns {
		args, _ := json.Marshal(map[string]any{"path": fmt.Sprintf("routing/file%d.go", i), "query": "func Encode"})
		msgs = append(msgs,
			map[string]any{"role": "user", "content": fmt.Sprintf("Step %d: find where the tokenizer is used and explain it. Keep it short; cite files.", i)},
			map[string]any{"role": "assistant", "content": "", "tool_calls": []map[string]any{{"id": fmt.Sprintf("c%d", i), "type": "function", "function": map[string]any{"name": "read_file", "arguments": string(args)}}}},
			map[string]any{"role": "tool", "tool_call_id": fmt.Sprintf("c%d", i), "content": strings.Repeat(fmt.Sprintf("func (t *Tokenizer) Encode%d(text string) []uint32 {\n\treturn t.Append(nil, text) // hot path: %d\n}\n", i, i*7), 8)},
			map[string]any{"role": "assistant", "content": fmt.Sprintf("File %d calls Encode on the rendered prompt; the result feeds BlockHashes with the fleet's block size.", i)},
		)
	}
	return msgs
}

var benchTools = json.RawMessage(`[{"type":"function","function":{"name":"read_file","description":"Read a file of the repository.","parameters":{"type":"object","properties":{"path":{"type":"string"},"query":{"type":"string"}},"required":["path"]}}}]`)

func mustBody(b *testing.B, msgs []map[string]any) []byte {
	body, err := json.Marshal(map[string]any{"model": "m", "messages": msgs, "tools": benchTools})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

func chatRequest(b *testing.B, msgs []map[string]any) Request {
	p := parse(b, mustBody(b, msgs), apireq.Chat)
	return Request{Parsed: p, Words: p.WordTokens()}
}

// BenchmarkPromptKeys32k: one request's prompt keys with hf:<Qwen3> and
// block size 16 for a ~32k-token agent conversation (render with the chat
// template, tokenize, chained block hashes). cold: the conversation is not
// in the tokenize cache (the tokenizer's word cache is warm, as in a
// running edge); cached: the conversation's other turn is, and only the
// tail is tokenized; cold-process: a freshly loaded tokenizer (empty word
// cache, the first request after a start); render and encode, encode-cached: the parts (the chat
// template alone, the tokenizer alone, the tokenizer resuming from the
// previous turn). The parse of the body is not included.
func BenchmarkPromptKeys32k(b *testing.B) {
	fs := contextFleet(b, "hf:"+qwenDir, 16)
	log := slog.New(slog.DiscardHandler)
	m := fs[fsm.FleetContext].model
	const turns = 84
	prev := chatRequest(b, agentChat(turns))
	msgs := agentChat(turns + 1)
	msgs = msgs[:len(msgs)-1] // the new turn ends with the tool output
	next := chatRequest(b, msgs)
	tokens := fs.Keys(next, false, log)[fsm.FleetContext].Tokens
	if tokens < 30_000 || tokens > 36_000 {
		b.Fatalf("%d tokens, want about 32k", tokens)
	}
	prevText, _, err := m.promptText(prev.Parsed, prev.Now)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("cold", func(b *testing.B) {
		runtime.GC() // not the setup\'s garbage (b.Loop starts the timer)
		next.Conversation = ""
		for b.Loop() {
			fs.Keys(next, false, log)
		}
		b.ReportMetric(float64(tokens), "tokens/op")
	})
	b.Run("cached", func(b *testing.B) {
		runtime.GC() // not the setup\'s garbage (b.Loop starts the timer)
		// One conversation alternating between two consecutive turns: each
		// request finds the other turn in the cache and tokenizes only its
		// own tail (no untimed setup, so GC work is counted).
		prev.Conversation, next.Conversation = "conv", "conv"
		i := 0
		for b.Loop() {
			if i++; i%2 == 0 {
				fs.Keys(prev, false, log)
			} else {
				fs.Keys(next, false, log)
			}
		}
		b.ReportMetric(float64(tokens), "tokens/op")
	})
	b.Run("cold-process", func(b *testing.B) {
		runtime.GC() // not the setup\'s garbage (b.Loop starts the timer)
		// A freshly loaded tokenizer: its word cache is empty too (the
		// first request after an edge starts).
		next.Conversation = ""
		for b.Loop() {
			b.StopTimer()
			fresh := contextFleet(b, "hf:"+qwenDir, 16)
			b.StartTimer()
			fresh.Keys(next, false, log)
		}
	})
	b.Run("render", func(b *testing.B) {
		runtime.GC() // not the setup\'s garbage (b.Loop starts the timer)
		for b.Loop() {
			if _, _, err := m.promptText(next.Parsed, next.Now); err != nil {
				b.Fatal(err)
			}
		}
	})
	text, _, _ := m.promptText(next.Parsed, next.Now)
	b.Run("encode", func(b *testing.B) {
		runtime.GC() // not the setup\'s garbage (b.Loop starts the timer)
		for b.Loop() {
			_ = m.tok.Encode(text)
		}
	})
	prevEnc := m.tok.EncodeFrom(nil, prevText)
	b.Run("encode-cached", func(b *testing.B) {
		runtime.GC() // not the setup\'s garbage (b.Loop starts the timer)
		for b.Loop() {
			_ = m.tok.EncodeFrom(prevEnc, text)
		}
	})
}
