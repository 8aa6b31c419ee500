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
	"gopkg.in/yaml.v3"

	"github.com/tether-project/tether/routing/hintauth"
	"github.com/tether-project/tether/routing/telemetry"
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

// Config is a worker's configuration. YAML keys are given beside each field;
// the fields after the YAML ones are for in-process use only.
type Config struct {
	InstanceID string          // instance_id (required): [A-Za-z0-9_-]{1,128}, a NATS subject token
	Fleet      telemetry.Fleet // fleet: context | generation (default context)
	// ServerRole is server_role: context | generation, or "" (omitted):
	// then the role used to verify sub-agent hints is inferred from each
	// request's disaggregated request type.
	ServerRole   hintauth.Role
	Hostname     string // hostname: listen address (default 127.0.0.1)
	Port         int    // port: listen port (0 = any free port)
	AdvertiseURL string // advertise_url: the URL published in telemetry (default http://hostname:port)
	Model        string // model (required)

	InternalRequestAuthKey          string   // internal_request_auth_key (or env TETHER_INTERNAL_REQUEST_AUTH_KEY)
	PreviousInternalRequestAuthKeys []string // previous_internal_request_auth_keys: still accepted during a rotation
	// HintSignatureFormats is hint_signature_formats: the sub-agent hint
	// signature formats accepted (trtllm, tether-v1; default both, so
	// edges can switch format while workers run; docs/upgrades.md). While
	// tether-v1 is accepted, the handoff of edges predating the trtllm
	// protocol (disaggregated_params.opaque_state, no x-trtllm-disagg-auth)
	// is accepted too.
	HintSignatureFormats []string

	// ADP is enable_attention_dp and attention_dp_config; Ranks is the
	// top-level ranks key (attention_dp_config.ranks is accepted too).
	ADP   adp.Config
	Ranks int

	Engine EngineConfig    // engine
	NATS   NATSConfig      // nats (optional: without a URL the worker runs standalone)
	TLS    ServerTLSConfig // tls: the HTTP listener's transport security (worker/tls.go)

	TelemetryInterval time.Duration // telemetry_interval (default 100ms)
	LegacyMode        bool          // legacy_mode: ignore sub-agent headers, advertise no hint support

	MaxBodyBytes     int64         // max_body_bytes (default 32 MiB)
	DefaultMaxTokens int           // default_max_tokens (default 16)
	MaxTokensLimit   int           // max_tokens_limit: larger requests are clamped (default 4096)
	WriteTimeout     time.Duration // write_timeout: per write (streams extend it per chunk; default 10m)

	// HTTP server limits.
	ReadHeaderTimeout time.Duration // read_header_timeout: reading a request's headers (default 10s)
	ReadTimeout       time.Duration // read_timeout: reading a whole request, body included (default 2m)
	IdleTimeout       time.Duration // idle_timeout: a kept-alive connection between requests (default 2m)
	// MaxConcurrentRequests is max_concurrent_requests: inference requests
	// in flight beyond it are refused with 429 and Retry-After (0: no
	// limit). The edges shed by load first; this protects a worker that
	// is reached directly or by a misbehaving caller.
	MaxConcurrentRequests int

	// In-process only.

	// TracerProvider creates the per-request server spans; nil means the
	// otel global provider (a no-op unless the program installed one).
	TracerProvider trace.TracerProvider
	// Logger receives operational messages; nil means slog.Default().
	Logger *slog.Logger
	// Version is the software version published in telemetry.
	Version string
	// EngineOverride, if set, is used instead of building Engine from the
	// engine section (tests, tether dev). The server closes it.
	EngineOverride engine.Engine
}

// EngineConfig is the engine section.
type EngineConfig struct {
	Type string // type: sim | proxy (default sim)

	// Simulated engine (type sim); defaults are worker/engine/sim's.
	BlockSize               int           // block_size: tokens per KV block (default 64)
	CapacityBlocks          int           // capacity_blocks: KV blocks per rank
	PrefillTokensPerSecond  float64       // prefill_tokens_per_second: uncached prompt tokens per second
	PrefillOverhead         time.Duration // prefill_overhead: fixed cost of every prefill
	DecodeTokenTime         time.Duration // decode_token_time: one decode step on an empty rank
	DecodeSlowdown          float64       // decode_slowdown: decode stretch at full KV occupancy
	TransferTokensPerSecond float64       // transfer_tokens_per_second: context→generation KV transfer
	StatsWindow             time.Duration // stats_window: rolling window of cache hit figures
	// TimeScale is wall time per unit of simulated time: 1 real time,
	// 0.01 a hundred times faster, 0 never waits.
	TimeScale float64 // time_scale (default 1)

	// Proxy engine (type proxy).
	Upstreams       []string      // upstreams: one base URL per rank
	UpstreamMetrics []string      // upstream_metrics: optional Prometheus URL per rank
	UpstreamTimeout time.Duration // upstream_timeout: per request (default 10m)
}

// NATSConfig is the nats section.
type NATSConfig struct {
	URLs         []string // url (one) or urls (several)
	User         string   // user
	Password     string   // password (or env TETHER_NATS_PASSWORD)
	Token        string   // token (or env TETHER_NATS_TOKEN)
	NKeySeedFile string   // nkey_seed_file
	CredsFile    string   // creds_file
	TLS          TLSConfig
}

// Enabled reports whether a NATS server is configured.
func (n NATSConfig) Enabled() bool { return len(n.URLs) > 0 }

// TLSConfig is nats.tls.
type TLSConfig struct {
	CAFile     string // ca_file
	CertFile   string // cert_file
	KeyFile    string // key_file
	ServerName string // server_name
}

// Defaults for omitted keys.
const (
	DefaultTelemetryInterval = 100 * time.Millisecond
	DefaultMaxBodyBytes      = 32 << 20
	DefaultMaxTokens         = 16
	DefaultMaxTokensLimit    = 4096
	DefaultWriteTimeout      = 10 * time.Minute
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 2 * time.Minute
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultHostname          = "127.0.0.1"
)

// defaultConfig is the configuration before the file is applied.
func defaultConfig() Config {
	sd := sim.DefaultConfig()
	c := Config{
		Fleet:             telemetry.FleetContext,
		Hostname:          DefaultHostname,
		TelemetryInterval: DefaultTelemetryInterval,
		MaxBodyBytes:      DefaultMaxBodyBytes,
		DefaultMaxTokens:  DefaultMaxTokens,
		MaxTokensLimit:    DefaultMaxTokensLimit,
		WriteTimeout:      DefaultWriteTimeout,
		ReadHeaderTimeout: DefaultReadHeaderTimeout,
		ReadTimeout:       DefaultReadTimeout,
		IdleTimeout:       DefaultIdleTimeout,
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
			UpstreamTimeout:         10 * time.Minute,
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
// naming the key, e.g. "attention_dp_config.max_sessions: want an integer".
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
	if k := getenv(EnvInternalRequestAuthKey); k != "" {
		c.InternalRequestAuthKey = k
	}
	n := &c.NATS
	if v := getenv(EnvNATSPassword); v != "" && n.User != "" {
		n.Password = v
	}
	if v := getenv(EnvNATSToken); v != "" && n.User == "" && n.NKeySeedFile == "" && n.CredsFile == "" {
		n.Token = v
	}
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

// Validate checks every value, naming the offending key.
func (c *Config) Validate() error {
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
	if c.ADP.AttentionDP.Ranks != 0 && c.Ranks != 0 && c.ADP.AttentionDP.Ranks != c.Ranks {
		return fmt.Errorf("ranks: %d disagrees with attention_dp_config.ranks %d (set one)", c.Ranks, c.ADP.AttentionDP.Ranks)
	}
	if c.Ranks < 0 {
		return fmt.Errorf("ranks: must be at least 1, got %d", c.Ranks)
	}
	if _, err := c.schedulerOptions(); err != nil {
		return err
	}
	if err := c.Engine.validate(c.RankCount()); err != nil {
		return err
	}
	if err := c.NATS.validate(); err != nil {
		return err
	}
	if err := c.TLS.validate(c.AdvertiseURL); err != nil {
		return err
	}
	if c.TelemetryInterval < time.Millisecond || c.TelemetryInterval > time.Hour {
		return fmt.Errorf("telemetry_interval: %v out of range (1ms..1h)", c.TelemetryInterval)
	}
	if c.MaxBodyBytes < 1024 {
		return fmt.Errorf("max_body_bytes: %d is too small (at least 1024)", c.MaxBodyBytes)
	}
	if c.MaxTokensLimit < 1 {
		return fmt.Errorf("max_tokens_limit: must be at least 1, got %d", c.MaxTokensLimit)
	}
	if c.DefaultMaxTokens < 1 || c.DefaultMaxTokens > c.MaxTokensLimit {
		return fmt.Errorf("default_max_tokens: %d out of range (1..max_tokens_limit %d)", c.DefaultMaxTokens, c.MaxTokensLimit)
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

func (e *EngineConfig) validate(ranks int) error {
	switch e.Type {
	case "sim":
		if len(e.Upstreams) > 0 || len(e.UpstreamMetrics) > 0 {
			return errors.New("engine.upstreams: only for engine.type proxy")
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
		return errors.New("nats.url: credentials or TLS given without a server URL")
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

// parseConfig applies the YAML document to the defaults, rejecting unknown
// keys and wrongly typed values. Validation of values is Validate's job.
func parseConfig(data []byte) (Config, error) {
	cfg := defaultConfig()
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return Config{}, fmt.Errorf("invalid YAML: %w", err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return Config{}, errors.New("empty configuration (instance_id and model are required)")
	}
	var role, fleet string
	interval := &yamlDuration{&cfg.TelemetryInterval}
	writeTimeout := &yamlDuration{&cfg.WriteTimeout}
	readHeaderTimeout := &yamlDuration{&cfg.ReadHeaderTimeout}
	readTimeout := &yamlDuration{&cfg.ReadTimeout}
	idleTimeout := &yamlDuration{&cfg.IdleTimeout}
	var natsURL string
	var natsURLs []string
	fleet = string(cfg.Fleet)
	adpFields := fields{
		"kv_cache_routing_conversation_affinity": &cfg.ADP.AttentionDP.ConversationAffinity,
		"kv_cache_routing_new_conv_placement":    &cfg.ADP.AttentionDP.NewConvPlacement,
		"ranks":                                  &cfg.ADP.AttentionDP.Ranks,
		"max_sessions":                           &cfg.ADP.AttentionDP.MaxSessions,
		"max_requests_per_rank":                  &cfg.ADP.AttentionDP.MaxRequestsPerRank,
	}
	engineFields := fields{
		"type":                       &cfg.Engine.Type,
		"block_size":                 &cfg.Engine.BlockSize,
		"capacity_blocks":            &cfg.Engine.CapacityBlocks,
		"prefill_tokens_per_second":  &cfg.Engine.PrefillTokensPerSecond,
		"prefill_overhead":           &yamlDuration{&cfg.Engine.PrefillOverhead},
		"decode_token_time":          &yamlDuration{&cfg.Engine.DecodeTokenTime},
		"decode_slowdown":            &cfg.Engine.DecodeSlowdown,
		"transfer_tokens_per_second": &cfg.Engine.TransferTokensPerSecond,
		"stats_window":               &yamlDuration{&cfg.Engine.StatsWindow},
		"time_scale":                 &cfg.Engine.TimeScale,
		"upstreams":                  &cfg.Engine.Upstreams,
		"upstream_metrics":           &cfg.Engine.UpstreamMetrics,
		"upstream_timeout":           &yamlDuration{&cfg.Engine.UpstreamTimeout},
	}
	tlsFields := fields{
		"ca_file":     &cfg.NATS.TLS.CAFile,
		"cert_file":   &cfg.NATS.TLS.CertFile,
		"key_file":    &cfg.NATS.TLS.KeyFile,
		"server_name": &cfg.NATS.TLS.ServerName,
	}
	natsFields := fields{
		"url":            &natsURL,
		"urls":           &natsURLs,
		"user":           &cfg.NATS.User,
		"password":       &cfg.NATS.Password,
		"token":          &cfg.NATS.Token,
		"nkey_seed_file": &cfg.NATS.NKeySeedFile,
		"creds_file":     &cfg.NATS.CredsFile,
		"tls":            tlsFields,
	}
	top := fields{
		"instance_id":                         &cfg.InstanceID,
		"fleet":                               &fleet,
		"server_role":                         &role,
		"hostname":                            &cfg.Hostname,
		"port":                                &cfg.Port,
		"advertise_url":                       &cfg.AdvertiseURL,
		"model":                               &cfg.Model,
		"internal_request_auth_key":           &cfg.InternalRequestAuthKey,
		"previous_internal_request_auth_keys": &cfg.PreviousInternalRequestAuthKeys,
		"hint_signature_formats":              &cfg.HintSignatureFormats,
		"enable_attention_dp":                 &cfg.ADP.EnableAttentionDP,
		"attention_dp_config":                 adpFields,
		"ranks":                               &cfg.Ranks,
		"engine":                              engineFields,
		"nats":                                natsFields,
		"tls":                                 serverTLSFields(&cfg.TLS),
		"telemetry_interval":                  interval,
		"legacy_mode":                         &cfg.LegacyMode,
		"max_body_bytes":                      &cfg.MaxBodyBytes,
		"default_max_tokens":                  &cfg.DefaultMaxTokens,
		"max_tokens_limit":                    &cfg.MaxTokensLimit,
		"write_timeout":                       writeTimeout,
		"read_header_timeout":                 readHeaderTimeout,
		"read_timeout":                        readTimeout,
		"idle_timeout":                        idleTimeout,
		"max_concurrent_requests":             &cfg.MaxConcurrentRequests,
	}
	if err := top.decode(doc.Content[0], ""); err != nil {
		return Config{}, err
	}
	cfg.Fleet, cfg.ServerRole = telemetry.Fleet(fleet), hintauth.Role(role)
	if natsURL != "" && len(natsURLs) > 0 {
		return Config{}, errors.New("nats.url: set url or urls, not both")
	}
	if natsURL != "" {
		natsURLs = strings.Split(natsURL, ",")
		for i := range natsURLs {
			natsURLs[i] = strings.TrimSpace(natsURLs[i])
		}
	}
	cfg.NATS.URLs = natsURLs
	return cfg, nil
}

// fields maps the keys of one YAML mapping to destinations: pointers to
// scalars, string lists, durations, or nested fields.
type fields map[string]any

func (f fields) decode(n *yaml.Node, path string) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		name := path
		if name == "" {
			name = "configuration"
		}
		return fmt.Errorf("%s: want a mapping of keys, got %s (line %d)", name, kindName(n), n.Line)
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := join(path, k.Value)
		if seen[k.Value] {
			return fmt.Errorf("%s: duplicate key (line %d)", key, k.Line)
		}
		seen[k.Value] = true
		dst, ok := f[k.Value]
		if !ok {
			return fmt.Errorf("%s: unknown key (line %d)", key, k.Line)
		}
		if err := decodeValue(v, key, dst); err != nil {
			return err
		}
	}
	return nil
}

func decodeValue(v *yaml.Node, key string, dst any) error {
	if sub, ok := dst.(fields); ok {
		return sub.decode(v, key)
	}
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return nil // "key:" with no value keeps the default
	}
	var want string
	switch d := dst.(type) {
	case *string:
		want = "a string"
		if v.Kind == yaml.ScalarNode {
			*d = v.Value
			return nil
		}
	case *int:
		want = "an integer"
		if v.Kind == yaml.ScalarNode && v.Tag == "!!int" && v.Decode(d) == nil {
			return nil
		}
	case *int64:
		want = "an integer"
		if v.Kind == yaml.ScalarNode && v.Tag == "!!int" && v.Decode(d) == nil {
			return nil
		}
	case *float64:
		want = "a number"
		if v.Kind == yaml.ScalarNode && (v.Tag == "!!int" || v.Tag == "!!float") && v.Decode(d) == nil {
			return nil
		}
	case *bool:
		want = "true or false"
		if v.Kind == yaml.ScalarNode && v.Tag == "!!bool" && v.Decode(d) == nil {
			return nil
		}
	case *[]string:
		want = "a list of strings"
		if v.Kind == yaml.SequenceNode {
			out := make([]string, 0, len(v.Content))
			for i, e := range v.Content {
				if e.Kind != yaml.ScalarNode || e.Tag == "!!null" {
					return fmt.Errorf("%s[%d]: want a string, got %s (line %d)", key, i, kindName(e), e.Line)
				}
				out = append(out, e.Value)
			}
			*d = out
			return nil
		}
	case *yamlDuration:
		want = `a duration such as "100ms" or "2s"`
		if v.Kind == yaml.ScalarNode && v.Tag == "!!str" {
			dur, err := time.ParseDuration(v.Value)
			if err == nil {
				*d.d = dur
				return nil
			}
		}
	default:
		return fmt.Errorf("%s: internal error: unsupported destination %T", key, dst)
	}
	return fmt.Errorf("%s: want %s, got %s (line %d)", key, want, describe(v), v.Line)
}

type yamlDuration struct{ d *time.Duration }

func describe(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return fmt.Sprintf("%q", n.Value)
	}
	return kindName(n)
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		return "a scalar " + fmt.Sprintf("%q", n.Value)
	}
	return "nothing"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
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
