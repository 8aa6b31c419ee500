package worker

import (
	"fmt"
	"log/slog"

	"github.com/tether-project/tether/internal/enginekv"
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
		eng, err := sim.New(sim.Config{
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
			MaxLoRAs:               cfg.LoRA.maxLoRAs(),
			LoRALoadTime:           cfg.LoRA.LoadTime,
		})
		if err != nil || (e.PublishKVEvents.Endpoint == "" && !e.PublishKVEvents.ServeTRTLLM) {
			return eng, err
		}
		return publishingEngine(eng, e, ranks)
	case "proxy":
		return proxy.New(proxy.Config{
			Upstreams:   e.Upstreams,
			MetricsURLs: e.UpstreamMetrics,
			Timeout:     e.UpstreamTimeout,
			BlockSize:   e.BlockSize,
			KVEvents:    kvEventSource(e, ranks, log),
			// Named so a deployment that prefills twice says so.
			EmulateDisaggregation: e.EmulateDisaggregation,
		})
	}
	return nil, fmt.Errorf("engine.type: unknown value %q", e.Type)
}

// kvEventSource is the proxy's engine.kv_events source, logging as the
// worker does.
func kvEventSource(e EngineConfig, ranks int, log *slog.Logger) *enginekv.Config {
	k := e.kvEventSource(ranks)
	if k != nil {
		k.Log = log.With("component", "kv_events")
	}
	return k
}

// publishingEngine wraps the simulated engine so that rank r also publishes
// vLLM-format KV events on the configured endpoints' port + r.
func publishingEngine(eng *sim.Engine, e EngineConfig, ranks int) (engine.Engine, error) {
	p := e.PublishKVEvents
	layout := kvevents.LayoutMap
	if p.Layout == "array" {
		layout = kvevents.LayoutArray
	}
	var pubs []*kvevents.Publisher
	fail := func(err error) (engine.Engine, error) {
		for _, pub := range pubs {
			pub.Close()
		}
		eng.Close()
		return nil, fmt.Errorf("engine.publish_kv_events: %w", err)
	}
	for r := range ranks {
		if p.Endpoint == "" {
			break // trtllm only
		}
		ep, err := enginekv.OffsetEndpoint(p.Endpoint, r)
		if err != nil {
			return fail(err)
		}
		rep := ""
		if p.ReplayEndpoint != "" {
			if rep, err = enginekv.OffsetEndpoint(p.ReplayEndpoint, r); err != nil {
				return fail(err)
			}
		}
		pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: ep, ReplayEndpoint: rep, Layout: layout})
		if err != nil {
			return fail(err)
		}
		pubs = append(pubs, pub)
	}
	w, err := kvevents.NewEngine(eng, e.BlockSize, pubs)
	if err != nil {
		return fail(err)
	}
	if p.ServeTRTLLM {
		w.ServeTRTLLM(0)
	}
	return w, nil
}
