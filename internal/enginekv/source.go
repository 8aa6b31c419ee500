package enginekv

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// Formats of engine event sources.
const (
	FormatVLLM   = "vllm"   // vLLM --kv-events-config (ZeroMQ + msgpack)
	FormatSGLang = "sglang" // SGLang --kv-events-config (same wire format)
	FormatTRTLLM = "trtllm" // trtllm-serve POST /kv_cache_events
)

// Config configures the event sources of one proxy worker.
type Config struct {
	Format string
	// Endpoints (vllm, sglang): ZeroMQ PUB endpoints, one per tether rank,
	// or one for all ranks (each batch's data_parallel_rank picks the rank).
	Endpoints []string
	// ReplayEndpoints optionally gives each endpoint's ROUTER replay socket.
	ReplayEndpoints []string
	Topic           string
	// URLs (trtllm): trtllm-serve base URLs, one per rank or one for all
	// (attention_dp_rank picks the rank).
	URLs         []string
	PollInterval time.Duration
	// Undecodable, when set, is called once for each engine event (or
	// whole message) that did not decode and was skipped, with its reason
	// (SkipBatch, SkipUnknownEvent, SkipMalformedEvent). It is called from
	// the feeds' goroutines.
	Undecodable func(reason string)
	// Ranks is the number of tether ADP ranks; BlockSize tether's (and the
	// engine's) tokens per block.
	Ranks     int
	BlockSize int
	Log       *slog.Logger
}

// Validate checks cfg.
func (c Config) Validate() error {
	switch c.Format {
	case FormatVLLM, FormatSGLang:
		if err := checkCount("endpoints", len(c.Endpoints), c.Ranks); err != nil {
			return err
		}
		if len(c.ReplayEndpoints) != 0 && len(c.ReplayEndpoints) != len(c.Endpoints) {
			return fmt.Errorf("kv_events.replay_endpoints: %d for %d endpoints (want one each, or none)", len(c.ReplayEndpoints), len(c.Endpoints))
		}
		for i, e := range append(append([]string(nil), c.Endpoints...), c.ReplayEndpoints...) {
			if !strings.HasPrefix(e, "tcp://") && !strings.HasPrefix(e, "ipc://") {
				return fmt.Errorf("kv_events endpoint %d %q: want tcp://host:port or ipc://path", i, e)
			}
		}
	case FormatTRTLLM:
		if err := checkCount("urls", len(c.URLs), c.Ranks); err != nil {
			return err
		}
		for i, u := range c.URLs {
			p, err := url.Parse(u)
			if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
				return fmt.Errorf("kv_events.urls[%d] %q: not an absolute http(s) URL", i, u)
			}
		}
	default:
		return fmt.Errorf("kv_events.format %q: want vllm, sglang or trtllm", c.Format)
	}
	if c.BlockSize <= 0 {
		return fmt.Errorf("kv_events: block size %d", c.BlockSize)
	}
	return nil
}

func checkCount(key string, n, ranks int) error {
	if n != 1 && n != ranks {
		return fmt.Errorf("kv_events.%s: %d for %d ranks (want one per rank, or one for all)", key, n, ranks)
	}
	return nil
}

// RankStatus is what a Source knows about one rank.
type RankStatus struct {
	Rank      int
	Source    string // endpoint or URL
	Blocks    int    // engine blocks mapped
	LastSeq   uint64
	HaveSeq   bool
	Resets    uint64
	LastReset string
	Stats     MapperStats
	// Undecodable counts the events (and whole messages) of the rank's
	// stream skipped because they did not decode, by reason (Skip.Reason);
	// a message whose rank is unknown counts on the feed's first rank.
	Undecodable map[string]uint64
}

// RankKeys is one change to one engine rank's cache in tether block keys:
// in each tier Removed applies before Stored. OffloadedStored and
// OffloadedRemoved are the offloaded tiers' (Mapper): a consumer that
// cannot carry them (the workers' NATS KV batches) ignores them.
type RankKeys struct {
	Rank             int
	Stored           []uint64
	Removed          []uint64
	OffloadedStored  []uint64
	OffloadedRemoved []uint64
}

// Source runs the configured subscribers or pollers and feeds the sink
// with tether-keyed RankKeys.
type Source struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	feeds  []*feed
}

// feed is one endpoint's handler: the ranks it covers and their mappers.
type feed struct {
	name  string
	sink  func(RankKeys)
	ranks []int // tether ranks this feed can address; one entry: fixed rank
	log   *slog.Logger
	// undecodable is Config.Undecodable (nil: not reported).
	undecodable func(reason string)

	mu      sync.Mutex
	mappers map[int]*Mapper
	status  map[int]*RankStatus
}

// Start validates cfg and starts one goroutine per endpoint or URL; sink
// is called from those goroutines (it must be safe for concurrent use).
func Start(cfg Config, sink func(RankKeys)) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Source{cancel: cancel}
	names := cfg.Endpoints
	if cfg.Format == FormatTRTLLM {
		names = cfg.URLs
	}
	for i, name := range names {
		f := &feed{name: name, sink: sink, log: log, undecodable: cfg.Undecodable, mappers: map[int]*Mapper{}, status: map[int]*RankStatus{}}
		if len(names) == cfg.Ranks {
			f.ranks = []int{i}
		} else {
			for r := 0; r < cfg.Ranks; r++ {
				f.ranks = append(f.ranks, r)
			}
		}
		for _, r := range f.ranks {
			f.mappers[r] = NewMapper(cfg.BlockSize, 0)
			f.status[r] = &RankStatus{Rank: r, Source: name}
		}
		var run func(context.Context, Handler) error
		if cfg.Format == FormatTRTLLM {
			p, err := NewPoller(PollerConfig{URL: name, Interval: cfg.PollInterval, Log: log})
			if err != nil {
				cancel()
				return nil, err
			}
			run = p.Run
		} else {
			sc := SubscriberConfig{Endpoint: name, Topic: cfg.Topic, Log: log, Decode: DecodeVLLM}
			if cfg.Format == FormatSGLang {
				sc.Decode = DecodeSGLang
			}
			if len(cfg.ReplayEndpoints) > 0 {
				sc.ReplayEndpoint = cfg.ReplayEndpoints[i]
			}
			sub, err := NewSubscriber(sc)
			if err != nil {
				cancel()
				return nil, err
			}
			run = sub.Run
		}
		s.feeds = append(s.feeds, f)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for ctx.Err() == nil {
				if err := run(ctx, f); err != nil {
					log.Warn("kv events source failed; retrying", "source", name, "err", err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}()
	}
	return s, nil
}

// Close stops every feed and waits for them.
func (s *Source) Close() {
	s.cancel()
	s.wg.Wait()
}

// Status reports every rank, ordered by rank.
func (s *Source) Status() []RankStatus {
	var out []RankStatus
	for _, f := range s.feeds {
		f.mu.Lock()
		for _, r := range f.ranks {
			st := *f.status[r]
			st.Undecodable = maps.Clone(st.Undecodable)
			st.Blocks = f.mappers[r].Len()
			st.Stats = f.mappers[r].Stats()
			out = append(out, st)
		}
		f.mu.Unlock()
	}
	return out
}

// rankOf picks the tether rank of a batch.
func (f *feed) rankOf(dp int) (int, bool) {
	if len(f.ranks) == 1 {
		return f.ranks[0], true
	}
	if dp < 0 {
		dp = 0
	}
	if dp >= len(f.ranks) {
		return 0, false
	}
	return f.ranks[dp], true
}

// Batch implements Handler. The events that decoded are applied; those
// that did not are counted and logged, and change nothing: the rank's
// blocks are reset only by the engine's own AllBlocksCleared or a lost
// stretch of the stream (Reset).
func (f *feed) Batch(seq uint64, b Batch) {
	rank, ok := f.rankOf(b.DPRank)
	if len(b.Skipped) > 0 {
		f.skipped(seq, rank, ok, b.Skipped)
	}
	if !ok {
		f.log.Warn("kv events for an unknown data-parallel rank", "source", f.name, "dp_rank", b.DPRank, "ranks", len(f.ranks))
		return
	}
	f.mu.Lock()
	m := f.mappers[rank]
	var acc Change
	for _, ev := range b.Events {
		c := m.ApplyTiers(ev)
		// Keep removal-before-store order across events of one batch by
		// emitting per event when an event removes after earlier stores.
		if acc.removesAfterStore(c) {
			f.emit(rank, acc)
			acc = Change{}
		}
		acc.add(c)
	}
	if len(b.Events) > 0 || len(b.Skipped) == 0 {
		// (A record of skipped elements alone may carry no sequence.)
		st := f.status[rank]
		st.LastSeq, st.HaveSeq = seq, true
	}
	f.mu.Unlock()
	f.emit(rank, acc)
}

// skipped counts a batch's undecodable events on its rank (the feed's
// first when the rank is unknown) and logs them: the first of each reason
// as a warning, later ones at debug level.
func (f *feed) skipped(seq uint64, rank int, known bool, skips []Skip) {
	if !known {
		rank = f.ranks[0]
	}
	f.mu.Lock()
	st := f.status[rank]
	if st.Undecodable == nil {
		st.Undecodable = map[string]uint64{}
	}
	var first []Skip
	for _, sk := range skips {
		if st.Undecodable[sk.Reason] == 0 {
			first = append(first, sk)
		}
		st.Undecodable[sk.Reason]++
	}
	f.mu.Unlock()
	for _, sk := range skips {
		level := slog.LevelDebug
		if slices.Contains(first, sk) {
			level = slog.LevelWarn
		}
		f.log.Log(context.Background(), level, "kv events: skipped an event that does not decode (the rest of its batch applies)",
			"source", f.name, "seq", seq, "rank", rank, "event", sk.Index, "reason", sk.Reason, "err", sk.Err)
		if f.undecodable != nil {
			f.undecodable(sk.Reason)
		}
	}
}

// Reset implements Handler: every rank of the feed forgets its blocks.
func (f *feed) Reset(reason string) {
	f.log.Warn("kv events reset", "source", f.name, "reason", reason)
	type out struct {
		rank    int
		removed Change
	}
	var outs []out
	f.mu.Lock()
	for _, r := range f.ranks {
		outs = append(outs, out{r, f.mappers[r].Clear()})
		st := f.status[r]
		st.Resets++
		st.LastReset = reason
		st.HaveSeq = false
	}
	f.mu.Unlock()
	for _, o := range outs {
		f.emit(o.rank, o.removed)
	}
}

func (f *feed) emit(rank int, c Change) {
	if c.empty() {
		return
	}
	f.sink(RankKeys{Rank: rank, Stored: c.Stored, Removed: c.Removed,
		OffloadedStored: c.OffloadedStored, OffloadedRemoved: c.OffloadedRemoved})
}

// Keys lists, per rank, the tether keys the engine holds as far as the
// source knows (a dump of its state).
func (s *Source) Keys() map[int][]uint64 {
	out := map[int][]uint64{}
	for _, f := range s.feeds {
		f.mu.Lock()
		for _, r := range f.ranks {
			if ks := f.mappers[r].Keys(); len(ks) > 0 {
				out[r] = append(out[r], ks...)
			}
		}
		f.mu.Unlock()
	}
	return out
}
