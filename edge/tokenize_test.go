package edge

import (
	"net/http"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/tokenize"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/test/engines/vllm"
)

// Through a running edge in front of a vLLM stand-in: a fleet with
// tokenizer hf:<Qwen3> and block_size 16 predicts, on the instance that
// served a chat, the blocks its tokenizer keys (edge/tokenize, whose tests
// hold them equal to the JavaScript reference's token ids: the keys vLLM's
// KV events map to, worker/kvevents) and not the words tokenizer's.
// qwenDir holds the Qwen3 tokenizer.json.gz and tokenizer_config.json of
// internal/hftok's test data (Apache-2.0, internal/hftok/testdata/NOTICE).
const qwenDir = "../internal/hftok/testdata/qwen3"

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
	body := chatBody(t, "You are a careful assistant. Answer in one line.", []string{longText("hf-keys", 120)}, nil)
	fleets, err := tokenize.Load(&ec.edge(0).cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, aerr := api.Parse(body, apireq.Chat.Path())
	if aerr != nil {
		t.Fatal(aerr.Message)
	}
	want := fleets.Keys(tokenize.Request{Parsed: p, Words: p.WordTokens()}, true, testLogger(t))[fsm.FleetContext].Blocks
	if len(want) < 4 {
		t.Fatalf("conversation too short: %d blocks", len(want))
	}
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
	if wb := prefix.BlockHashes(p.WordTokens(), 16); len(wb) > 0 {
		if held, _ := ix.Holds("vllm-0", -1, wb[0], te.e.now()); held {
			t.Fatal("the words tokenizer's first block is predicted: the fleet's hf tokenizer was not used")
		}
	}
}
