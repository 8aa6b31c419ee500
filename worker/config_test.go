package worker

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/worker/adp"
)

const fullConfig = `
instance_id: ctx-0
fleet: context
server_role: context
hostname: 0.0.0.0
port: 8001
advertise_url: http://ctx-0.internal:8001
model: llama-3.1-70b
internal_request_auth_key: current-key-0123456789
previous_internal_request_auth_keys: [previous-key-0123456789]
enable_attention_dp: true
attention_dp_config:
  kv_cache_routing_conversation_affinity: true
  kv_cache_routing_new_conv_placement: least_tokens
  max_sessions: 1000
  max_requests_per_rank: 32
ranks: 4
engine:
  type: sim
  block_size: 32
  capacity_blocks: 2048
  prefill_tokens_per_second: 8000
  prefill_overhead: 5ms
  decode_token_time: 10ms
  decode_slowdown: 0.25
  transfer_tokens_per_second: 200000
  stats_window: 30s
  time_scale: 0.5
nats:
  urls: [nats://127.0.0.1:4222, nats://127.0.0.1:4223]
  user: worker
  password: secret
telemetry_interval: 50ms
legacy_mode: false
max_body_bytes: 1048576
default_max_tokens: 32
max_model_len: 131072
write_timeout: 5m
read_header_timeout: 5s
read_timeout: 1m
idle_timeout: 90s
max_concurrent_requests: 64
`

func TestParseFullConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(fullConfig))
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"instance", cfg.InstanceID, "ctx-0"},
		{"fleet", cfg.Fleet, telemetry.FleetContext},
		{"role", cfg.ServerRole, hintauth.RoleContext},
		{"hostname", cfg.Hostname, "0.0.0.0"},
		{"port", cfg.Port, 8001},
		{"advertise", cfg.AdvertiseURL, "http://ctx-0.internal:8001"},
		{"model", cfg.Model, "llama-3.1-70b"},
		{"keys", len(cfg.AuthKeys()), 2},
		{"ranks", cfg.RankCount(), 4},
		{"affinity", cfg.ADP.AttentionDP.ConversationAffinity, true},
		{"placement", cfg.ADP.AttentionDP.NewConvPlacement, "least_tokens"},
		{"max sessions", cfg.ADP.AttentionDP.MaxSessions, 1000},
		{"max per rank", cfg.ADP.AttentionDP.MaxRequestsPerRank, 32},
		{"engine", cfg.Engine.Type, "sim"},
		{"block", cfg.Engine.BlockSize, 32},
		{"capacity", cfg.Engine.CapacityBlocks, 2048},
		{"prefill", cfg.Engine.PrefillTokensPerSecond, 8000.0},
		{"overhead", cfg.Engine.PrefillOverhead, 5 * time.Millisecond},
		{"decode", cfg.Engine.DecodeTokenTime, 10 * time.Millisecond},
		{"slowdown", cfg.Engine.DecodeSlowdown, 0.25},
		{"transfer", cfg.Engine.TransferTokensPerSecond, 200000.0},
		{"window", cfg.Engine.StatsWindow, 30 * time.Second},
		{"scale", cfg.Engine.TimeScale, 0.5},
		{"nats urls", strings.Join(cfg.NATS.URLs, ","), "nats://127.0.0.1:4222,nats://127.0.0.1:4223"},
		{"nats user", cfg.NATS.User, "worker"},
		{"interval", cfg.TelemetryInterval, 50 * time.Millisecond},
		{"body", cfg.MaxBodyBytes, int64(1 << 20)},
		{"default max", cfg.DefaultMaxTokens, 32},
		{"context length", cfg.MaxModelLen, 131072},
		{"write", cfg.WriteTimeout, 5 * time.Minute},
		{"read header", cfg.ReadHeaderTimeout, 5 * time.Second},
		{"read", cfg.ReadTimeout, time.Minute},
		{"idle", cfg.IdleTimeout, 90 * time.Second},
		{"concurrency", cfg.MaxConcurrentRequests, 64},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	o, err := cfg.schedulerOptions()
	if err != nil || o.Placement != adp.LeastTokens || o.Ranks != 4 || !o.ConversationAffinity {
		t.Errorf("scheduler options = %+v, %v", o, err)
	}
}

// A configuration written for max_tokens_limit still loads: the key is
// read, ignored and reported as deprecated at its line (max_model_len
// bounds a request now, as vLLM bounds it).
func TestMaxTokensLimitIsDeprecated(t *testing.T) {
	cfg, err := ParseConfig([]byte("instance_id: w1\nmodel: m\nmax_tokens_limit: 4096\n"))
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.Deprecated()
	if len(w) != 1 || !strings.HasPrefix(w[0], "max_tokens_limit, line 3: deprecated and ignored") || !strings.Contains(w[0], "max_model_len (1048576)") {
		t.Fatalf("warnings %q", w)
	}
	if cfg, _ := ParseConfig([]byte("instance_id: w1\nmodel: m\n")); len(cfg.Deprecated()) != 0 {
		t.Fatalf("warnings without the key: %q", cfg.Deprecated())
	}
}

func TestMinimalConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig([]byte("instance_id: w1\nmodel: m\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Fleet != telemetry.FleetContext || cfg.ServerRole != "" || cfg.RankCount() != 1 ||
		cfg.TelemetryInterval != 100*time.Millisecond || cfg.MaxBodyBytes != 32<<20 || cfg.DefaultMaxTokens != 0 || cfg.MaxModelLen != DefaultMaxModelLen ||
		cfg.Engine.Type != "sim" || cfg.NATS.Enabled() || cfg.Hostname != "127.0.0.1" ||
		cfg.ReadHeaderTimeout != 10*time.Second || cfg.ReadTimeout != 2*time.Minute || cfg.IdleTimeout != 2*time.Minute ||
		cfg.MaxConcurrentRequests != 0 {
		t.Fatalf("defaults: %+v", cfg)
	}
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	base := "instance_id: w1\nmodel: m\n"
	cases := []struct {
		name, yaml, want string
	}{
		{"empty", "", "empty configuration"},
		{"not yaml", "instance_id: [", "invalid YAML"},
		{"not a mapping", "- a\n- b\n", "configuration, line 1: want a mapping"},
		{"unknown key", base + "colour: blue\n", "colour, line 3: unknown key"},
		{"unknown nested key", base + "attention_dp_config:\n  fastest: true\n", "attention_dp_config.fastest, line 4: unknown key"},
		{"unknown engine key", base + "engine:\n  turbo: 1\n", "engine.turbo, line 4: unknown key"},
		{"unknown nats tls key", base + "nats:\n  url: nats://h:4222\n  tls:\n    pin: x\n", "nats.tls.pin, line 6: unknown key"},
		{"duplicate key", base + "model: n\n", "model, line 3: duplicate key (first given on line 2)"},
		{"missing instance", "model: m\n", "instance_id: instance id is empty"},
		{"bad instance", "instance_id: a.b\nmodel: m\n", "instance_id, line 1: instance id \"a.b\""},
		{"missing model", "instance_id: w1\n", "model: required"},
		{"placement", base + "enable_attention_dp: true\nattention_dp_config:\n  kv_cache_routing_new_conv_placement: fastest\n",
			`attention_dp_config.kv_cache_routing_new_conv_placement, line 5: unknown value "fastest" (allowed: round_robin, least_tokens, least_queued, kv_aware)`},
		{"fleet", base + "fleet: prefill\n", `fleet, line 3: unknown value "prefill" (want context or generation)`},
		{"role", base + "server_role: decode\n", `server_role, line 3: unknown value "decode"`},
		{"port type", base + "port: eighty\n", `port, line 3: want an integer, got "eighty"`},
		{"port range", base + "port: 70000\n", "port, line 3: 70000 out of range"},
		{"bool type", base + "legacy_mode: maybe\n", `legacy_mode, line 3: want true or false, got "maybe"`},
		{"section type", base + "engine: sim\n", `engine, line 3: want a mapping of keys, got "sim"`},
		{"list type", base + "previous_internal_request_auth_keys: onekey-0123456789abc\n", "previous_internal_request_auth_keys, line 3: want a list of strings"},
		{"duration type", base + "telemetry_interval: 100\n", `telemetry_interval, line 3: want a duration such as "100ms" or "2s", got "100"`},
		{"duration value", base + "telemetry_interval: 0s\n", "telemetry_interval, line 3: 0s out of range"},
		{"short key", base + "internal_request_auth_key: short\n", "internal_request_auth_key, line 3: 5 bytes is too short"},
		{"short previous key", base + "internal_request_auth_key: current-key-0123456789\nprevious_internal_request_auth_keys: [old]\n", "previous_internal_request_auth_keys[0], line 4: 3 bytes is too short"},
		{"previous without current", base + "previous_internal_request_auth_keys: [previous-key-0123456789]\n", "previous_internal_request_auth_keys, line 3: set internal_request_auth_key too"},
		{"ranks without adp", base + "ranks: 4\n", "ranks, line 3: 4 ranks need enable_attention_dp: true"},
		{"ranks disagree", base + "enable_attention_dp: true\nranks: 4\nattention_dp_config:\n  ranks: 2\n", "ranks, line 4: 4 disagrees with attention_dp_config.ranks 2"},
		{"negative sessions", base + "enable_attention_dp: true\nattention_dp_config:\n  max_sessions: -1\n", "attention_dp_config.max_sessions, line 5: must not be negative"},
		{"engine type", base + "engine:\n  type: gpu\n", `engine.type, line 4: unknown value "gpu" (want sim or proxy)`},
		{"block size", base + "engine:\n  block_size: 0\n", "engine.block_size, line 4: 0 out of range"},
		{"capacity", base + "engine:\n  capacity_blocks: -5\n", "engine.capacity_blocks, line 4: -5 out of range"},
		{"prefill rate", base + "engine:\n  prefill_tokens_per_second: 0\n", "engine.prefill_tokens_per_second, line 4: must be positive"},
		{"time scale", base + "engine:\n  time_scale: -1\n", "engine.time_scale, line 4: -1 out of range"},
		{"float type", base + "engine:\n  time_scale: fast\n", `engine.time_scale, line 4: want a number, got "fast"`},
		{"list item type", base + "engine:\n  type: proxy\n  upstreams: [\"http://h:1\", [x]]\n", "engine.upstreams[1], line 5: want a string, got a list"},
		{"upstreams on sim", base + "engine:\n  upstreams: [http://h:1]\n", "engine.upstreams, line 4: only for engine.type proxy"},
		{"proxy upstream count", base + "engine:\n  type: proxy\n", "engine.upstreams, line 3: 0 URLs for 1 ranks"},
		{"proxy upstream url", base + "engine:\n  type: proxy\n  upstreams: [ftp://h]\n", `engine.upstreams[0], line 5: "ftp://h" is not an absolute http(s) URL`},
		{"nats url", base + "nats:\n  url: http://h:4222\n", `nats.urls[0], line 4: "http://h:4222" is not a nats://`},
		{"nats url and urls", base + "nats:\n  url: nats://a:1\n  urls: [nats://b:1]\n", "nats.urls, line 5: given twice, as url on line 4 and as urls"},
		{"nats half auth", base + "nats:\n  url: nats://a:1\n  user: u\n", "nats.user, line 5: user and password go together"},
		{"nats two auths", base + "nats:\n  url: nats://a:1\n  user: u\n  password: p\n  creds_file: /x\n", "nats, line 3: choose one of"},
		{"nats auth without url", base + "nats:\n  user: u\n  password: p\n", "nats.urls, line 3: credentials or TLS given without a server URL"},
		{"advertise url", base + "advertise_url: ctx-0:8001\n", `advertise_url, line 3: "ctx-0:8001" is not an absolute http(s) URL`},
		{"body limit", base + "max_body_bytes: 10\n", "max_body_bytes, line 3: 10 is too small"},
		{"default above context", base + "default_max_tokens: 50\nmax_model_len: 10\n", "default_max_tokens, line 3: 50 out of range"},
		{"context length", base + "max_model_len: 1\n", "max_model_len, line 3: 1 out of range"},
		{"alias is the model", base + "model_aliases: [x, m]\n", `model_aliases[1], line 3: "m" is named twice`},
		{"alias is an adapter", base + "model_aliases: [x]\nlora:\n  adapters: [x]\n", `lora.adapters[0], line 5: "x" is named twice`},
		{"subagent tool name", base + "engine:\n  subagent_tools: [Agent, \"not a name\"]\n", `engine.subagent_tools[1], line 4: "not a name" is not a function name`},
		{"negative concurrency", base + "max_concurrent_requests: -1\n", "max_concurrent_requests, line 3: must be 0 (no limit) or more"},
		{"concurrency type", base + "max_concurrent_requests: many\n", `max_concurrent_requests, line 3: want an integer, got "many"`},
		{"read header timeout", base + "read_header_timeout: 1ms\n", "read_header_timeout, line 3: 1ms is too short"},
		{"idle timeout type", base + "idle_timeout: 30\n", `idle_timeout, line 3: want a duration such as "100ms" or "2s", got "30"`},
		{"nats token and user", base + "nats:\n  url: nats://a:1\n  user: u\n  password: p\n  token: t\n", "nats, line 3: choose one of user/password, token"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(c.yaml))
			if err == nil {
				t.Fatalf("accepted:\n%s", c.yaml)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q\ndoes not contain %q", err, c.want)
			}
		})
	}
}

func TestLoadConfigAndEnv(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(path, []byte("instance_id: w1\nmodel: m\ninternal_request_auth_key: file-key-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvInternalRequestAuthKey, "env-key-0123456789abcdef")
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.InternalRequestAuthKey != "env-key-0123456789abcdef" {
		t.Fatalf("env did not override the file: %q", cfg.InternalRequestAuthKey)
	}
	t.Setenv(EnvInternalRequestAuthKey, "short")
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), "internal_request_auth_key, line 3: 5 bytes is too short") {
		t.Fatalf("short env key: %v", err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte("instance_id: w1\nmodel: m\nbogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "bogus, line 3: unknown key") {
		t.Fatalf("unknown key via file: %v", err)
	}
}

// The NATS credential may come from the environment instead of the file
// (a Kubernetes Secret as an env var), and wins over the file.
func TestNATSCredentialsFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(path, []byte("instance_id: w1\nmodel: m\nnats:\n  url: nats://127.0.0.1:4222\n  user: worker\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvNATSPassword, "")
	t.Setenv(EnvNATSToken, "")
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), "nats.user") || !strings.Contains(err.Error(), EnvNATSPassword) {
		t.Fatalf("user without a password anywhere: %v", err)
	}
	t.Setenv(EnvNATSPassword, "from-the-secret")
	cfg, err := LoadConfig(path)
	if err != nil || cfg.NATS.Password != "from-the-secret" {
		t.Fatalf("password from %s: %q, %v", EnvNATSPassword, cfg.NATS.Password, err)
	}
	if err := os.WriteFile(path, []byte("instance_id: w1\nmodel: m\nnats:\n  url: nats://127.0.0.1:4222\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The password goes with a user only; a token with no other
	// credential (one environment may serve several components).
	t.Setenv(EnvNATSPassword, "from-the-secret")
	t.Setenv(EnvNATSToken, "token-from-the-secret")
	if cfg, err = LoadConfig(path); err != nil || cfg.NATS.Token != "token-from-the-secret" || cfg.NATS.Password != "" {
		t.Fatalf("token from %s: %q (password %q), %v", EnvNATSToken, cfg.NATS.Token, cfg.NATS.Password, err)
	}
	if err := os.WriteFile(path, []byte("instance_id: w1\nmodel: m\nnats:\n  url: nats://127.0.0.1:4222\n  nkey_seed_file: /etc/worker.nk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, err = LoadConfig(path); err != nil || cfg.NATS.Token != "" || cfg.NATS.Password != "" {
		t.Fatalf("nkey worker with NATS secrets in its environment: token %q password %q, %v", cfg.NATS.Token, cfg.NATS.Password, err)
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	cfg := testConfig("w1")
	cfg.Engine.Type = "gpu"
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "engine.type") {
		t.Fatalf("New = %v, want an engine.type error", err)
	}
}

func TestHintSignatureFormatsKey(t *testing.T) {
	cfg, err := ParseConfig([]byte("instance_id: w1\nmodel: m\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f := cfg.hintFormats(); len(f) != 2 || !cfg.acceptsTetherV1() {
		t.Fatalf("default formats %v", f)
	}
	cfg, err = ParseConfig([]byte("instance_id: w1\nmodel: m\nhint_signature_formats: [trtllm]\n"))
	if err != nil || cfg.acceptsTetherV1() {
		t.Fatalf("%v %v", cfg.HintSignatureFormats, err)
	}
	_, err = ParseConfig([]byte("instance_id: w1\nmodel: m\nhint_signature_formats: [trtllm, v2]\n"))
	if err == nil || !strings.Contains(err.Error(), "hint_signature_formats[1]") {
		t.Fatalf("unknown format: %v", err)
	}
}

// The worker spells its settings as the edge does; the former spellings
// still work, each with a warning naming the new key.
func TestDeprecatedSpellings(t *testing.T) {
	cfg, err := ParseConfig([]byte(`instance_id: w1
model: m
legacy_mode: true
nats:
  url: nats://a:4222, nats://b:4222
`))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.IgnoreSubagentHints || len(cfg.NATS.URLs) != 2 || cfg.NATS.URLs[1] != "nats://b:4222" {
		t.Fatalf("read as %+v %v", cfg.IgnoreSubagentHints, cfg.NATS.URLs)
	}
	want := []string{
		"legacy_mode, line 3: deprecated spelling: write ignore_subagent_hints (read the same way for now)",
		"nats.url, line 5: deprecated spelling: write nats.urls (read the same way for now)",
	}
	if got := cfg.Deprecated(); !slices.Equal(got, want) {
		t.Fatalf("warnings\n%q\nwant\n%q", got, want)
	}
}
