package edge

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/hftok"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/test/engines/vllm"
)

// The Qwen3 tokenizer.json.gz and tokenizer_config.json of internal/hftok's
// test data (Apache-2.0, internal/hftok/testdata/NOTICE).
const qwenDir = "../internal/hftok/testdata/qwen3"

func TestLoadFleetTokenizersNamesTheKey(t *testing.T) {
	cfg := DefaultConfig()
	cfg.GenerationServers.Tokenizer = "hf:" + t.TempDir()
	if _, err := loadFleetTokenizers(&cfg); err == nil || !strings.Contains(err.Error(), "generation_servers.tokenizer") ||
		!strings.Contains(err.Error(), "tokenizer.json") {
		t.Fatalf("err = %v", err)
	}
	cfg.GenerationServers.Tokenizer = "hf:" + qwenDir
	cfg.ContextServers.Tokenizer = "hf:" + qwenDir
	fts, err := loadFleetTokenizers(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fts[fsm.FleetContext].model == nil || fts[fsm.FleetContext].model != fts[fsm.FleetGeneration].model {
		t.Fatal("two fleets naming one directory should share one loaded model")
	}
}

// testEdge is an edge with only what promptKeys needs.
func tokenizeEdge(t testing.TB, tokenizer string, blockSize int) *Edge {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ContextServers.Tokenizer, cfg.ContextServers.BlockSize = tokenizer, blockSize
	fts, err := loadFleetTokenizers(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &Edge{cfg: cfg, tokenizers: fts, log: slog.New(slog.DiscardHandler)}
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
	data, err := os.ReadFile("../internal/chattmpl/testdata/qwen3_chat_golden.json")
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
	body := map[string]any{"model": testModel, "messages": c.Request.Messages, "add_generation_prompt": c.AddGenerationPrompt}
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
	e := tokenizeEdge(t, "hf:"+qwenDir, 16)
	for _, c := range chatGoldens(t) {
		rq, _, words, aerr := parseBody(goldenBody(t, c), apireq.Chat)
		if aerr != nil {
			t.Fatalf("%s: %v", c.Name, aerr.Message)
		}
		rq.id.ConversationID = "conv-" + c.Name
		e.promptKeys(rq, words)
		got := rq.prompts[fsm.FleetContext]
		if got.tokens != len(c.IDs) || !slices.Equal(got.blocks, prefix.BlockHashes(c.IDs, 16)) {
			t.Errorf("%s: %d tokens, %d blocks; want %d tokens, %d blocks", c.Name, got.tokens, len(got.blocks), len(c.IDs), len(c.IDs)/16)
		}
		if gen := rq.prompts[fsm.FleetGeneration]; gen.tokens != len(words) || !slices.Equal(gen.blocks, prefix.BlockHashes(words, prefix.DefaultBlockSize)) {
			t.Errorf("%s: the words fleet's keys changed", c.Name)
		}
		if rq.promptTokens != len(c.IDs) {
			t.Errorf("%s: promptTokens %d, want the context fleet's %d", c.Name, rq.promptTokens, len(c.IDs))
		}
	}
}

// Turn after turn of one conversation, the cached path gives the cold
// path's keys; completions prompts (string or token ids) too.
func TestPromptKeysAcrossTurnsAndCompletions(t *testing.T) {
	e := tokenizeEdge(t, "hf:"+qwenDir, 16)
	cold := tokenizeEdge(t, "hf:"+qwenDir, 16)
	msgs := []map[string]any{{"role": "system", "content": strings.Repeat("You are careful. ", 200)}}
	for turn := range 6 {
		msgs = append(msgs, map[string]any{"role": "user", "content": "question " + strings.Repeat("é", turn)})
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		keys := func(e *Edge, conv string) prompt {
			rq, _, words, aerr := parseBody(body, apireq.Chat)
			if aerr != nil {
				t.Fatal(aerr.Message)
			}
			rq.id.ConversationID = conv
			e.promptKeys(rq, words)
			return rq.prompts[fsm.FleetContext]
		}
		warm, want := keys(e, "c1"), keys(cold, "")
		if warm.tokens != want.tokens || !slices.Equal(warm.blocks, want.blocks) || want.tokens < 200 {
			t.Fatalf("turn %d: cached %d tokens, cold %d", turn, warm.tokens, want.tokens)
		}
		msgs = append(msgs, map[string]any{"role": "assistant", "content": "answer " + strings.Repeat("z", turn)})
	}
	if n, _ := e.tokenizers[fsm.FleetContext].model.cache.stats(); n != 1 {
		t.Fatalf("cache holds %d conversations, want 1", n)
	}
	tok := e.tokenizers[fsm.FleetContext].model.tok
	for body, want := range map[string][]uint32{
		`{"model":"m","prompt":"Hello, my dog is cute"}`:   tok.Encode("Hello, my dog is cute"),
		`{"model":"m","prompt":["Hello, my dog is cute"]}`: tok.Encode("Hello, my dog is cute"),
		`{"model":"m","prompt":[9707,11,847]}`:             {9707, 11, 847},
	} {
		rq, _, words, aerr := parseBody([]byte(body), apireq.Completions)
		if aerr != nil {
			t.Fatal(aerr.Message)
		}
		e.promptKeys(rq, words)
		if got := rq.prompts[fsm.FleetContext]; got.tokens != len(want) || !slices.Equal(got.blocks, prefix.BlockHashes(want, 16)) {
			t.Errorf("%s: %d tokens, want %d", body, got.tokens, len(want))
		}
	}
}

// A chat the template cannot render routes without block keys (the engine
// answers it) rather than failing at the edge.
func TestPromptKeysWhenTheTemplateFails(t *testing.T) {
	e := tokenizeEdge(t, "hf:"+qwenDir, 16)
	body := `{"model":"m","messages":[{"role":"assistant","content":"x","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{not json"}}]}]}`
	rq, _, words, aerr := parseBody([]byte(body), apireq.Chat)
	if aerr != nil {
		t.Fatal(aerr.Message)
	}
	e.promptKeys(rq, words)
	if got := rq.prompts[fsm.FleetContext]; got.blocks != nil || got.tokens != len(words) {
		t.Fatalf("got %+v", got)
	}
}

// The cache holds at most its byte budget, dropping the least recently
// used conversation first.
func TestConvCacheIsBoundedLRU(t *testing.T) {
	tok := tokenizeEdge(t, "hf:"+qwenDir, 16).tokenizers[fsm.FleetContext].model.tok
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
	e := tokenizeEdge(t, "hf:"+qwenDir, 16)
	cold := tokenizeEdge(t, "hf:"+qwenDir, 16)
	var bodies [][]byte
	msgs := []map[string]any{{"role": "system", "content": strings.Repeat("Stay on task. ", 100)}}
	for turn := range 4 {
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("turn %d", turn)})
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		bodies = append(bodies, b)
		msgs = append(msgs, map[string]any{"role": "assistant", "content": "ok"})
	}
	keys := func(e *Edge, body []byte, conv string) prompt {
		rq, _, words, aerr := parseBody(body, apireq.Chat)
		if aerr != nil {
			panic(aerr.Message)
		}
		rq.id.ConversationID = conv
		e.promptKeys(rq, words)
		return rq.prompts[fsm.FleetContext]
	}
	want := make([]prompt, len(bodies))
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
				if got.tokens != want[k].tokens || !slices.Equal(got.blocks, want[k].blocks) {
					errs <- fmt.Sprintf("goroutine %d, turn %d: %d tokens, want %d", g, k, got.tokens, want[k].tokens)
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

// Through a running edge in front of a vLLM stand-in: a fleet with
// tokenizer hf:<Qwen3> and block_size 16 predicts, on the instance that
// served a chat, the blocks whose keys are the chained hashes of the
// JavaScript reference's token ids — the keys vLLM's KV events map to
// (worker/kvevents) — and not the words tokenizer's.
func TestHFTokenizerKeysReachTheKVIndex(t *testing.T) {
	srv := vllm.Start(vllm.Options{Model: testModel})
	t.Cleanup(srv.Close)
	ec := startEdges(t, 1, "", func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.ContextServers = ServersConfig{URLs: []StaticInstance{{Name: "vllm-0", URL: srv.URL()}}, Engine: EngineVLLM,
			Tokenizer: "hf:" + qwenDir, BlockSize: 16}
		c.GenerationServers = ServersConfig{}
	})
	ec.waitInstances(1)
	var golden chatGolden
	for _, c := range chatGoldens(t) {
		if c.Name == "tool call round trip" {
			golden = c
		}
	}
	want := prefix.BlockHashes(golden.IDs, 16)
	if len(want) < 4 {
		t.Fatalf("golden conversation too short: %d blocks", len(want))
	}
	body := goldenBody(t, golden)
	client := httpClient(t)
	te := ec.edge(0)
	waitFor(t, "/readyz", 15*time.Second, func() bool {
		return do(t, client, http.MethodGet, te.url()+"/readyz", nil, nil).status == http.StatusOK
	})
	if r := do(t, client, http.MethodPost, te.url()+"/v1/chat/completions", body, map[string]string{"x-session-id": "hf-conv"}); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	ix := te.e.fleet.Index()
	for i, b := range want {
		if held, _ := ix.Holds("vllm-0", -1, b, te.e.now()); !held {
			t.Fatalf("block %d of the reference's ids (%016x) is not predicted on vllm-0", i, b)
		}
	}
	_, _, words, aerr := parseBody(body, apireq.Chat)
	if aerr != nil {
		t.Fatal(aerr.Message)
	}
	if wb := prefix.BlockHashes(words, 16); len(wb) > 0 {
		if held, _ := ix.Holds("vllm-0", -1, wb[0], te.e.now()); held {
			t.Fatal("the words tokenizer's first block is predicted: the fleet's hf tokenizer was not used")
		}
	}
}
