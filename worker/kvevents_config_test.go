package worker

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/engine"
	"github.com/tether-project/tether/worker/kvevents"
)

const proxyKVEventsConfig = `
instance_id: ctx-0
model: m
ranks: 2
enable_attention_dp: true
engine:
  type: proxy
  block_size: 16
  upstreams: [http://10.0.0.5:8000, http://10.0.0.5:8001]
  kv_events:
    format: vllm
    endpoints: [tcp://10.0.0.5:5557, tcp://10.0.0.5:5558]
    replay_endpoints: [tcp://10.0.0.5:5657, tcp://10.0.0.5:5658]
    topic: kv
`

func TestKVEventsConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(proxyKVEventsConfig))
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.Engine.KVEvents
	if k.Format != "vllm" || len(k.Endpoints) != 2 || k.ReplayEndpoints[1] != "tcp://10.0.0.5:5658" || k.Topic != "kv" || k.PollInterval != 200*time.Millisecond {
		t.Fatalf("kv_events = %+v", k)
	}
	src := cfg.Engine.kvEventSource(cfg.RankCount())
	if src.BlockSize != 16 || src.Ranks != 2 {
		t.Fatalf("source = %+v", src)
	}
	// trtllm polls the upstreams unless told otherwise.
	trt, err := ParseConfig([]byte(strings.Replace(proxyKVEventsConfig, `    format: vllm
    endpoints: [tcp://10.0.0.5:5557, tcp://10.0.0.5:5558]
    replay_endpoints: [tcp://10.0.0.5:5657, tcp://10.0.0.5:5658]
    topic: kv
`, "    format: trtllm\n    poll_interval: 50ms\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if s := trt.Engine.kvEventSource(2); len(s.URLs) != 2 || s.URLs[0] != "http://10.0.0.5:8000" || s.PollInterval != 50*time.Millisecond {
		t.Fatalf("trtllm source = %+v", s)
	}
}

func TestKVEventsConfigErrorsNameTheKey(t *testing.T) {
	cases := []struct{ from, to, want string }{
		{"format: vllm", "format: mystery", "engine.kv_events.format"},
		{"endpoints: [tcp://10.0.0.5:5557, tcp://10.0.0.5:5558]", "endpoints: [a, b, c]", "engine.kv_events.endpoints"},
		{"endpoints: [tcp://10.0.0.5:5557, tcp://10.0.0.5:5558]", "endpoints: [http://x:1, http://x:2]", "engine.kv_events endpoint 0"},
		{"replay_endpoints: [tcp://10.0.0.5:5657, tcp://10.0.0.5:5658]", "replay_endpoints: [tcp://10.0.0.5:5657]", "engine.kv_events.replay_endpoints"},
		{"topic: kv", "topic: kv\n    urls: [http://x:1]", "engine.kv_events.urls"},
		{"topic: kv", "topic: kv\n    poll_interval: 2h", "engine.kv_events.poll_interval"},
		{"topic: kv", "topic: kv\n    nonsense: 1", "engine.kv_events.nonsense, line 15: unknown key"},
		{"type: proxy", "type: sim", "engine.kv_events, line 9: only for engine.type proxy"},
		{"  kv_events:", "  publish_kv_events:\n    endpoint: tcp://*:5557\n  kv_events:", "engine.publish_kv_events, line 10: only for engine.type sim"},
	}
	for _, c := range cases {
		doc := strings.Replace(proxyKVEventsConfig, c.from, c.to, 1)
		if strings.Contains(c.want, "only for engine.type proxy") {
			doc = strings.Replace(doc, "  upstreams: [http://10.0.0.5:8000, http://10.0.0.5:8001]\n", "", 1)
		}
		cfg, err := ParseConfig([]byte(doc))
		if err == nil {
			err = cfg.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q → %q: error %v, want one naming %q", c.from, c.to, err, c.want)
		}
	}
}

// A simulated worker configured with engine.publish_kv_events speaks
// vLLM's protocol on one port pair per rank; reading it back gives the
// prompt's block keys on the rank that ran it.
func TestSimPublishesKVEvents(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
instance_id: sim-0
model: m
ranks: 2
enable_attention_dp: true
engine:
  type: sim
  block_size: 4
  time_scale: 0
  publish_kv_events:
    endpoint: tcp://127.0.0.1:0
    replay_endpoint: tcp://127.0.0.1:0
    layout: array
`))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := buildEngine(cfg, 2, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	w, ok := eng.(*kvevents.Engine)
	if !ok {
		t.Fatalf("engine is a %T, want the publishing wrapper", eng)
	}
	pubs, replays := w.Endpoints()
	var mu sync.Mutex
	held := map[int]map[uint64]bool{}
	src, err := enginekv.Start(enginekv.Config{Format: enginekv.FormatSGLang, Endpoints: pubs, ReplayEndpoints: replays, Ranks: 2, BlockSize: 4}, func(ev enginekv.RankKeys) {
		mu.Lock()
		defer mu.Unlock()
		if held[ev.Rank] == nil {
			held[ev.Rank] = map[uint64]bool{}
		}
		for _, h := range ev.Stored {
			held[ev.Rank][h] = true
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	prompt := prefix.Tokenize("one two three four five six seven eight nine")
	want := prefix.BlockHashes(prompt, 4)
	if _, err := eng.Run(context.Background(), engine.Request{ID: "r1", Rank: 1, Prompt: prompt, MaxTokens: 1}, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		got := len(held[1]) == len(want) && held[1][want[0]] && held[1][want[1]] && len(held[0]) == 0
		mu.Unlock()
		if got {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 1's blocks never arrived through the vLLM events: %v", held)
		}
		// Rank 1's publisher: an empty batch makes a late subscriber replay.
		if err := w.PublishEmpty(1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
