package worker

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
	"github.com/tether-project/tether/test/workertest"
)

func startNATS(t *testing.T, port int) *natsserver.Server {
	t.Helper()
	return natstest.Start(t, &natsserver.Options{Port: port})
}

// edgeView is an edge-side subscriber written with the telemetry codecs
// only: it decodes everything the worker publishes and records rejects.
type edgeView struct {
	t       *testing.T
	loads   chan telemetry.LoadReport
	kv      chan telemetry.KVEventBatch
	evicts  chan telemetry.Evictions
	rejects chan error
}

func subscribeEdge(t *testing.T, url string) (*edgeView, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	v := &edgeView{t: t, loads: make(chan telemetry.LoadReport, 4096), kv: make(chan telemetry.KVEventBatch, 4096),
		evicts: make(chan telemetry.Evictions, 64), rejects: make(chan error, 64)}
	handle := func(m *nats.Msg) {
		var err error
		switch {
		case strings.HasPrefix(m.Subject, "tether.v1.load."):
			var r telemetry.LoadReport
			if r, err = telemetry.DecodeLoad(m.Subject, m.Data); err == nil {
				v.loads <- r
			}
		case strings.HasPrefix(m.Subject, "tether.v1.kv."):
			var b telemetry.KVEventBatch
			if b, err = telemetry.DecodeKVEvents(m.Subject, m.Data); err == nil {
				v.kv <- b
			}
		case strings.HasPrefix(m.Subject, "tether.v1.evict."):
			var e telemetry.Evictions
			if e, err = telemetry.DecodeEvictions(m.Subject, m.Data); err == nil {
				v.evicts <- e
			}
		default:
			return
		}
		if err != nil {
			v.rejects <- err
		}
	}
	for _, subj := range []string{telemetry.LoadSubjectAll, telemetry.KVSubjectAll, telemetry.EvictSubjectAll} {
		if _, err := nc.Subscribe(subj, handle); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return v, nc
}

// waitLoad returns the first load report satisfying ok, or fails at the deadline.
func (v *edgeView) waitLoad(what string, ok func(telemetry.LoadReport) bool) telemetry.LoadReport {
	v.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-v.loads:
			if ok(r) {
				return r
			}
		case err := <-v.rejects:
			v.t.Fatalf("worker telemetry rejected by the decoder: %v", err)
		case <-deadline:
			v.t.Fatalf("no load report with %s within 10s", what)
		}
	}
}

func (v *edgeView) waitKV(what string, ok func(telemetry.KVEventBatch) bool) telemetry.KVEventBatch {
	v.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case b := <-v.kv:
			if ok(b) {
				return b
			}
		case <-deadline:
			v.t.Fatalf("no KV batch with %s within 10s", what)
		}
	}
}

func chatPromptTokens(prompt string) []uint32 {
	return prefix.Tokenize(prefix.RenderChat([]prefix.Message{{Role: "system", Content: "you are terse"}, {Role: "user", Content: prompt}}))
}

func TestTelemetryOverNATS(t *testing.T) {
	ns := startNATS(t, -1)
	edge, edgeNC := subscribeEdge(t, ns.ClientURL())

	cfg := testConfig("ctx-7")
	cfg.NATS.URLs = []string{ns.ClientURL()}
	cfg.TelemetryInterval = 20 * time.Millisecond
	cfg.ADP.AttentionDP.MaxSessions = 1
	// Real time, so a request can be caught running: prefill takes a few
	// milliseconds, each decode step 20 ms.
	cfg.Engine.TimeScale = 1
	cfg.Engine.DecodeTokenTime = 20 * time.Millisecond
	cfg.Engine.PrefillOverhead = time.Millisecond
	s := workertest.Start(t, New, cfg)

	// Registration/heartbeat: identity and capabilities.
	first := edge.waitLoad("identity", func(r telemetry.LoadReport) bool { return r.Instance == "ctx-7" })
	if first.URL != s.URL() || first.BootID != s.BootID() || !first.VerifiesHints || first.Model != "test-model" ||
		len(first.Ranks) != 2 || first.Ranks[0].KVBlocksTotal != 4096 || first.BlockSize != 4 || first.IntervalMilli != 20 ||
		first.Fleet != telemetry.FleetContext || first.FeatureLevel != telemetry.FeatureLevel {
		t.Fatalf("first load report %+v", first)
	}
	c := testClient(t)
	waitReady(t, c, s.URL(), http.StatusOK)

	// A slow streaming request: its prompt tokens show as active load on
	// its rank while it runs, and disappear when it ends.
	slowPrompt := longPrompt("slow", 40)
	slowTokens := len(chatPromptTokens(slowPrompt))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/chat/completions",
		strings.NewReader(chatBody(slowPrompt, `"stream":true,"max_tokens":2000`)))
	req.Header.Set("x-session-id", "conv-slow")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	slowRank := resp.Header.Get(HeaderADPRank)
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil { // first chunk: it is running
		t.Fatal(err)
	}
	running := edge.waitLoad("the slow request active", func(r telemetry.LoadReport) bool {
		rl := r.Ranks[rankIndex(t, slowRank)]
		return rl.ActivePromptTokens == int64(slowTokens) && rl.ActiveRequests == 1
	})
	other := running.Ranks[1-rankIndex(t, slowRank)]
	if other.ActivePromptTokens != 0 || other.ActiveRequests != 0 {
		t.Fatalf("idle rank reports load: %+v", other)
	}
	cancel()
	resp.Body.Close()
	edge.waitLoad("the slow request gone", func(r telemetry.LoadReport) bool {
		rl := r.Ranks[rankIndex(t, slowRank)]
		return rl.ActivePromptTokens == 0 && rl.ActiveRequests == 0
	})

	// KV events: the slow request stored its prompt's full blocks on its rank.
	want := prefix.BlockHashes(chatPromptTokens(slowPrompt), 4)
	var stored []uint64
	var lastSeq uint64
	edge.waitKV("the slow prompt's blocks", func(b telemetry.KVEventBatch) bool {
		if b.BootID != s.BootID() || b.Instance != "ctx-7" {
			t.Fatalf("batch identity %s/%d", b.Instance, b.BootID)
		}
		if lastSeq != 0 && b.Seq != lastSeq+1 {
			t.Fatalf("KV batch sequence jumped %d → %d", lastSeq, b.Seq)
		}
		lastSeq = b.Seq
		for _, ev := range b.Events {
			if ev.Rank == rankIndex(t, slowRank) {
				stored = append(stored, ev.Stored...)
			}
		}
		return len(stored) >= len(want)
	})
	if !slices.Equal(stored, want) {
		t.Fatalf("stored hashes %v, want the prompt's block hashes %v", stored, want)
	}

	// Two more conversations with max_sessions 1: the older binding is
	// evicted and reported; their blocks arrive in later batches with
	// consecutive sequence numbers.
	for _, conv := range []string{"conv-a", "conv-b"} {
		r := post(t, c, s.URL()+"/v1/chat/completions", chatBody(longPrompt(conv, 12), `"max_tokens":1`), map[string]string{"x-session-id": conv})
		if r.status != 200 {
			t.Fatalf("%s: %d %s", conv, r.status, r.body)
		}
	}
	evicted := map[string]bool{}
	deadline := time.After(10 * time.Second)
	for !evicted["conv-a"] {
		select {
		case e := <-edge.evicts:
			if e.Instance != "ctx-7" || e.BootID != s.BootID() {
				t.Fatalf("eviction identity %+v", e)
			}
			for _, ev := range e.Evictions {
				evicted[ev.ConversationID] = true
				if ev.Rank < 0 || ev.Rank > 1 {
					t.Fatalf("eviction rank %d", ev.Rank)
				}
			}
		case <-deadline:
			t.Fatalf("no eviction of conv-a; saw %v", evicted)
		}
	}
	if !evicted["conv-slow"] {
		t.Fatalf("conv-slow (evicted by conv-a) not reported: %v", evicted)
	}
	edge.waitKV("conv-b's blocks", func(b telemetry.KVEventBatch) bool {
		if b.Seq != lastSeq+1 {
			t.Fatalf("KV batch sequence jumped %d → %d", lastSeq, b.Seq)
		}
		lastSeq = b.Seq
		for _, ev := range b.Events {
			if slices.Contains(ev.Stored, prefix.BlockHashes(chatPromptTokens(longPrompt("conv-b", 12)), 4)[0]) {
				return true
			}
		}
		return false
	})
	after := edge.waitLoad("KV use and kv_seq", func(r telemetry.LoadReport) bool { return r.KVSeq >= lastSeq })
	used := after.Ranks[0].KVBlocksUsed + after.Ranks[1].KVBlocksUsed
	if used < int64(len(want)) || after.Ranks[rankIndex(t, slowRank)].WindowLookupTokens == 0 {
		t.Fatalf("after requests: KV blocks used %d (want >= %d), ranks %+v", used, len(want), after.Ranks)
	}

	// A KV dump rebuilds exactly what the events announced.
	dump := requestDump(t, edgeNC, "ctx-7")
	if dump.seq < lastSeq || dump.boot != s.BootID() {
		t.Fatalf("dump at seq %d boot %d; events reached %d", dump.seq, dump.boot, lastSeq)
	}
	for _, h := range want {
		if !slices.Contains(dump.blocks[rankIndex(t, slowRank)], h) {
			t.Fatalf("dump of rank %s lacks block %d", slowRank, h)
		}
	}

	// A malformed message on a worker's subject is rejected by the decoder
	// with a typed error, and telemetry keeps flowing.
	for _, bad := range []struct {
		subject string
		data    string
		kind    error
	}{
		{telemetry.LoadSubject(telemetry.FleetContext, "ctx-7"), `{"v":1,"instance":"ctx-7","ranks":"lots"}`, telemetry.ErrMalformed},
		{telemetry.LoadSubject(telemetry.FleetContext, "ctx-7"), strings.Replace(string(mustEncodeLoad(t, first)), `"instance":"ctx-7"`, `"instance":"ctx-8"`, 1), telemetry.ErrSubjectMismatch},
		{telemetry.KVSubject("ctx-7"), "TK\x01\x01garbage", telemetry.ErrMalformed},
		{telemetry.EvictSubject("ctx-7"), `{"v":9}`, telemetry.ErrUnknownVersion},
	} {
		if err := edgeNC.Publish(bad.subject, []byte(bad.data)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-edge.rejects:
			var de *telemetry.DecodeError
			if !errors.As(err, &de) || !errors.Is(err, bad.kind) {
				t.Fatalf("rogue message on %s: %v, want %v", bad.subject, err, bad.kind)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("rogue message on %s was not rejected", bad.subject)
		}
	}
	edge.waitLoad("reports after the rogue messages", func(r telemetry.LoadReport) bool { return r.BootID == s.BootID() })
}

func rankIndex(t *testing.T, header string) int {
	t.Helper()
	switch header {
	case "0":
		return 0
	case "1":
		return 1
	}
	t.Fatalf("rank header %q", header)
	return -1
}

func mustEncodeLoad(t *testing.T, r telemetry.LoadReport) []byte {
	t.Helper()
	b, err := telemetry.EncodeLoad(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type dumpResult struct {
	seq, boot uint64
	blocks    map[int][]uint64
}

// requestDump asks instance for its KV dump and collects every part.
func requestDump(t *testing.T, nc *nats.Conn, instance string) dumpResult {
	t.Helper()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(telemetry.KVDumpSubject(instance), inbox, nil); err != nil {
		t.Fatal(err)
	}
	res := dumpResult{blocks: map[int][]uint64{}}
	for got, parts := 0, 1; got < parts; got++ {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("dump part %d: %v", got, err)
		}
		d, err := telemetry.DecodeKVDump(telemetry.KVDumpSubject(instance), m.Data)
		if err != nil {
			t.Fatal(err)
		}
		parts, res.seq, res.boot = d.Parts, d.Seq, d.BootID
		for _, rb := range d.Ranks {
			res.blocks[rb.Rank] = append(res.blocks[rb.Rank], rb.Blocks...)
		}
	}
	return res
}

func waitReady(t *testing.T, c *http.Client, url string, want int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := do(t, c, http.MethodGet, url+"/readyz", "", nil)
		if r.status == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz stayed %d (%s), want %d", r.status, r.body, want)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not a wait-to-pass
	}
}

// The worker keeps serving while NATS is down, reports not-ready (but
// serving, to /readyz?telemetry=optional), and reconnects by itself when
// NATS returns.
func TestNATSOutageAndReconnect(t *testing.T) {
	ns := startNATS(t, -1)
	addr := ns.ClientURL()
	cfg := testConfig("ctx-r")
	cfg.NATS.URLs = []string{addr}
	cfg.TelemetryInterval = 20 * time.Millisecond
	s := workertest.Start(t, New, cfg)
	c := testClient(t)
	waitReady(t, c, s.URL(), http.StatusOK)

	ns.Shutdown()
	ns.WaitForShutdown()
	waitReady(t, c, s.URL(), http.StatusServiceUnavailable)
	// An edge whose own NATS link is down asks whether the worker can
	// serve: it can.
	if r := do(t, c, http.MethodGet, s.URL()+"/readyz?telemetry=optional", "", nil); r.status != http.StatusOK || r.json(t)["nats"] != "disconnected" {
		t.Fatalf("/readyz?telemetry=optional during the outage: %d %s", r.status, r.body)
	}
	if r := do(t, c, http.MethodGet, s.URL()+"/health", "", nil); r.status != http.StatusOK {
		t.Fatalf("/health during the outage: %d %s", r.status, r.body)
	}
	if r := post(t, c, s.URL()+"/v1/chat/completions", chatBody("served without nats", `"max_tokens":1`), nil); r.status != 200 {
		t.Fatalf("request during NATS outage: %d %s", r.status, r.body)
	}

	ns2 := startNATS(t, natsPort(t, addr))
	edge, _ := subscribeEdge(t, ns2.ClientURL())
	waitReady(t, c, s.URL(), http.StatusOK)
	edge.waitLoad("reports after reconnecting", func(r telemetry.LoadReport) bool { return r.Instance == "ctx-r" && r.BootID == s.BootID() })
}

func natsPort(t *testing.T, url string) int {
	t.Helper()
	i := strings.LastIndexByte(url, ':')
	var p int
	for _, c := range url[i+1:] {
		p = p*10 + int(c-'0')
	}
	if p == 0 {
		t.Fatalf("no port in %s", url)
	}
	return p
}

// A burst of requests is reported at once, not an interval later: with a
// one-hour interval the only reports are the one on connecting and the
// ones the queue jump triggers.
func TestQueueJumpTriggersImmediateLoadReport(t *testing.T) {
	ns := startNATS(t, -1)
	edge, _ := subscribeEdge(t, ns.ClientURL())
	cfg := slowConfig("ctx-burst")
	cfg.NATS.URLs = []string{ns.ClientURL()}
	cfg.TelemetryInterval = time.Hour
	s := workertest.Start(t, New, cfg)
	c := testClient(t)
	waitReady(t, c, s.URL(), http.StatusOK)
	// The report sent on connecting to NATS runs on nats.go's callback
	// goroutine and may come at any time; counted during the burst it would
	// leave less than queueJump of the burst to trigger a report.
	edge.waitLoad("the report on connecting", func(telemetry.LoadReport) bool { return true })
	for i := 0; i < queueJump; i++ {
		startStream(t, c, s.URL(), "4096")
	}
	edge.waitLoad("the burst", func(r telemetry.LoadReport) bool {
		return r.Ranks[0].ActiveRequests+r.Ranks[0].QueuedRequests+r.Ranks[1].ActiveRequests+r.Ranks[1].QueuedRequests >= queueJump
	})
}

// An engine's figures out of telemetry's bounds are clamped, so a
// misbehaving engine cannot make every load report undecodable.
func TestClampRankKeepsReportsDecodable(t *testing.T) {
	for _, bad := range []int64{-1, telemetry.MaxTokens + 1} {
		rl := telemetry.RankLoad{ActivePromptTokens: bad, PrefillTokens: bad, QueuedRequests: -3, KVBlocksTotal: 10, KVBlocksUsed: 11}
		clampRank(&rl)
		r := telemetry.LoadReport{Instance: "ctx-1", Fleet: telemetry.FleetContext, URL: "http://ctx-1:8000", Model: "m", Version: "v",
			FeatureLevel: telemetry.FeatureLevel, BootID: 1, Seq: 1, IntervalMilli: 100, BlockSize: 4, Ranks: []telemetry.RankLoad{rl}}
		if _, err := telemetry.EncodeLoad(r); err != nil {
			t.Fatalf("clamped %+v: %v", rl, err)
		}
		if rl.PrefillTokens < 0 || rl.PrefillTokens > telemetry.MaxTokens || rl.KVBlocksUsed != 10 {
			t.Fatalf("clamped %+v", rl)
		}
	}
}
