// Package engineevents reads the engines' own KV cache events into an
// edge's KV index, for engines that publish them but are not tether
// workers: the ZeroMQ publishers of static vLLM and SGLang instances
// (urls[].kv_events, rank r on the endpoint's port + r), each change an
// exact batch of the instance; and, while the edge leads, the drain of each
// trtllm-serve's /kv_cache_events (kv_cache_events: the endpoint hands each
// event out once), shared with every edge over NATS as KV batches of the
// instance, with its dump requests answered from what was mapped. Events
// that do not decode are skipped and counted.
package engineevents

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing/kvindex"
)

// Reader reads the engines' own KV events into the edge's fleet view: the
// sources of static vLLM and SGLang instances (internal/enginekv, the
// mapping the worker's proxy uses too), and, while the edge leads, the
// drains of trtllm-serve's /kv_cache_events shared over NATS.
type Reader struct {
	edge Edge
	cfg  Config
	log  *slog.Logger

	mu      sync.Mutex
	sources []*enginekv.Source
}

// Edge is what the reader uses of the edge (from its Start on).
type Edge interface {
	// Node is the edge's cluster node (the drains run while it leads).
	Node() *cluster.Node
	// Fleet is the edge's view of the workers, whose KV index the events
	// feed.
	Fleet() *fleetview.View
	// NATS is the edge's connection (nil: the drains' blocks reach this
	// edge's index alone).
	NATS() *nats.Conn
}

// Config is what the reader takes from the edge's configuration.
type Config struct {
	// Models are each model's configuration, the first first.
	Models []*config.Config
	// LeaderInterval is leader.interval: how often the drains check
	// leadership.
	LeaderInterval time.Duration
	Metrics        *observe.Metrics
	Logger         *slog.Logger
}

// New is the reader of edge's engines' KV events; Start subscribes.
func New(edge Edge, cfg Config) *Reader {
	return &Reader{edge: edge, cfg: cfg, log: cfg.Logger}
}

// Start subscribes to the KV event publishers of the static
// vLLM and SGLang instances that name one (urls[].kv_events): rank r of an
// instance with data_parallel_size N on the endpoint's port + r, as the
// engines offset it. Each change becomes an exact batch of the instance in
// this edge's KV index.
func (e *Reader) Start() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.cfg.Models {
		for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
			if err := e.startFleetEngineEvents(m, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// startFleetEngineEvents subscribes to the publishers of one model's fleet
// (e.mu held).
func (e *Reader) startFleetEngineEvents(mc *config.Config, f fsm.Fleet) error {
	sc := mc.Servers(f)
	kind := sc.Engine.Kind()
	size := mc.DataParallelSize(f)
	for _, si := range sc.URLs {
		ev := si.KVEvents
		if ev == nil || !kind.AggregatedOnly() {
			continue
		}
		cfg := enginekv.Config{Format: string(kind), Topic: ev.Topic, Ranks: size,
			BlockSize: mc.RoutingConfig(f).BlockSize, Log: e.log.With("instance", si.ID()), Undecodable: e.countUndecodable(si.ID())}
		for r := range size {
			ep, err := enginekv.OffsetEndpoint(ev.Endpoint, r)
			if err != nil {
				return fmt.Errorf("%s kv_events: %w", si.ID(), err)
			}
			cfg.Endpoints = append(cfg.Endpoints, ep)
			if ev.ReplayEndpoint != "" {
				rep, err := enginekv.OffsetEndpoint(ev.ReplayEndpoint, r)
				if err != nil {
					return fmt.Errorf("%s kv_events: %w", si.ID(), err)
				}
				cfg.ReplayEndpoints = append(cfg.ReplayEndpoints, rep)
			}
		}
		id := si.ID()
		src, err := enginekv.Start(cfg, func(k enginekv.RankKeys) {
			e.edge.Fleet().ApplyEngineKV(id, engineRankEvents(k)...)
		})
		if err != nil {
			return fmt.Errorf("%s kv_events: %w", id, err)
		}
		e.sources = append(e.sources, src)
		e.log.Info("reading the engine's KV events", "instance", id, "endpoints", cfg.Endpoints)
	}
	return nil
}

// countUndecodable counts the engine KV events of instance id that did
// not decode (tether_edge_kv_events_undecodable_total).
func (e *Reader) countUndecodable(id string) func(string) {
	return func(reason string) {
		if e.cfg.Metrics != nil {
			e.cfg.Metrics.KVUndecodable.WithLabelValues(id, reason).Inc()
		}
	}
}

// engineRankEvents is one engine change as KV index events: the rank's GPU
// tier, then its offloaded tier (kvindex RankEvent.Offloaded), when either
// changed.
func engineRankEvents(k enginekv.RankKeys) []kvindex.RankEvent {
	evs := make([]kvindex.RankEvent, 0, 2)
	if len(k.Stored)+len(k.Removed) > 0 {
		evs = append(evs, kvindex.RankEvent{Rank: k.Rank, Stored: k.Stored, Removed: k.Removed})
	}
	if len(k.OffloadedStored)+len(k.OffloadedRemoved) > 0 {
		evs = append(evs, kvindex.RankEvent{Rank: k.Rank, Stored: k.OffloadedStored, Removed: k.OffloadedRemoved, Offloaded: true})
	}
	return evs
}

// Close closes every source.
func (e *Reader) Close() {
	e.mu.Lock()
	srcs := e.sources
	e.sources = nil
	e.mu.Unlock()
	for _, s := range srcs {
		s.Close()
	}
}

// trtllmRanks bounds the attention-DP ranks of a trtllm-serve whose
// /kv_cache_events the edge drains (attention_dp_rank picks the rank; the
// edge does not choose trtllm ranks, so the count only sizes the mappers).
const trtllmRanks = 64

// trtDrain is the leader's drain of one trtllm-serve's /kv_cache_events.
// The endpoint hands each event out once, so one edge drains; it shares the
// blocks over NATS as KV batches of the instance (internal/telemetry), and
// answers the instance's dump requests from what it mapped, so every edge's
// KV index follows (fleetview, Static.SharedEvents). Without NATS only the
// draining edge's index learns them.
type trtDrain struct {
	e    *Reader
	id   string
	src  *enginekv.Source
	sub  *nats.Subscription
	boot uint64

	mu  sync.Mutex
	seq uint64
}

// RunDrains starts the drains of trtllm-serve's KV cache events while this
// edge is the leader and stops them when it is not (a new leader starts
// over with a new boot: the edges take its first batch as the baseline),
// until ctx is done.
func (e *Reader) RunDrains(ctx context.Context) {
	type target struct {
		id, url string
		f       fsm.Fleet
	}
	var targets []target
	for _, m := range e.cfg.Models {
		for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
			sc := m.Servers(f)
			if !sc.KVCacheEvents || sc.Engine.Kind() != config.EngineTRTLLM {
				continue
			}
			for _, si := range sc.URLs {
				targets = append(targets, target{si.ID(), strings.TrimRight(si.URL, "/"), f})
			}
		}
	}
	if len(targets) == 0 {
		return
	}
	var drains []*trtDrain
	stop := func() {
		for _, d := range drains {
			d.close()
		}
		drains = nil
	}
	defer stop()
	t := time.NewTicker(e.cfg.LeaderInterval)
	defer t.Stop()
	for {
		leader := e.edge.Node().IsLeader()
		switch {
		case leader && drains == nil:
			for _, tg := range targets {
				d, err := e.startTRTDrain(tg.id, tg.url, tg.f)
				if err != nil {
					e.log.Warn("cannot drain the trtllm-serve KV cache events", "instance", tg.id, "err", err)
					continue
				}
				drains = append(drains, d)
			}
		case !leader && drains != nil:
			stop()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (e *Reader) startTRTDrain(id, url string, f fsm.Fleet) (*trtDrain, error) {
	d := &trtDrain{e: e, id: id, boot: rand.Uint64() | 1}
	cfg := enginekv.Config{Format: enginekv.FormatTRTLLM, URLs: []string{url}, Ranks: trtllmRanks,
		BlockSize: e.cfg.Models[0].RoutingConfig(f).BlockSize, Log: e.log.With("instance", id), Undecodable: e.countUndecodable(id)}
	if nc := e.edge.NATS(); nc != nil {
		sub, err := nc.Subscribe(telemetry.KVDumpSubject(id), d.answerDump)
		if err != nil {
			return nil, err
		}
		d.sub = sub
	}
	src, err := enginekv.Start(cfg, d.publish)
	if err != nil {
		if d.sub != nil {
			_ = d.sub.Unsubscribe()
		}
		return nil, err
	}
	d.src = src
	e.log.Info("draining the trtllm-serve KV cache events (leader)", "instance", id, "url", url)
	return d, nil
}

// publish shares one change: a KV batch of the instance over NATS (every
// edge applies it, this one included), else this edge's index alone.
func (d *trtDrain) publish(k enginekv.RankKeys) {
	if len(k.Stored)+len(k.Removed) == 0 {
		return // the KV batches edges share carry the GPU tier only
	}
	if d.e.edge.NATS() == nil {
		d.e.edge.Fleet().ApplyEngineKV(d.id, kvindex.RankEvent{Rank: k.Rank, Stored: k.Stored, Removed: k.Removed})
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	data, err := telemetry.AppendKVEvents(nil, telemetry.KVEventBatch{Instance: d.id, BootID: d.boot, Seq: d.seq,
		Events: []telemetry.KVEvent{{Rank: k.Rank, Removed: k.Removed, Stored: k.Stored}}})
	if err == nil {
		err = d.e.edge.NATS().Publish(telemetry.KVSubject(d.id), data)
	}
	if err != nil {
		d.e.log.Warn("sharing trtllm-serve KV events failed (the edges resync by dump)", "instance", d.id, "err", err)
	}
}

// answerDump replies to an edge's dump request with every block mapped so
// far, as of the last batch shared.
func (d *trtDrain) answerDump(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	d.mu.Lock()
	dump := telemetry.KVDump{Instance: d.id, BootID: d.boot, Seq: d.seq}
	for r, ks := range d.src.Keys() {
		slices.Sort(ks)
		dump.Ranks = append(dump.Ranks, telemetry.RankBlocks{Rank: r, Blocks: ks})
	}
	d.mu.Unlock()
	slices.SortFunc(dump.Ranks, func(a, b telemetry.RankBlocks) int { return a.Rank - b.Rank })
	limit := int64(1 << 20)
	if mp := d.e.edge.NATS().MaxPayload(); mp > 0 {
		limit = mp
	}
	for _, part := range telemetry.SplitKVDump(dump, int(max((limit-4096)/12, 1))) {
		data, err := telemetry.EncodeKVDump(part)
		if err == nil {
			err = d.e.edge.NATS().Publish(m.Reply, data)
		}
		if err != nil {
			d.e.log.Warn("answering a KV dump request failed", "instance", d.id, "err", err)
			return
		}
	}
}

func (d *trtDrain) close() {
	if d.sub != nil {
		_ = d.sub.Unsubscribe()
	}
	d.src.Close()
}
