package sim

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/engine"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// prompt returns n distinct tokens; prompts with different seeds share none.
func prompt(seed uint32, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = seed<<20 | uint32(i)
	}
	return t
}

func testConfig() Config {
	c := DefaultConfig()
	c.TimeScale = 0
	c.Ranks = 2
	c.CapacityBlocks = 64
	return c
}

func newEngine(t testing.TB, c Config) *Engine {
	t.Helper()
	e, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func run(t testing.TB, e *Engine, req engine.Request) engine.Completion {
	t.Helper()
	c, err := e.Run(context.Background(), req, nil)
	if err != nil {
		t.Fatalf("run %s: %v", req.ID, err)
	}
	return c
}

func prefillOf(uncached int) time.Duration {
	c := DefaultConfig()
	return c.prefillTime(uncached)
}

func TestRepeatedPromptHitsItsFullBlockPrefix(t *testing.T) {
	e := newEngine(t, testConfig())
	p := prompt(1, 200)
	first := run(t, e, engine.Request{ID: "a", Prompt: p, MaxTokens: 4})
	second := run(t, e, engine.Request{ID: "b", Prompt: p, MaxTokens: 4})
	if first.CachedTokens != 0 || second.CachedTokens != 192 {
		t.Fatalf("cached tokens %d then %d, want 0 then 192 (3 full blocks of 64)", first.CachedTokens, second.CachedTokens)
	}
	if first.PromptTokens != 200 || second.PromptTokens != 200 {
		t.Fatalf("prompt tokens %d, %d, want 200", first.PromptTokens, second.PromptTokens)
	}
	// Prefill = 10 ms + uncached / 5,500 tok/s.
	if first.Prefill != prefillOf(200) || second.Prefill != prefillOf(8) || second.Prefill >= first.Prefill {
		t.Fatalf("prefill %v then %v, want %v then %v", first.Prefill, second.Prefill, prefillOf(200), prefillOf(8))
	}
	if first.Queue != 0 || second.Queue != 0 {
		t.Fatalf("sequential runs queued: %v, %v", first.Queue, second.Queue)
	}
	// On the other rank nothing is cached.
	other := run(t, e, engine.Request{ID: "c", Rank: 1, Prompt: p, MaxTokens: 1})
	if other.CachedTokens != 0 {
		t.Fatalf("rank 1 reported %d cached tokens of a prompt only rank 0 ran", other.CachedTokens)
	}
}

func TestEvictionUnderPressureLowersHits(t *testing.T) {
	c := testConfig()
	c.CapacityBlocks = 5
	e := newEngine(t, c)
	a := prompt(1, 200) // 3 blocks
	b := prompt(2, 256) // 4 blocks: needs 2 of a's
	run(t, e, engine.Request{ID: "a1", Prompt: a, MaxTokens: 1})
	if got := run(t, e, engine.Request{ID: "a2", Prompt: a, MaxTokens: 1}).CachedTokens; got != 192 {
		t.Fatalf("a again: %d cached, want 192", got)
	}
	run(t, e, engine.Request{ID: "b", Prompt: b, MaxTokens: 1})
	// a's tail blocks went first, so its first block still matches.
	if got := run(t, e, engine.Request{ID: "a3", Prompt: a, MaxTokens: 1}).CachedTokens; got != 64 {
		t.Fatalf("a after pressure: %d cached, want 64 (first block survives)", got)
	}
	if s := e.Stats()[0]; s.Evictions == 0 || s.KVBlocksUsed != 5 || s.KVBlocksTotal != 5 {
		t.Fatalf("stats %+v, want evictions and a full 5-block cache", s)
	}
}

func TestContextOnlyThenGenerationOnlyOnAnotherRank(t *testing.T) {
	e := newEngine(t, testConfig())
	p := prompt(3, 200)
	ctxRun := run(t, e, engine.Request{ID: "ctx", Rank: 0, Prompt: p, MaxTokens: 5, Phase: engine.PhaseContextOnly})
	if ctxRun.CompletionTokens != 1 || ctxRun.Decode != 0 || len(ctxRun.ContextState) == 0 {
		t.Fatalf("context-only: %+v, want 1 token, no decode, a context state", ctxRun)
	}
	want := OutputText(p, 5)
	if !strings.HasPrefix(want, ctxRun.Text) || strings.Contains(ctxRun.Text, " ") {
		t.Fatalf("context-only text %q is not the first word of %q", ctxRun.Text, want)
	}

	// Generation on rank 1: the prompt's KV is not there, all 200 tokens move.
	gen := run(t, e, engine.Request{ID: "gen", Rank: 1, MaxTokens: 5, Phase: engine.PhaseGenerationOnly, ContextState: ctxRun.ContextState})
	if gen.TransferTokens != 200 || gen.CachedTokens != 0 || gen.Transfer != 2*time.Millisecond || gen.Prefill != 0 {
		t.Fatalf("generation-only: %+v, want 200 tokens transferred in 2ms (100k tok/s), no prefill", gen)
	}
	if gen.Text != want || gen.CompletionTokens != 5 || gen.PromptTokens != 200 {
		t.Fatalf("generation text %q (%d tokens), want %q", gen.Text, gen.CompletionTokens, want)
	}
	// The transferred blocks are now resident on rank 1.
	again := run(t, e, engine.Request{ID: "gen2", Rank: 1, Prompt: p, MaxTokens: 2, Phase: engine.PhaseGenerationOnly, ContextState: ctxRun.ContextState})
	if again.TransferTokens != 8 || again.CachedTokens != 192 {
		t.Fatalf("second generation-only: transfer %d cached %d, want 8 and 192", again.TransferTokens, again.CachedTokens)
	}
	// The context rank holds them too (prefill stored them).
	local := run(t, e, engine.Request{ID: "gen3", Rank: 0, MaxTokens: 2, Phase: engine.PhaseGenerationOnly, ContextState: ctxRun.ContextState})
	if local.TransferTokens != 8 {
		t.Fatalf("generation on the context rank transferred %d tokens, want 8", local.TransferTokens)
	}
}

func TestCancelReleasesBlocks(t *testing.T) {
	c := testConfig()
	c.TimeScale = 1 // real time: the request would decode for 25 minutes
	e := newEngine(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := e.Run(ctx, engine.Request{ID: "long", Prompt: prompt(4, 200), MaxTokens: 100_000}, func(engine.Chunk) error {
			once.Do(func() { close(first) })
			return nil
		})
		done <- err
	}()
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("no first token within 10s")
	}
	if s := e.Stats()[0]; s.ActiveRequests != 1 || e.referenced(0) != 3 {
		t.Fatalf("while running: %+v, %d referenced blocks; want 1 active, 3 referenced", s, e.referenced(0))
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if n := e.referenced(0); n != 0 {
		t.Fatalf("%d blocks still referenced after cancel", n)
	}
	s := e.Stats()[0]
	if s.ActiveRequests != 0 || s.ActivePromptTokens != 0 || s.KVBlocksUsed != 3 {
		t.Fatalf("after cancel: %+v, want idle with the 3 blocks still cached", s)
	}
}

func TestCancelOrEmitErrorWithoutWaiting(t *testing.T) {
	e := newEngine(t, testConfig())
	ctx, cancel := context.WithCancel(context.Background())
	_, err := e.Run(ctx, engine.Request{ID: "x", Prompt: prompt(5, 130), MaxTokens: 10}, func(engine.Chunk) error {
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || e.referenced(0) != 0 {
		t.Fatalf("Run = %v with %d referenced, want context.Canceled and none", err, e.referenced(0))
	}
	broken := errors.New("client went away")
	_, err = e.Run(context.Background(), engine.Request{ID: "y", Prompt: prompt(5, 130), MaxTokens: 10}, func(engine.Chunk) error {
		return broken
	})
	if !errors.Is(err, broken) || e.referenced(0) != 0 {
		t.Fatalf("Run = %v with %d referenced, want the emit error and none", err, e.referenced(0))
	}
	if _, err := e.Run(ctx, engine.Request{ID: "z", Prompt: prompt(5, 130), MaxTokens: 1}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run with a done context = %v", err)
	}
}

func TestCloseStopsRunningRequests(t *testing.T) {
	c := testConfig()
	c.TimeScale = 1
	e := newEngine(t, c)
	started := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := e.Run(context.Background(), engine.Request{ID: "long", Prompt: prompt(6, 64), MaxTokens: 100_000}, func(engine.Chunk) error {
			once.Do(func() { close(started) })
			return nil
		})
		done <- err
	}()
	<-started
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("running request after Close: %v, want ErrClosed", err)
	}
	if e.referenced(0) != 0 {
		t.Fatal("blocks still referenced after Close")
	}
	if _, err := e.Run(context.Background(), engine.Request{ID: "late", Prompt: prompt(6, 64), MaxTokens: 1}, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close: %v, want ErrClosed", err)
	}
}

func TestOutputIsDeterministic(t *testing.T) {
	p := prompt(7, 100)
	texts := make([]string, 2)
	for i := range texts {
		e := newEngine(t, testConfig())
		var chunks []string
		c, err := e.Run(context.Background(), engine.Request{ID: "r", Prompt: p, MaxTokens: 12}, func(ch engine.Chunk) error {
			chunks = append(chunks, ch.Text)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(chunks) != 12 || strings.Join(chunks, "") != c.Text || len(strings.Fields(c.Text)) != 12 {
			t.Fatalf("chunks %q do not make text %q of 12 words", chunks, c.Text)
		}
		if c.FinishReason != "length" || c.CompletionTokens != 12 {
			t.Fatalf("finish %q with %d tokens, want length and 12", c.FinishReason, c.CompletionTokens)
		}
		texts[i] = c.Text
	}
	if texts[0] != texts[1] || texts[0] != OutputText(p, 12) {
		t.Fatalf("same prompt gave %q and %q", texts[0], texts[1])
	}
	if OutputText(prompt(8, 100), 12) == texts[0] {
		t.Fatal("a different prompt gave the same text")
	}
}

func TestVirtualRankPrefillIsFIFOAndDecodeOverlaps(t *testing.T) {
	r, err := NewVirtualRank(0, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	a, b := prompt(1, 1100), prompt(2, 1100)
	bs := prefix.DefaultBlockSize
	ra, err := r.Admit(0, VirtualRequest{Hashes: prefix.BlockHashes(a, bs), PromptTokens: len(a), OutputTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := r.Admit(0, VirtualRequest{Hashes: prefix.BlockHashes(b, bs), PromptTokens: len(b), OutputTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	if ra.Queue != 0 || ra.Prefill != prefillOf(1100) || ra.TTFT != ra.Prefill {
		t.Fatalf("first arrival: %+v", ra)
	}
	if rb.StartAt != ra.FirstTokenAt || rb.Queue != ra.Prefill || rb.TTFT != ra.Prefill+rb.Prefill {
		t.Fatalf("second arrival start %v queue %v, want to wait for the first's prefill (%v)", rb.StartAt, rb.Queue, ra.Prefill)
	}
	// Decode is not FIFO: b prefills while a decodes, and both finish
	// long before two back-to-back decodes would.
	if !(rb.StartAt < ra.DoneAt) || rb.DoneAt != rb.FirstTokenAt+49*rb.TokenTime {
		t.Fatalf("decode: a done %v, b start %v, b done %v", ra.DoneAt, rb.StartAt, rb.DoneAt)
	}
	if s := r.Stats(0); s.ActiveRequests != 1 || s.QueuedRequests != 1 || s.ActivePromptTokens != 2200 {
		t.Fatalf("stats at 0: %+v, want 1 active, 1 queued, 2200 tokens", s)
	}
	// A sibling with a's prompt arriving at once finds a's blocks: they
	// were stored when a's prefill began.
	rc, err := r.Admit(0, VirtualRequest{Hashes: prefix.BlockHashes(a, bs), PromptTokens: len(a), OutputTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	if rc.CachedTokens != 1088 || rc.StartAt != rb.FirstTokenAt {
		t.Fatalf("sibling: cached %d start %v, want 1088 after b's prefill %v", rc.CachedTokens, rc.StartAt, rb.FirstTokenAt)
	}
	// Once everything is done, a new arrival does not queue.
	late := rb.DoneAt + time.Second
	rd, err := r.Admit(late, VirtualRequest{Hashes: prefix.BlockHashes(b, bs), PromptTokens: len(b), OutputTokens: 1})
	if err != nil || rd.Queue != 0 || rd.CachedTokens != 1088 {
		t.Fatalf("late arrival: %+v %v", rd, err)
	}
	if s := r.Stats(late + time.Minute); s.ActiveRequests+s.QueuedRequests != 0 || r.Referenced() != 0 {
		t.Fatalf("after all done: %+v, %d referenced", s, r.Referenced())
	}
	if _, err := r.Admit(late-1, VirtualRequest{PromptTokens: 1, OutputTokens: 1}); !errors.Is(err, ErrTimeWentBackwards) {
		t.Fatalf("admit in the past: %v", err)
	}
}

func TestVirtualRankWaitsForKVSpace(t *testing.T) {
	c := testConfig()
	c.CapacityBlocks = 4
	r, err := NewVirtualRank(0, c)
	if err != nil {
		t.Fatal(err)
	}
	a := prefix.BlockHashes(prompt(1, 256), 64)
	b := prefix.BlockHashes(prompt(2, 256), 64)
	ra, err := r.Admit(0, VirtualRequest{Hashes: a, PromptTokens: 256, OutputTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := r.Admit(0, VirtualRequest{Hashes: b, PromptTokens: 256, OutputTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	if rb.StartAt != ra.DoneAt || len(rb.Removed) != 4 {
		t.Fatalf("b started at %v (removed %d), want at a's completion %v evicting a's 4 blocks", rb.StartAt, len(rb.Removed), ra.DoneAt)
	}
	big := prefix.BlockHashes(prompt(3, 320), 64)
	if _, err := r.Admit(rb.DoneAt, VirtualRequest{Hashes: big, PromptTokens: 320, OutputTokens: 1}); !errors.Is(err, ErrPromptTooLarge) {
		t.Fatalf("5 blocks on a 4-block rank: %v, want ErrPromptTooLarge", err)
	}
	if _, err := r.Admit(rb.DoneAt, VirtualRequest{Hashes: a, PromptTokens: 256}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("0 output tokens: %v, want ErrInvalidRequest", err)
	}
}

func TestDecodeSlowsWithKVOccupancy(t *testing.T) {
	c := testConfig()
	c.CapacityBlocks = 10
	r, err := NewVirtualRank(0, c)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Admit(0, VirtualRequest{Hashes: prefix.BlockHashes(prompt(1, 320), 64), PromptTokens: 320, OutputTokens: 11})
	if err != nil {
		t.Fatal(err)
	}
	// 5 of 10 blocks used: 15 ms × (1 + 0.5 × 0.5).
	want := time.Duration(float64(15*time.Millisecond) * 1.25)
	if res.TokenTime != want || res.Decode != 10*want {
		t.Fatalf("token time %v decode %v, want %v and %v", res.TokenTime, res.Decode, want, 10*want)
	}
}

func TestStatsWindowRolls(t *testing.T) {
	r, err := NewVirtualRank(0, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	h := prefix.BlockHashes(prompt(1, 200), 64)
	for _, at := range []time.Duration{0, 10 * time.Second} {
		if _, err := r.Admit(at, VirtualRequest{Hashes: h, PromptTokens: 200, OutputTokens: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if s := r.Stats(20 * time.Second); s.WindowLookupTokens != 400 || s.WindowHitTokens != 192 {
		t.Fatalf("window at 20s: lookups %d hits %d, want 400 and 192", s.WindowLookupTokens, s.WindowHitTokens)
	}
	if s := r.Stats(65 * time.Second); s.WindowLookupTokens != 200 || s.WindowHitTokens != 192 {
		t.Fatalf("window at 65s: lookups %d hits %d, want only the 10s request", s.WindowLookupTokens, s.WindowHitTokens)
	}
	if s := r.Stats(200 * time.Second); s.WindowLookupTokens != 0 || s.WindowHitTokens != 0 {
		t.Fatalf("window at 200s: %+v, want empty", s)
	}
}

func TestEngineStatsAndKVEvents(t *testing.T) {
	c := testConfig()
	c.CapacityBlocks = 4
	e := newEngine(t, c)
	var events []engine.KVEvent
	e.SetKVEventSink(func(ev engine.KVEvent) { events = append(events, ev) })
	p := prompt(1, 200)
	run(t, e, engine.Request{ID: "1", Prompt: p, MaxTokens: 3})
	run(t, e, engine.Request{ID: "2", Prompt: p, MaxTokens: 3})
	if len(events) != 1 || events[0].Rank != 0 || !slices.Equal(events[0].Stored, prefix.BlockHashes(p, 64)) || events[0].Removed != nil {
		t.Fatalf("events %+v, want one storing the prompt's 3 blocks", events)
	}
	q := prompt(2, 128)
	run(t, e, engine.Request{ID: "3", Prompt: q, MaxTokens: 1})
	last := events[len(events)-1]
	if len(events) != 2 || !slices.Equal(last.Stored, prefix.BlockHashes(q, 64)) || !slices.Equal(last.Removed, prefix.BlockHashes(p, 64)[2:]) {
		t.Fatalf("eviction event %+v, want q's blocks stored and p's last block removed", last)
	}
	s := e.Stats()
	if len(s) != 2 || s[0].WindowLookupTokens != 528 || s[0].WindowHitTokens != 192 || s[0].KVBlocksUsed != 4 || s[1].KVBlocksUsed != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestConcurrentEventsArriveInCacheOrder replays the KV events of concurrent
// runs and checks they rebuild exactly the rank's resident blocks.
func TestConcurrentEventsArriveInCacheOrder(t *testing.T) {
	c := testConfig()
	c.CapacityBlocks = 12
	c.Ranks = 1
	e := newEngine(t, c)
	var mu sync.Mutex
	resident := map[uint64]bool{}
	e.SetKVEventSink(func(ev engine.KVEvent) {
		e.Stats() // the sink may call back into the engine
		mu.Lock()
		defer mu.Unlock()
		for _, h := range ev.Removed {
			if !resident[h] {
				t.Errorf("removed %x before it was stored", h)
			}
			delete(resident, h)
		}
		for _, h := range ev.Stored {
			resident[h] = true
		}
	})
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				p := prompt(uint32((g*7+i)%9), 64*(1+(g+i)%3))
				if _, err := e.Run(context.Background(), engine.Request{ID: "r", Prompt: p, MaxTokens: 2}, nil); err != nil {
					t.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	e.ranks[0].mu.Lock()
	defer e.ranks[0].mu.Unlock()
	vr := e.ranks[0].vr
	if vr.cache.Used() != len(resident) || vr.Referenced() != 0 {
		t.Fatalf("cache holds %d blocks (%d referenced), events say %d", vr.cache.Used(), vr.Referenced(), len(resident))
	}
	for h := range resident {
		if !vr.Contains(h) {
			t.Fatalf("events say %x is resident; the cache disagrees", h)
		}
	}
}

func TestInvalidInputIsRejected(t *testing.T) {
	e := newEngine(t, testConfig())
	ok := run(t, e, engine.Request{ID: "ctx", Prompt: prompt(1, 130), MaxTokens: 1, Phase: engine.PhaseContextOnly})
	bad := []engine.Request{
		{ID: "rank", Rank: 2, Prompt: prompt(1, 10), MaxTokens: 1},
		{ID: "neg", Rank: -1, Prompt: prompt(1, 10), MaxTokens: 1},
		{ID: "max", Prompt: prompt(1, 10), MaxTokens: 0},
		{ID: "phase", Prompt: prompt(1, 10), MaxTokens: 1, Phase: 9},
		{ID: "nostate", MaxTokens: 1, Phase: engine.PhaseGenerationOnly},
		{ID: "garbage", MaxTokens: 1, Phase: engine.PhaseGenerationOnly, ContextState: []byte("not a state")},
		{ID: "mismatch", Prompt: prompt(2, 130), MaxTokens: 1, Phase: engine.PhaseGenerationOnly, ContextState: ok.ContextState},
	}
	// Every truncation and a version bump of a valid state are rejected.
	for i := 0; i < len(ok.ContextState); i++ {
		bad = append(bad, engine.Request{ID: "trunc", MaxTokens: 1, Phase: engine.PhaseGenerationOnly, ContextState: ok.ContextState[:i]})
	}
	v2 := slices.Clone(ok.ContextState)
	v2[4] = 2
	bad = append(bad, engine.Request{ID: "v2", MaxTokens: 1, Phase: engine.PhaseGenerationOnly, ContextState: v2})
	for _, req := range bad {
		if _, err := e.Run(context.Background(), req, nil); !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("request %s (%d-byte state): %v, want ErrInvalidRequest", req.ID, len(req.ContextState), err)
		}
	}
	small := testConfig()
	small.BlockSize = 32
	e2 := newEngine(t, small)
	if _, err := e2.Run(context.Background(), engine.Request{ID: "bs", MaxTokens: 1, Phase: engine.PhaseGenerationOnly, ContextState: ok.ContextState}, nil); !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "block size") {
		t.Fatalf("state from another block size: %v", err)
	}
	if _, err := e.Run(context.Background(), engine.Request{ID: "huge", Prompt: prompt(3, 64*65), MaxTokens: 1}, nil); !errors.Is(err, ErrPromptTooLarge) {
		t.Fatalf("prompt larger than the rank: %v, want ErrPromptTooLarge", err)
	}
	for _, c := range []Config{{DecodeSlowdown: -1}, {TimeScale: -1}, {Ranks: -2}, {PrefillTokensPerSec: -5}} {
		if _, err := New(c); err == nil {
			t.Fatalf("config %+v accepted", c)
		}
	}
}

func TestConcurrentRunsOnSeveralRanks(t *testing.T) {
	c := testConfig()
	c.Ranks = 3
	c.TimeScale = 0.0001 // real waiting, 10,000× faster
	// The hit window is engine time: at this scale the default 60 s is 6 ms of
	// wall time, which a slow machine spends between the last run and Stats.
	c.StatsWindow = 100_000 * time.Hour
	e := newEngine(t, c)
	var wg sync.WaitGroup
	shared := prompt(1, 640)
	for g := 0; g < 9; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				p := append(slices.Clone(shared), prompt(uint32(10+g), 64*(i+1))...)
				comp, err := e.Run(context.Background(), engine.Request{ID: "r", Rank: g % 3, Prompt: p, MaxTokens: 8}, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if comp.CompletionTokens != 8 || comp.Text != OutputText(p, 8) {
					t.Errorf("run %d/%d: %+v", g, i, comp)
				}
			}
		}(g)
	}
	wg.Wait()
	for r, s := range e.Stats() {
		if s.ActiveRequests+s.QueuedRequests != 0 || e.referenced(r) != 0 || s.WindowHitTokens == 0 {
			t.Fatalf("rank %d after all runs: %+v (referenced %d), want idle with hits", r, s, e.referenced(r))
		}
	}
}

// referenced is rank r's number of blocks held by running requests.
func (e *Engine) referenced(r int) int {
	rd := e.ranks[r]
	rd.mu.Lock()
	defer rd.mu.Unlock()
	return rd.vr.Referenced()
}

// BenchmarkVirtualAdmit replays agentic turns on one virtual rank: 16
// conversations sharing a 300-block system prefix, each turn adding 4 blocks,
// in a 4,096-block cache (evictions once warm).
func BenchmarkVirtualAdmit(b *testing.B) {
	c := DefaultConfig()
	c.CapacityBlocks = 4096
	r, err := NewVirtualRank(0, c)
	if err != nil {
		b.Fatal(err)
	}
	sys := prompt(1, 300*64)
	convs := make([][]uint32, 16)
	for i := range convs {
		convs[i] = slices.Clone(sys)
	}
	type turn struct {
		hashes []uint64
		tokens int
	}
	turns := make([]turn, 0, 1024)
	for i := 0; len(turns) < cap(turns); i++ {
		k := i % len(convs)
		convs[k] = append(convs[k], prompt(uint32(100+k), 256)...)
		if len(convs[k]) > 2000*64 {
			convs[k] = slices.Clone(sys)
		}
		turns = append(turns, turn{prefix.BlockHashes(convs[k], 64), len(convs[k])})
	}
	b.ReportAllocs()
	b.ResetTimer()
	var now time.Duration
	for i := 0; i < b.N; i++ {
		t := turns[i%len(turns)]
		now += 200 * time.Millisecond
		if _, err := r.Admit(now, VirtualRequest{Hashes: t.hashes, PromptTokens: t.tokens, OutputTokens: 100}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/admit")
}

// BenchmarkEngineRun is the whole Run path without waiting (TimeScale 0):
// tokenized 2,000-token prompt, block hashing, admission, 16 output tokens.
func BenchmarkEngineRun(b *testing.B) {
	c := DefaultConfig()
	c.TimeScale = 0
	e := newEngine(b, c)
	p := prompt(1, 2000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := e.Run(context.Background(), engine.Request{ID: "b", Prompt: p, MaxTokens: 16}, func(engine.Chunk) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/run")
}
