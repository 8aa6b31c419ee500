package edge

import (
	"strings"
	"testing"
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
	if !cfg.Aggregated() || cfg.dataParallelSize(0) != 4 || cfg.ContextServers.Engine.Kind().metricsFormat() != "vllm" {
		t.Fatalf("aggregated %v, dp %d", cfg.Aggregated(), cfg.dataParallelSize(0))
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

// Every disaggregated request id the edge can draw lies in TensorRT-LLM's
// global id range [2^40, 2^63) (disagg_utils.py MIN_GLOBAL_ID: below it
// are a worker's local request ids) and stays exact in float64 JSON
// parsers (< 2^53), whatever the random prefix. Before, a prefix below
// 2^19 (one edge start in 4,096) gave ids under 2^40.
func TestDisaggIDsInTRTLLMGlobalRange(t *testing.T) {
	for _, r := range []uint32{0, 1, 1 << 18, 0x7fffffff, 0xffffffff} {
		base := disaggIDBase(r)
		for _, seq := range []uint64{0, 1, 1<<disaggIDSeqBits - 1} {
			id := base | seq
			if id < 1<<40 || id >= 1<<53 {
				t.Errorf("prefix %#x, counter %d: id %d outside [2^40, 2^53)", r, seq, id)
			}
		}
	}
	if disaggIDBase(1) == disaggIDBase(2) {
		t.Error("distinct prefixes give one base")
	}
}
