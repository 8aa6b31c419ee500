package tokenize

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/hftok"
	"github.com/tether-project/tether/internal/prefix"
)

// The Qwen3 tokenizer.json.gz and tokenizer_config.json of internal/hftok's
// test data (Apache-2.0, internal/hftok/testdata/NOTICE).
const qwenDir = "../../internal/hftok/testdata/qwen3"

func TestLoadNamesTheKey(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.GenerationServers.Tokenizer = "hf:" + t.TempDir()
	if _, err := Load(&cfg); err == nil || !strings.Contains(err.Error(), "generation_servers.tokenizer") ||
		!strings.Contains(err.Error(), "tokenizer.json") {
		t.Fatalf("err = %v", err)
	}
	cfg.GenerationServers.Tokenizer = "hf:" + qwenDir
	cfg.ContextServers.Tokenizer = "hf:" + qwenDir
	fts, err := Load(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fts[fsm.FleetContext].model == nil || fts[fsm.FleetContext].model != fts[fsm.FleetGeneration].model {
		t.Fatal("two fleets naming one directory should share one loaded model")
	}
}

// contextFleet is a model's fleets whose context fleet cuts blockSize
// blocks with tokenizer (the generation fleet: the words tokenizer).
func contextFleet(t testing.TB, tokenizer string, blockSize int) *Fleets {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.ContextServers.Tokenizer, cfg.ContextServers.BlockSize = tokenizer, blockSize
	fs, err := Load(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fs
}

// parse is a body of dialect d as the request model reads it.
func parse(t testing.TB, body []byte, d apireq.Dialect) *apireq.Request {
	t.Helper()
	p, aerr := apireq.Parse(d, body)
	if aerr != nil {
		t.Fatal(aerr.Message)
	}
	return p
}

// keysOf are each fleet's keys of p in conversation conv.
func keysOf(fs *Fleets, p *apireq.Request, conv string) [3]Prompt {
	return fs.Keys(Request{Parsed: p, Words: p.WordTokens(), Conversation: conv}, false, slog.New(slog.DiscardHandler))
}

type chatGolden struct {
	Name    string `json:"name"`
	Request struct {
		Messages json.RawMessage `json:"messages"`
		Tools    json.RawMessage `json:"tools"`
	} `json:"request"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Kwargs              json.RawMessage `json:"kwargs"`
	IDs                 []uint32        `json:"ids"`
}

func chatGoldens(t testing.TB) []chatGolden {
	t.Helper()
	data, err := os.ReadFile("../../internal/chattmpl/testdata/qwen3_chat_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []chatGolden `json:"cases"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	return file.Cases
}

// goldenBody is the request body of a golden conversation.
func goldenBody(t testing.TB, c chatGolden) []byte {
	t.Helper()
	body := map[string]any{"model": "test-model", "messages": c.Request.Messages, "add_generation_prompt": c.AddGenerationPrompt}
	if len(c.Request.Tools) > 0 {
		body["tools"] = c.Request.Tools
	}
	if len(c.Kwargs) > 0 && string(c.Kwargs) != "null" {
		body["chat_template_kwargs"] = c.Kwargs
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// With hf:<dir>, the edge's block keys for a chat request are the chained
// hashes of the JavaScript reference's token ids (template and tokenizer),
// cut at the fleet's block size; the words fleet keeps internal/prefix's.
func TestPromptKeysMatchTheReference(t *testing.T) {
	fs := contextFleet(t, "hf:"+qwenDir, 16)
	for _, c := range chatGoldens(t) {
		p := parse(t, goldenBody(t, c), apireq.Chat)
		words := p.WordTokens()
		prompts := keysOf(fs, p, "conv-"+c.Name)
		got := prompts[fsm.FleetContext]
		if got.Tokens != len(c.IDs) || !slices.Equal(got.Blocks, prefix.BlockHashes(c.IDs, 16)) {
			t.Errorf("%s: %d tokens, %d blocks; want %d tokens, %d blocks", c.Name, got.Tokens, len(got.Blocks), len(c.IDs), len(c.IDs)/16)
		}
		if gen := prompts[fsm.FleetGeneration]; gen.Tokens != len(words) || !slices.Equal(gen.Blocks, prefix.BlockHashes(words, prefix.DefaultBlockSize)) {
			t.Errorf("%s: the words fleet's keys changed", c.Name)
		}
	}
}

// Turn after turn of one conversation, the cached path gives the cold
// path's keys; completions prompts (string or token ids) too.
func TestPromptKeysAcrossTurnsAndCompletions(t *testing.T) {
	e := contextFleet(t, "hf:"+qwenDir, 16)
	cold := contextFleet(t, "hf:"+qwenDir, 16)
	msgs := []map[string]any{{"role": "system", "content": strings.Repeat("You are careful. ", 200)}}
	for turn := range 6 {
		msgs = append(msgs, map[string]any{"role": "user", "content": "question " + strings.Repeat("é", turn)})
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		keys := func(fs *Fleets, conv string) Prompt {
			return keysOf(fs, parse(t, body, apireq.Chat), conv)[fsm.FleetContext]
		}
		warm, want := keys(e, "c1"), keys(cold, "")
		if warm.Tokens != want.Tokens || !slices.Equal(warm.Blocks, want.Blocks) || want.Tokens < 200 {
			t.Fatalf("turn %d: cached %d tokens, cold %d", turn, warm.Tokens, want.Tokens)
		}
		msgs = append(msgs, map[string]any{"role": "assistant", "content": "answer " + strings.Repeat("z", turn)})
	}
	if n, _ := e[fsm.FleetContext].model.cache.stats(); n != 1 {
		t.Fatalf("cache holds %d conversations, want 1", n)
	}
	tok := e[fsm.FleetContext].model.tok
	for body, want := range map[string][]uint32{
		`{"model":"m","prompt":"Hello, my dog is cute"}`:   tok.Encode("Hello, my dog is cute"),
		`{"model":"m","prompt":["Hello, my dog is cute"]}`: tok.Encode("Hello, my dog is cute"),
		`{"model":"m","prompt":[9707,11,847]}`:             {9707, 11, 847},
	} {
		if got := keysOf(e, parse(t, []byte(body), apireq.Completions), "")[fsm.FleetContext]; got.Tokens != len(want) || !slices.Equal(got.Blocks, prefix.BlockHashes(want, 16)) {
			t.Errorf("%s: %d tokens, want %d", body, got.Tokens, len(want))
		}
	}
}

// A chat the template cannot render routes without block keys (the engine
// answers it) rather than failing at the edge.
func TestPromptKeysWhenTheTemplateFails(t *testing.T) {
	fs := contextFleet(t, "hf:"+qwenDir, 16)
	body := `{"model":"m","messages":[{"role":"assistant","content":"x","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{not json"}}]}]}`
	p := parse(t, []byte(body), apireq.Chat)
	if got := keysOf(fs, p, "")[fsm.FleetContext]; got.Blocks != nil || got.Tokens != len(p.WordTokens()) {
		t.Fatalf("got %+v", got)
	}
}

// The cache holds at most its byte budget, dropping the least recently
// used conversation first.
func TestConvCacheIsBoundedLRU(t *testing.T) {
	tok := contextFleet(t, "hf:"+qwenDir, 16)[fsm.FleetContext].model.tok
	enc := func(s string) *hftok.Encoded { return tok.EncodeFrom(nil, s) }
	one := enc(strings.Repeat("word ", 1000))
	c := newConvCache(3*(one.Bytes()+200) + 10)
	for _, conv := range []string{"a", "b", "c"} {
		c.put(conv, one)
	}
	c.get("a") // a is now the most recent
	c.put("d", one)
	if c.get("b") != nil || c.get("a") == nil || c.get("c") == nil || c.get("d") == nil {
		t.Fatal("want b (least recently used) dropped, a, c, d kept")
	}
	if n, bytes := c.stats(); n != 3 || bytes > c.maxBytes {
		t.Fatalf("%d entries, %d bytes (max %d)", n, bytes, c.maxBytes)
	}
	c.put("huge", enc(strings.Repeat("word ", 200_000)))
	if c.get("huge") != nil {
		t.Fatal("an entry larger than the cache was kept")
	}
	c.put("a", enc("short"))
	if n, _ := c.stats(); n != 3 {
		t.Fatalf("replacing a conversation's entry: %d entries", n)
	}
}

// Concurrent requests of one conversation (and of others) share the cache
// safely and each gets the cold path's keys.
func TestPromptKeysConcurrent(t *testing.T) {
	e := contextFleet(t, "hf:"+qwenDir, 16)
	cold := contextFleet(t, "hf:"+qwenDir, 16)
	var bodies [][]byte
	msgs := []map[string]any{{"role": "system", "content": strings.Repeat("Stay on task. ", 100)}}
	for turn := range 4 {
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("turn %d", turn)})
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		bodies = append(bodies, b)
		msgs = append(msgs, map[string]any{"role": "assistant", "content": "ok"})
	}
	keys := func(fs *Fleets, body []byte, conv string) Prompt {
		p, aerr := apireq.Parse(apireq.Chat, body)
		if aerr != nil {
			panic(aerr.Message)
		}
		return keysOf(fs, p, conv)[fsm.FleetContext]
	}
	want := make([]Prompt, len(bodies))
	for i, b := range bodies {
		want[i] = keys(cold, b, "")
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				k := (g + i) % len(bodies)
				got := keys(e, bodies[k], fmt.Sprintf("conv-%d", g%2))
				if got.Tokens != want[k].Tokens || !slices.Equal(got.Blocks, want[k].Blocks) {
					errs <- fmt.Sprintf("goroutine %d, turn %d: %d tokens, want %d", g, k, got.Tokens, want[k].Tokens)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// An adapter request's block keys are the adapter's (vLLM keys its blocks
// by lora_name): the base model's cached prefix is not credited to it.
func TestAdapterBlockKeys(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Placement.BlockSize = 4
	fs, err := Load(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4, "messages": []map[string]any{
		{"role": "system", "content": strings.Repeat("sys words ", 20)}, {"role": "user", "content": "hello"}}})
	p := parse(t, body, apireq.Chat)
	words := p.WordTokens()
	log := slog.New(slog.DiscardHandler)
	b := fs.Keys(Request{Parsed: p, Words: words}, false, log)[fsm.FleetContext].Blocks
	l := fs.Keys(Request{Parsed: p, Words: words, Adapter: "agent-a"}, false, log)[fsm.FleetContext].Blocks
	if len(b) == 0 || !slices.Equal(l, prefix.AdapterBlockHashes("agent-a", words, 4)) || slices.Contains(b, l[0]) {
		t.Fatalf("base %x, adapter %x", b, l)
	}
}
