package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/worker"
	"github.com/tether-project/tether/worker/engine/sim"
	"github.com/tether-project/tether/worker/kvevents"
)

// EngineEventsVLLM is Options.EngineEvents for simulated engines speaking
// vLLM's KV event protocol behind proxy workers.
const EngineEventsVLLM = "vllm"

// proxyToEngines starts one simulated engine per ADP rank of worker id (a
// single-rank `tether worker` without NATS whose engine also publishes
// vLLM-format KV events on its own ZeroMQ ports, as vLLM's DP rank i does
// on port+i) and turns cfg into a proxy in front of them that consumes
// those events. The engines listen in plaintext on loopback.
func (s *Stack) proxyToEngines(ctx context.Context, id string, cfg *worker.Config) error {
	o := s.opts
	ranks := cfg.RankCount()
	blockSize := cfg.Engine.BlockSize
	var upstreams, endpoints, replays []string
	for r := range ranks {
		engID := fmt.Sprintf("%s-engine-%d", id, r)
		host := net.JoinHostPort(o.Host, "0")
		pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://" + host, ReplayEndpoint: "tcp://" + host})
		if err != nil {
			return fmt.Errorf("devstack: engine %s: %w", engID, err)
		}
		scfg := sim.DefaultConfig()
		scfg.Ranks, scfg.BlockSize, scfg.CapacityBlocks, scfg.TimeScale = 1, blockSize, cfg.Engine.CapacityBlocks, o.TimeScale
		if len(cfg.LoRA.Adapters) > 0 {
			scfg.MaxLoRAs, scfg.LoRALoadTime = cfg.LoRA.MaxLoRAs, cfg.LoRA.LoadTime
		}
		inner, err := sim.New(scfg)
		if err != nil {
			pub.Close()
			return fmt.Errorf("devstack: engine %s: %w", engID, err)
		}
		eng, err := kvevents.NewEngine(inner, blockSize, []*kvevents.Publisher{pub})
		if err != nil {
			inner.Close()
			pub.Close()
			return fmt.Errorf("devstack: engine %s: %w", engID, err)
		}
		ecfg := worker.DefaultConfig()
		ecfg.InstanceID, ecfg.Model, ecfg.LoRA = engID, cfg.Model, cfg.LoRA
		ecfg.ModelAliases, ecfg.MaxModelLen = cfg.ModelAliases, cfg.MaxModelLen
		ecfg.Hostname, ecfg.Port = o.Host, 0
		ecfg.Engine.BlockSize = blockSize
		ecfg.EngineOverride = eng // the worker closes it
		// The engines stand for vLLM servers: their own plaintext warnings
		// would drown the stack's; errors still show.
		ecfg.Logger, ecfg.Version = slog.New(minLevel{o.Logger.Handler(), slog.LevelError}), o.Version
		srv, err := worker.New(ecfg)
		if err != nil {
			eng.Close()
			return fmt.Errorf("devstack: engine %s: %w", engID, err)
		}
		if err := srv.Start(ctx); err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = srv.Close(cctx)
			cancel()
			return fmt.Errorf("devstack: engine %s: %w", engID, err)
		}
		s.engines = append(s.engines, srv)
		upstreams = append(upstreams, srv.URL())
		endpoints = append(endpoints, pub.Endpoint())
		replays = append(replays, pub.ReplayEndpoint())
	}
	cfg.Engine.Type = "proxy"
	cfg.Engine.Upstreams = upstreams
	// tether dev's disaggregated fleets through proxies: emulated (each
	// hop's simulated engine prefills on its own), named so. An aggregated
	// stack's proxies get whole requests only, as in front of an
	// aggregated vLLM server.
	cfg.Engine.EmulateDisaggregation = !o.Aggregated
	cfg.Engine.KVEvents.Format = enginekv.FormatVLLM
	cfg.Engine.KVEvents.Endpoints = endpoints
	cfg.Engine.KVEvents.ReplayEndpoints = replays
	return nil
}

// closeEngines stops the simulated engines behind proxy workers.
func (s *Stack) closeEngines(ctx context.Context) error {
	var errs []error
	for _, e := range s.engines {
		if err := e.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("devstack: engine: %w", err))
		}
	}
	s.engines = nil
	return errors.Join(errs...)
}

// minLevel drops records below level.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(attrs), h.level}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.level}
}
