package config

import (
	"strings"
	"testing"

	"github.com/tether-project/tether/fsm"
)

const engineYAMLBase = `
model: m
cluster: {node_id: edge-1, data_dir: /tmp/x, bootstrap: true, peers: [{id: edge-1, addr: "127.0.0.1:7400"}], auth_key: cluster-secret-0123456789}
`

func TestEngineConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(engineYAMLBase + `
context_servers:
  engine: vllm
  data_parallel_size: 4
  urls: [http://10.0.0.1:8000, {name: vllm-b, url: "http://10.0.0.2:8000"}]
conversation_affinity_header_for_subagents: X-Dynamo-Parent-Session-ID
`))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Aggregated() || cfg.DataParallelSize(0) != 4 || cfg.ContextServers.Engine.Kind() != EngineVLLM {
		t.Fatalf("aggregated %v, dp %d", cfg.Aggregated(), cfg.DataParallelSize(0))
	}
	// Without the key: tether workers by default.
	cfg, err = ParseConfig([]byte(engineYAMLBase + `
context_servers: {urls: [http://10.0.0.1:8000]}
generation_servers: {urls: [http://10.0.0.2:8000]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Aggregated() || cfg.ContextServers.Engine.Kind() != EngineTether {
		t.Fatalf("default engine %q aggregated %v", cfg.ContextServers.Engine.Kind(), cfg.Aggregated())
	}
}

func TestEngineConfigErrors(t *testing.T) {
	for name, tc := range map[string]struct{ yaml, want string }{
		"unknown engine": {`
context_servers: {engine: tgi, urls: [http://a:1]}
generation_servers: {urls: [http://b:1]}`, `context_servers.engine, line 5: unknown engine "tgi"`},
		"vllm in generation": {`
context_servers: {urls: [http://a:1]}
generation_servers: {engine: vllm, urls: [http://b:1]}`, "generation_servers.engine, line 6: vllm serves the generation fleet only as the decode servers of a prefill/decode split"},
		"generation next to sglang": {`
context_servers: {engine: sglang, urls: [http://a:1]}
generation_servers: {urls: [http://b:1]}`, "generation_servers, line 6: must be empty with context_servers.engine: sglang"},
		"no urls": {`
context_servers: {engine: vllm}
nats: {urls: ["nats://127.0.0.1:4222"]}`, "context_servers.urls, line 5: engine vllm needs its servers' URLs"},
		"dp for tether workers": {`
context_servers: {data_parallel_size: 2, urls: [http://a:1]}
generation_servers: {urls: [http://b:1]}`, "context_servers.data_parallel_size, line 5: only for engine vllm or sglang"},
		"dp out of range": {`
context_servers: {engine: vllm, data_parallel_size: 5000, urls: [http://a:1]}`, "context_servers.data_parallel_size, line 5: must be 0..1024"},
		"dp wrong type": {`
context_servers: {engine: vllm, data_parallel_size: four, urls: [http://a:1]}`, "data_parallel_size"},
		"kv_events without an endpoint": {`
context_servers: {engine: vllm, urls: [{url: "http://a:1", kv_events: {replay_endpoint: "tcp://a:5558"}}]}`, "context_servers.urls[0].kv_events.endpoint, line 5: required"},
		"kv_events binding everywhere": {`
context_servers: {engine: sglang, urls: [{url: "http://a:1", kv_events: {endpoint: "tcp://*:5557"}}]}`, "binds on every interface"},
		"kv_events ports beyond the ranks": {`
context_servers: {engine: vllm, data_parallel_size: 4, urls: [{url: "http://a:1", kv_events: {endpoint: "tcp://a:65534"}}]}`, "context_servers.urls[0].kv_events.endpoint"},
		"kv_events for trtllm": {`
context_servers: {engine: trtllm, urls: [{url: "http://a:1", kv_events: {endpoint: "tcp://a:5557"}}]}
generation_servers: {engine: trtllm, urls: [http://b:1]}`, "only for engine vllm or sglang"},
		"kv_cache_events for vllm": {`
context_servers: {engine: vllm, kv_cache_events: true, urls: [http://a:1]}`, "context_servers.kv_cache_events, line 5: only for engine trtllm"},
		"health_timeout negative": {`
context_servers: {engine: sglang, health_timeout: -1s, urls: [http://a:1]}`, "context_servers.health_timeout"},
		"disagg auth format": {`
context_servers: {engine: trtllm, urls: [http://a:1]}
generation_servers: {engine: trtllm, urls: [http://b:1]}
disagg_auth_format: model-dump`, "disagg_auth_format"},
		"conditional disagg": {`
context_servers: {engine: vllm, urls: [http://a:1]}
conditional_disagg_config: {max_local_prefill_length: 100}`, "conditional_disagg_config, line 6: does not apply"},
	} {
		_, err := ParseConfig([]byte(engineYAMLBase + tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", name, err, tc.want)
		}
	}
}

func TestKVShadowBlocksConfig(t *testing.T) {
	t.Setenv(EnvInternalRequestAuthKey, "")
	parse := func(extra string) (Config, error) {
		return ParseConfig([]byte(`
model: m
context_servers: {engine: vllm, urls: [http://a:1]` + extra + `}
cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}
`))
	}
	cfg, err := parse("")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ContextServers.KVShadowBlocks != DefaultKVShadowBlocks || cfg.GenerationServers.KVShadowBlocks != DefaultKVShadowBlocks {
		t.Fatalf("default kv_shadow_blocks %d/%d, want %d", cfg.ContextServers.KVShadowBlocks, cfg.GenerationServers.KVShadowBlocks, DefaultKVShadowBlocks)
	}
	if cfg, err = parse(", kv_shadow_blocks: 0"); err != nil || cfg.ContextServers.KVShadowBlocks != 0 {
		t.Fatalf("kv_shadow_blocks: 0 (off): %v, %d", err, cfg.ContextServers.KVShadowBlocks)
	}
	for _, bad := range []string{", kv_shadow_blocks: -1", ", kv_shadow_blocks: 99999999"} {
		if _, err := parse(bad); err == nil || !strings.Contains(err.Error(), "context_servers.kv_shadow_blocks") {
			t.Errorf("%s: %v, want an error naming context_servers.kv_shadow_blocks", bad, err)
		}
	}
}

func TestTokenizerConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(engineYAMLBase + `
placement: {block_size: 64}
context_servers: {engine: vllm, tokenizer: "hf:/models/qwen3", block_size: 16, urls: [http://10.0.0.1:8000]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ContextServers.Tokenizer != "hf:/models/qwen3" || cfg.RoutingConfig(fsm.FleetContext).BlockSize != 16 {
		t.Fatalf("tokenizer %q, block size %d", cfg.ContextServers.Tokenizer, cfg.RoutingConfig(fsm.FleetContext).BlockSize)
	}
	if cfg.GenerationServers.Tokenizer != TokenizerWords || cfg.RoutingConfig(fsm.FleetGeneration).BlockSize != 64 {
		t.Fatalf("generation fleet: tokenizer %q, block size %d (want words, placement's 64)",
			cfg.GenerationServers.Tokenizer, cfg.RoutingConfig(fsm.FleetGeneration).BlockSize)
	}
	d := DefaultConfig()
	d.Normalize()
	if d.ContextServers.Tokenizer != TokenizerWords || d.ContextServers.BlockSize != 0 {
		t.Fatalf("defaults: %q %d", d.ContextServers.Tokenizer, d.ContextServers.BlockSize)
	}
	for name, tc := range map[string]struct{ yaml, want string }{
		"unknown":    {`context_servers: {engine: vllm, tokenizer: sentencepiece, urls: [http://a:1]}`, `context_servers.tokenizer, line 4: "sentencepiece" is not "words" or "hf:"<dir>`},
		"empty dir":  {`context_servers: {engine: vllm, tokenizer: "hf:", urls: [http://a:1]}`, `context_servers.tokenizer, line 4: "hf:" names no directory`},
		"block size": {`context_servers: {engine: vllm, block_size: -1, urls: [http://a:1]}`, "context_servers.block_size, line 4: must be 0"},
		"too big": {`context_servers: {urls: [http://a:1]}
generation_servers: {block_size: 2000000, urls: [http://b:1]}`, "generation_servers.block_size"},
	} {
		_, err := ParseConfig([]byte(engineYAMLBase + tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}
}
