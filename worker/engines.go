package worker

import (
	"fmt"
	"log/slog"

	"github.com/tether-project/tether/worker/engine"
	"github.com/tether-project/tether/worker/engine/sim"
	"github.com/tether-project/tether/worker/kvevents"
	"github.com/tether-project/tether/worker/proxy"
)

// buildEngine creates the configured engine with one rank per ADP rank.
func buildEngine(cfg Config, ranks int, log *slog.Logger) (engine.Engine, error) {
	if cfg.EngineOverride != nil {
		return cfg.EngineOverride, nil
	}
	e := cfg.Engine
	switch e.Type {
	case "sim":
		return sim.New(sim.Config{
			Ranks:                  ranks,
			CapacityBlocks:         e.CapacityBlocks,
			BlockSize:              e.BlockSize,
			PrefillTokensPerSec:    e.PrefillTokensPerSecond,
			PrefillOverhead:        e.PrefillOverhead,
			DecodeTokenTime:        e.DecodeTokenTime,
			DecodeSlowdown:         e.DecodeSlowdown,
			KVTransferTokensPerSec: e.TransferTokensPerSecond,
			StatsWindow:            e.StatsWindow,
			TimeScale:              e.TimeScale,
		})
	case "proxy":
		return proxy.New(proxy.Config{
			Upstreams:   e.Upstreams,
			MetricsURLs: e.UpstreamMetrics,
			Timeout:     e.UpstreamTimeout,
			BlockSize:   e.BlockSize,
			KVEvents:    kvEventSource(e, ranks, log),
		})
	}
	return nil, fmt.Errorf("engine.type: unknown value %q", e.Type)
}

// kvEventSource is the proxy's engine.kv_events source, logging as the
// worker does.
func kvEventSource(e EngineConfig, ranks int, log *slog.Logger) *kvevents.Config {
	k := e.kvEventSource(ranks)
	if k != nil {
		k.Log = log.With("component", "kv_events")
	}
	return k
}
