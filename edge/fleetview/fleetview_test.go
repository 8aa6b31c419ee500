package fleetview

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/routing/breaker"
	"github.com/tether-project/tether/test/metricstest"
	"github.com/tether-project/tether/test/natstest"
	"github.com/tether-project/tether/test/waitfor"
	"github.com/tether-project/tether/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	waitfor.True(t, timeout, what, cond)
}

// clock is a settable test clock.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func newFleet(t testing.TB, cfg Config) (*View, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f, reg
}

func metric(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	return metricstest.Sum(t, reg, name, labels)
}

func report(id string, fleet telemetry.Fleet, boot, seq, kvSeq uint64) telemetry.LoadReport {
	return telemetry.LoadReport{
		Instance: id, Fleet: fleet, URL: "http://" + id + ".test:8000", Model: "m", Version: "v", FeatureLevel: 1,
		VerifiesHints: true, BootID: boot, Seq: seq, KVSeq: kvSeq, SentUnixMilli: 1, IntervalMilli: 100, BlockSize: 4,
		Ranks: []telemetry.RankLoad{{Rank: 0, QueuedRequests: 2, ActiveRequests: 1, ActivePromptTokens: 100, KVBlocksUsed: 3, KVBlocksTotal: 10,
			WindowLookupTokens: 100, WindowHitTokens: 80}, {Rank: 1}},
	}
}

func publishLoad(t testing.TB, nc *nats.Conn, r telemetry.LoadReport) {
	t.Helper()
	b, err := telemetry.EncodeLoad(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(telemetry.LoadSubject(r.Fleet, r.Instance), b); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func publishKV(t testing.TB, nc *nats.Conn, id string, boot, seq uint64, rank int, stored ...uint64) {
	t.Helper()
	b, err := telemetry.AppendKVEvents(nil, telemetry.KVEventBatch{Instance: id, BootID: boot, Seq: seq, Events: []telemetry.KVEvent{{Rank: rank, Stored: stored}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(telemetry.KVSubject(id), b); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func matched(f *View, id string, blocks []uint64) int {
	for _, m := range f.Index().Match(blocks, time.Now(), nil) {
		if m.Instance == id {
			return m.Blocks
		}
	}
	return 0
}

// Malformed telemetry, and payloads naming another instance than their
// subject, are dropped and counted; the view carries on.
func TestMalformedMessagesAreDroppedAndCounted(t *testing.T) {
	ns := natstest.Start(t, nil)
	nc := connect(t, ns.ClientURL())
	f, reg := newFleet(t, Config{Conn: connect(t, ns.ClientURL())})

	good, _ := telemetry.EncodeLoad(report("w1", telemetry.FleetContext, 7, 1, 0))
	spoofKV, _ := telemetry.AppendKVEvents(nil, telemetry.KVEventBatch{Instance: "w2", BootID: 1, Seq: 1, Events: []telemetry.KVEvent{{Rank: 0, Stored: []uint64{9}}}})
	for _, m := range []struct{ subject, data string }{
		{"tether.v1.load.context.w1", "{not json"},
		{"tether.v1.load.context.w1", `{"v":2,"instance":"w1"}`},
		{"tether.v1.load.context.w9", string(good)},    // payload says w1
		{"tether.v1.load.generation.w1", string(good)}, // payload says context
		{"tether.v1.kv.w1", "garbage"},
		{"tether.v1.kv.w1", string(spoofKV)}, // payload says w2
		{"tether.v1.evict.w1", `{"v":1,"instance":"w1","boot_id":0,"seq":1,"evictions":[]}`},
	} {
		if err := nc.Publish(m.subject, []byte(m.data)); err != nil {
			t.Fatal(err)
		}
	}
	publishLoad(t, nc, report("w1", telemetry.FleetContext, 7, 1, 0))
	waitFor(t, "the good report", 5*time.Second, func() bool {
		_, ok := f.Instance("w1", time.Now())
		return ok
	})
	waitFor(t, "7 drops counted", 5*time.Second, func() bool {
		return metric(t, reg, "tether_edge_telemetry_dropped_total", nil) == 7
	})
	if n := metric(t, reg, "tether_edge_telemetry_dropped_total", map[string]string{"reason": "subject_mismatch"}); n != 3 {
		t.Fatalf("subject mismatches %v, want 3", n)
	}
	if _, ok := f.Instance("w9", time.Now()); ok {
		t.Fatal("a spoofed report registered an instance")
	}
	if matched(f, "w2", []uint64{9}) != 0 {
		t.Fatal("a spoofed KV batch reached the index")
	}
	in, _ := f.Instance("w1", time.Now())
	if !in.Healthy || in.QueuedRequests != 2 || in.ActivePromptTokens != 100 || in.Ranks != 2 || in.HitRate() != 0.8 {
		t.Fatalf("instance %+v", in)
	}
}

// dumpResponder answers KV dump requests for one instance from a fixed
// cache content, in parts of at most two hashes.
func dumpResponder(t testing.TB, nc *nats.Conn, id string, content func() telemetry.KVDump) *atomic.Int32 {
	var asked atomic.Int32
	sub, err := nc.Subscribe(telemetry.KVDumpSubject(id), func(m *nats.Msg) {
		asked.Add(1)
		for _, part := range telemetry.SplitKVDump(content(), 2) {
			b, err := telemetry.EncodeKVDump(part)
			if err != nil {
				t.Error(err)
				return
			}
			_ = nc.Publish(m.Reply, b)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &asked
}

// A sequence gap makes the view ask the worker for a full dump (in parts)
// and rebuild its index from it; batches after the dump apply on top.
func TestGapTriggersDumpAndRebuild(t *testing.T) {
	ns := natstest.Start(t, nil)
	nc := connect(t, ns.ClientURL())
	var mu sync.Mutex
	content := telemetry.KVDump{Instance: "w1", BootID: 5, Seq: 3, Ranks: []telemetry.RankBlocks{{Rank: 0, Blocks: []uint64{11, 12, 13}}, {Rank: 1, Blocks: []uint64{21}}}}
	asked := dumpResponder(t, nc, "w1", func() telemetry.KVDump { mu.Lock(); defer mu.Unlock(); return content })
	f, reg := newFleet(t, Config{Conn: connect(t, ns.ClientURL())})

	publishLoad(t, nc, report("w1", telemetry.FleetContext, 5, 1, 0))
	waitFor(t, "registration", 5*time.Second, func() bool { _, ok := f.Instance("w1", time.Now()); return ok })
	publishKV(t, nc, "w1", 5, 1, 0, 11, 12)
	waitFor(t, "batch 1 applied", 5*time.Second, func() bool { return matched(f, "w1", []uint64{11, 12}) == 2 })
	if asked.Load() != 0 {
		t.Fatal("a dump was requested without a gap")
	}
	publishKV(t, nc, "w1", 5, 3, 0, 13) // seq 2 lost
	waitFor(t, "the dump installed", 5*time.Second, func() bool { return matched(f, "w1", []uint64{11, 12, 13}) == 3 })
	if asked.Load() != 1 {
		t.Fatalf("dumps requested %d", asked.Load())
	}
	if matched(f, "w1", []uint64{21}) != 1 {
		t.Fatal("rank 1's blocks from the dump's second part are missing")
	}
	publishKV(t, nc, "w1", 5, 4, 0, 14)
	waitFor(t, "batch 4 applied on the dump", 5*time.Second, func() bool { return matched(f, "w1", []uint64{11, 12, 13, 14}) == 4 })
	if n := metric(t, reg, "tether_edge_kv_dumps_total", map[string]string{"result": "installed"}); n != 1 {
		t.Fatalf("installed dumps %v", n)
	}
}

// A view that starts while workers are mid-stream rebuilds its index from
// dumps at once (a real worker: its own dump handler and codecs).
func TestFreshViewRebuildsFromRealWorker(t *testing.T) {
	ns := natstest.Start(t, nil)
	w := startRealWorker(t, "w-real", ns.ClientURL(), func(cfg *worker.Config) {
		cfg.Ranks = 2
		cfg.ADP.EnableAttentionDP = true
	})
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	text := strings.Repeat("alpha beta gamma delta ", 20)
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": text, "max_tokens": 1})
	resp, err := (&http.Client{Transport: tr}).Post(w.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	blocks := prefix.BlockHashes(prefix.Tokenize(text), 4)

	first, _ := newFleet(t, Config{Conn: connect(t, ns.ClientURL())})
	waitFor(t, "the first view to index the prompt", 5*time.Second, func() bool { return matched(first, "w-real", blocks) == len(blocks) })
	// A second view joins late: the worker's batches so far are history.
	late, reg := newFleet(t, Config{Conn: connect(t, ns.ClientURL())})
	waitFor(t, "the late view to rebuild from a dump", 5*time.Second, func() bool { return matched(late, "w-real", blocks) == len(blocks) })
	if n := metric(t, reg, "tether_edge_kv_dumps_total", map[string]string{"result": "installed"}); n < 1 {
		t.Fatalf("the late view installed %v dumps", n)
	}
}

// Health comes from heartbeat age: stale after stale_intervals intervals
// (and at least min_stale_after); a draining report marks the instance
// draining; dispatches count as queued until the next report.
// The prefill a worker reports still to compute reaches routing summed
// over its ranks, from telemetry feature level 2; an older worker's zero
// means "not reported", so routing estimates the backlog itself.
func TestPrefillReportedFromFeatureLevel2(t *testing.T) {
	f, _, nc, clk := clockedFleet(t)
	old := report("w1", telemetry.FleetContext, 1, 1, 0)
	cur := report("w2", telemetry.FleetContext, 1, 1, 0)
	cur.FeatureLevel = telemetry.FeatureLevelPrefill
	cur.Ranks[0].PrefillTokens, cur.Ranks[1].PrefillTokens = 300_000, 20_000
	publishLoad(t, nc, old)
	publishLoad(t, nc, cur)
	waitFor(t, "both registrations", 5*time.Second, func() bool { return len(f.Views(clk.now(), nil)) == 2 })
	if v := viewOf(t, f, "w1", clk.now()); v.PrefillReported || v.PrefillTokens != 0 {
		t.Fatalf("feature level 1: %+v, want no prefill reported", v)
	}
	if v := viewOf(t, f, "w2", clk.now()); !v.PrefillReported || v.PrefillTokens != 320_000 {
		t.Fatalf("feature level 2: %+v, want 320,000 prefill tokens reported", v)
	}
	if in, _ := f.Instance("w2", clk.now()); !in.PrefillReported || in.PrefillTokens != 320_000 {
		t.Fatalf("instance snapshot: %+v", in)
	}
}

func TestHealthFromHeartbeatAge(t *testing.T) {
	f, reg, nc, clk := clockedFleet(t)
	publishLoad(t, nc, report("w1", telemetry.FleetGeneration, 1, 1, 0))
	waitFor(t, "registration", 5*time.Second, func() bool { _, ok := f.Instance("w1", clk.now()); return ok })
	views := f.Views(clk.now(), nil)
	if len(views) != 1 || !views[0].Healthy || views[0].Fleet != fsm.FleetGeneration || views[0].QueuedRequests != 2 {
		t.Fatalf("views %+v", views)
	}
	done := f.NoteDispatch("w1", 500)
	if v := f.Views(clk.now(), nil)[0]; v.QueuedRequests != 3 || v.QueuedPrefillTokens != 500 {
		t.Fatalf("after a dispatch: queued %d, prefill %d", v.QueuedRequests, v.QueuedPrefillTokens)
	}
	// A hop that ends before the next report stops counting at once.
	done()
	done()
	if v := f.Views(clk.now(), nil)[0]; v.QueuedRequests != 2 || v.QueuedPrefillTokens != 0 {
		t.Fatalf("after the hop ended: queued %d, prefill %d; want the report's 2 and 0", v.QueuedRequests, v.QueuedPrefillTokens)
	}
	f.NoteDispatch("w1", 500)           // still pending when the next report arrives
	clk.advance(250 * time.Millisecond) // < 3 × 100 ms
	if !f.Views(clk.now(), nil)[0].Healthy {
		t.Fatal("unhealthy within 3 intervals")
	}
	if age := metric(t, reg, "tether_edge_telemetry_age_seconds", map[string]string{"instance": "w1"}); age < 0.24 || age > 0.26 {
		t.Fatalf("telemetry age %v, want 0.25", age)
	}
	clk.advance(100 * time.Millisecond)
	// Another instance reports meanwhile: w1's silence is its own.
	publishLoad(t, nc, report("w2", telemetry.FleetGeneration, 1, 1, 0))
	waitFor(t, "w2's registration", 5*time.Second, func() bool { _, ok := f.Instance("w2", clk.now()); return ok })
	if viewOf(t, f, "w1", clk.now()).Healthy {
		t.Fatal("healthy after 3 missed intervals")
	}
	r := report("w1", telemetry.FleetGeneration, 1, 2, 0)
	r.Draining = true
	publishLoad(t, nc, r)
	waitFor(t, "the draining report", 5*time.Second, func() bool { v := viewOf(t, f, "w1", clk.now()); return v.Healthy && v.Draining })
	if v := viewOf(t, f, "w1", clk.now()); v.QueuedRequests != 2 || v.QueuedPrefillTokens != 0 {
		t.Fatalf("the report did not absorb the dispatch: %+v", v)
	}
}

// clockedFleet is a view on a fake clock (an hour past zero), stale after 3
// intervals and at least 200 ms, with a publisher's NATS connection.
func clockedFleet(t *testing.T) (*View, *prometheus.Registry, *nats.Conn, *clock) {
	t.Helper()
	ns := natstest.Start(t, nil)
	clk := &clock{}
	clk.advance(time.Hour)
	f, reg := newFleet(t, Config{Conn: connect(t, ns.ClientURL()), StaleIntervals: 3, MinStaleAfter: 200 * time.Millisecond, Now: clk.now})
	return f, reg, connect(t, ns.ClientURL()), clk
}

// viewOf is instance id's routing view at now.
func viewOf(t *testing.T, f *View, id string, now time.Time) routing.InstanceView {
	t.Helper()
	for _, v := range f.Views(now, nil) {
		if v.ID == id {
			return v
		}
	}
	t.Fatalf("no view of %s", id)
	return routing.InstanceView{}
}

// A silence every instance shares is the edge's own (its process or its
// subscription stalled): the instances keep the health they had when the
// edge last heard anyone. Once the edge hears one of them again, the
// others are late by that report; a failed probe since an instance's last
// report ends the benefit of the doubt.
func TestSharedSilenceKeepsHealth(t *testing.T) {
	f, _, nc, clk := clockedFleet(t)
	publishLoad(t, nc, report("w1", telemetry.FleetContext, 1, 1, 0))
	publishLoad(t, nc, report("w2", telemetry.FleetGeneration, 1, 1, 0))
	waitFor(t, "registration", 5*time.Second, func() bool {
		_, ok1 := f.Instance("w1", clk.now())
		_, ok2 := f.Instance("w2", clk.now())
		return ok1 && ok2
	})
	clk.advance(5 * time.Second) // the edge heard nobody: far past the 300 ms window
	for _, id := range []string{"w1", "w2"} {
		if v := viewOf(t, f, id, clk.now()); !v.Healthy || v.Silent {
			t.Fatalf("%s after a silence every instance shares: healthy %v, silent %v", id, v.Healthy, v.Silent)
		}
		if in, _ := f.Instance(id, clk.now()); !in.Healthy {
			t.Fatalf("%s's instance record unhealthy after a shared silence", id)
		}
	}
	publishLoad(t, nc, report("w2", telemetry.FleetGeneration, 1, 2, 0))
	waitFor(t, "w2 heard again", 5*time.Second, func() bool { return !viewOf(t, f, "w1", clk.now()).Healthy })
	if v := viewOf(t, f, "w1", clk.now()); !v.Silent {
		t.Fatalf("w1 late by w2's report should be silent (no failed probe): %+v", v)
	}
	if !viewOf(t, f, "w2", clk.now()).Healthy {
		t.Fatal("w2 unhealthy after its own report")
	}
	// A failed probe since w2's last report: a shared silence no longer
	// keeps it healthy.
	clk.advance(5 * time.Second)
	if !viewOf(t, f, "w2", clk.now()).Healthy {
		t.Fatal("w2 unhealthy in a shared silence")
	}
	f.mu.Lock()
	in := f.byID["w2"]
	in.probedAt, in.probeOK = clk.now(), false
	f.mu.Unlock()
	if viewOf(t, f, "w2", clk.now()).Healthy {
		t.Fatal("w2 healthy after a failed probe")
	}
}

// Static instances without telemetry are judged by probes of their health path (default /health); a
// worker reporting telemetry from the same URL under another id is merged
// into the static entry.
func TestStaticInstancesProbedAndMerged(t *testing.T) {
	var ready atomic.Bool
	ready.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == DefaultHealthPath && ready.Load() {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	ns := natstest.Start(t, nil)
	nc := connect(t, ns.ClientURL())
	f, _ := newFleet(t, Config{
		Conn: connect(t, ns.ClientURL()), ProbeInterval: 20 * time.Millisecond, MinStaleAfter: 100 * time.Millisecond,
		Static: []Static{{ID: "ctx-static", URL: srv.URL, Fleet: fsm.FleetContext}},
	})
	waitFor(t, "a successful probe", 5*time.Second, func() bool { in, _ := f.Instance("ctx-static", time.Now()); return in.Healthy })
	in, _ := f.Instance("ctx-static", time.Now())
	if in.Telemetry || !in.Static || !in.VerifiesHints {
		t.Fatalf("static instance %+v", in)
	}
	ready.Store(false)
	waitFor(t, "failed probes to make it unhealthy", 5*time.Second, func() bool { in, _ := f.Instance("ctx-static", time.Now()); return !in.Healthy })

	r := report("worker-7", telemetry.FleetContext, 3, 1, 0)
	r.URL = srv.URL + "/"
	r.VerifiesHints = false
	publishLoad(t, nc, r)
	waitFor(t, "telemetry merged into the static entry", 5*time.Second, func() bool {
		in, _ := f.Instance("ctx-static", time.Now())
		return in.Telemetry && in.Healthy && !in.VerifiesHints
	})
	if _, ok := f.Instance("worker-7", time.Now()); ok {
		t.Fatal("the static worker was also registered under its own id")
	}
	publishKV(t, nc, "worker-7", 3, 1, 0, 77)
	waitFor(t, "its KV events indexed under the static id", 5*time.Second, func() bool { return matched(f, "ctx-static", []uint64{77}) == 1 })
}

// Evictions reach the callback with the instance's fleet.
func TestEvictionsForwarded(t *testing.T) {
	ns := natstest.Start(t, nil)
	nc := connect(t, ns.ClientURL())
	got := make(chan string, 4)
	f, _ := newFleet(t, Config{Conn: connect(t, ns.ClientURL()), OnEvictions: func(id string, fl fsm.Fleet, evs []telemetry.Eviction) {
		for _, e := range evs {
			got <- fmt.Sprintf("%s/%s/%s", id, fl, e.ConversationID)
		}
	}})
	publishLoad(t, nc, report("w1", telemetry.FleetContext, 1, 1, 0))
	waitFor(t, "registration", 5*time.Second, func() bool { _, ok := f.Instance("w1", time.Now()); return ok })
	b, _ := telemetry.EncodeEvictions(telemetry.Evictions{Instance: "w1", BootID: 1, Seq: 1, Evictions: []telemetry.Eviction{{Rank: 0, ConversationID: "conv-a"}}})
	if err := nc.Publish(telemetry.EvictSubject("w1"), b); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "w1/context/conv-a" {
			t.Fatalf("eviction %s", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("eviction not forwarded")
	}
}

// While the edge's own NATS connection is down,
// telemetry silence is not evidence. A real NATS server goes away: both
// real workers stay healthy (their last known health, loads marked
// stale), they are probed over HTTP instead, and the one that stops
// serving becomes unhealthy by its failed probe. NATS comes back on the
// same port: the live worker reports again, the dead one stays unhealthy.
func TestTelemetryOutageKeepsHealthAndProbes(t *testing.T) {
	ns := natstest.Start(t, nil)
	url := ns.ClientURL()
	port := ns.Addr().(*net.TCPAddr).Port

	start := func(id string) *worker.Server { return startRealWorker(t, id, url, nil) }
	wa, wb := start("w-a"), start("w-b")

	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f, reg := newFleet(t, Config{Conn: nc, StaleIntervals: 3, MinStaleAfter: 100 * time.Millisecond,
		ProbeInterval: 50 * time.Millisecond, ReconnectGrace: 10 * time.Second})
	healthy := func(id string) Instance { in, _ := f.Instance(id, time.Now()); return in }
	waitFor(t, "both workers healthy from telemetry", 10*time.Second, func() bool {
		return healthy("w-a").Healthy && healthy("w-a").Telemetry && healthy("w-b").Healthy && healthy("w-b").Telemetry
	})
	if f.TelemetryLinkDown() || metric(t, reg, "tether_edge_telemetry_link_up", nil) != 1 {
		t.Fatal("telemetry link reported down while connected")
	}

	ns.Shutdown()
	ns.WaitForShutdown()
	waitFor(t, "the link seen down", 10*time.Second, f.TelemetryLinkDown)
	if metric(t, reg, "tether_edge_telemetry_link_up", nil) != 0 {
		t.Fatal("tether_edge_telemetry_link_up still 1")
	}
	// Past the staleness bound (3 × 20 ms, at least 100 ms: both
	// workers' figures marked stale) and through two successful probes,
	// both stay healthy at every look.
	waitFor(t, "both workers' figures stale and two probes answered, both healthy throughout", 15*time.Second, func() bool {
		stale := true
		for _, id := range []string{"w-a", "w-b"} {
			in := healthy(id)
			if !in.Healthy {
				t.Fatalf("%s unhealthy during the telemetry outage although it serves: %+v", id, in)
			}
			stale = stale && in.TelemetryStale
		}
		return stale && metric(t, reg, "tether_edge_probes_total", map[string]string{"result": "ok"}) >= 2
	})

	// A worker that stops serving fails its probe: unhealthy.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = wb.Close(cctx)
	cancel()
	waitFor(t, "the stopped worker unhealthy by its failed probe", 5*time.Second, func() bool { return !healthy("w-b").Healthy })
	if !healthy("w-a").Healthy {
		t.Fatal("the live worker became unhealthy with the stopped one")
	}

	// NATS back on the same port: the live worker reports again (a load
	// report heard after the server came back).
	back := time.Now()
	natstest.Start(t, &natsserver.Options{Port: port})
	waitFor(t, "the link back", 10*time.Second, func() bool { return !f.TelemetryLinkDown() })
	waitFor(t, "w-a reporting again", 15*time.Second, func() bool {
		in := healthy("w-a")
		return in.Healthy && !in.TelemetryStale && in.LastSeen.After(back)
	})
	if healthy("w-b").Healthy {
		t.Fatal("the stopped worker is healthy again")
	}
	if !wa.Ready() {
		t.Fatal("w-a not ready (connected) after NATS came back")
	}
}

// TestBreakerCountsOnlyPromptsThatCouldHit: prompts shorter than one KV
// block can never hit a prefix cache: their misses are no evidence (counted,
// they would open every instance's breaker), while misses of whole-block
// prompts still open it.
func TestBreakerCountsOnlyPromptsThatCouldHit(t *testing.T) {
	var clk clock
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	cfg := breaker.DefaultConfig()
	cfg.MinLookups, cfg.MinLookupTokens = 5, 0
	f, _ := newFleet(t, Config{Breaker: cfg, BlockSize: 16, Now: clk.now})
	for range 50 {
		f.RecordUsage("w-short", 15, 0, clk.now())
		clk.advance(10 * time.Millisecond)
	}
	if st := f.Breakers().State("w-short", clk.now()); st != breaker.Closed {
		t.Fatalf("50 misses of prompts shorter than a block: breaker %s, want closed", st)
	}
	for range 50 {
		f.RecordUsage("w-long", 64, 0, clk.now())
		clk.advance(10 * time.Millisecond)
	}
	if st := f.Breakers().State("w-long", clk.now()); st != breaker.Open {
		t.Fatalf("50 misses of 4-block prompts: breaker %s, want open", st)
	}
}

// startRealWorker starts a real worker (simulated engine, TimeScale 0,
// blocks of 4 tokens) reporting every 20 ms to the NATS server at natsURL;
// mutate, when set, changes its configuration first.
func startRealWorker(t *testing.T, id, natsURL string, mutate func(*worker.Config)) *worker.Server {
	t.Helper()
	cfg := worker.DefaultConfig()
	cfg.InstanceID, cfg.Model = id, "m"
	cfg.Engine.TimeScale, cfg.Engine.BlockSize = 0, 4
	cfg.TelemetryInterval = 20 * time.Millisecond
	cfg.NATS.URLs = []string{natsURL}
	cfg.Logger = slog.New(slog.DiscardHandler)
	if mutate != nil {
		mutate(&cfg)
	}
	w, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	return w
}

// The edge is deaf once it has heard none of its workers for three of
// their report intervals (its own silence, or theirs: it cannot tell), not
// before, and not when it never heard one; any report, or a fresh
// successful probe, ends it.
func TestDeafWhenNoWorkerIsHeard(t *testing.T) {
	f, _, nc, clk := clockedFleet(t)
	if _, deaf := f.Deaf(clk.now()); deaf {
		t.Fatal("deaf before any worker was heard")
	}
	publishLoad(t, nc, report("w1", telemetry.FleetContext, 1, 1, 0))
	publishLoad(t, nc, report("w2", telemetry.FleetGeneration, 1, 1, 0))
	waitFor(t, "registration", 5*time.Second, func() bool {
		_, ok1 := f.Instance("w1", clk.now())
		_, ok2 := f.Instance("w2", clk.now())
		return ok1 && ok2
	})
	clk.advance(250 * time.Millisecond) // under 3 × the 100 ms interval
	if _, deaf := f.Deaf(clk.now()); deaf {
		t.Fatal("deaf within three report intervals")
	}
	clk.advance(100 * time.Millisecond)
	silence, deaf := f.Deaf(clk.now())
	if !deaf || silence != 350*time.Millisecond {
		t.Fatalf("after 350 ms without a report: deaf %v, silence %s", deaf, silence)
	}
	// A fresh successful probe is hearing a worker; a failed one is not.
	f.mu.Lock()
	in := f.byID["w1"]
	in.lastProbeOK, in.probedAt, in.probeOK = clk.now(), clk.now(), true
	f.mu.Unlock()
	if _, deaf := f.Deaf(clk.now()); deaf {
		t.Fatal("deaf right after a successful probe")
	}
	f.mu.Lock()
	in.probedAt, in.probeOK = clk.now(), false
	f.mu.Unlock()
	if _, deaf := f.Deaf(clk.now()); !deaf {
		t.Fatal("not deaf with the last probe failed and no report")
	}
	publishLoad(t, nc, report("w2", telemetry.FleetGeneration, 1, 2, 0))
	waitFor(t, "w2 heard again", 5*time.Second, func() bool { _, deaf := f.Deaf(clk.now()); return !deaf })
}
