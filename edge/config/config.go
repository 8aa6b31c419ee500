// Package config is the configuration of `tether edge`: every key of the
// YAML file (the TensorRT-LLM disaggregated launch's keys with their names
// and meaning, and tether's), the defaults, the environment overrides of the
// secrets, the values that follow other settings (Normalize) and the checks
// (Validate), which name each problem's key and line. It reads files and the
// environment only when asked to (LoadConfig, ReadConfig, ApplyEnv); the
// edge (edge.New) and the packages below it read the values.
package config

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/yamlconf"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/routing/breaker"
)

// Environment variables that override secrets from the configuration file,
// so they need not be written to disk.
const (
	EnvInternalRequestAuthKey = "TETHER_INTERNAL_REQUEST_AUTH_KEY"
	EnvAdminToken             = "TETHER_ADMIN_TOKEN"
	EnvClusterAuthKey         = "TETHER_CLUSTER_AUTH_KEY"
	// EnvNATSPassword and EnvNATSToken supply the NATS credentials (the
	// password of nats.user; a token when the file names no other
	// credential), so a Kubernetes Secret can hold them instead of the
	// whole configuration file.
	EnvNATSPassword = "TETHER_NATS_PASSWORD"
	EnvNATSToken    = "TETHER_NATS_TOKEN"
)

// MinSecretLen is the shortest internal key, cluster key or admin token
// accepted: a short shared secret is guessable.
const MinSecretLen = 16

// Defaults of tether's own keys.
const (
	DefaultPort          = 8000
	DefaultSessionTTL    = 10 * time.Minute
	DefaultMaxBindings   = fsm.DefaultMaxBindings
	DefaultTouchInterval = time.Second
	DefaultMaxBodyBytes  = 32 << 20
	// DefaultMaxInflightBodyBytes: two bodies at max_body_bytes, or
	// hundreds of typical agentic prompts at once.
	DefaultMaxInflightBodyBytes = 64 << 20
	DefaultMaxRetries           = 1
	DefaultLeaderInterval       = time.Second
	DefaultSweepBatch           = 512
	DefaultStaleIntervals       = 5
	DefaultMinStaleAfter        = time.Second
	DefaultDownAfter            = 10 * time.Second
	DefaultProbeInterval        = time.Second
	DefaultDumpTimeout          = 2 * time.Second
	DefaultEmbeddedNATSAddr     = "127.0.0.1:4222"
	// DefaultClusterBindAddr: a loopback port the system picks, for a
	// single edge; a cluster of several sets cluster.bind_addr.
	DefaultClusterBindAddr = "127.0.0.1:0"
	DefaultUpstreamTimeout = 10 * time.Minute
	// DefaultStoredResponseRetention bounds how long a response id routes
	// (OpenAI keeps stored responses 30 days).
	DefaultStoredResponseRetention = 30 * 24 * time.Hour
	DefaultStartupGrace            = 15 * time.Second

	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 2 * time.Minute
	DefaultIdleTimeout       = 2 * time.Minute
)

// Config is an edge's configuration. The YAML keys shared with a
// TensorRT-LLM disaggregated launch keep their names and meaning; the rest
// are tether's. Load it with LoadConfig/ParseConfig (which apply defaults and
// validate) or fill it in code and call Validate.
type Config struct {
	Hostname string `yaml:"hostname"`
	Port     int    `yaml:"port"`
	Model    string `yaml:"model"`
	// ModelAliases are more names of the first model (model_aliases):
	// requests may give any of them and route as the model (its fleets,
	// its routing keys); GET /v1/models lists them, as vLLM lists every
	// --served-model-name. The fleets' engines must serve them too.
	ModelAliases      []string      `yaml:"model_aliases"`
	ContextServers    ServersConfig `yaml:"context_servers"`
	GenerationServers ServersConfig `yaml:"generation_servers"`
	// AnthropicInlineSystem is the first model's anthropic_inline_system:
	// where a Messages request's inline role "system" messages go in the
	// prompt the edge keys, preserve (default) or fold, as the model's
	// engine places them (internal/apireq inline_system.go;
	// docs/engines.md). A tether worker reads the same key.
	AnthropicInlineSystem string `yaml:"anthropic_inline_system"`

	// ParentHeader is conversation_affinity_header_for_subagents ("" = off).
	ParentHeader string `yaml:"conversation_affinity_header_for_subagents"`
	// ClientSubagentHeaders is client_subagent_headers (default true):
	// read the sub-agent headers Claude Code and Codex send
	// (x-claude-code-agent-id, x-claude-code-parent-agent-id,
	// x-codex-parent-thread-id; docs/subagent-routing.md) as the parent
	// header is read. false routes those requests by their session alone.
	ClientSubagentHeaders bool `yaml:"client_subagent_headers"`
	// Scope is subagent_affinity_scope: context (default) or both.
	Scope routing.Scope `yaml:"subagent_affinity_scope"`
	// InternalRequestAuthKey signs sub-agent hints (env
	// TETHER_INTERNAL_REQUEST_AUTH_KEY overrides it).
	InternalRequestAuthKey string                  `yaml:"internal_request_auth_key"`
	ConditionalDisagg      ConditionalDisaggConfig `yaml:"conditional_disagg_config"`
	// HintSignatureFormat is hint_signature_format: trtllm (default;
	// TensorRT-LLM's "sha256=<hex>", which trtllm-serve workers verify) or
	// tether-v1 (workers predating it; docs/upgrades.md).
	HintSignatureFormat hintauth.Format `yaml:"hint_signature_format"`
	// DisaggAuthFormat is what x-trtllm-disagg-auth signs: trtllm (the
	// default: ctx_info_endpoint and encoded_opaque_state, current
	// TensorRT-LLM) or trtllm-params (the whole disaggregated_params, the
	// first releases with the header). docs/engines.md.
	DisaggAuthFormat hintauth.DisaggFormat `yaml:"disagg_auth_format"`
	// MaxRetries is how many times a failed hop is retried on another
	// instance (connection errors and 5xx only).
	MaxRetries int `yaml:"max_retries"`

	SessionTTL       time.Duration        `yaml:"session_ttl"`
	MaxBindings      uint64               `yaml:"max_bindings"`
	TouchInterval    time.Duration        `yaml:"touch_interval"`
	MaxSubagentDepth int                  `yaml:"max_subagent_depth"`
	TrustedGateway   TrustedGatewayConfig `yaml:"trusted_gateway"`
	DebugRouteHeader bool                 `yaml:"debug_route_header"`
	// AdminToken guards /admin/v1 (env TETHER_ADMIN_TOKEN overrides it).
	// Empty disables the admin API.
	AdminToken   string `yaml:"admin_token"`
	MaxBodyBytes int64  `yaml:"max_body_bytes"`
	// MetricsAccess is who may read /metrics on the API port: "public"
	// (default) or "admin_token" (Authorization: Bearer <admin_token>).
	// The metrics name instances, their health and hit rates.
	MetricsAccess string `yaml:"metrics_access"`
	// MaxInflightBodyBytes bounds the request-body bytes held at once,
	// over all requests (429 with Retry-After beyond it); >= max_body_bytes.
	MaxInflightBodyBytes int64 `yaml:"max_inflight_body_bytes"`
	// UpstreamTimeout bounds one worker hop, streaming included.
	UpstreamTimeout time.Duration `yaml:"upstream_timeout"`
	// Admission: load shedding on the edge's own saturation (edge/admission).
	Admission AdmissionConfig `yaml:"admission"`
	// FlowControl: fair, fleet-wide admission across tenants (edge/flow).
	FlowControl FlowConfig `yaml:"flow_control"`
	// StoredResponseRetention is how long a Responses API id the edge
	// minted routes to its response (0: as long as the engine keeps it);
	// an older id is answered 404 without asking the engine.
	StoredResponseRetention time.Duration `yaml:"stored_response_retention"`

	// HTTP server timeouts of the client-facing listener.
	// ReadHeaderTimeout bounds reading a request's headers (slow clients);
	// ReadTimeout the whole request, body included; IdleTimeout a kept-alive
	// connection between requests. WriteTimeout (0: none) bounds each write
	// of a response: a stream extends it before every chunk, so it limits a
	// stalled client, not a long stream.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	ReadTimeout       time.Duration `yaml:"read_timeout"`
	IdleTimeout       time.Duration `yaml:"idle_timeout"`
	WriteTimeout      time.Duration `yaml:"write_timeout"`

	Placement PlacementConfig `yaml:"placement"`
	Telemetry TelemetryConfig `yaml:"telemetry"`
	Leader    LeaderConfig    `yaml:"leader"`
	Cluster   ClusterConfig   `yaml:"cluster"`
	NATS      NATSConfig      `yaml:"nats"`
	Tracing   TracingConfig   `yaml:"tracing"`
	// TLS is transport security for every link (edge/edgetls).
	TLS TLSConfig `yaml:"tls"`

	// LoRA is the first model's LoRA adapters; Models are the models
	// served besides the first, each on its own fleets (edge/catalog).
	LoRA   LoRAConfig    `yaml:"lora"`
	Models []ModelConfig `yaml:"models"`

	// doc is the file the configuration was read from (ParseConfig): where
	// each key stands, for the lines of validation errors.
	doc *yamlconf.Doc
}

// ServersConfig is context_servers or generation_servers.
type ServersConfig struct {
	// NumInstances is informational when URLs are given (it must then
	// match their number); with telemetry-discovered workers it is the
	// number /readyz waits for (0: at least one).
	NumInstances int              `yaml:"num_instances"`
	URLs         []StaticInstance `yaml:"urls"`
	Router       RouterConfig     `yaml:"router"`
	// Engine is what serves the fleet (edge/dispatch/engines.go): tether workers
	// (the default), trtllm-serve, vLLM or SGLang.
	Engine EngineKind `yaml:"engine"`
	// Aggregated (context_servers only): the fleet's tether workers serve
	// whole requests, prefill and decode on one worker, as aggregated vLLM
	// and SGLang fleets do (those without the key); generation_servers
	// stays empty (edge/config/engines.go).
	Aggregated bool `yaml:"aggregated"`
	// DataParallelSize is the number of data-parallel ranks behind each
	// URL of a vLLM or SGLang fleet (0 or 1: none); the edge picks a
	// conversation's rank and sends it as X-Data-Parallel-Rank.
	DataParallelSize int `yaml:"data_parallel_size"`
	// KVShadowBlocks: the blocks per rank of the edge's shadow of a static
	// engine's prefix cache (edge/kvshadow) when the engine does not report
	// its KV capacity on /metrics; 0 turns the shadow off. Only static
	// instances without telemetry (no KV events) are shadowed.
	KVShadowBlocks int `yaml:"kv_shadow_blocks"`
	// HealthPath is the readiness probe of the static workers (urls):
	// GET answering 200 means ready. Default /health, which trtllm-serve,
	// vLLM, SGLang and tether workers serve (docs/engines.md).
	HealthPath string `yaml:"health_path"`
	// HealthCheckModel: a probe also requires the served model in the
	// worker's GET /v1/models list.
	HealthCheckModel bool `yaml:"health_check_model"`
	// HealthTimeout bounds one readiness probe (0: the engine's default,
	// engines.go: SGLang's /health runs a one-token generation and
	// answers after at least a second; the others answer at once and get
	// telemetry.probe_interval).
	HealthTimeout time.Duration `yaml:"health_timeout"`
	// Tokenizer is how the edge turns this fleet's prompts into tokens
	// for block keys (edge/tokenize): "words" (internal/prefix, what
	// tether's simulated workers use) or "hf:<dir>" (the model's
	// tokenizer.json and chat template, as a real engine renders and
	// tokenizes).
	Tokenizer string `yaml:"tokenizer"`
	// KVCacheEvents (engine trtllm): the leader edge drains each
	// server's POST /kv_cache_events (start trtllm-serve with
	// kv_cache_config.event_buffer_max_size > 0) and shares the blocks with
	// every edge over NATS (edge/engineevents).
	KVCacheEvents bool `yaml:"kv_cache_events"`
	// BlockSize is the engine's KV block size in tokens (vLLM 16,
	// trtllm-serve tokens_per_block 32, SGLang page size); 0 takes
	// placement.block_size.
	BlockSize int `yaml:"block_size"`
}

// DefaultHealthPath is the default probe path of static workers.
const DefaultHealthPath = "/health"

// withDefaults fills the fleet's zero keys: health_path and tokenizer.
func (s *ServersConfig) withDefaults() {
	if s.HealthPath == "" {
		s.HealthPath = DefaultHealthPath
	}
	if s.Tokenizer == "" {
		s.Tokenizer = TokenizerWords
	}
}

// StaticInstance is one configured worker: a URL, or {name, url}. Its
// instance id is the name when given, else the URL.
type StaticInstance struct {
	Name string `yaml:"name"`
	URL  string `yaml:"url"`
	// KVEvents names the engine's KV event publisher (vLLM and SGLang
	// --kv-events-config with the zmq publisher): the edge subscribes
	// itself and its KV index holds what the engine caches
	// (edge/engineevents).
	KVEvents *InstanceKVEvents `yaml:"kv_events"`
	// BootstrapPort is an SGLang prefill server's
	// --disaggregation-bootstrap-port, which its decode servers dial (0:
	// SGLang's default, 8998; edge/dispatch/pd_sglang.go).
	BootstrapPort int `yaml:"bootstrap_port"`
}

// InstanceKVEvents is a static engine's ZeroMQ KV event publisher.
type InstanceKVEvents struct {
	// Endpoint is the PUB socket, tcp://host:port (rank 0's with data
	// parallelism: rank r publishes on port + r, as the engines offset
	// it).
	Endpoint string `yaml:"endpoint"`
	// ReplayEndpoint is the ROUTER replay socket (same offset per rank);
	// without it a gap clears the rank's blocks instead of being filled.
	ReplayEndpoint string `yaml:"replay_endpoint"`
	// Topic is the publisher's topic ("" by default).
	Topic string `yaml:"topic"`
}

// UnmarshalYAML accepts a plain URL string or a {name, url} mapping.
func (s *StaticInstance) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		s.Name, s.URL = "", n.Value
		return nil
	}
	type plain StaticInstance
	var p plain
	if err := yamlconf.DecodeNode(n, &p); err != nil {
		return err
	}
	*s = StaticInstance(p)
	return nil
}

// ID is the instance id the edge uses for the entry.
func (s StaticInstance) ID() string {
	if s.Name != "" {
		return s.Name
	}
	return s.URL
}

// RouterConfig is a fleet's router section.
type RouterConfig struct {
	Type routing.RouterType `yaml:"type"`
}

// ConditionalDisaggConfig is conditional_disagg_config.
type ConditionalDisaggConfig struct {
	// MaxLocalPrefillLength: when the generation instance would have to
	// prefill fewer uncached prompt tokens than this, the context hop is
	// skipped and the generation worker runs the request aggregated.
	// 0 disables conditional disaggregation.
	MaxLocalPrefillLength int `yaml:"max_local_prefill_length"`
}

// TrustedGatewayConfig says which requests may carry the parent-session
// header. When Enabled, the header is stripped from requests that come
// neither from one of CIDRs nor with the gateway token in TokenHeader.
type TrustedGatewayConfig struct {
	Enabled     bool     `yaml:"enabled"`
	CIDRs       []string `yaml:"cidrs"`
	TokenHeader string   `yaml:"token_header"`
	Token       string   `yaml:"token"`

	prefixes []netip.Prefix
}

// PlacementConfig is the routing configuration shared by both fleets (the
// fleets differ by router type): KV weights, overflow thresholds,
// rebind_after, the cache circuit breaker and the hard limits for shedding.
type PlacementConfig struct {
	BlockSize  int                    `yaml:"block_size"`
	PredictTTL time.Duration          `yaml:"predict_ttl"`
	Weights    routing.Weights        `yaml:"weights"`
	Overflow   routing.OverflowConfig `yaml:"overflow"`
	Shed       routing.ShedConfig     `yaml:"shed"`
	Breaker    breaker.Config         `yaml:"circuit_breaker"`
	// ReportedPrefill makes the backlog the prefill the workers report
	// still to compute (routing.Config.ReportedPrefill).
	ReportedPrefill bool `yaml:"reported_prefill"`
	// CommitFirst makes a new conversation's first request wait for its
	// Bind to commit before it is dispatched. Off (the default), the edge
	// dispatches at once and proposes the Bind beside it: the first
	// committed Bind still decides the binding, and a request that raced
	// and lost costs at most its own cache hit (routing/DESIGN.md §7).
	CommitFirst bool `yaml:"commit_first"`
}

// TelemetryConfig tunes how the edge judges workers from their telemetry.
type TelemetryConfig struct {
	// StaleIntervals: a worker is unhealthy after this many of its
	// telemetry intervals without a load report (and at least
	// MinStaleAfter).
	StaleIntervals int           `yaml:"stale_intervals"`
	MinStaleAfter  time.Duration `yaml:"min_stale_after"`
	// DownAfter: the leader records an instance down after this long
	// without telemetry (or failed probes), evicting its bindings.
	DownAfter time.Duration `yaml:"down_after"`
	// ProbeInterval: static instances without telemetry are probed on
	// GET /readyz this often.
	ProbeInterval time.Duration `yaml:"probe_interval"`
	// DumpTimeout bounds one KV dump request.
	DumpTimeout time.Duration `yaml:"dump_timeout"`
	// StartupGrace: after (re)start, /readyz also waits until the edge
	// has heard (telemetry or probe) every instance the log records up,
	// and num_instances per fleet, or until this much time has passed.
	StartupGrace time.Duration `yaml:"startup_grace"`
}

// LeaderConfig tunes the leader's duties.
type LeaderConfig struct {
	// Interval between rounds of duties (TTL sweep, instance states,
	// feature level, settings).
	Interval time.Duration `yaml:"interval"`
	// SweepBatch bounds the evictions proposed per round.
	SweepBatch int `yaml:"sweep_batch"`
}

// ClusterConfig is the edge's cluster section: the cluster node's
// settings (cluster.Settings, inline: node_id, bind_addr, advertise_addr,
// data_dir, bootstrap, peers, join, suffrage, autopilot, propose_timeout,
// raft, archive_max_age, archive_max_events, compat_feature_level; their
// defaults and checks are the cluster package's) and the edge's own keys.
type ClusterConfig struct {
	cluster.Settings `yaml:",inline"`
	// AuthKey authenticates inter-edge RPCs (env TETHER_CLUSTER_AUTH_KEY);
	// defaults to internal_request_auth_key.
	AuthKey string `yaml:"auth_key"`
	// DegradedPlacementWindow: when the log cannot commit, a new key is
	// placed by degraded rendezvous only if this edge's state was current
	// (it had applied everything it knew committed) and it heard from a
	// leader within this window; otherwise the request gets 503 with
	// Retry-After. 0: 5 × the election timeout.
	DegradedPlacementWindow time.Duration `yaml:"degraded_placement_window"`
}

// NATSConfig is where worker telemetry comes from. Authenticate with one
// of user/password (the password may come from TETHER_NATS_PASSWORD), a
// token (or TETHER_NATS_TOKEN), an nkey seed file or a creds file.
type NATSConfig struct {
	// Embedded runs a NATS server inside the edge on Listen and connects
	// to it (a single-edge or development deployment).
	Embedded     bool     `yaml:"embedded"`
	Listen       string   `yaml:"listen"`
	URLs         []string `yaml:"urls"`
	User         string   `yaml:"user"`
	Password     string   `yaml:"password"`
	Token        string   `yaml:"token"`
	NKeySeedFile string   `yaml:"nkey_seed_file"`
	CredsFile    string   `yaml:"creds_file" was:"creds"`
	// TLS toward an external server; WorkerUsers are accounts of the
	// embedded server (edge/edgetls).
	TLS         NATSTLSConfig    `yaml:"tls"`
	WorkerUsers []NATSWorkerUser `yaml:"worker_users"`
}

// Enabled reports whether the edge subscribes to telemetry.
func (n NATSConfig) Enabled() bool { return n.Embedded || len(n.URLs) > 0 }

// TracingConfig selects the span exporter: none, stdout (one JSON object
// per finished span on standard output) or otlp (OTLP/HTTP protobuf to
// Endpoint, e.g. http://otel-collector:4318; a URL without a path gets
// /v1/traces).
type TracingConfig struct {
	Exporter string `yaml:"exporter"` // none | stdout | otlp
	Endpoint string `yaml:"endpoint"`
}

// DefaultConfig returns the defaults; callers fill model, servers and the
// cluster section.
func DefaultConfig() Config {
	rc := routing.DefaultConfig()
	c := Config{
		Hostname:             "127.0.0.1",
		Port:                 DefaultPort,
		MaxRetries:           DefaultMaxRetries,
		SessionTTL:           DefaultSessionTTL,
		MaxBindings:          DefaultMaxBindings,
		TouchInterval:        DefaultTouchInterval,
		MaxBodyBytes:         DefaultMaxBodyBytes,
		MaxInflightBodyBytes: DefaultMaxInflightBodyBytes,
		Admission:            DefaultAdmissionConfig(),
		FlowControl:          DefaultFlowConfig(),
		UpstreamTimeout:      DefaultUpstreamTimeout,
		MetricsAccess:        MetricsPublic,

		ClientSubagentHeaders: true,

		StoredResponseRetention: DefaultStoredResponseRetention,

		ReadHeaderTimeout: DefaultReadHeaderTimeout,
		ReadTimeout:       DefaultReadTimeout,
		IdleTimeout:       DefaultIdleTimeout,
		Placement: PlacementConfig{
			BlockSize:  rc.BlockSize,
			PredictTTL: rc.PredictTTL,
			Weights:    rc.Weights,
			Overflow:   rc.Overflow,
			Shed:       rc.Shed,
			Breaker:    rc.Breaker,
		},
		Telemetry: TelemetryConfig{
			StaleIntervals: DefaultStaleIntervals,
			MinStaleAfter:  DefaultMinStaleAfter,
			DownAfter:      DefaultDownAfter,
			ProbeInterval:  DefaultProbeInterval,
			DumpTimeout:    DefaultDumpTimeout,
			StartupGrace:   DefaultStartupGrace,
		},
		Leader: LeaderConfig{Interval: DefaultLeaderInterval, SweepBatch: DefaultSweepBatch},
		// The cluster section's defaults are normalize's (the cluster
		// package's: some follow the Raft timing a file sets).
		NATS:    NATSConfig{Listen: DefaultEmbeddedNATSAddr},
		Tracing: TracingConfig{Exporter: "none"},
		TLS:     TLSConfig{Mode: TLSModePlaintext},
	}
	c.HintSignatureFormat = hintauth.FormatTRTLLM
	c.DisaggAuthFormat = hintauth.DisaggFields
	c.ContextServers.KVShadowBlocks, c.GenerationServers.KVShadowBlocks = DefaultKVShadowBlocks, DefaultKVShadowBlocks
	return c
}

// LoadConfig reads, parses, applies the environment to and validates the
// file at path.
func LoadConfig(path string) (Config, error) {
	cfg, err := ReadConfig(path)
	if err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// ReadConfig is LoadConfig without the validation: for a program that
// sets more (command-line flags) before it validates.
func ReadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	cfg, err := DecodeConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig parses YAML over the defaults (internal/yamlconf: unknown
// keys are errors, every error names its key path and line), applies the
// environment overrides and validates.
func ParseConfig(data []byte) (Config, error) {
	cfg, err := DecodeConfig(data)
	if err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// DecodeConfig is ParseConfig without the validation.
func DecodeConfig(data []byte) (Config, error) {
	cfg := DefaultConfig()
	cfg.TLS.Mode = "" // a file states its tls.mode (unset: plaintext with a warning)
	doc, err := yamlconf.DecodeDoc(data, &cfg)
	if err != nil && !errors.Is(err, yamlconf.ErrEmpty) {
		return Config{}, err
	}
	cfg.doc = doc
	cfg.ApplyEnv(os.Getenv)
	cfg.Normalize()
	return cfg, nil
}

// ApplyEnv lets environment variables override the secrets.
func (c *Config) ApplyEnv(getenv func(string) string) {
	n := &c.NATS
	yamlconf.ApplyEnv(getenv,
		yamlconf.EnvSecret{Var: EnvInternalRequestAuthKey, Dst: &c.InternalRequestAuthKey},
		yamlconf.EnvSecret{Var: EnvAdminToken, Dst: &c.AdminToken},
		yamlconf.EnvSecret{Var: EnvClusterAuthKey, Dst: &c.Cluster.AuthKey},
		// The NATS password goes with the file's nats.user; a token
		// applies when the file names no other credential.
		yamlconf.EnvSecret{Var: EnvNATSPassword, Dst: &n.Password, Skip: n.User == ""},
		yamlconf.EnvSecret{Var: EnvNATSToken, Dst: &n.Token, Skip: n.User != "" || n.NKeySeedFile != "" || n.CredsFile != ""},
	)
}

// RoutingConfig is fleet f's routing configuration.
func (c *Config) RoutingConfig(f fsm.Fleet) routing.Config {
	p := c.Placement
	rc := routing.Config{
		BlockSize: p.BlockSize, PredictTTL: p.PredictTTL, Weights: p.Weights,
		Overflow: p.Overflow, Shed: p.Shed, Breaker: p.Breaker, ReportedPrefill: p.ReportedPrefill,
	}
	rc.Type = c.Servers(f).Router.Type
	if bs := c.Servers(f).BlockSize; bs > 0 {
		rc.BlockSize = bs // the fleet's engine cuts blocks of this size
	}
	if f == fsm.FleetGeneration {
		// The cache-lost rebind reads the KV index, and a generation
		// worker's prompt blocks arrive by transfer from the context side
		// each turn: what its index entries say is no measure of what
		// staying buys (the generation binding keeps the conversation's
		// ADP rank and decode state), so only the context fleet uses it.
		rc.Overflow.CacheLostBelow = 0
	}
	return rc
}

func (c *Config) Servers(f fsm.Fleet) *ServersConfig {
	if f == fsm.FleetGeneration {
		return &c.GenerationServers
	}
	return &c.ContextServers
}

// IdentityConfig is the sub-agent identity configuration routing uses.
func (c *Config) IdentityConfig() routing.IdentityConfig {
	return routing.IdentityConfig{ParentHeader: c.ParentHeader, Scope: c.Scope, MaxDepth: c.MaxSubagentDepth,
		ClientHeaders: c.ClientSubagentHeaders}
}

// clusterAuthKey is the key inter-edge RPCs use.
func (c *Config) ClusterAuthKey() string {
	if c.Cluster.AuthKey != "" {
		return c.Cluster.AuthKey
	}
	return c.InternalRequestAuthKey
}

// Validate checks the configuration; it changes nothing. Every problem
// is reported, each as "key.path, line N: message" (the line of the key in
// the file ParseConfig read; no line for a configuration built in code).
// It checks the configuration as New runs it: with the defaults that
// follow other settings filled in (normalize), on a copy.
func (c *Config) Validate() error {
	n := *c
	n.Models = slices.Clone(c.Models) // normalize fills the copy's entries, not c's
	n.Normalize()
	p := yamlconf.NewProblems(c.doc)
	bad := p.Add
	n.validateServing(p)
	n.validateFleets(p)
	n.validateLimits(bad)
	n.Admission.validate(bad)
	n.FlowControl.validate(n.Admission.MaxInflight, bad)
	n.validateGateway(bad)
	n.validateTelemetry(bad)
	n.validateCluster(p)
	n.validateNATS(bad)
	n.validateTLS(bad)
	n.validateTracing(bad)
	n.validateModels(p)
	return p.Err()
}

// complain records one problem with the key it concerns.
type complain = func(key, format string, args ...any)

// normalize fills the values that default from other settings (the
// cluster section's, from the cluster package: its Raft timing, autopilot
// and propose timeout follow the heartbeat a file sets), the zero keys of
// each fleet's section (a section built in code is a ServersConfig
// literal, as are the models' fleets), admission's zero keys (0: the
// default) and the gateway's parsed CIDRs. ParseConfig and New run it; the
// other defaults are DefaultConfig's.
func (c *Config) Normalize() {
	c.Cluster.Settings = c.Cluster.Settings.WithDefaults()
	if c.Cluster.BindAddr == "" {
		c.Cluster.BindAddr = DefaultClusterBindAddr // (unused when Deps bring a listener)
	}
	c.Admission.withDefaults(c.Cluster.Raft.LeaderLeaseTimeout)
	c.FlowControl.withDefaults()
	for _, s := range []*ServersConfig{&c.ContextServers, &c.GenerationServers} {
		s.withDefaults()
	}
	for i := range c.Models {
		c.Models[i].ContextServers.withDefaults()
		c.Models[i].GenerationServers.withDefaults()
	}
	g := &c.TrustedGateway
	g.prefixes = nil
	for _, s := range g.CIDRs {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
			g.prefixes = append(g.prefixes, p.Masked())
		}
	}
}

// Deprecated lists the former spellings of keys the file used, as
// warnings to log ("nats.creds, line 4: deprecated spelling: write
// nats.creds_file …").
func (c *Config) Deprecated() []string {
	return c.doc.Warnings()
}

// validateServing: the listener, the model, sub-agent affinity and hints,
// scopes, conditional disaggregation, retries.
func (c *Config) validateServing(p *yamlconf.Problems) {
	bad := p.Add
	if c.Port < 0 || c.Port > 65535 {
		bad("port", "must be 0..65535, got %d", c.Port)
	}
	if strings.TrimSpace(c.Model) == "" {
		bad("model", "required: the model name the edge serves")
	}

	// Sub-agent affinity (the startup checks of docs/subagent-routing.md).
	if err := c.IdentityConfig().Validate(); err != nil {
		p.AddError("", err)
	}
	if c.InternalRequestAuthKey != "" && len(c.InternalRequestAuthKey) < MinSecretLen {
		bad("internal_request_auth_key", "%d bytes is too short (want at least %d)", len(c.InternalRequestAuthKey), MinSecretLen)
	}
	if !c.HintSignatureFormat.Valid() {
		bad("hint_signature_format", "%q is not a format (want trtllm or tether-v1)", c.HintSignatureFormat)
	}
	if !c.DisaggAuthFormat.Valid() {
		bad("disagg_auth_format", "%q is not a format (want trtllm or trtllm-params)", c.DisaggAuthFormat)
	}
	if c.ParentHeader != "" && c.InternalRequestAuthKey == "" && !c.ContextServers.Engine.AggregatedOnly() {
		bad("internal_request_auth_key", "required when conversation_affinity_header_for_subagents is set (%s): sub-agent hints must be signed; set it or %s",
			c.ParentHeader, EnvInternalRequestAuthKey)
	}
	if c.Scope == routing.ScopeBoth && c.GenerationServers.Router.Type != routing.RouterConversation {
		bad("subagent_affinity_scope", "both requires generation_servers.router.type: conversation (got %s)", c.GenerationServers.Router.Type)
	}
	if c.ConditionalDisagg.MaxLocalPrefillLength < 0 {
		bad("conditional_disagg_config.max_local_prefill_length", "must be >= 0 (0 disables), got %d", c.ConditionalDisagg.MaxLocalPrefillLength)
	}
	if c.ConditionalDisagg.MaxLocalPrefillLength > 0 {
		if c.Scope == routing.ScopeBoth {
			bad("conditional_disagg_config", "cannot be used with subagent_affinity_scope: both (use context scope with conditional disaggregation)")
		}
		if c.GenerationServers.Router.Type != routing.RouterKVCacheAware {
			bad("conditional_disagg_config", "requires generation_servers.router.type: kv_cache_aware (got %s)", c.GenerationServers.Router.Type)
		}
	}
	if c.MaxRetries < 0 || c.MaxRetries > 16 {
		bad("max_retries", "must be 0..16, got %d", c.MaxRetries)
	}
}

// validateFleets: each fleet's instances, probes and engine, and the
// routing configuration of both.
func (c *Config) validateFleets(p *yamlconf.Problems) {
	bad := p.Add
	seen := map[string]string{}
	seenIDs := map[string]string{}
	for _, fl := range []struct {
		key string
		s   *ServersConfig
	}{{"context_servers", &c.ContextServers}, {"generation_servers", &c.GenerationServers}} {
		if fl.s.NumInstances < 0 {
			bad(fl.key+".num_instances", "must be >= 0, got %d", fl.s.NumInstances)
		}
		if len(fl.s.URLs) > 0 && fl.s.NumInstances != 0 && fl.s.NumInstances != len(fl.s.URLs) {
			bad(fl.key+".num_instances", "is %d but %s.urls lists %d instances", fl.s.NumInstances, fl.key, len(fl.s.URLs))
		}
		if hp := fl.s.HealthPath; !strings.HasPrefix(hp, "/") || strings.ContainsAny(hp, " \t\r\n#") {
			bad(fl.key+".health_path", "must be a URL path starting with / (e.g. /health), got %q", hp)
		}
		if len(fl.s.URLs) == 0 && !c.NATS.Enabled() && !(fl.s == &c.GenerationServers && c.Aggregated()) {
			bad(fl.key+".urls", "no instances: list the workers' URLs or configure nats so workers register themselves")
		}
		c.validateEngine(fl.key, fl.s, bad)
		validateTokenizer(fl.key, fl.s, bad)
		for i, si := range fl.s.URLs {
			key := fmt.Sprintf("%s.urls[%d]", fl.key, i)
			if err := checkWorkerURL(si.URL); err != nil {
				bad(key, "%v", err)
				continue
			}
			norm := strings.TrimRight(si.URL, "/")
			if prev, dup := seen[norm]; dup {
				bad(key, "duplicate URL %s (also %s)", si.URL, prev)
			}
			seen[norm] = key
			if prev, dup := seenIDs[si.ID()]; dup {
				bad(key, "duplicate instance id %q (also %s)", si.ID(), prev)
			}
			seenIDs[si.ID()] = key
			if si.Name != "" && !validInstanceName(si.Name) {
				bad(key+".name", "%q must be 1..128 characters of [A-Za-z0-9_-] (the workers' instance_id)", si.Name)
			}
		}
	}
	for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
		if err := c.RoutingConfig(f).Validate(); err != nil {
			key := "context_servers"
			if f == fsm.FleetGeneration {
				key = "generation_servers"
			}
			// Placement keys are shared; name them under placement.
			msg := strings.ReplaceAll(err.Error(), "router.type", key+".router.type")
			msg = strings.ReplaceAll(msg, "router.", "placement.")
			p.AddError("", errors.New(msg))
			break
		}
	}
}

// validateLimits: bindings, bodies, timeouts, the admin token, /metrics.
func (c *Config) validateLimits(bad complain) {
	if c.SessionTTL <= 0 {
		bad("session_ttl", "must be > 0, got %s", c.SessionTTL)
	}
	if c.MaxBindings == 0 {
		bad("max_bindings", "must be > 0")
	}
	if c.TouchInterval <= 0 {
		bad("touch_interval", "must be > 0, got %s", c.TouchInterval)
	}
	if c.MaxBodyBytes <= 0 {
		bad("max_body_bytes", "must be > 0, got %d", c.MaxBodyBytes)
	}
	switch c.MetricsAccess {
	case MetricsPublic:
	case MetricsAdminToken:
		if c.AdminToken == "" {
			bad("metrics_access", "%q needs admin_token (or %s)", MetricsAdminToken, EnvAdminToken)
		}
	default:
		bad("metrics_access", "%q is not one of %q, %q", c.MetricsAccess, MetricsPublic, MetricsAdminToken)
	}
	if c.MaxInflightBodyBytes < c.MaxBodyBytes {
		bad("max_inflight_body_bytes", "%d is below max_body_bytes (%d): a body at the limit could never be read", c.MaxInflightBodyBytes, c.MaxBodyBytes)
	}
	if c.UpstreamTimeout <= 0 {
		bad("upstream_timeout", "must be > 0, got %s", c.UpstreamTimeout)
	}
	if c.StoredResponseRetention < 0 {
		bad("stored_response_retention", "must be >= 0 (0: no limit), got %s", c.StoredResponseRetention)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"read_header_timeout", c.ReadHeaderTimeout}, {"read_timeout", c.ReadTimeout}, {"idle_timeout", c.IdleTimeout}} {
		if d.v <= 0 {
			bad(d.key, "must be > 0, got %s", d.v)
		}
	}
	if c.WriteTimeout < 0 {
		bad("write_timeout", "must be >= 0 (0: no limit), got %s", c.WriteTimeout)
	} else if c.WriteTimeout > 0 && c.WriteTimeout < time.Second {
		bad("write_timeout", "%s is too short (at least 1s, or 0 for no limit)", c.WriteTimeout)
	}
	if c.AdminToken != "" && len(c.AdminToken) < MinSecretLen {
		bad("admin_token", "%d bytes is too short (want at least %d)", len(c.AdminToken), MinSecretLen)
	}
}

// validateGateway: the trusted gateway that may set the parent header.
func (c *Config) validateGateway(bad complain) {
	g := &c.TrustedGateway
	for i, s := range g.CIDRs {
		if _, err := netip.ParsePrefix(strings.TrimSpace(s)); err != nil {
			bad(fmt.Sprintf("trusted_gateway.cidrs[%d]", i), "%q is not a CIDR (e.g. 10.0.0.0/8): %v", s, err)
		}
	}
	if g.Token != "" && g.TokenHeader == "" {
		bad("trusted_gateway.token_header", "required when trusted_gateway.token is set")
	}
	if g.Token != "" && len(g.Token) < MinSecretLen {
		bad("trusted_gateway.token", "%d bytes is too short (want at least %d)", len(g.Token), MinSecretLen)
	}
	if g.TokenHeader != "" && g.Token == "" {
		bad("trusted_gateway.token", "required when trusted_gateway.token_header is set")
	}
	if g.Enabled && len(g.CIDRs) == 0 && g.Token == "" {
		bad("trusted_gateway", "enabled without cidrs or a token: no request could carry the parent-session header")
	}
	if g.Enabled && c.ParentHeader == "" && !c.ClientSubagentHeaders && !c.FlowControl.Enabled {
		bad("trusted_gateway", "enabled but neither conversation_affinity_header_for_subagents, client_subagent_headers nor flow_control is set: there is no header to guard")
	}
}

// validateTelemetry: worker telemetry and the leader's duty rounds.
func (c *Config) validateTelemetry(bad complain) {
	t := c.Telemetry
	if t.StaleIntervals < 1 {
		bad("telemetry.stale_intervals", "must be >= 1, got %d", t.StaleIntervals)
	}
	if t.MinStaleAfter < 0 {
		bad("telemetry.min_stale_after", "must be >= 0, got %s", t.MinStaleAfter)
	}
	if t.DownAfter <= 0 {
		bad("telemetry.down_after", "must be > 0, got %s", t.DownAfter)
	}
	if t.ProbeInterval <= 0 {
		bad("telemetry.probe_interval", "must be > 0, got %s", t.ProbeInterval)
	}
	if t.DumpTimeout <= 0 {
		bad("telemetry.dump_timeout", "must be > 0, got %s", t.DumpTimeout)
	}
	if t.StartupGrace < 0 {
		bad("telemetry.startup_grace", "must be >= 0, got %s", t.StartupGrace)
	}
	if c.Leader.Interval <= 0 {
		bad("leader.interval", "must be > 0, got %s", c.Leader.Interval)
	}
	if c.Leader.SweepBatch < 1 || c.Leader.SweepBatch > 65536 {
		bad("leader.sweep_batch", "must be 1..65536, got %d", c.Leader.SweepBatch)
	}
}

// validateCluster: the Raft group this edge is a member of. The node's
// settings are the cluster package's to check (cluster.ValidateConfig, on
// the node configuration the edge opens); its problems are reported under
// the cluster section's keys.
func (c *Config) validateCluster(p *yamlconf.Problems) {
	cl := &c.Cluster
	key := c.ClusterAuthKey()
	for _, ce := range cluster.ConfigErrors(cluster.ValidateConfig(c.NodeConfig())) {
		if ce.Key == "auth_key" && key == "" {
			continue // said below, with where else the key may come from
		}
		p.Add("cluster."+ce.Key, "%s", ce.Msg)
	}
	if key == "" {
		p.Add("cluster.auth_key", "required (or internal_request_auth_key, or %s): it authenticates the edges to each other", EnvClusterAuthKey)
	}
	if cl.DegradedPlacementWindow < 0 {
		p.Add("cluster.degraded_placement_window", "must be >= 0 (0: 5 × the election timeout), got %s", cl.DegradedPlacementWindow)
	}
}

// nodeConfig is the cluster node's configuration as far as the file
// decides it (Start adds the listener, TLS, metrics and logger).
func (c *Config) NodeConfig() cluster.Config {
	return cluster.Config{Settings: c.Cluster.Settings, AuthKey: []byte(c.ClusterAuthKey())}
}

// validateNATS: the embedded server or the external one and its credentials.
func (c *Config) validateNATS(bad complain) {
	n := &c.NATS
	if n.Embedded && len(n.URLs) > 0 {
		bad("nats", "set either nats.embedded or nats.urls, not both")
	}
	for i, u := range n.URLs {
		pu, err := url.Parse(u)
		if err != nil || pu.Host == "" || (pu.Scheme != "nats" && pu.Scheme != "tls" && pu.Scheme != "ws" && pu.Scheme != "wss") {
			bad(fmt.Sprintf("nats.urls[%d]", i), "%q is not a nats://, tls://, ws:// or wss:// URL (e.g. nats://127.0.0.1:4222)", u)
		}
	}
	if n.Listen != "" {
		if _, _, err := net.SplitHostPort(n.Listen); err != nil {
			bad("nats.listen", "%q is not host:port: %v", n.Listen, err)
		}
	}
	if n.Password != "" && n.User == "" {
		bad("nats.user", "required when nats.password is set (or %s)", EnvNATSPassword)
	}
	if n.User != "" && n.Password == "" {
		bad("nats.password", "required when nats.user is set: set it or %s", EnvNATSPassword)
	}
	methods := 0
	for _, set := range []bool{n.User != "", n.Token != "", n.NKeySeedFile != "", n.CredsFile != ""} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		bad("nats", "choose one of user/password, token, nkey_seed_file or creds_file")
	}
	if n.Embedded && (n.NKeySeedFile != "" || n.CredsFile != "") {
		bad("nats", "the embedded server supports user/password or token only (not nkey_seed_file or creds_file)")
	}
	for _, f := range []struct{ key, path string }{{"nats.creds_file", n.CredsFile}, {"nats.nkey_seed_file", n.NKeySeedFile}} {
		if f.path != "" {
			if _, err := os.Stat(f.path); err != nil {
				bad(f.key, "%v", err)
			}
		}
	}
}

func (c *Config) validateTracing(bad complain) {
	switch c.Tracing.Exporter {
	case "", "none", "stdout":
		if c.Tracing.Endpoint != "" {
			bad("tracing.endpoint", "only used with tracing.exporter: otlp")
		}
	case "otlp":
		if c.Tracing.Endpoint == "" {
			bad("tracing.endpoint", "required with tracing.exporter: otlp (the collector's OTLP/HTTP URL, e.g. http://otel-collector:4318)")
		} else if _, err := OTLPTracesURL(c.Tracing.Endpoint); err != nil {
			bad("tracing.endpoint", "%v", err)
		}
	default:
		bad("tracing.exporter", "unknown exporter %q (allowed: none, stdout, otlp)", c.Tracing.Exporter)
	}
}

func checkWorkerURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %v", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an absolute http(s) URL", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q: a worker URL takes no query or fragment", s)
	}
	return nil
}

func validInstanceName(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// trusted reports whether a request from remote (host:port) carrying h may
// set the parent-session header.
func (g *TrustedGatewayConfig) Trusted(remote string, tokenValue string) bool {
	if !g.Enabled {
		return true
	}
	if g.Token != "" && tokenValue != "" && constantTimeEqual(tokenValue, g.Token) {
		return true
	}
	if len(g.prefixes) == 0 {
		return false
	}
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	ip = ip.Unmap()
	for _, p := range g.prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// metrics_access values.
const (
	MetricsPublic     = "public"
	MetricsAdminToken = "admin_token"
)

// inlineSystem is the model's anthropic_inline_system mode (validated).
func (c *Config) InlineSystem() apireq.InlineSystem {
	m, _ := apireq.ParseInlineSystem(c.AnthropicInlineSystem)
	return m
}

// Fleet tokenizers (context_servers.tokenizer, generation_servers.tokenizer).
const (
	// TokenizerWords is internal/prefix's whitespace tokenizer and chat
	// markers: what tether's simulated workers cut their blocks over.
	TokenizerWords = "words"
	// TokenizerHFPrefix names a directory with the model's tokenizer.json
	// (or tokenizer.json.gz) and tokenizer_config.json.
	TokenizerHFPrefix = "hf:"
)

// validateTokenizer checks a fleet's tokenizer and block_size keys; the
// files are read when the edge starts (loadFleetTokenizers).
func validateTokenizer(key string, s *ServersConfig, bad complain) {
	switch {
	case s.Tokenizer == TokenizerWords:
	case strings.HasPrefix(s.Tokenizer, TokenizerHFPrefix):
		if strings.TrimSpace(strings.TrimPrefix(s.Tokenizer, TokenizerHFPrefix)) == "" {
			bad(key+".tokenizer", "%q names no directory (want hf:<dir with tokenizer.json and tokenizer_config.json>)", s.Tokenizer)
		}
	default:
		bad(key+".tokenizer", "%q is not %q or %q<dir>", s.Tokenizer, TokenizerWords, TokenizerHFPrefix)
	}
	if s.BlockSize < 0 || s.BlockSize > 1<<20 {
		bad(key+".block_size", "must be 0 (placement.block_size) or 1..1048576 tokens, got %d", s.BlockSize)
	}
}

// DefaultKVShadowBlocks is the default kv_shadow_blocks: the size, in
// blocks per rank, of the shadow cache of a static engine that does not
// report its KV capacity (65,536 tokens at the default block size: a small
// GPU's cache, so the shadow errs toward forgetting, and corrections from
// cached_tokens do the rest).
const DefaultKVShadowBlocks = 4096

// otlpTracesURL checks an OTLP/HTTP endpoint and completes it: an http(s)
// URL; without a path, the standard /v1/traces.
func OTLPTracesURL(endpoint string) (*url.URL, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q is not an OTLP/HTTP URL (e.g. http://otel-collector:4318)", endpoint)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%q: an OTLP endpoint takes no query or fragment", endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u, nil
}

func constantTimeEqual(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}
