package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/kvshadow"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/enginekv"
)

// EngineKind is what serves a fleet (context_servers.engine,
// generation_servers.engine). docs/engines.md says what works with each.
type EngineKind string

const (
	// EngineTether: tether workers (the default): telemetry over NATS,
	// hint verification, ranks chosen by the worker's scheduler.
	EngineTether EngineKind = "tether"
	// EngineTRTLLM: trtllm-serve workers.
	EngineTRTLLM EngineKind = "trtllm"
	// EngineVLLM: `vllm serve`, aggregated: the context fleet takes whole
	// requests; load from its /metrics; ranks by X-Data-Parallel-Rank.
	EngineVLLM EngineKind = "vllm"
	// EngineSGLang: an SGLang server, aggregated like vLLM.
	EngineSGLang EngineKind = "sglang"
)

// maxDataParallelSize bounds data_parallel_size (vLLM and SGLang
// deployments run a few dozen ranks at most).
const maxDataParallelSize = 1024

// SGLangHealthTimeout is the default probe timeout of an SGLang fleet.
// SGLang's /health (http_server.py health_generate) sends a one-token
// generation, sleeps a second, and answers 200 once the scheduler has
// answered since (503 after SGLANG_HEALTH_CHECK_TIMEOUT, 20 s): it never
// answers in less than a second.
const SGLangHealthTimeout = 5 * time.Second

// maxHealthTimeout bounds health_timeout.
const maxHealthTimeout = 5 * time.Minute

// healthTimeout is the fleet's probe timeout: health_timeout, else the
// engine's default (SGLang's slow /health), else the probe interval.
func (s *ServersConfig) ProbeTimeout(probeInterval time.Duration) time.Duration {
	switch {
	case s.HealthTimeout > 0:
		return s.HealthTimeout
	case s.Engine.Kind() == EngineSGLang:
		return max(SGLangHealthTimeout, probeInterval)
	}
	return probeInterval
}

// Kind is the engine with the default applied.
func (k EngineKind) Kind() EngineKind {
	if k == "" {
		return EngineTether
	}
	return k
}

// aggregatedOnly: the engine serves whole requests only (no disaggregated
// protocol tether speaks with it).
func (k EngineKind) AggregatedOnly() bool {
	return k == EngineVLLM || k == EngineSGLang
}

// Aggregated reports whether requests are served whole by the context
// fleet (a vLLM or SGLang fleet without the prefill/decode split of
// edge/dispatch/pd.go, or tether workers with context_servers.aggregated):
// no context/generation split, the generation fleet is empty.
func (c *Config) Aggregated() bool {
	return c.ContextServers.Aggregated || (c.ContextServers.Engine.AggregatedOnly() && c.PDEngine() == "")
}

// EngineAggregated: an aggregated vLLM or SGLang fleet, which the edge
// relays to directly (no hints, the edge picks the rank, no Conversations
// API).
func (c *Config) EngineAggregated() bool {
	return c.Aggregated() && c.ContextServers.Engine.AggregatedOnly()
}

// AnswerFleet is the fleet whose instance answers a whole request (and
// holds its stored response or conversation): the generation fleet, or the
// context fleet when aggregated.
func (c *Config) AnswerFleet() fsm.Fleet {
	if c.Aggregated() {
		return fsm.FleetContext
	}
	return fsm.FleetGeneration
}

// servedFleets are the fleets requests go to: the context fleet alone when
// aggregated, else both.
func (c *Config) ServedFleets() []fsm.Fleet {
	if c.Aggregated() {
		return []fsm.Fleet{fsm.FleetContext}
	}
	return []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration}
}

// dataParallelSize is fleet f's configured rank count (1: none).
func (c *Config) DataParallelSize(f fsm.Fleet) int {
	return max(c.Servers(f).DataParallelSize, 1)
}

// validateEngine checks a fleet's engine keys.
func (c *Config) validateEngine(key string, s *ServersConfig, bad complain) {
	kind := s.Engine.Kind()
	switch kind {
	case EngineTether, EngineTRTLLM, EngineVLLM, EngineSGLang:
	default:
		bad(key+".engine", "unknown engine %q (want tether, trtllm, vllm or sglang)", string(s.Engine))
		return
	}
	if s.DataParallelSize < 0 || s.DataParallelSize > maxDataParallelSize {
		bad(key+".data_parallel_size", "must be 0..%d, got %d", maxDataParallelSize, s.DataParallelSize)
	}
	if s.HealthTimeout < 0 || s.HealthTimeout > maxHealthTimeout {
		bad(key+".health_timeout", "must be 0 (the engine's default) up to %s, got %s", maxHealthTimeout, s.HealthTimeout)
	}
	if s.KVShadowBlocks < 0 || s.KVShadowBlocks > kvshadow.MaxBlocksPerRank {
		bad(key+".kv_shadow_blocks", "must be 0..%d (0: no shadow cache), got %d", kvshadow.MaxBlocksPerRank, s.KVShadowBlocks)
	}
	validateEngineEvents(key, s, kind, bad)
	c.validatePDKeys(key, s, bad)
	if s.Aggregated {
		c.validateAggregated(key, s, kind, bad)
	}
	if s.DataParallelSize > 1 && !kind.AggregatedOnly() {
		bad(key+".data_parallel_size", "only for engine vllm or sglang (the edge picks their rank); %s workers place requests on ranks themselves", kind)
	}
	if !kind.AggregatedOnly() {
		return
	}
	if c.PDEngine() == kind {
		// A prefill/decode split: prefill servers in the context fleet,
		// decode servers in the generation fleet (edge/dispatch/pd.go).
		c.validatePD(key, s, kind, bad)
		return
	}
	if s == &c.GenerationServers {
		bad(key+".engine", "%s serves the generation fleet only as the decode servers of a prefill/decode split, with context_servers.engine: %s too; to serve it aggregated configure its servers under context_servers (docs/engines.md)", kind, kind)
		return
	}
	if len(s.URLs) == 0 {
		bad(key+".urls", "engine %s needs its servers' URLs (they do not register over NATS)", kind)
	}
	g := &c.GenerationServers
	if len(g.URLs) > 0 || g.NumInstances != 0 || (g.Engine != "" && g.Engine != s.Engine) {
		bad("generation_servers", "must be empty with context_servers.engine: %s (served aggregated: the context fleet takes whole requests); for prefill/decode disaggregation set generation_servers.engine: %s and its decode servers' urls", kind, kind)
	}
	if c.ConditionalDisagg.MaxLocalPrefillLength > 0 {
		bad("conditional_disagg_config", "does not apply to context_servers.engine: %s (served aggregated)", kind)
	}
}

// validateEngineEvents checks the fleet's engine KV event sources:
// kv_events of a URL (vLLM, SGLang: tcp://host:port or ipc://path, every
// rank's port in range) and kv_cache_events (trtllm).
func validateEngineEvents(key string, s *ServersConfig, kind EngineKind, bad complain) {
	if s.KVCacheEvents && kind != EngineTRTLLM {
		bad(key+".kv_cache_events", "only for engine trtllm (vLLM and SGLang publish on ZeroMQ: urls[].kv_events)")
	}
	for i, si := range s.URLs {
		ev := si.KVEvents
		if ev == nil {
			continue
		}
		k := fmt.Sprintf("%s.urls[%d].kv_events", key, i)
		if !kind.AggregatedOnly() {
			bad(k, "only for engine vllm or sglang (trtllm-serve: kv_cache_events; tether workers report their own)")
			continue
		}
		for _, f := range []struct{ name, ep string }{{"endpoint", ev.Endpoint}, {"replay_endpoint", ev.ReplayEndpoint}} {
			if f.ep == "" {
				if f.name == "endpoint" {
					bad(k+".endpoint", "required: the engine's PUB socket, tcp://host:port")
				}
				continue
			}
			if strings.Contains(f.ep, "*") {
				bad(k+"."+f.name, "%q binds on every interface; name the host the edge dials", f.ep)
				continue
			}
			for r := range max(s.DataParallelSize, 1) {
				if _, err := enginekv.OffsetEndpoint(f.ep, r); err != nil {
					bad(k+"."+f.name, "%v", err)
					break
				}
			}
		}
	}
}

// pdEngine is the engine whose prefill/decode split the edge drives: vllm
// or sglang when both fleets name it, else "".
func (c *Config) PDEngine() EngineKind {
	k := c.ContextServers.Engine.Kind()
	if k.AggregatedOnly() && c.GenerationServers.Engine.Kind() == k {
		return k
	}
	return ""
}

// validatePDKeys checks the keys only a prefill/decode split takes:
// bootstrap_port names an SGLang prefill server's bootstrap port.
func (c *Config) validatePDKeys(key string, s *ServersConfig, bad complain) {
	sglangPrefill := s == &c.ContextServers && c.PDEngine() == EngineSGLang
	for i, si := range s.URLs {
		k := fmt.Sprintf("%s.urls[%d].bootstrap_port", key, i)
		switch {
		case si.BootstrapPort == 0:
		case !sglangPrefill:
			bad(k, "only for the prefill servers of an SGLang prefill/decode split (context_servers and generation_servers both engine: sglang)")
		case si.BootstrapPort < 0 || si.BootstrapPort > 65535:
			bad(k, "must be a port, 1..65535 (0: SGLang's default, %d), got %d", disagg.DefaultSGLangBootstrapPort, si.BootstrapPort)
		}
	}
}

// validatePD checks a prefill/decode split of engine kind: both fleets
// list their servers and conditional disaggregation (a trtllm-serve
// feature) is off.
func (c *Config) validatePD(key string, s *ServersConfig, kind EngineKind, bad complain) {
	if len(s.URLs) == 0 {
		what := "prefill"
		if s == &c.GenerationServers {
			what = "decode"
		}
		bad(key+".urls", "a %s prefill/decode split needs its %s servers' URLs (they do not register over NATS)", kind, what)
	}
	if s == &c.ContextServers && c.ConditionalDisagg.MaxLocalPrefillLength > 0 {
		bad("conditional_disagg_config", "does not apply to a %s prefill/decode split (every request is prefilled on the context fleet)", kind)
	}
}

// validateAggregated checks a fleet's aggregated key: tether workers of
// the context fleet, the generation fleet empty (vLLM and SGLang fleets are
// checked above).
func (c *Config) validateAggregated(key string, s *ServersConfig, kind EngineKind, bad complain) {
	g := &c.GenerationServers
	switch {
	case s != &c.ContextServers:
		bad(key+".aggregated", "only context_servers serves whole requests")
	case kind == EngineTRTLLM || c.PDEngine() != "":
		bad(key+".aggregated", "a %s fleet with generation_servers is served disaggregated; remove the key", kind)
	case kind == EngineTether && (len(g.URLs) > 0 || g.NumInstances != 0 || g.Engine.Kind() != EngineTether):
		bad("generation_servers", "must be empty with context_servers.aggregated (the context fleet's workers serve whole requests)")
	case c.ConditionalDisagg.MaxLocalPrefillLength > 0:
		bad("conditional_disagg_config", "does not apply to context_servers.aggregated (no context hop to skip)")
	}
}
