package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/internal/yamlconf"
	"github.com/tether-project/tether/worker/adp"
	"github.com/tether-project/tether/worker/engine"
	"github.com/tether-project/tether/worker/engine/sim"
)

// EnvInternalRequestAuthKey, when set, overrides internal_request_auth_key
// (ApplyEnv), so the secret need not live in the configuration file.
const EnvInternalRequestAuthKey = "TETHER_INTERNAL_REQUEST_AUTH_KEY"

// EnvNATSPassword and EnvNATSToken, when set, supply nats.password and
// nats.token (ApplyEnv), so a Kubernetes Secret can hold the credential
// instead of the whole configuration file.
const (
	EnvNATSPassword = "TETHER_NATS_PASSWORD"
	EnvNATSToken    = "TETHER_NATS_TOKEN"
)

// MinAuthKeyLen is the shortest internal_request_auth_key accepted.
const MinAuthKeyLen = 16

// Config is a worker's configuration: the YAML keys are the fields' tags
// (internal/yamlconf decodes them); the fields tagged "-", after them, are
// for in-process use only.
type Config struct {
	InstanceID string          `yaml:"instance_id"` // required: [A-Za-z0-9_-]{1,128}, a NATS subject token
	Fleet      telemetry.Fleet `yaml:"fleet"`       // context | generation (default context)
	// ServerRole is server_role: context | generation, or "" (omitted):
	// then the role used to verify sub-agent hints is inferred from each
	// request's disaggregated request type.
	ServerRole   hintauth.Role `yaml:"server_role"`
	Hostname     string        `yaml:"hostname"`      // listen address (default 127.0.0.1)
	Port         int           `yaml:"port"`          // listen port (0 = any free port)
	AdvertiseURL string        `yaml:"advertise_url"` // the URL published in telemetry (default http://hostname:port)
	Model        string        `yaml:"model"`         // required
	// ModelAliases are more names of the model (model_aliases): requests
	// may give any of them, GET /v1/models lists them all, as vLLM's
	// --served-model-name takes several names; telemetry reports Model.
	ModelAliases []string `yaml:"model_aliases"`

	InternalRequestAuthKey          string   `yaml:"internal_request_auth_key"`           // (or env TETHER_INTERNAL_REQUEST_AUTH_KEY)
	PreviousInternalRequestAuthKeys []string `yaml:"previous_internal_request_auth_keys"` // still accepted during a rotation
	// HintSignatureFormats is hint_signature_formats: the sub-agent hint
	// signature formats accepted (trtllm, tether-v1; default both, so
	// edges can switch format while workers run; docs/upgrades.md). While
	// tether-v1 is accepted, the handoff of edges predating the trtllm
	// protocol (disaggregated_params.opaque_state, no x-trtllm-disagg-auth)
	// is accepted too.
	HintSignatureFormats []string `yaml:"hint_signature_formats"`

	// ADP is enable_attention_dp and attention_dp_config; Ranks is the
	// top-level ranks key (attention_dp_config.ranks is accepted too).
	ADP   adp.Config `yaml:",inline"`
	Ranks int        `yaml:"ranks"`

	Engine EngineConfig    `yaml:"engine"`
	LoRA   LoRAConfig      `yaml:"lora"` // LoRA adapters served besides the model (worker/lora.go)
	NATS   NATSConfig      `yaml:"nats"` // (optional: without a URL the worker runs standalone)
	TLS    ServerTLSConfig `yaml:"tls"`  // the HTTP listener's transport security (worker/tls.go)

	TelemetryInterval time.Duration `yaml:"telemetry_interval"` // (default 100ms)
	// IgnoreSubagentHints ignores the sub-agent affinity headers and
	// advertises no hint support (verifies_hints: false), as a worker
	// predating hints behaves; its former spelling is legacy_mode.
	IgnoreSubagentHints bool `yaml:"ignore_subagent_hints" was:"legacy_mode"`

	MaxBodyBytes int64 `yaml:"max_body_bytes"` // (default 32 MiB)
	// MaxInflightBodyBytes is max_inflight_body_bytes: the request-body
	// bytes held at once over all requests, 429 beyond (default 64 MiB,
	// at least max_body_bytes).
	MaxInflightBodyBytes int64 `yaml:"max_inflight_body_bytes"`
	// AnthropicInlineSystem is anthropic_inline_system: where the inline
	// role "system" messages of a Messages request go in the prompt,
	// preserve (default: kept in place) or fold (merged into the
	// neighbouring user turn), as vLLM's Anthropic endpoint places them
	// (internal/apireq inline_system.go). The edges' setting for this
	// model must be the same (docs/engines.md).
	AnthropicInlineSystem string `yaml:"anthropic_inline_system"`
	// MaxModelLen is max_model_len, the model's context length (vLLM
	// --max-model-len): a request whose prompt plus max_tokens exceeds it
	// is refused with vLLM's 400; without max_tokens the answer may run
	// to max_model_len − prompt. Checked for the simulated engine (a
	// proxied engine checks its own, with its own tokenizer).
	MaxModelLen int `yaml:"max_model_len"` // (default 1048576)
	// DefaultMaxTokens is default_max_tokens: the bound of an answer
	// whose request sets no max tokens, as a model's generation config
	// (max_new_tokens) gives vLLM one; 0 (default): max_model_len − prompt.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// MaxTokensLimit is the former max_tokens_limit, read and ignored
	// with a deprecation warning: max_model_len bounds prompt plus output.
	MaxTokensLimit int `yaml:"max_tokens_limit"`
	// ResponsesStoreEntries and ResponsesStoreBytes bound the Responses
	// API store (stored responses live in this process; the least recently
	// used is evicted first, and each eviction is logged).
	ResponsesStoreEntries int           `yaml:"responses_store_entries"` // (default 10000)
	ResponsesStoreBytes   int64         `yaml:"responses_store_bytes"`   // (default 256 MiB)
	WriteTimeout          time.Duration `yaml:"write_timeout"`           // per write (streams extend it per chunk; default 10m)

	// HTTP server limits.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"` // reading a request's headers (default 10s)
	ReadTimeout       time.Duration `yaml:"read_timeout"`        // reading a whole request, body included (default 2m)
	IdleTimeout       time.Duration `yaml:"idle_timeout"`        // a kept-alive connection between requests (default 2m)
	// MaxConcurrentRequests is max_concurrent_requests: inference requests
	// in flight beyond it are refused with 429 and Retry-After (0: no
	// limit). The edges shed by load first; this protects a worker that
	// is reached directly or by a misbehaving caller.
	MaxConcurrentRequests int `yaml:"max_concurrent_requests"`

	// In-process only.

	// TracerProvider creates the per-request server spans; nil means the
	// otel global provider (a no-op unless the program installed one).
	TracerProvider trace.TracerProvider `yaml:"-"`
	// Logger receives operational messages; nil means slog.Default().
	Logger *slog.Logger `yaml:"-"`
	// Version is the software version published in telemetry.
	Version string `yaml:"-"`
	// EngineOverride, if set, is used instead of building Engine from the
	// engine section (tests, tether dev). The server closes it.
	EngineOverride engine.Engine `yaml:"-"`

	// doc is the file the configuration was read from: where each key
	// stands, for the lines of validation errors.
	doc *yamlconf.Doc
}

// EngineConfig is the engine section.
type EngineConfig struct {
	Type string `yaml:"type"` // sim | proxy (default sim)

	// Simulated engine (type sim); defaults are worker/engine/sim's.
	// SubagentTools are the tools that start sub-agents
	// (engine.subagent_tools, default DefaultSubagentTools): the
	// simulated model calls one only when the last user turn names it
	// exactly, never as a fallback (worker/engine/sim/DESIGN.md).
	SubagentTools           []string      `yaml:"subagent_tools"`
	BlockSize               int           `yaml:"block_size"`                 // tokens per KV block (default 64)
	CapacityBlocks          int           `yaml:"capacity_blocks"`            // KV blocks per rank
	PrefillTokensPerSecond  float64       `yaml:"prefill_tokens_per_second"`  // uncached prompt tokens per second
	PrefillOverhead         time.Duration `yaml:"prefill_overhead"`           // fixed cost of every prefill
	DecodeTokenTime         time.Duration `yaml:"decode_token_time"`          // one decode step on an empty rank
	DecodeSlowdown          float64       `yaml:"decode_slowdown"`            // decode stretch at full KV occupancy
	TransferTokensPerSecond float64       `yaml:"transfer_tokens_per_second"` // context→generation KV transfer
	StatsWindow             time.Duration `yaml:"stats_window"`               // rolling window of cache hit figures
	// TimeScale is wall time per unit of simulated time: 1 real time,
	// 0.01 a hundred times faster, 0 never waits.
	TimeScale float64 `yaml:"time_scale"` // (default 1)
	// PublishKVEvents makes the simulated engine also publish its cache
	// changes in vLLM's KV event protocol (engine.publish_kv_events).
	PublishKVEvents PublishKVEventsConfig `yaml:"publish_kv_events"`

	// Proxy engine (type proxy).
	Upstreams       []string      `yaml:"upstreams"`        // one base URL per rank
	UpstreamMetrics []string      `yaml:"upstream_metrics"` // optional Prometheus URL per rank
	UpstreamTimeout time.Duration `yaml:"upstream_timeout"` // per request (default 10m)
	// EmulateDisaggregation lets a proxy serve context-only and
	// generation-only hops, emulated: the generation upstream prefills the
	// prompt again (worker/proxy). Off: whole requests only.
	EmulateDisaggregation bool `yaml:"emulate_disaggregation"`
	// KVEvents reads the upstream engines' KV cache events (engine.kv_events).
	KVEvents KVEventsConfig `yaml:"kv_events"`
}

// PublishKVEventsConfig is engine.publish_kv_events: the simulated engine
// speaks vLLM's KV event protocol (worker/kvevents.Engine), so a proxy
// worker in front of it exercises the real-engine path. Rank r listens on
// the endpoints' port + r, as vLLM's data-parallel rank r does.
type PublishKVEventsConfig struct {
	Endpoint       string `yaml:"endpoint"`        // PUB listen endpoint, e.g. tcp://*:5557 ("" = off)
	ReplayEndpoint string `yaml:"replay_endpoint"` // ROUTER replay endpoint ("" = no replay)
	Layout         string `yaml:"layout"`          // map (current vLLM, default) | array (SGLang, older vLLM)
	// ServeTRTLLM also serves the changes as trtllm-serve does, drained at
	// POST /kv_cache_events on the worker's port (serve_trtllm).
	ServeTRTLLM bool `yaml:"serve_trtllm"`
}

// KVEventsConfig is engine.kv_events: where a proxy worker reads its
// upstreams' KV cache events (worker/kvevents). Format "" is off.
type KVEventsConfig struct {
	Format          string        `yaml:"format"`           // vllm | sglang | trtllm
	Endpoints       []string      `yaml:"endpoints"`        // ZeroMQ PUB endpoints, one per rank or one for all
	ReplayEndpoints []string      `yaml:"replay_endpoints"` // the engines' ROUTER replay sockets
	Topic           string        `yaml:"topic"`            // the publishers' topic
	URLs            []string      `yaml:"urls"`             // trtllm-serve base URLs (default: upstreams)
	PollInterval    time.Duration `yaml:"poll_interval"`    // trtllm polling (default 200ms)
}

// NATSConfig is the nats section.
type NATSConfig struct {
	// URLs are the servers (the edge's nats.urls); the former key url
	// took one, or several separated by commas.
	URLs         []string  `yaml:"urls" was:"url"`
	User         string    `yaml:"user"`
	Password     string    `yaml:"password"` // (or env TETHER_NATS_PASSWORD)
	Token        string    `yaml:"token"`    // (or env TETHER_NATS_TOKEN)
	NKeySeedFile string    `yaml:"nkey_seed_file"`
	CredsFile    string    `yaml:"creds_file"`
	TLS          TLSConfig `yaml:"tls"`
}

// Enabled reports whether a NATS server is configured.
func (n NATSConfig) Enabled() bool { return len(n.URLs) > 0 }

// TLSConfig is nats.tls.
type TLSConfig struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

// Defaults for omitted keys.
const (
	DefaultTelemetryInterval     = 100 * time.Millisecond
	DefaultMaxBodyBytes          = 32 << 20
	DefaultMaxInflightBodyBytes  = 64 << 20
	DefaultMaxTokens             = 0       // max_model_len − prompt
	DefaultMaxModelLen           = 1 << 20 // a whole simulated rank: 16384 blocks of 64 tokens
	DefaultResponsesStoreEntries = 10000
	DefaultResponsesStoreBytes   = 256 << 20
	DefaultWriteTimeout          = 10 * time.Minute
	DefaultReadHeaderTimeout     = 10 * time.Second
	DefaultReadTimeout           = 2 * time.Minute
	DefaultIdleTimeout           = 2 * time.Minute
	DefaultHostname              = "127.0.0.1"
)

// maxModelLenLimit bounds max_model_len (apireq caps max tokens there too).
const maxModelLenLimit = 1 << 30

// DefaultSubagentTools are the tools of the agent clients tether serves
// that start sub-agents: Claude Code's Agent (formerly Task) and Codex's
// spawn_agent (in its multi_agent_v1 namespace).
var DefaultSubagentTools = []string{"Agent", "Task", "spawn_agent"}

// defaultConfig is the configuration before the file is applied.
func defaultConfig() Config {
	sd := sim.DefaultConfig()
	c := Config{
		Fleet:             telemetry.FleetContext,
		Hostname:          DefaultHostname,
		TelemetryInterval: DefaultTelemetryInterval,
		MaxBodyBytes:      DefaultMaxBodyBytes,
		DefaultMaxTokens:  DefaultMaxTokens,
		MaxModelLen:       DefaultMaxModelLen,

		ResponsesStoreEntries: DefaultResponsesStoreEntries,
		ResponsesStoreBytes:   DefaultResponsesStoreBytes,
		WriteTimeout:          DefaultWriteTimeout,
		ReadHeaderTimeout:     DefaultReadHeaderTimeout,
		ReadTimeout:           DefaultReadTimeout,
		IdleTimeout:           DefaultIdleTimeout,
		Engine: EngineConfig{
			Type:                    "sim",
			BlockSize:               sd.BlockSize,
			CapacityBlocks:          sd.CapacityBlocks,
			PrefillTokensPerSecond:  sd.PrefillTokensPerSec,
			PrefillOverhead:         sd.PrefillOverhead,
			DecodeTokenTime:         sd.DecodeTokenTime,
			DecodeSlowdown:          sd.DecodeSlowdown,
			TransferTokensPerSecond: sd.KVTransferTokensPerSec,
			StatsWindow:             sd.StatsWindow,
			TimeScale:               sd.TimeScale,
			SubagentTools:           append([]string(nil), DefaultSubagentTools...),
			UpstreamTimeout:         10 * time.Minute,
			KVEvents:                KVEventsConfig{PollInterval: 200 * time.Millisecond},
		},
	}
	c.HintSignatureFormats = []string{string(hintauth.FormatTRTLLM), string(hintauth.FormatTetherV1)}
	return c
}

// DefaultConfig returns a valid standalone configuration for one simulated
// rank; callers set InstanceID and Model (and whatever else they need).
// Its listener is explicitly plaintext (tls.mode); a configuration file
// states its own.
func DefaultConfig() Config {
	c := defaultConfig()
	c.TLS.Mode = TLSModePlaintext
	return c
}

// LoadConfig reads and parses a YAML configuration file, then applies the
// environment (ApplyEnv) and validates.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	cfg, err := parseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	cfg.ApplyEnv(os.Getenv)
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig parses and validates a YAML configuration. It does not read
// the environment (see ApplyEnv). Unknown keys and invalid values are errors
// naming the key path and line, e.g. "attention_dp_config.max_sessions,
// line 4: want an integer, got \"many\"".
func ParseConfig(data []byte) (Config, error) {
	cfg, err := parseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return cfg, nil
}

// ApplyEnv sets the auth key from TETHER_INTERNAL_REQUEST_AUTH_KEY and the
// NATS credential from TETHER_NATS_PASSWORD (the password of nats.user, when
// the file names a user) or TETHER_NATS_TOKEN (when the file names no other
// credential), when they are non-empty; they win over the file.
func (c *Config) ApplyEnv(getenv func(string) string) {
	n := &c.NATS
	yamlconf.ApplyEnv(getenv,
		yamlconf.EnvSecret{Var: EnvInternalRequestAuthKey, Dst: &c.InternalRequestAuthKey},
		yamlconf.EnvSecret{Var: EnvNATSPassword, Dst: &n.Password, Skip: n.User == ""},
		yamlconf.EnvSecret{Var: EnvNATSToken, Dst: &n.Token, Skip: n.User != "" || n.NKeySeedFile != "" || n.CredsFile != ""},
	)
}

// AuthKeys returns the keys hint signatures are verified with, current first.
func (c *Config) AuthKeys() [][]byte {
	var keys [][]byte
	if c.InternalRequestAuthKey != "" {
		keys = append(keys, []byte(c.InternalRequestAuthKey))
	}
	for _, k := range c.PreviousInternalRequestAuthKeys {
		keys = append(keys, []byte(k))
	}
	return keys
}

// Validate checks every value, section by section; it only reads (the
// defaults are defaultConfig, the base a file is decoded over). Each
// section reports its first problem, as "key.path, line N: message" (the
// line of the key in the file parseConfig read).
func (c *Config) Validate() error {
	p := yamlconf.NewProblems(c.doc)
	for _, check := range []func() error{
		c.validateIdentity,
		c.validateLoRA,
		c.validateHintKeys,
		c.validateRanks,
		func() error { return c.Engine.validate(c.RankCount()) },
		c.NATS.validate,
		func() error { return c.TLS.validate(c.AdvertiseURL) },
		c.validateLimits,
	} {
		p.AddError("", check())
	}
	return p.Err()
}

// Deprecated lists the former spellings of keys the file used, and the
// keys it still has that are no longer read, as warnings to log.
func (c *Config) Deprecated() []string {
	out := c.doc.Warnings()
	if line := c.doc.Line("max_tokens_limit"); line > 0 {
		e := yamlconf.Error{Path: "max_tokens_limit", Line: line, Msg: fmt.Sprintf(
			"deprecated and ignored: a request is refused only when its prompt plus max_tokens exceeds max_model_len (%d), as vLLM refuses it; remove the key", c.MaxModelLen)}
		out = append(out, e.Error())
	}
	return out
}

// validateIdentity: who the worker is, where it listens, what it serves.
func (c *Config) validateIdentity() error {
	if err := telemetry.ValidInstanceID(c.InstanceID); err != nil {
		return fmt.Errorf("instance_id: %v", err)
	}
	if !c.Fleet.Valid() {
		return fmt.Errorf("fleet: unknown value %q (want context or generation)", c.Fleet)
	}
	if c.ServerRole != "" && !c.ServerRole.Valid() {
		return fmt.Errorf("server_role: unknown value %q (want context, generation, or omit the key)", c.ServerRole)
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("port: %d out of range (0..65535)", c.Port)
	}
	if c.AdvertiseURL != "" {
		if u, err := url.Parse(c.AdvertiseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("advertise_url: %q is not an absolute http(s) URL", c.AdvertiseURL)
		}
	}
	if strings.TrimSpace(c.Model) == "" {
		return errors.New("model: required")
	}
	if len(c.Model) > telemetry.MaxStringLen {
		return fmt.Errorf("model: %d bytes is too long (max %d)", len(c.Model), telemetry.MaxStringLen)
	}
	seen := map[string]bool{c.Model: true}
	for i, a := range c.ModelAliases {
		switch {
		case strings.TrimSpace(a) == "" || len(a) > telemetry.MaxStringLen:
			return fmt.Errorf("model_aliases[%d]: %q must be a name of 1..%d bytes", i, a, telemetry.MaxStringLen)
		case seen[a]:
			return fmt.Errorf("model_aliases[%d]: %q is named twice (model and its aliases are distinct names)", i, a)
		}
		seen[a] = true
	}
	return nil
}

// validateHintKeys: the keys and formats sub-agent hints are verified with.
func (c *Config) validateHintKeys() error {
	if k := c.InternalRequestAuthKey; k != "" && len(k) < MinAuthKeyLen {
		return fmt.Errorf("internal_request_auth_key: %d bytes is too short (want at least %d)", len(k), MinAuthKeyLen)
	}
	for i, k := range c.PreviousInternalRequestAuthKeys {
		if len(k) < MinAuthKeyLen {
			return fmt.Errorf("previous_internal_request_auth_keys[%d]: %d bytes is too short (want at least %d)", i, len(k), MinAuthKeyLen)
		}
	}
	for i, f := range c.HintSignatureFormats {
		if !hintauth.Format(f).Valid() {
			return fmt.Errorf("hint_signature_formats[%d]: %q is not a format (want trtllm or tether-v1)", i, f)
		}
	}
	if len(c.PreviousInternalRequestAuthKeys) > 0 && c.InternalRequestAuthKey == "" {
		return errors.New("previous_internal_request_auth_keys: set internal_request_auth_key too (the current key)")
	}
	return nil
}

// validateRanks: the ADP ranks and their scheduler.
func (c *Config) validateRanks() error {
	if c.ADP.AttentionDP.Ranks != 0 && c.Ranks != 0 && c.ADP.AttentionDP.Ranks != c.Ranks {
		return fmt.Errorf("ranks: %d disagrees with attention_dp_config.ranks %d (set one)", c.Ranks, c.ADP.AttentionDP.Ranks)
	}
	if c.Ranks < 0 {
		return fmt.Errorf("ranks: must be at least 1, got %d", c.Ranks)
	}
	if _, err := c.schedulerOptions(); err != nil {
		return err
	}
	return nil
}

// validateLimits: telemetry, request bodies, tokens, HTTP timeouts,
// concurrency.
func (c *Config) validateLimits() error {
	if c.TelemetryInterval < time.Millisecond || c.TelemetryInterval > time.Hour {
		return fmt.Errorf("telemetry_interval: %v out of range (1ms..1h)", c.TelemetryInterval)
	}
	if c.MaxBodyBytes < 1024 {
		return fmt.Errorf("max_body_bytes: %d is too small (at least 1024)", c.MaxBodyBytes)
	}
	if c.MaxInflightBodyBytes != 0 && c.MaxInflightBodyBytes < c.MaxBodyBytes {
		return fmt.Errorf("max_inflight_body_bytes: %d is below max_body_bytes (%d): a body at the limit could never be read", c.MaxInflightBodyBytes, c.MaxBodyBytes)
	}
	if c.MaxModelLen < 2 || c.MaxModelLen > maxModelLenLimit {
		return fmt.Errorf("max_model_len: %d out of range (2..%d)", c.MaxModelLen, maxModelLenLimit)
	}
	if _, err := apireq.ParseInlineSystem(c.AnthropicInlineSystem); err != nil {
		return fmt.Errorf("anthropic_inline_system: %v", err)
	}
	if c.DefaultMaxTokens < 0 || c.DefaultMaxTokens >= c.MaxModelLen {
		return fmt.Errorf("default_max_tokens: %d out of range (0 for max_model_len − prompt, or 1..max_model_len %d − 1)", c.DefaultMaxTokens, c.MaxModelLen)
	}
	if c.ResponsesStoreEntries < 1 {
		return fmt.Errorf("responses_store_entries: must be at least 1, got %d", c.ResponsesStoreEntries)
	}
	if c.ResponsesStoreBytes < 1<<20 {
		return fmt.Errorf("responses_store_bytes: %d is too small (at least 1 MiB)", c.ResponsesStoreBytes)
	}
	if c.WriteTimeout < time.Second {
		return fmt.Errorf("write_timeout: %v is too short (at least 1s)", c.WriteTimeout)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"read_header_timeout", c.ReadHeaderTimeout}, {"read_timeout", c.ReadTimeout}, {"idle_timeout", c.IdleTimeout}} {
		if d.v < 100*time.Millisecond {
			return fmt.Errorf("%s: %v is too short (at least 100ms)", d.key, d.v)
		}
	}
	if c.MaxConcurrentRequests < 0 {
		return fmt.Errorf("max_concurrent_requests: must be 0 (no limit) or more, got %d", c.MaxConcurrentRequests)
	}
	return nil
}

// RankCount is the number of ADP ranks the worker runs.
func (c *Config) RankCount() int {
	o, err := c.schedulerOptions()
	if err != nil {
		return 1
	}
	return o.Ranks
}

// schedulerOptions merges the top-level ranks key into the ADP config.
func (c *Config) schedulerOptions() (adp.Options, error) {
	a := c.ADP
	if c.Ranks != 0 {
		a.AttentionDP.Ranks = c.Ranks
	}
	if a.EnableAttentionDP && a.AttentionDP.Ranks == 0 {
		a.AttentionDP.Ranks = 1
	}
	o, err := a.Options()
	if err != nil && c.Ranks != 0 && strings.HasPrefix(err.Error(), "attention_dp_config.ranks") {
		// The user wrote the top-level key; name it.
		return adp.Options{}, errors.New("ranks" + strings.TrimPrefix(err.Error(), "attention_dp_config.ranks"))
	}
	return o, err
}

// kvEventSource is the worker/kvevents configuration of engine.kv_events
// (nil when off). URLs default to the upstreams for trtllm.
func (e *EngineConfig) kvEventSource(ranks int) *enginekv.Config {
	k := e.KVEvents
	if k.Format == "" {
		return nil
	}
	urls := k.URLs
	if k.Format == enginekv.FormatTRTLLM && len(urls) == 0 {
		urls = e.Upstreams
	}
	return &enginekv.Config{Format: k.Format, Endpoints: k.Endpoints, ReplayEndpoints: k.ReplayEndpoints,
		Topic: k.Topic, URLs: urls, PollInterval: k.PollInterval, Ranks: ranks, BlockSize: e.BlockSize}
}

func (e *EngineConfig) validateKVEvents(ranks int) error {
	k := e.KVEvents
	if k.Format == "" {
		if len(k.Endpoints)+len(k.ReplayEndpoints)+len(k.URLs) > 0 || k.Topic != "" {
			return errors.New("engine.kv_events: endpoints or urls given without a format (vllm, sglang or trtllm)")
		}
		return nil
	}
	if e.Type != "proxy" {
		return errors.New("engine.kv_events: only for engine.type proxy (the simulated engine announces its cache itself)")
	}
	if k.PollInterval <= 0 || k.PollInterval > time.Minute {
		return fmt.Errorf("engine.kv_events.poll_interval: %v out of range (0..1m]", k.PollInterval)
	}
	if k.Format == enginekv.FormatTRTLLM && (len(k.Endpoints) > 0 || len(k.ReplayEndpoints) > 0) {
		return errors.New("engine.kv_events.endpoints: ZeroMQ endpoints are for vllm and sglang; trtllm is polled at urls")
	}
	if k.Format != enginekv.FormatTRTLLM && len(k.URLs) > 0 {
		return errors.New("engine.kv_events.urls: only for format trtllm")
	}
	if err := e.kvEventSource(ranks).Validate(); err != nil {
		return fmt.Errorf("engine.%v", strings.TrimPrefix(err.Error(), "kvevents: "))
	}
	return nil
}

func (e *EngineConfig) validatePublishKVEvents(ranks int) error {
	p := e.PublishKVEvents
	if p.Endpoint == "" && (p.ReplayEndpoint != "" || p.Layout != "") {
		return errors.New("engine.publish_kv_events: replay_endpoint or layout given without an endpoint")
	}
	if p.Endpoint == "" && !p.ServeTRTLLM {
		return nil
	}
	if e.Type != "sim" {
		return errors.New("engine.publish_kv_events: only for engine.type sim")
	}
	if p.Layout != "" && p.Layout != "map" && p.Layout != "array" {
		return fmt.Errorf("engine.publish_kv_events.layout: %q (want map or array)", p.Layout)
	}
	for _, c := range []struct{ key, ep string }{{"endpoint", p.Endpoint}, {"replay_endpoint", p.ReplayEndpoint}} {
		if c.ep == "" && c.key == "endpoint" && p.Endpoint == "" {
			continue
		}
		if c.ep == "" {
			continue
		}
		if _, err := enginekv.OffsetEndpoint(c.ep, ranks-1); err != nil {
			return fmt.Errorf("engine.publish_kv_events.%s: %v", c.key, err)
		}
	}
	return nil
}

func (e *EngineConfig) validate(ranks int) error {
	if err := e.validateKVEvents(ranks); err != nil {
		return err
	}
	if err := e.validatePublishKVEvents(ranks); err != nil {
		return err
	}
	switch e.Type {
	case "sim":
		if len(e.Upstreams) > 0 || len(e.UpstreamMetrics) > 0 {
			return errors.New("engine.upstreams: only for engine.type proxy")
		}
		for i, name := range e.SubagentTools {
			if !toolNameRE.MatchString(name) {
				return fmt.Errorf("engine.subagent_tools[%d]: %q is not a function name (^[a-zA-Z0-9_-]{1,64}$)", i, truncate(name, 80))
			}
		}
	case "proxy":
		if len(e.Upstreams) != ranks {
			return fmt.Errorf("engine.upstreams: %d URLs for %d ranks (want one per rank)", len(e.Upstreams), ranks)
		}
		for i, u := range e.Upstreams {
			if err := checkHTTPURL(u); err != nil {
				return fmt.Errorf("engine.upstreams[%d]: %v", i, err)
			}
		}
		if len(e.UpstreamMetrics) != 0 && len(e.UpstreamMetrics) != ranks {
			return fmt.Errorf("engine.upstream_metrics: %d URLs for %d ranks (want one per rank, or none)", len(e.UpstreamMetrics), ranks)
		}
		for i, u := range e.UpstreamMetrics {
			if err := checkHTTPURL(u); err != nil {
				return fmt.Errorf("engine.upstream_metrics[%d]: %v", i, err)
			}
		}
		if e.UpstreamTimeout <= 0 {
			return fmt.Errorf("engine.upstream_timeout: must be positive, got %v", e.UpstreamTimeout)
		}
	default:
		return fmt.Errorf("engine.type: unknown value %q (want sim or proxy)", e.Type)
	}
	if e.BlockSize < 1 || e.BlockSize > telemetry.MaxBlockSize {
		return fmt.Errorf("engine.block_size: %d out of range (1..%d)", e.BlockSize, telemetry.MaxBlockSize)
	}
	if e.CapacityBlocks < 1 || e.CapacityBlocks > 1<<30 {
		return fmt.Errorf("engine.capacity_blocks: %d out of range (1..%d)", e.CapacityBlocks, 1<<30)
	}
	for _, r := range []struct {
		key string
		v   float64
	}{
		{"engine.prefill_tokens_per_second", e.PrefillTokensPerSecond},
		{"engine.transfer_tokens_per_second", e.TransferTokensPerSecond},
	} {
		if !(r.v > 0) || r.v > 1e12 {
			return fmt.Errorf("%s: must be positive, got %v", r.key, r.v)
		}
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"engine.prefill_overhead", e.PrefillOverhead},
		{"engine.decode_token_time", e.DecodeTokenTime},
		{"engine.stats_window", e.StatsWindow},
	} {
		if d.v < 0 {
			return fmt.Errorf("%s: must not be negative, got %v", d.key, d.v)
		}
	}
	if !(e.DecodeSlowdown >= 0) || e.DecodeSlowdown > 1e6 {
		return fmt.Errorf("engine.decode_slowdown: %v out of range (0 or more)", e.DecodeSlowdown)
	}
	if !(e.TimeScale >= 0) || e.TimeScale > 1e6 {
		return fmt.Errorf("engine.time_scale: %v out of range (0 = instant, 1 = real time)", e.TimeScale)
	}
	return nil
}

func (n *NATSConfig) validate() error {
	for i, u := range n.URLs {
		p, err := url.Parse(u)
		if err != nil || p.Host == "" || (p.Scheme != "nats" && p.Scheme != "tls" && p.Scheme != "ws" && p.Scheme != "wss") {
			return fmt.Errorf("nats.urls[%d]: %q is not a nats://, tls://, ws:// or wss:// URL", i, u)
		}
	}
	auth := 0
	if n.User != "" || n.Password != "" {
		auth++
		if n.User == "" || n.Password == "" {
			return fmt.Errorf("nats.user: user and password go together (the password may come from %s)", EnvNATSPassword)
		}
	}
	if n.Token != "" {
		auth++
	}
	if n.NKeySeedFile != "" {
		auth++
	}
	if n.CredsFile != "" {
		auth++
	}
	if auth > 1 {
		return errors.New("nats: choose one of user/password, token, nkey_seed_file or creds_file")
	}
	if (n.TLS.CertFile == "") != (n.TLS.KeyFile == "") {
		return errors.New("nats.tls.cert_file: cert_file and key_file go together")
	}
	if !n.Enabled() && (auth > 0 || n.TLS != (TLSConfig{})) {
		return errors.New("nats.urls: credentials or TLS given without a server URL")
	}
	return nil
}

func checkHTTPURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an absolute http(s) URL", s)
	}
	return nil
}

// parseConfig decodes the YAML document over the defaults
// (internal/yamlconf: unknown keys and wrongly typed values are errors
// naming the key path and line). Validation of values is Validate's job.
func parseConfig(data []byte) (Config, error) {
	cfg := defaultConfig()
	doc, err := yamlconf.DecodeDoc(data, &cfg)
	if err != nil {
		if errors.Is(err, yamlconf.ErrEmpty) {
			return Config{}, errors.New("empty configuration (instance_id and model are required)")
		}
		return Config{}, err
	}
	cfg.doc = doc
	return cfg, nil
}

// hintFormats returns HintSignatureFormats as formats (both when unset:
// a Config built in code without DefaultConfig).
func (c Config) hintFormats() []hintauth.Format {
	if len(c.HintSignatureFormats) == 0 {
		return []hintauth.Format{hintauth.FormatTRTLLM, hintauth.FormatTetherV1}
	}
	out := make([]hintauth.Format, len(c.HintSignatureFormats))
	for i, f := range c.HintSignatureFormats {
		out[i] = hintauth.Format(f)
	}
	return out
}

// acceptsTetherV1 reports whether edges predating the trtllm protocol are
// still served (migration: docs/upgrades.md).
func (c Config) acceptsTetherV1() bool {
	for _, f := range c.hintFormats() {
		if f == hintauth.FormatTetherV1 {
			return true
		}
	}
	return false
}

// inlineSystem is the anthropic_inline_system mode (validated).
func (c *Config) inlineSystem() apireq.InlineSystem {
	m, _ := apireq.ParseInlineSystem(c.AnthropicInlineSystem)
	return m
}
