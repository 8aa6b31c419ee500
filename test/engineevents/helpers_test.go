package engineevents

import (
	"context"
	"log/slog"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/test/workertest"
	"github.com/tether-project/tether/worker"
)

// startProxyWorker starts a `tether worker` in proxy mode with two ranks
// whose KV cache events come from the engine publisher at endpoint (one
// endpoint for both ranks: each batch's data_parallel_rank picks the
// rank). Its upstreams are never called.
func startProxyWorker(t *testing.T, ns *natsserver.Server, id, endpoint, replay string) *worker.Server {
	t.Helper()
	cfg := worker.DefaultConfig()
	cfg.InstanceID, cfg.Model = id, "m"
	cfg.Ranks = 2
	cfg.ADP.EnableAttentionDP = true
	cfg.Engine.Type = "proxy"
	cfg.Engine.Upstreams = []string{"http://127.0.0.1:9/r0", "http://127.0.0.1:9/r1"}
	cfg.Engine.BlockSize = 4
	cfg.Engine.KVEvents.Format = enginekv.FormatVLLM
	cfg.Engine.KVEvents.Endpoints = []string{endpoint}
	if replay != "" {
		cfg.Engine.KVEvents.ReplayEndpoints = []string{replay}
	}
	return startWorker(t, ns, cfg)
}

// startWorker starts cfg as a worker reporting to ns (if any) every 20 ms;
// the test's cleanup closes it.
func startWorker(t *testing.T, ns *natsserver.Server, cfg worker.Config) *worker.Server {
	t.Helper()
	cfg.TelemetryInterval = 20 * time.Millisecond
	if ns != nil {
		cfg.NATS.URLs = []string{ns.ClientURL()}
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	return workertest.Start(t, worker.New, cfg)
}

// newFleet starts an edge's view of the workers (NATS subscriptions, KV
// index, dumps).
func newFleet(t *testing.T, ns *natsserver.Server) *fleetview.View {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f, err := fleetview.New(fleetview.Config{Conn: nc, Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// matchRank is how many leading blocks instance id holds, and on which rank.
func matchRank(f *fleetview.View, id string, blocks []uint64) (int, int) {
	for _, m := range f.Index().Match(blocks, time.Now(), nil) {
		if m.Instance == id {
			return m.Blocks, m.Rank
		}
	}
	return 0, -1
}

// waitNudging waits for cond, calling nudge on every tick: an engine's PUB
// socket drops what it sends before a subscriber's subscription arrives,
// and the next batch makes the subscriber replay what it missed.
func waitNudging(t *testing.T, what string, nudge func(), cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		nudge()
		time.Sleep(20 * time.Millisecond)
	}
}
