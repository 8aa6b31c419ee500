package config

import (
	"strings"
	"testing"
)

// context_servers.aggregated: tether workers of the context fleet serve
// whole requests, the generation fleet empty; the key anywhere else, or
// with a generation fleet, is refused by name. Sub-agent hints are still
// signed (a tether worker verifies them) and the Conversations API served.
func TestAggregatedTetherFleetConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(engineYAMLBase + `
context_servers: {aggregated: true}
conversation_affinity_header_for_subagents: X-Dynamo-Parent-Session-ID
internal_request_auth_key: hint-secret-0123456789
nats: {urls: ["nats://127.0.0.1:4222"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Aggregated() || cfg.EngineAggregated() || len(cfg.ServedFleets()) != 1 {
		t.Fatalf("aggregated %v, engine aggregated %v, served fleets %v", cfg.Aggregated(), cfg.EngineAggregated(), cfg.ServedFleets())
	}
	for name, tc := range map[string]struct{ yaml, want string }{
		"on the generation fleet": {`
context_servers: {urls: [http://a:1]}
generation_servers: {aggregated: true, urls: [http://b:1]}`, "generation_servers.aggregated, line 6: only context_servers"},
		"beside a generation fleet": {`
context_servers: {aggregated: true, urls: [http://a:1]}
generation_servers: {urls: [http://b:1]}`, "generation_servers, line 6: must be empty with context_servers.aggregated"},
		"trtllm": {`
context_servers: {engine: trtllm, aggregated: true, urls: [http://a:1]}
generation_servers: {engine: trtllm, urls: [http://b:1]}`, "context_servers.aggregated, line 5: a trtllm fleet with generation_servers is served disaggregated"},
		"conditional disagg": {`
context_servers: {aggregated: true, urls: [http://a:1]}
conditional_disagg_config: {max_local_prefill_length: 100}`, "conditional_disagg_config, line 6: does not apply to context_servers.aggregated"},
		"hints unsigned": {`
context_servers: {aggregated: true, urls: [http://a:1]}
conversation_affinity_header_for_subagents: X-Dynamo-Parent-Session-ID`, "internal_request_auth_key"},
	} {
		_, err := ParseConfig([]byte(engineYAMLBase + tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}
