package worker

import (
	"fmt"

	"github.com/tether-project/tether/worker/engine"
	"github.com/tether-project/tether/worker/engine/sim"
	"github.com/tether-project/tether/worker/proxy"
)

// buildEngine creates the configured engine with one rank per ADP rank.
func buildEngine(cfg Config, ranks int) (engine.Engine, error) {
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
		})
	}
	return nil, fmt.Errorf("engine.type: unknown value %q", e.Type)
}
