package config

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/routing"
)

// validYAML is a complete configuration: the TensorRT-LLM keys plus
// tether's.
const validYAML = `
hostname: 0.0.0.0
port: 8000
model: llama-3.1-70b
context_servers:
  num_instances: 2
  urls:
    - http://10.0.0.1:8001
    - {name: ctx-b, url: "http://10.0.0.2:8001"}
  router:
    type: conversation
generation_servers:
  urls: [http://10.0.1.1:8002]
  router:
    type: conversation
conversation_affinity_header_for_subagents: X-Dynamo-Parent-Session-ID
subagent_affinity_scope: both
internal_request_auth_key: 0123456789abcdef0123
max_retries: 2
session_ttl: 15m
max_bindings: 50000
touch_interval: 500ms
max_subagent_depth: 2
trusted_gateway:
  enabled: true
  cidrs: [10.0.0.0/8]
  token_header: X-Gateway-Token
  token: gateway-secret-0123456789
debug_route_header: true
admin_token: admin-secret-0123456789
max_body_bytes: 1048576
placement:
  block_size: 32
  reported_prefill: true
  weights: {cache: 1.5, queue: 1, decode: 0.1, queued_request: 200, interactive_queue_factor: 2, background_cache_factor: 2}
  overflow: {queued_requests: 4, active_prompt_tokens: 100000, rebind_after: 10s}
  shed: {max_backlog_seconds: 45, max_queued_requests: 32, prefill_tokens_per_second: 6000, retry_after_min: 1s, retry_after_max: 20s}
  circuit_breaker: {window: 30s, buckets: 6, open_below: 0.3, close_above: 0.5, min_lookups: 10, min_lookup_tokens: 1000, cooldown: 30s}
telemetry: {stale_intervals: 4, down_after: 20s, startup_grace: 30s}
leader: {interval: 2s, sweep_batch: 100}
cluster:
  node_id: edge-1
  bind_addr: 10.0.0.9:7400
  data_dir: /var/lib/tether/edge-1
  bootstrap: true
  peers:
    - {id: edge-1, addr: "10.0.0.9:7400"}
    - {id: edge-2, addr: "10.0.0.10:7400"}
  propose_timeout: 80ms
  degraded_placement_window: 4s
  compat_feature_level: 1
nats:
  urls: [nats://10.0.0.20:4222]
  user: edge
  password: nats-password
tracing:
  exporter: otlp
  endpoint: http://otel-collector:4318
read_header_timeout: 5s
read_timeout: 1m
idle_timeout: 90s
write_timeout: 30s
`

func TestParseFullConfig(t *testing.T) {
	t.Setenv(EnvInternalRequestAuthKey, "")
	t.Setenv(EnvAdminToken, "")
	t.Setenv(EnvClusterAuthKey, "")
	cfg, err := ParseConfig([]byte(validYAML))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Scope != routing.ScopeBoth || cfg.GenerationServers.Router.Type != routing.RouterConversation ||
		cfg.ContextServers.URLs[1].ID() != "ctx-b" || cfg.ContextServers.URLs[0].ID() != "http://10.0.0.1:8001" ||
		cfg.SessionTTL != 15*time.Minute || cfg.TouchInterval != 500*time.Millisecond || cfg.MaxBindings != 50000 ||
		cfg.Cluster.ProposeTimeout != 80*time.Millisecond || cfg.Placement.Overflow.RebindAfter != 10*time.Second ||
		cfg.Placement.Breaker.Window != 30*time.Second || cfg.Placement.BlockSize != 32 || !cfg.TrustedGateway.Enabled ||
		cfg.Cluster.DegradedPlacementWindow != 4*time.Second || cfg.Cluster.FeatureLevel != 1 || cfg.Telemetry.StartupGrace != 30*time.Second ||
		cfg.ReadHeaderTimeout != 5*time.Second || cfg.ReadTimeout != time.Minute || cfg.IdleTimeout != 90*time.Second || cfg.WriteTimeout != 30*time.Second ||
		cfg.Tracing.Exporter != "otlp" || cfg.NATS.Password != "nats-password" {
		t.Fatalf("parsed %+v", cfg)
	}
	rc := cfg.RoutingConfig(fsm.FleetGeneration)
	if rc.Type != routing.RouterConversation || rc.Weights.Cache != 1.5 || rc.Shed.MaxQueuedRequests != 32 || rc.Shed.MaxBacklogSeconds != 45 || !rc.ReportedPrefill {
		t.Fatalf("routing config %+v", rc)
	}
	if !cfg.TrustedGateway.Trusted("10.1.2.3:5555", "") || cfg.TrustedGateway.Trusted("192.168.0.1:1", "") ||
		!cfg.TrustedGateway.Trusted("192.168.0.1:1", "gateway-secret-0123456789") {
		t.Fatal("trusted gateway decisions")
	}
}

func TestMinimalConfigDefaults(t *testing.T) {
	t.Setenv(EnvInternalRequestAuthKey, "")
	cfg, err := ParseConfig([]byte(`
model: m
context_servers: {urls: [http://a:1]}
generation_servers: {urls: [http://b:1]}
cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SessionTTL != DefaultSessionTTL || cfg.MaxBindings != DefaultMaxBindings || cfg.TouchInterval != DefaultTouchInterval ||
		cfg.Cluster.ProposeTimeout != time.Second || cfg.Scope != routing.ScopeContext || cfg.MaxRetries != DefaultMaxRetries ||
		cfg.ReadHeaderTimeout != DefaultReadHeaderTimeout || cfg.ReadTimeout != DefaultReadTimeout || cfg.IdleTimeout != DefaultIdleTimeout ||
		cfg.WriteTimeout != 0 || cfg.Telemetry.StartupGrace != DefaultStartupGrace || cfg.Cluster.DegradedPlacementWindow != 0 ||
		cfg.Cluster.FeatureLevel != fsm.FeatureLevelMax || cfg.Cluster.Suffrage != "voter" || cfg.Cluster.Autopilot.Voters != cluster.DefaultAutopilotVoters ||
		cfg.Cluster.Autopilot.StabilizationTime != cluster.DefaultAutopilotStabilize || cfg.Cluster.Autopilot.DeadServerTimeout != cluster.DefaultAutopilotDeadServer ||
		cfg.Cluster.Autopilot.Interval != cluster.DefaultAutopilotInterval || cfg.Cluster.Autopilot.MaxTrailingLogs != cluster.DefaultAutopilotTrailingLogs {
		t.Fatalf("defaults %+v", cfg)
	}
	if cfg.ContextServers.HealthPath != DefaultHealthPath || cfg.GenerationServers.HealthPath != DefaultHealthPath ||
		cfg.ContextServers.HealthCheckModel || cfg.HintSignatureFormat != hintauth.FormatTRTLLM || cfg.Placement.Weights.OffloadedBlock != routing.DefaultOffloadedBlock {
		t.Fatalf("probe and hint defaults %+v %+v", cfg.ContextServers, cfg.GenerationServers)
	}
	// The hard limit is seconds of prefill queued ahead; the request
	// count is an option, off.
	if s := cfg.RoutingConfig(fsm.FleetContext).Shed; s.MaxBacklogSeconds != routing.DefaultMaxBacklogSeconds || s.MaxQueuedRequests != 0 {
		t.Fatalf("shed defaults %+v", s)
	}
	// The backlog is estimated from request counts unless asked otherwise.
	if cfg.RoutingConfig(fsm.FleetContext).ReportedPrefill {
		t.Fatal("reported_prefill on by default")
	}
}

// Every startup validation error names the key at fault.
func TestConfigErrorsNameTheKey(t *testing.T) {
	t.Setenv(EnvInternalRequestAuthKey, "")
	t.Setenv(EnvAdminToken, "")
	t.Setenv(EnvClusterAuthKey, "")
	base := `
model: m
internal_request_auth_key: 0123456789abcdef0123
context_servers: {urls: [http://a:1]}
generation_servers: {urls: [http://b:1]}
cluster: {node_id: e1, data_dir: /tmp/x}
`
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"affinity header without internal key", `
model: m
conversation_affinity_header_for_subagents: X-Parent
context_servers: {urls: [http://a:1]}
generation_servers: {urls: [http://b:1]}
cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}
`, []string{"internal_request_auth_key", "conversation_affinity_header_for_subagents"}},
		{"unknown scope", base + "subagent_affinity_scope: everything\n", []string{"subagent_affinity_scope", "everything"}},
		{"unknown router type", strings.Replace(base, "context_servers: {urls: [http://a:1]}", "context_servers: {urls: [http://a:1], router: {type: magic}}", 1),
			[]string{"router.type", "magic"}},
		{"unknown key", base + "max_retrys: 3\n", []string{"max_retrys, line 7: unknown key (did you mean max_retries?)"}},
		{"unknown nested key", strings.Replace(base, "cluster: {node_id: e1, data_dir: /tmp/x}", "cluster: {node_id: e1, data_dir: /tmp/x, peer: []}", 1),
			[]string{"cluster.peer, line 6: unknown key"}},
		{"duplicate URL", strings.Replace(base, "generation_servers: {urls: [http://b:1]}", "generation_servers: {urls: [http://a:1/]}", 1),
			[]string{"generation_servers.urls[0]", "duplicate URL"}},
		{"bad URL", strings.Replace(base, "http://b:1", "ftp://b", 1), []string{"generation_servers.urls[0]", "http(s)"}},
		{"missing node id", strings.Replace(base, "node_id: e1, ", "", 1), []string{"cluster.node_id, line 6: required"}},
		{"missing data dir", strings.Replace(base, ", data_dir: /tmp/x", "", 1), []string{"cluster.data_dir", "required"}},
		{"no model", strings.Replace(base, "model: m", "", 1), []string{"model", "required"}},
		{"short key", strings.Replace(base, "0123456789abcdef0123", "short", 1), []string{"internal_request_auth_key", "too short"}},
		{"unknown hint format", base + "hint_signature_format: v2\n", []string{"hint_signature_format", "trtllm or tether-v1"}},
		{"health path without a slash", strings.Replace(base, "context_servers: {urls: [http://a:1]}", "context_servers: {urls: [http://a:1], health_path: health}", 1),
			[]string{"context_servers.health_path", "starting with /"}},
		{"no instances", strings.Replace(base, "generation_servers: {urls: [http://b:1]}", "", 1), []string{"generation_servers.urls", "no instances"}},
		{"num_instances mismatch", strings.Replace(base, "context_servers: {urls: [http://a:1]}", "context_servers: {num_instances: 3, urls: [http://a:1]}", 1),
			[]string{"context_servers.num_instances"}},
		{"bad duration", base + "session_ttl: forever\n", []string{`session_ttl, line 7: want a duration such as "100ms" or "2s", got "forever"`}},
		// A value of the wrong type is named by its key path, not
		// only its line.
		{"wrong type names the key", strings.Replace(base, "model: m", "model: [1, 2]", 1), []string{"model, line 2: want a string, got a list"}},
		{"wrong nested type names the path", strings.Replace(base, "context_servers: {urls: [http://a:1]}", "context_servers: {urls: [http://a:1], router: {type: [x]}}", 1),
			[]string{"context_servers.router.type, line 4: want a string, got a list"}},
		{"unknown enum names the path", strings.Replace(base, "context_servers: {urls: [http://a:1]}", "context_servers:\n  urls: [http://a:1]\n  router:\n    type: magic", 1),
			[]string{`context_servers.router.type, line 7: unknown value "magic"`}},
		{"wrong types in two places", base + "max_retries: lots\ntelemetry: {down_after: [1]}\n", []string{`max_retries, line 7: want an integer, got "lots"`, "telemetry.down_after, line 8: want a duration"}},
		{"wrong type in a list item", strings.Replace(base, "data_dir: /tmp/x}", "data_dir: /tmp/x, peers: [{id: e1, addr: \"a:1\"}, {id: e2, addr: [x]}]}", 1),
			[]string{"cluster.peers[1].addr, line 6: want a string, got a list"}},
		{"duplicate key", base + "max_retries: 1\nmax_retries: 2\n", []string{"max_retries, line 8: duplicate key (first given on line 7)"}},
		{"a tab", base + "telemetry:\n\tdown_after: 2s\n", []string{"invalid YAML: line 8", "a tab"}},
		{"section of the wrong kind", base + "leader: 5\n", []string{`leader, line 7: want a mapping of keys, got "5"`}},
		{"urls entry with an unknown key", strings.Replace(base, "context_servers: {urls: [http://a:1]}", "context_servers: {urls: [{url: http://a:1, weight: 2}]}", 1),
			[]string{"context_servers.urls[0].weight, line 4: unknown key (allowed: name, url, kv_events, bootstrap_port)"}},
		// NATS URL schemes as the worker accepts them.
		{"nats url scheme", base + "nats: {urls: [\"http://n:4222\"]}\n", []string{"nats.urls[0]", "nats://, tls://, ws:// or wss://"}},
		{"nats user without password", base + "nats: {urls: [nats://n:4222], user: edge}\n", []string{"nats.password", EnvNATSPassword}},
		{"nats two methods", base + "nats: {urls: [nats://n:4222], token: t, creds: /x}\n", []string{"nats", "choose one of"}},
		{"nats missing nkey seed", base + "nats: {urls: [nats://n:4222], nkey_seed_file: /nonexistent/seed.nk}\n", []string{"nats.nkey_seed_file"}},
		{"nats embedded with creds", base + "nats: {embedded: true, creds: /x}\n", []string{"nats", "embedded server"}},
		{"zero read header timeout", base + "read_header_timeout: 0s\n", []string{"read_header_timeout", "> 0"}},
		{"short write timeout", base + "write_timeout: 10ms\n", []string{"write_timeout", "too short"}},
		{"negative startup grace", base + "telemetry: {startup_grace: -1s}\n", []string{"telemetry.startup_grace"}},
		{"negative degraded window", strings.Replace(base, "data_dir: /tmp/x}", "data_dir: /tmp/x, degraded_placement_window: -1s}", 1), []string{"cluster.degraded_placement_window"}},
		{"compat level above this build", strings.Replace(base, "data_dir: /tmp/x}", "data_dir: /tmp/x, compat_feature_level: 99}", 1), []string{"cluster.compat_feature_level", "99"}},
		{"zero ttl", base + "session_ttl: 0s\n", []string{"session_ttl", "> 0"}},
		{"bad cidr", base + "conversation_affinity_header_for_subagents: X-P\ntrusted_gateway: {enabled: true, cidrs: [10.0.0.300/8]}\n", []string{"trusted_gateway.cidrs[0]"}},
		{"gateway without header", base + "client_subagent_headers: false\ntrusted_gateway: {enabled: true, cidrs: [10.0.0.0/8]}\n", []string{"trusted_gateway", "conversation_affinity_header_for_subagents", "client_subagent_headers"}},
		{"offloaded block weight above 1", base + "placement:\n  weights: {offloaded_block: 1.5}\n", []string{"placement.weights.offloaded_block, line 8: must be a fraction 0..1"}},
		{"negative offloaded block weight", base + "placement: {weights: {offloaded_block: -1}}\n", []string{"placement.weights.offloaded_block, line 7"}},
		{"placement overflow above shed", base + "placement: {overflow: {queued_requests: 80}, shed: {max_queued_requests: 10}}\n", []string{"placement.overflow.queued_requests"}},
		{"negative backlog limit", base + "placement: {shed: {max_backlog_seconds: -1}}\n", []string{"placement.shed.max_backlog_seconds, line 7: must be a finite number of seconds >= 0"}},
		{"negative queued limit", base + "placement: {shed: {max_queued_requests: -1}}\n", []string{"placement.shed.max_queued_requests, line 7"}},
		{"bootstrap without peers", strings.Replace(base, "data_dir: /tmp/x}", "data_dir: /tmp/x, bootstrap: true}", 1), []string{"cluster.peers"}},
		{"unknown suffrage", strings.Replace(base, "data_dir: /tmp/x}", "data_dir: /tmp/x, suffrage: observer}", 1), []string{"cluster.suffrage", "observer"}},
		{"non-voter bootstrap", strings.Replace(base, "data_dir: /tmp/x}", "data_dir: /tmp/x, suffrage: nonvoter, bootstrap: true, peers: [{id: e1, addr: \"a:1\"}]}", 1),
			[]string{"cluster.suffrage", "cannot bootstrap"}},
		{"too many voters", strings.Replace(base, "data_dir: /tmp/x}", "data_dir: /tmp/x, autopilot: {voters: 12}}", 1), []string{"cluster.autopilot.voters", "12"}},
		{"negative stabilization", strings.Replace(base, "data_dir: /tmp/x}", "data_dir: /tmp/x, autopilot: {stabilization_time: -1s}}", 1), []string{"cluster.autopilot.stabilization_time"}},
		{"otlp without endpoint", base + "tracing: {exporter: otlp}\n", []string{"tracing.endpoint", "required"}},
		{"otlp endpoint not a URL", base + "tracing: {exporter: otlp, endpoint: \"otel:4318\"}\n", []string{"tracing.endpoint", "not an OTLP/HTTP URL"}},
		{"endpoint without otlp", base + "tracing: {exporter: stdout, endpoint: \"http://otel:4318\"}\n", []string{"tracing.endpoint", "only used with"}},
		{"unknown exporter", base + "tracing: {exporter: jaeger}\n", []string{"tracing.exporter", "jaeger"}},
		{"embedded and urls", base + "nats: {embedded: true, urls: [nats://x:4222]}\n", []string{"nats", "not both"}},
		{"parent header is a session header", base + "conversation_affinity_header_for_subagents: x-session-id\n", []string{"conversation_affinity_header_for_subagents", "session header"}},
		// The cluster package's checks, at config time, under the file's keys.
		{"advertise every address", strings.Replace(base, "data_dir: /tmp/x}", "data_dir: /tmp/x, advertise_addr: \"0.0.0.0:7400\"}", 1),
			[]string{`cluster.advertise_addr, line 6: "0.0.0.0:7400" is not an address peers can dial`}},
		{"bind every address, advertise none", strings.Replace(base, "data_dir: /tmp/x}", "data_dir: /tmp/x, bind_addr: \"0.0.0.0:7400\"}", 1),
			[]string{`cluster.advertise_addr, line 6: required when bind_addr "0.0.0.0:7400" binds every address`}},
		{"raft lease above heartbeat", strings.Replace(base, "data_dir: /tmp/x}", "data_dir: /tmp/x, raft: {heartbeat_timeout: 1s, leader_lease_timeout: 2s}}", 1),
			[]string{"cluster.raft.leader_lease_timeout, line 6: 2s exceeds raft.heartbeat_timeout 1s"}},
		{"a validation error is at its key's line", strings.Replace(base, "cluster: {node_id: e1, data_dir: /tmp/x}", "cluster:\n  node_id: e1\n  data_dir: /tmp/x\n  suffrage: observer", 1),
			[]string{`cluster.suffrage, line 9: "observer" is not voter or nonvoter`}},
		{"both spellings of creds", base + "nats: {urls: [nats://n:4222], creds_file: /x, creds: /y}\n", []string{"nats.creds, line 7: given twice"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// The cross-field rules of sub-agent affinity and conditional
// disaggregation (built in code: YAML cannot repeat a key).
func TestAffinityAndConditionalDisaggRules(t *testing.T) {
	ok := func() Config {
		c := DefaultConfig()
		c.Model = "m"
		c.InternalRequestAuthKey = "0123456789abcdef0123"
		c.ParentHeader = "X-Parent"
		c.ContextServers.URLs = []StaticInstance{{URL: "http://a:1"}}
		c.GenerationServers.URLs = []StaticInstance{{URL: "http://b:1"}}
		c.Cluster.NodeID, c.Cluster.DataDir = "e1", "/tmp/x"
		return c
	}
	c := ok()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{"both needs a conversation generation router", func(c *Config) {
			c.Scope = routing.ScopeBoth
			c.GenerationServers.Router.Type = routing.RouterKVCacheAware
		}, []string{"subagent_affinity_scope", "generation_servers.router.type: conversation"}},
		{"conditional disagg with both", func(c *Config) {
			c.Scope = routing.ScopeBoth
			c.ConditionalDisagg.MaxLocalPrefillLength = 100
		}, []string{"conditional_disagg_config", "subagent_affinity_scope: both"}},
		{"conditional disagg needs kv_cache_aware", func(c *Config) {
			c.ConditionalDisagg.MaxLocalPrefillLength = 100
		}, []string{"conditional_disagg_config", "kv_cache_aware"}},
		{"no cluster key", func(c *Config) {
			c.InternalRequestAuthKey = ""
			c.ParentHeader = ""
		}, []string{"cluster.auth_key"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := ok()
			tc.mutate(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestLoadConfigAppliesEnvironment(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(path, []byte(`
model: m
conversation_affinity_header_for_subagents: X-Parent
context_servers: {urls: [http://a:1]}
generation_servers: {urls: [http://b:1]}
cluster: {node_id: e1, data_dir: /tmp/x}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvInternalRequestAuthKey, "")
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), "internal_request_auth_key") || !strings.Contains(err.Error(), path) {
		t.Fatalf("without the key: %v", err)
	}
	t.Setenv(EnvInternalRequestAuthKey, "env-key-0123456789abcdef")
	t.Setenv(EnvAdminToken, "env-admin-0123456789")
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.InternalRequestAuthKey != "env-key-0123456789abcdef" || cfg.AdminToken != "env-admin-0123456789" || cfg.ClusterAuthKey() != cfg.InternalRequestAuthKey {
		t.Fatalf("env not applied: %+v", cfg)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}

	// The NATS credential from the environment (a Kubernetes Secret as an
	// env var): the file names the user only.
	if err := os.WriteFile(path, []byte(`
model: m
context_servers: {urls: [http://a:1]}
generation_servers: {urls: [http://b:1]}
cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}
nats: {urls: [nats://n:4222], user: edge}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvNATSPassword, "")
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), "nats.password") {
		t.Fatalf("user without a password anywhere: %v", err)
	}
	t.Setenv(EnvNATSPassword, "from-the-secret")
	if cfg, err = LoadConfig(path); err != nil || cfg.NATS.Password != "from-the-secret" {
		t.Fatalf("password from %s: %q, %v", EnvNATSPassword, cfg.NATS.Password, err)
	}
	// A token from the environment is for a file that names no other
	// credential (one environment may serve several components).
	t.Setenv(EnvNATSToken, "token-from-the-secret")
	if cfg, err = LoadConfig(path); err != nil || cfg.NATS.Token != "" || cfg.NATS.Password != "from-the-secret" {
		t.Fatalf("token beside nats.user: token %q password %q, %v", cfg.NATS.Token, cfg.NATS.Password, err)
	}
	if err := os.WriteFile(path, []byte(`
model: m
context_servers: {urls: [http://a:1]}
generation_servers: {urls: [http://b:1]}
cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}
nats: {urls: [nats://n:4222]}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, err = LoadConfig(path); err != nil || cfg.NATS.Token != "token-from-the-secret" || cfg.NATS.Password != "" {
		t.Fatalf("token from %s: %q, %v", EnvNATSToken, cfg.NATS.Token, err)
	}
}

// A former spelling still works, with a warning that names the new one.
func TestDeprecatedSpellings(t *testing.T) {
	t.Setenv(EnvInternalRequestAuthKey, "")
	creds := filepath.Join(t.TempDir(), "edge.creds")
	if err := os.WriteFile(creds, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig([]byte(`
model: m
context_servers: {urls: [http://a:1]}
generation_servers: {urls: [http://b:1]}
cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}
nats:
  urls: [nats://n:4222]
  creds: ` + creds + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.CredsFile != creds {
		t.Fatalf("nats.creds read as %q", cfg.NATS.CredsFile)
	}
	if d := cfg.Deprecated(); len(d) != 1 || d[0] != "nats.creds, line 8: deprecated spelling: write nats.creds_file (read the same way for now)" {
		t.Fatalf("warnings %q", d)
	}
}

// Validate reports; it does not fill or change anything.
func TestValidateDoesNotChangeTheConfig(t *testing.T) {
	c := DefaultConfig()
	c.Model = "m"
	c.ContextServers.URLs = []StaticInstance{{URL: "http://a:1"}}
	c.GenerationServers.URLs = []StaticInstance{{URL: "http://b:1"}}
	c.Cluster.NodeID, c.Cluster.DataDir, c.Cluster.AuthKey = "e1", t.TempDir(), "cluster-key-0123456789"
	c.TrustedGateway.CIDRs = []string{"10.0.0.0/8"}
	c.Admission = AdmissionConfig{MaxInflight: 4}
	c.Models = []ModelConfig{{Name: "m2", ContextServers: ServersConfig{URLs: []StaticInstance{{URL: "http://c:1"}}},
		GenerationServers: ServersConfig{URLs: []StaticInstance{{URL: "http://d:1"}}}}}
	before := c
	before.Models = slices.Clone(c.Models)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, c) {
		t.Fatalf("Validate changed the config:\n%+v\n%+v", before, c)
	}
	if c.Cluster.ProposeTimeout != 0 || c.ContextServers.HealthPath != "" || c.Models[0].ContextServers.HealthPath != "" || c.Admission.MinInflight != 0 {
		t.Fatal("defaults filled in the caller's config")
	}
}

// The clients' sub-agent headers are read by default, and an edge without
// internal_request_auth_key still starts with them (its client sub-agents
// get no signed hint); a file turns them off.
func TestClientSubagentHeadersConfig(t *testing.T) {
	const noKey = "model: m\ncontext_servers: {urls: [http://a:1]}\ngeneration_servers: {urls: [http://b:1]}\ncluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789abcdef}\n"
	cfg, err := ParseConfig([]byte(noKey))
	if err != nil {
		t.Fatalf("no key, no parent header: %v", err)
	}
	if !cfg.ClientSubagentHeaders || !cfg.IdentityConfig().ClientHeaders {
		t.Fatalf("client_subagent_headers is off by default")
	}
	cfg, err = ParseConfig([]byte(noKey + "client_subagent_headers: false\n"))
	if err != nil || cfg.IdentityConfig().ClientHeaders {
		t.Fatalf("client_subagent_headers: false: %v %+v", err, cfg.IdentityConfig())
	}
	// A trusted gateway guarding only the clients' headers is accepted.
	if _, err := ParseConfig([]byte(noKey + "trusted_gateway: {enabled: true, cidrs: [10.0.0.0/8]}\n")); err != nil {
		t.Fatalf("gateway guarding the clients' headers: %v", err)
	}
}

// anthropic_inline_system takes preserve (the default) or fold; another
// value is refused naming the key.
func TestAnthropicInlineSystemKey(t *testing.T) {
	_, err := ParseConfig([]byte(strings.Replace(validYAML, "model: llama-3.1-70b\n", "model: llama-3.1-70b\nanthropic_inline_system: hoist\n", 1)))
	if err == nil || !strings.Contains(err.Error(), `anthropic_inline_system`) || !strings.Contains(err.Error(), `"hoist" is not preserve or fold`) {
		t.Fatalf("a bad mode: %v", err)
	}
	cfg, err := ParseConfig([]byte(strings.Replace(validYAML, "model: llama-3.1-70b\n", "model: llama-3.1-70b\nanthropic_inline_system: fold\n", 1)))
	if err != nil || cfg.InlineSystem() != apireq.InlineSystemFold {
		t.Fatalf("fold: %v", err)
	}
}
