package worker

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/worker/engine"
)

// queueJump is the change in placed requests (summed over ranks) that
// triggers a load report before the next tick, so edges see a burst within milliseconds
// rather than an interval later.
const queueJump = 4

// publisher sends the worker's telemetry over NATS (internal/telemetry
// subjects and codecs). Request serving never waits for it: the engine's KV
// sink and the scheduler's eviction callback only append to buffers under a
// mutex; one goroutine encodes and publishes every interval.
type publisher struct {
	s   *Server
	log *slog.Logger
	nc  *nats.Conn

	mu           sync.Mutex
	pendingKV    []telemetry.KVEvent
	pendingEvict []telemetry.Eviction
	kvSeq        uint64 // last KV batch sequence assigned
	evictSeq     uint64
	loadSeq      uint64
	// mirror is every rank's cache contents as announced by the published
	// batches up to kvSeq: what a KV dump replies with.
	mirror []map[uint64]struct{}

	reportedMu sync.Mutex
	reported   []int // per rank: active+queued in the last load report
	lastLoadAt time.Time

	nudge chan struct{}
	stop  chan struct{}
	done  chan struct{}
}

func newPublisher(s *Server) *publisher {
	p := &publisher{
		s:        s,
		log:      s.log.With("component", "telemetry"),
		mirror:   make([]map[uint64]struct{}, s.ranks),
		reported: make([]int, s.ranks),
		nudge:    make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for i := range p.mirror {
		p.mirror[i] = map[uint64]struct{}{}
	}
	return p
}

// natsOptions builds the connection options from the nats section.
func natsOptions(cfg *Config, log *slog.Logger, onReconnect func()) ([]nats.Option, error) {
	n := cfg.NATS
	opts := []nats.Option{
		nats.Name("tether-worker-" + cfg.InstanceID),
		nats.MaxReconnects(-1), // reconnect forever
		nats.RetryOnFailedConnect(true),
		nats.CustomReconnectDelay(reconnectDelay),
		// Telemetry goes stale fast: buffer little while disconnected;
		// sequence numbers let edges detect what was dropped.
		nats.ReconnectBufSize(4 << 20),
		nats.PingInterval(10 * time.Second),
		nats.Timeout(5 * time.Second),
		nats.NoCallbacksAfterClientClose(),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("nats disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("nats reconnected", "server", c.ConnectedUrlRedacted())
			onReconnect()
		}),
		nats.ConnectHandler(func(c *nats.Conn) {
			log.Info("nats connected", "server", c.ConnectedUrlRedacted())
			onReconnect()
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Warn("nats async error", "subject", subj, "err", err)
		}),
	}
	switch {
	case n.User != "":
		opts = append(opts, nats.UserInfo(n.User, n.Password))
	case n.Token != "":
		opts = append(opts, nats.Token(n.Token))
	case n.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(n.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nats.nkey_seed_file: %w", err)
		}
		opts = append(opts, o)
	case n.CredsFile != "":
		if _, err := os.Stat(n.CredsFile); err != nil {
			return nil, fmt.Errorf("nats.creds_file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(n.CredsFile))
	}
	if n.TLS != (TLSConfig{}) {
		tc, err := natsClientTLS(n.TLS)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

// reconnectDelay backs off exponentially from 100 ms to 5 s, with jitter so
// a fleet does not reconnect in lockstep after a NATS restart.
func reconnectDelay(attempts int) time.Duration {
	d := 100 * time.Millisecond << min(max(attempts-1, 0), 6)
	d = min(d, 5*time.Second)
	return d + time.Duration(rand.Int64N(int64(d/5)+1))
}

// start connects (without waiting for the server to be reachable),
// subscribes to KV dump requests and starts the publishing loop.
func (p *publisher) start() error {
	opts, err := natsOptions(&p.s.cfg, p.log, p.poke)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(strings.Join(p.s.cfg.NATS.URLs, ","), opts...)
	if err != nil {
		return fmt.Errorf("nats connect: %w", err)
	}
	p.nc = nc
	if _, err := nc.Subscribe(telemetry.KVDumpSubject(p.s.cfg.InstanceID), p.handleDump); err != nil {
		nc.Close()
		return fmt.Errorf("nats subscribe %s: %w", telemetry.KVDumpSubject(p.s.cfg.InstanceID), err)
	}
	go p.loop()
	return nil
}

func (p *publisher) connected() bool { return p.nc != nil && p.nc.IsConnected() }

// poke asks the loop for a load report soon (non-blocking).
func (p *publisher) poke() {
	select {
	case p.nudge <- struct{}{}:
	default:
	}
}

// checkJump pokes the loop when the ranks' request counts moved by
// queueJump or more in total since the last report (a burst on one rank, or
// spread over several: the edge balances instances by the sum).
func (p *publisher) checkJump(loads []int) {
	p.reportedMu.Lock()
	moved := 0
	for r, n := range loads {
		if r < len(p.reported) {
			moved += max(n-p.reported[r], p.reported[r]-n)
		}
	}
	p.reportedMu.Unlock()
	if moved >= queueJump {
		p.poke()
	}
}

func (p *publisher) loop() {
	defer close(p.done)
	interval := p.s.cfg.TelemetryInterval
	// Early reports are at least this far apart, so a storm of changes
	// cannot turn into a storm of messages.
	gap := min(interval/4, 25*time.Millisecond)
	t := time.NewTicker(interval)
	defer t.Stop()
	deferred := time.NewTimer(time.Hour)
	deferred.Stop()
	defer deferred.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.flush(false)
		case <-deferred.C:
			p.flush(false)
		case <-p.nudge:
			p.reportedMu.Lock()
			wait := gap - time.Since(p.lastLoadAt)
			p.reportedMu.Unlock()
			if wait <= 0 {
				p.flush(false)
			} else {
				// Too soon after the last report: send one as soon as
				// allowed rather than dropping the change.
				deferred.Reset(wait)
			}
		}
	}
}

// flush publishes pending KV events (first, so the load report's kv_seq
// covers them), pending evictions and a load report.
func (p *publisher) flush(draining bool) {
	p.publishKV()
	p.publishEvictions()
	p.publishLoad(draining)
}

// addKVEvent is the engine's KV sink.
func (p *publisher) addKVEvent(ev engine.KVEvent) {
	if len(ev.Stored) == 0 && len(ev.Removed) == 0 {
		return
	}
	te := telemetry.KVEvent{Rank: ev.Rank, Stored: slices.Clone(ev.Stored), Removed: slices.Clone(ev.Removed)}
	p.mu.Lock()
	p.pendingKV = append(p.pendingKV, te)
	p.mu.Unlock()
}

// addEviction is called for each conversation binding the scheduler drops.
func (p *publisher) addEviction(conversationID string, rank int) {
	if conversationID == "" || len(conversationID) > telemetry.MaxStringLen || rank < 0 || rank >= telemetry.MaxRanks {
		return // not representable; the edge's binding then just ages out
	}
	p.mu.Lock()
	p.pendingEvict = append(p.pendingEvict, telemetry.Eviction{Rank: rank, ConversationID: conversationID, Reason: "lru"})
	p.mu.Unlock()
}

// maxHashes is how many block hashes fit in one message under the
// server's payload limit, leaving room for headers.
func (p *publisher) maxHashes() int {
	limit := int64(1 << 20) // the NATS default, until the server says
	if p.nc != nil {
		if mp := p.nc.MaxPayload(); mp > 0 {
			limit = mp
		}
	}
	return int(max((limit-4096)/12, 1)) // 8 bytes a hash, plus per-event varints
}

func (p *publisher) publish(kind, subject string, data []byte) {
	err := p.nc.Publish(subject, data)
	result := "ok"
	if err != nil {
		result = "error"
		p.log.Debug("publish failed", "subject", subject, "err", err)
	}
	p.s.metrics.publishes.WithLabelValues(kind, result).Inc()
}

func (p *publisher) publishKV() {
	inst, boot := p.s.cfg.InstanceID, p.s.bootID
	p.mu.Lock()
	events := p.pendingKV
	p.pendingKV = nil
	if len(events) == 0 {
		p.mu.Unlock()
		return
	}
	var msgs [][]byte
	for _, group := range telemetry.SplitKVEvents(events, p.maxHashes()) {
		p.kvSeq++
		for _, ev := range group {
			m := p.mirror[ev.Rank]
			for _, h := range ev.Removed {
				delete(m, h)
			}
			for _, h := range ev.Stored {
				m[h] = struct{}{}
			}
		}
		data, err := telemetry.AppendKVEvents(nil, telemetry.KVEventBatch{Instance: inst, BootID: boot, Seq: p.kvSeq, Events: group})
		if err != nil {
			// Cannot happen with engine-produced events; the gap in
			// sequence numbers makes edges resynchronise from a dump.
			p.log.Error("encode KV events", "err", err)
			continue
		}
		msgs = append(msgs, data)
	}
	p.mu.Unlock()
	for _, m := range msgs {
		p.publish("kv", telemetry.KVSubject(inst), m)
	}
}

func (p *publisher) publishEvictions() {
	inst, boot := p.s.cfg.InstanceID, p.s.bootID
	p.mu.Lock()
	evs := p.pendingEvict
	p.pendingEvict = nil
	var msgs [][]byte
	for len(evs) > 0 {
		n := min(len(evs), telemetry.MaxEvictionsPerMsg)
		p.evictSeq++
		data, err := telemetry.EncodeEvictions(telemetry.Evictions{Instance: inst, BootID: boot, Seq: p.evictSeq, Evictions: evs[:n]})
		if err != nil {
			p.log.Error("encode evictions", "err", err)
		} else {
			msgs = append(msgs, data)
		}
		evs = evs[n:]
	}
	p.mu.Unlock()
	for _, m := range msgs {
		p.publish("evict", telemetry.EvictSubject(inst), m)
	}
}

// loadReport builds the current load report.
func (p *publisher) loadReport(draining bool) telemetry.LoadReport {
	s := p.s
	p.mu.Lock()
	p.loadSeq++
	seq, kvSeq := p.loadSeq, p.kvSeq
	p.mu.Unlock()
	return telemetry.LoadReport{
		Instance:      s.cfg.InstanceID,
		Fleet:         s.cfg.Fleet,
		Role:          string(s.cfg.ServerRole),
		URL:           s.URL(),
		Model:         s.cfg.Model,
		Version:       s.cfg.Version,
		FeatureLevel:  telemetry.FeatureLevel,
		VerifiesHints: s.verifiesHints(),
		BootID:        s.bootID,
		Seq:           seq,
		KVSeq:         kvSeq,
		SentUnixMilli: time.Now().UnixMilli(),
		IntervalMilli: max(s.cfg.TelemetryInterval.Milliseconds(), 1),
		BlockSize:     s.blockSize(),
		KVSource:      s.kvSource(),
		Draining:      draining,
		Ranks:         s.rankLoads(),
		MaxLoRAs:      s.reportedMaxLoRAs(),
	}
}

func (p *publisher) publishLoad(draining bool) {
	r := p.loadReport(draining)
	data, err := telemetry.EncodeLoad(r)
	if err != nil {
		p.log.Error("encode load report", "err", err)
		p.s.metrics.publishes.WithLabelValues("load", "error").Inc()
		return
	}
	p.reportedMu.Lock()
	for i, rl := range r.Ranks {
		p.reported[i] = int(rl.ActiveRequests + rl.QueuedRequests)
	}
	p.lastLoadAt = time.Now()
	p.reportedMu.Unlock()
	p.publish("load", telemetry.LoadSubject(r.Fleet, r.Instance), data)
}

// handleDump answers a KV dump request with the mirror as of kvSeq, in
// parts that fit the payload limit.
func (p *publisher) handleDump(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	p.mu.Lock()
	seq := p.kvSeq
	ranks := make([][]uint64, len(p.mirror))
	for r, set := range p.mirror {
		ranks[r] = make([]uint64, 0, len(set))
		for h := range set {
			ranks[r] = append(ranks[r], h)
		}
	}
	p.mu.Unlock()
	d := telemetry.KVDump{Instance: p.s.cfg.InstanceID, BootID: p.s.bootID, Seq: seq}
	for r, hs := range ranks {
		if len(hs) == 0 {
			continue
		}
		slices.Sort(hs)
		d.Ranks = append(d.Ranks, telemetry.RankBlocks{Rank: r, Blocks: hs})
	}
	for _, part := range telemetry.SplitKVDump(d, p.maxHashes()) {
		data, err := telemetry.EncodeKVDump(part)
		if err != nil {
			p.log.Error("encode KV dump", "err", err)
			p.s.metrics.publishes.WithLabelValues("kvdump", "error").Inc()
			return
		}
		p.publish("kvdump", m.Reply, data)
	}
}

// close stops the loop, publishes what is pending plus a final draining
// load report, flushes (bounded by ctx, at most 2 s) and disconnects.
func (p *publisher) close(ctx context.Context) error {
	if p.nc == nil {
		return nil
	}
	close(p.stop)
	<-p.done
	p.flush(true)
	fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if p.nc.IsConnected() {
		// Best effort: with NATS unreachable the final report is lost and
		// edges notice the worker's silence instead.
		if err := p.nc.FlushWithContext(fctx); err != nil {
			p.log.Warn("final telemetry flush failed", "err", err)
		}
	}
	p.nc.Close()
	return nil
}

// kvSource is the load report's kv_source: what the worker's KV events
// reflect (the edge's /admin/v1/instances shows it).
func (s *Server) kvSource() string {
	switch {
	case s.cfg.Engine.Type != "proxy":
		return ""
	case s.cfg.Engine.KVEvents.Format != "":
		return telemetry.KVSourceEngineEvents
	}
	return telemetry.KVSourceNone
}
