package edge

import (
	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/config"
)

// The names the edge's embedders (cmd/tether, ops/devstack, the tests)
// use with New: the configuration's (edge/config) and the response
// headers' (edge/api).

// Config is an edge's configuration (config.Config).
type (
	Config                  = config.Config
	ServersConfig           = config.ServersConfig
	StaticInstance          = config.StaticInstance
	InstanceKVEvents        = config.InstanceKVEvents
	RouterConfig            = config.RouterConfig
	ConditionalDisaggConfig = config.ConditionalDisaggConfig
	TrustedGatewayConfig    = config.TrustedGatewayConfig
	PlacementConfig         = config.PlacementConfig
	TelemetryConfig         = config.TelemetryConfig
	LeaderConfig            = config.LeaderConfig
	ClusterConfig           = config.ClusterConfig
	NATSConfig              = config.NATSConfig
	NATSTLSConfig           = config.NATSTLSConfig
	NATSWorkerUser          = config.NATSWorkerUser
	TracingConfig           = config.TracingConfig
	TLSConfig               = config.TLSConfig
	AdmissionConfig         = config.AdmissionConfig
	ModelConfig             = config.ModelConfig
	LoRAConfig              = config.LoRAConfig
	AdapterConfig           = config.AdapterConfig
	EngineKind              = config.EngineKind
)

// Environment variables, secrets, engines and TLS modes (edge/config).
const (
	EnvInternalRequestAuthKey = config.EnvInternalRequestAuthKey
	EnvAdminToken             = config.EnvAdminToken
	EnvClusterAuthKey         = config.EnvClusterAuthKey
	EnvNATSPassword           = config.EnvNATSPassword
	EnvNATSToken              = config.EnvNATSToken
	MinSecretLen              = config.MinSecretLen
	DefaultPort               = config.DefaultPort
	EngineTether              = config.EngineTether
	EngineTRTLLM              = config.EngineTRTLLM
	EngineVLLM                = config.EngineVLLM
	EngineSGLang              = config.EngineSGLang
	TLSModeMutual             = config.TLSModeMutual
	TLSModePlaintext          = config.TLSModePlaintext
)

// DefaultConfig returns the defaults (config.DefaultConfig).
func DefaultConfig() Config { return config.DefaultConfig() }

// LoadConfig reads, parses, applies the environment to and validates the
// file at path (config.LoadConfig).
func LoadConfig(path string) (Config, error) { return config.LoadConfig(path) }

// ReadConfig is LoadConfig without the validation (config.ReadConfig).
func ReadConfig(path string) (Config, error) { return config.ReadConfig(path) }

// ParseConfig parses, applies the environment to and validates YAML
// (config.ParseConfig).
func ParseConfig(data []byte) (Config, error) { return config.ParseConfig(data) }

// DecodeConfig is ParseConfig without the validation (config.DecodeConfig).
func DecodeConfig(data []byte) (Config, error) { return config.DecodeConfig(data) }

// Response headers (edge/api).
const (
	HeaderRoute   = api.HeaderRoute
	HeaderADPRank = api.HeaderADPRank
)

// Route is an x-tether-route header read back (api.Route).
type Route = api.Route

// ParseRoute reads an x-tether-route header as the edge writes it
// (api.ParseRoute).
func ParseRoute(h string) (Route, error) { return api.ParseRoute(h) }
