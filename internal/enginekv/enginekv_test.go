package enginekv_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/kvevents"
)

func toks(n, base int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

func TestDecodeVLLMBothLayouts(t *testing.T) {
	in := enginekv.Batch{TS: 12.5, DPRank: 3, Events: []enginekv.Event{
		{Kind: enginekv.Stored, Hashes: []enginekv.Hash{enginekv.IntHash(7), enginekv.BytesHash([]byte{1, 2, 3})}, Parent: enginekv.IntHash(uint64(1<<63 + 5)), HasParent: true, Tokens: toks(8, 100), BlockSize: 4},
		{Kind: enginekv.Removed, Hashes: []enginekv.Hash{enginekv.IntHash(7)}},
		{Kind: enginekv.Cleared},
	}}
	for _, layout := range []kvevents.Layout{kvevents.LayoutMap, kvevents.LayoutArray} {
		data, err := kvevents.EncodeVLLM(in, layout)
		if err != nil {
			t.Fatal(err)
		}
		got, err := enginekv.DecodeVLLM(data)
		if err != nil {
			t.Fatalf("layout %d: %v", layout, err)
		}
		if got.TS != in.TS || got.DPRank != 3 || len(got.Events) != 3 {
			t.Fatalf("layout %d: batch = %+v", layout, got)
		}
		s := got.Events[0]
		if s.Kind != enginekv.Stored || !slices.Equal(s.Hashes, in.Events[0].Hashes) || s.Parent != in.Events[0].Parent || !s.HasParent ||
			!slices.Equal(s.Tokens, in.Events[0].Tokens) || s.BlockSize != 4 || s.Foreign || s.Offloaded() {
			t.Fatalf("layout %d: stored = %+v", layout, s)
		}
		if got.Events[1].Kind != enginekv.Removed || got.Events[1].Hashes[0] != enginekv.IntHash(7) || got.Events[2].Kind != enginekv.Cleared {
			t.Fatalf("layout %d: events = %+v", layout, got.Events)
		}
	}
}

// TestDecodeVLLMFieldOrder pins the array_like field order of
// vllm/distributed/kv_events.py (and SGLang's older, shorter form), with
// fields newer engines append.
func TestDecodeVLLMFieldOrder(t *testing.T) {
	sglang, _ := msgpack.Marshal([]any{1.0, []any{
		[]any{"BlockStored", []any{int64(-9)}, nil, []any{1, 2}, 2, nil},
		[]any{"BlockRemoved", []any{int64(-9)}},
	}})
	b, err := enginekv.DecodeVLLM(sglang)
	if err != nil {
		t.Fatal(err)
	}
	if b.DPRank != -1 || b.Events[0].Hashes[0] != enginekv.IntHash(uint64(1<<64-9+0*1)) || b.Events[0].HasParent || b.Events[1].Kind != enginekv.Removed {
		t.Fatalf("sglang batch = %+v", b)
	}
	vllm, _ := msgpack.Marshal([]any{1.0, []any{
		[]any{"BlockStored", []any{[]byte("h1")}, []byte("h0"), []any{1, 2}, 2, nil, "GPU", "my-lora", []any{nil}, 0, "full", nil, "future-field"},
		[]any{"BlockStored", []any{[]byte("h2")}, nil, []any{1, 2}, 2, nil, "CPU", nil},
		[]any{"BlockRemoved", []any{[]byte("h1")}, "GPU", 1},
	}, 0})
	b, err = enginekv.DecodeVLLM(vllm)
	if err != nil {
		t.Fatal(err)
	}
	if b.Events[0].Foreign || b.Events[0].LoRAName != "my-lora" || b.Events[0].Parent != enginekv.BytesHash([]byte("h0")) || b.DPRank != 0 {
		t.Fatalf("a lora_name block is keyed under its adapter: %+v", b.Events[0])
	}
	if b.Events[1].Medium != "CPU" || b.Events[2].Group != 1 || b.Events[0].SpecKind != "full" {
		t.Fatalf("medium CPU must be offloaded, group_idx and kv_cache_spec_kind read: %+v", b.Events)
	}
}

func TestDecodeVLLMRejectsGarbage(t *testing.T) {
	// Messages that are no batch at all are an error.
	bad := [][]byte{
		nil,
		{0xc1},
		mustMsgpack(t, "hello"),
		mustMsgpack(t, []any{1.0}),
	}
	for i, data := range bad {
		if _, err := enginekv.DecodeVLLM(data); err == nil {
			t.Errorf("case %d: want an error", i)
		}
	}
	// An event that does not decode is skipped with its reason; the
	// batch's other events decode.
	good := []any{"BlockRemoved", []any{7}}
	events := []struct {
		ev     any
		reason string
	}{
		{[]any{"Nope"}, enginekv.SkipUnknownEvent},
		{[]any{"BlockStored", []any{1.5}, nil, []any{}, 1, nil}, enginekv.SkipMalformedEvent},
		{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1, nil}, enginekv.SkipMalformedEvent},
		{[]any{"BlockStored", []any{1}, nil, []any{1}, 0, nil}, enginekv.SkipMalformedEvent},
		{map[string]any{"block_hashes": []any{}}, enginekv.SkipMalformedEvent},
	}
	for i, c := range events {
		b, err := enginekv.DecodeVLLM(mustMsgpack(t, []any{1.0, []any{good, c.ev, good}}))
		if err != nil {
			t.Fatalf("event case %d: %v", i, err)
		}
		if len(b.Events) != 2 || len(b.Skipped) != 1 || b.Skipped[0].Index != 1 || b.Skipped[0].Reason != c.reason {
			t.Errorf("event case %d: events %+v, skipped %+v (want the two good ones, event 1 skipped as %s)", i, b.Events, b.Skipped, c.reason)
		}
	}
}

func mustMsgpack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMapperFollowsParentChains(t *testing.T) {
	const bs = 4
	prompt := toks(4*bs, 1000)
	want := prefix.BlockHashes(prompt, bs)
	m := enginekv.NewMapper(bs, 0)
	// The engine stores the prompt's blocks in two events, the second
	// naming the first's last block as parent.
	s1, r1 := m.Apply(enginekv.Event{Kind: enginekv.Stored, Hashes: []enginekv.Hash{enginekv.IntHash(1), enginekv.IntHash(2)}, Tokens: prompt[:2*bs], BlockSize: bs})
	s2, _ := m.Apply(enginekv.Event{Kind: enginekv.Stored, Hashes: []enginekv.Hash{enginekv.IntHash(3), enginekv.IntHash(4)}, Parent: enginekv.IntHash(2), HasParent: true, Tokens: prompt[2*bs:], BlockSize: bs})
	if len(r1) != 0 || !slices.Equal(append(s1, s2...), want) {
		t.Fatalf("stored keys = %x, want the edge's block hashes %x", append(s1, s2...), want)
	}
	// A replayed store changes nothing.
	if s, r := m.Apply(enginekv.Event{Kind: enginekv.Stored, Hashes: []enginekv.Hash{enginekv.IntHash(1)}, Tokens: prompt[:bs], BlockSize: bs}); len(s)+len(r) != 0 {
		t.Fatalf("re-store: %x %x", s, r)
	}
	// A second engine block with the same tokens and parent (two KV groups,
	// say) shares the key: removing one keeps the key.
	m.Apply(enginekv.Event{Kind: enginekv.Stored, Hashes: []enginekv.Hash{enginekv.BytesHash([]byte("dup"))}, Tokens: prompt[:bs], BlockSize: bs})
	if _, r := m.Apply(enginekv.Event{Kind: enginekv.Removed, Hashes: []enginekv.Hash{enginekv.IntHash(1)}}); len(r) != 0 {
		t.Fatalf("key still held by another block was removed: %x", r)
	}
	if _, r := m.Apply(enginekv.Event{Kind: enginekv.Removed, Hashes: []enginekv.Hash{enginekv.BytesHash([]byte("dup")), enginekv.IntHash(99)}}); !slices.Equal(r, want[:1]) {
		t.Fatalf("removed = %x, want %x", r, want[:1])
	}
	// Unknown parent, other block size, LoRA: not announced, counted.
	m.Apply(enginekv.Event{Kind: enginekv.Stored, Hashes: []enginekv.Hash{enginekv.IntHash(50)}, Parent: enginekv.IntHash(49), HasParent: true, Tokens: toks(bs, 0), BlockSize: bs})
	m.Apply(enginekv.Event{Kind: enginekv.Stored, Hashes: []enginekv.Hash{enginekv.IntHash(51)}, Tokens: toks(8, 0), BlockSize: 8})
	m.Apply(enginekv.Event{Kind: enginekv.Stored, Hashes: []enginekv.Hash{enginekv.IntHash(52)}, Tokens: toks(bs, 0), BlockSize: bs, Foreign: true})
	m.Apply(enginekv.Event{Kind: enginekv.Stored, Hashes: []enginekv.Hash{enginekv.IntHash(53)}, Tokens: toks(3, 0), BlockSize: bs})
	st := m.Stats()
	if st.Orphans != 1 || st.SizeMismatch != 1 || st.Foreign != 1 || st.Malformed != 1 {
		t.Fatalf("stats = %+v", st)
	}
	_, cleared := m.Apply(enginekv.Event{Kind: enginekv.Cleared})
	slices.Sort(cleared)
	rest := slices.Clone(want[1:])
	slices.Sort(rest)
	if !slices.Equal(cleared, rest) || m.Len() != 0 {
		t.Fatalf("cleared %x, want %x", cleared, rest)
	}
}

func TestMapperBound(t *testing.T) {
	m := enginekv.NewMapper(1, 2)
	s, _ := m.Apply(enginekv.Event{Kind: enginekv.Stored, Hashes: []enginekv.Hash{enginekv.IntHash(1), enginekv.IntHash(2), enginekv.IntHash(3)}, Tokens: toks(3, 0), BlockSize: 1})
	if len(s) != 2 || m.Len() != 2 || m.Stats().Overflow != 1 {
		t.Fatalf("stored %d, len %d, stats %+v", len(s), m.Len(), m.Stats())
	}
}

// recorder is a Handler that records what it receives.
type recorder struct {
	mu      sync.Mutex
	seqs    []uint64
	batches []enginekv.Batch
	resets  []string
	changed chan struct{}
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{}, 1)} }

func (r *recorder) Batch(seq uint64, b enginekv.Batch) {
	r.mu.Lock()
	r.seqs = append(r.seqs, seq)
	r.batches = append(r.batches, b)
	r.mu.Unlock()
	r.poke()
}

func (r *recorder) Reset(reason string) {
	r.mu.Lock()
	r.resets = append(r.resets, reason)
	r.mu.Unlock()
	r.poke()
}

func (r *recorder) poke() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// waitFor calls cond until it holds (under the recorder's lock), calling
// nudge on each tick (the publisher's slow-joiner: messages sent before
// the subscription is in place are lost).
func (r *recorder) waitFor(t *testing.T, what string, nudge func(), cond func() bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-deadline:
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("timed out waiting for %s; seqs %v, resets %q", what, r.seqs, r.resets)
		case <-r.changed:
		case <-tick.C:
			if nudge != nil {
				nudge()
			}
		}
	}
}

func TestSubscriberReplaysGapsAndResetsOnRestart(t *testing.T) {
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { pub.Close() }()
	sub, err := enginekv.NewSubscriber(enginekv.SubscriberConfig{Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Topic: "kv"})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx, rec) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	empty := enginekv.Batch{TS: 1, DPRank: -1}
	published := 0 // the nudges sent (each one batch of the stream)
	nudge := func() {
		if pub.Publish(empty) == nil {
			published++
		}
	}
	rec.waitFor(t, "the first batch", nudge, func() bool { return len(rec.seqs) > 0 })
	// Nudges sent before the first arrived may still be on their way: the
	// gap below is counted from the last of them.
	rec.waitFor(t, "every nudge", nil, func() bool { return len(rec.seqs) >= published })
	rec.mu.Lock()
	// Batches published before the subscription took hold were replayed:
	// the stream is seen whole from 0.
	for i, s := range rec.seqs {
		if s != uint64(i) {
			t.Fatalf("seqs = %v, want 0.. without holes", rec.seqs)
		}
	}
	if len(rec.resets) != 0 {
		t.Fatalf("resets on a fresh start: %q", rec.resets)
	}
	n := len(rec.seqs)
	rec.mu.Unlock()

	// A lost message is filled from the replay socket, in order.
	lost := enginekv.Batch{TS: 2, DPRank: -1, Events: []enginekv.Event{{Kind: enginekv.Removed, Hashes: []enginekv.Hash{enginekv.IntHash(42)}}}}
	if err := pub.Skip(lost); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(empty); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "the gap filled", nil, func() bool { return len(rec.seqs) >= n+2 })
	rec.mu.Lock()
	if rec.seqs[n] != uint64(n) || rec.seqs[n+1] != uint64(n+1) || len(rec.resets) != 0 || rec.batches[n].Events[0].Hashes[0] != enginekv.IntHash(42) {
		t.Fatalf("after a gap: seqs %v, resets %q", rec.seqs, rec.resets)
	}
	rec.mu.Unlock()

	// The engine restarts on the same port: its sequence starts over; the
	// subscriber reconnects and resets.
	ep, rep := strings.TrimPrefix(pub.Endpoint(), ""), pub.ReplayEndpoint()
	pub.Close()
	pub, err = kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: ep, ReplayEndpoint: rep, Topic: "kv"})
	if err != nil {
		t.Fatalf("restart publisher on %s: %v", ep, err)
	}
	rec.waitFor(t, "a reset after the restart", func() { pub.Publish(empty) }, func() bool { return len(rec.resets) > 0 })
}

func TestPollerDrainsTRTLLMEvents(t *testing.T) {
	var mu sync.Mutex
	var queue []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/kv_cache_events" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprint(w, "["+strings.Join(queue, ",")+"]")
		queue = nil
	}))
	defer srv.Close()
	tok := func(ids ...int) string {
		var s []string
		for _, id := range ids {
			s = append(s, fmt.Sprintf(`{"type":"unique_token","token_id":%d,"token_extra_id":0}`, id))
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	push := func(evs ...string) {
		mu.Lock()
		queue = append(queue, evs...)
		mu.Unlock()
	}
	// Hashes above 2^53 must survive JSON.
	push(`{"event_id":0,"data":{"type":"created","num_blocks_per_cache_level":[100,0]},"window_size":64}`,
		`{"event_id":1,"data":{"type":"stored","parent_hash":null,"blocks":[{"type":"stored_block","block_hash":18446744073709551615,"tokens":`+tok(1, 2)+`,"cache_level":0,"priority":35}]},"window_size":64}`,
		`{"event_id":2,"data":{"type":"stored","parent_hash":18446744073709551615,"blocks":[{"type":"stored_block","block_hash":5,"tokens":`+tok(3, 4)+`,"cache_level":0,"priority":35}]},"window_size":64,"attention_dp_rank":0}`,
		`{"event_id":3,"data":{"type":"updated","block_hash":5,"cache_level":null,"priority":{"type":"event_diff","new_value":50,"old_value":35}},"window_size":64}`)
	var got []enginekv.RankKeys
	offloaded := func() map[uint64]bool {
		held := map[uint64]bool{}
		for _, ev := range got {
			for _, h := range ev.OffloadedRemoved {
				delete(held, h)
			}
			for _, h := range ev.OffloadedStored {
				held[h] = true
			}
		}
		return held
	}
	var gotMu sync.Mutex
	changed := make(chan struct{}, 1)
	src, err := enginekv.Start(enginekv.Config{Format: enginekv.FormatTRTLLM, URLs: []string{srv.URL}, PollInterval: 10 * time.Millisecond, Ranks: 1, BlockSize: 2, Log: testLog(t)}, func(ev enginekv.RankKeys) {
		gotMu.Lock()
		got = append(got, ev)
		gotMu.Unlock()
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	want := prefix.BlockHashes([]uint32{1, 2, 3, 4}, 2)
	wait := func(what string, cond func([]uint64) bool) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			gotMu.Lock()
			held := map[uint64]bool{}
			for _, ev := range got {
				for _, h := range ev.Removed {
					delete(held, h)
				}
				for _, h := range ev.Stored {
					held[h] = true
				}
			}
			gotMu.Unlock()
			var keys []uint64
			for k := range held {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if cond(keys) {
				return
			}
			select {
			case <-changed:
			case <-deadline:
				t.Fatalf("timed out waiting for %s; held %x", what, keys)
			}
		}
	}
	sorted := slices.Clone(want)
	slices.Sort(sorted)
	wait("both blocks", func(k []uint64) bool { return slices.Equal(k, sorted) })
	// A block offloaded to the host level (KVCacheUpdatedData cache_level
	// 0 → 1) leaves the GPU tier for the offloaded one; back (1 → 0), it
	// returns.
	level := func(id, from, to int) string {
		return fmt.Sprintf(`{"event_id":%d,"data":{"type":"updated","block_hash":5,"cache_level":{"type":"event_diff","new_value":%d,"old_value":%d},"priority":null},"window_size":64}`, id, to, from)
	}
	push(level(4, 0, 1))
	wait("the offload", func(k []uint64) bool {
		gotMu.Lock()
		defer gotMu.Unlock()
		return slices.Equal(k, want[:1]) && offloaded()[want[1]]
	})
	push(level(5, 1, 0))
	wait("the onboard", func(k []uint64) bool {
		gotMu.Lock()
		defer gotMu.Unlock()
		return slices.Equal(k, sorted) && len(offloaded()) == 0
	})
	push(level(6, 0, 1), `{"event_id":7,"data":{"type":"removed","block_hashes":[5]},"window_size":64}`)
	wait("the removal", func(k []uint64) bool {
		gotMu.Lock()
		defer gotMu.Unlock()
		return slices.Equal(k, want[:1]) && len(offloaded()) == 0
	})
	// Elements that do not decode are skipped and counted; the rest of the
	// answer applies and nothing is reset.
	push(`{"event_id":8,"data":{"type":"stored","parent_hash":null,"blocks":[{"block_hash":"not a number","tokens":[]}]},"window_size":64}`,
		`{"event_id":9,"data":{"type":"teleported"},"window_size":64}`,
		`"not an event"`,
		`{"event_id":11,"data":{"type":"stored","parent_hash":18446744073709551615,"blocks":[{"type":"stored_block","block_hash":5,"tokens":`+tok(3, 4)+`,"cache_level":0,"priority":35}]},"window_size":64}`)
	wait("the store after the undecodable elements", func(k []uint64) bool { return slices.Equal(k, sorted) })
	if st := src.Status()[0]; st.Resets != 0 || st.Undecodable[enginekv.SkipMalformedEvent] != 2 || st.Undecodable[enginekv.SkipUnknownEvent] != 1 {
		t.Fatalf("status %+v: want no reset, 2 malformed and 1 unknown event", st)
	}
	push(`{"event_id":12,"data":{"type":"removed","block_hashes":[5]},"window_size":64}`)
	wait("the removal", func(k []uint64) bool { return slices.Equal(k, want[:1]) })
	// An id gap (events lost) resets the rank.
	push(`{"event_id":19,"data":{"type":"removed","block_hashes":[]},"window_size":64}`)
	wait("the reset", func(k []uint64) bool { return len(k) == 0 })
	// The reset is delivered before the batch that revealed the gap.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st := src.Status()
		if len(st) == 1 && st[0].Resets == 1 && st[0].LastSeq == 19 && st[0].HaveSeq {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status = %+v, want one reset and event 9 applied", st)
		}
	}
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func TestOffsetEndpoint(t *testing.T) {
	for _, c := range []struct {
		in   string
		r    int
		want string
	}{
		{"tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp://*:5557", 3, "tcp://*:5560"},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558"},
		{"tcp://127.0.0.1:0", 5, "tcp://127.0.0.1:0"},
		{"ipc:///tmp/kv", 2, "ipc:///tmp/kv_dp2"},
	} {
		got, err := enginekv.OffsetEndpoint(c.in, c.r)
		if err != nil || got != c.want {
			t.Errorf("OffsetEndpoint(%q, %d) = %q, %v; want %q", c.in, c.r, got, err, c.want)
		}
	}
	for _, bad := range []string{"tcp://host", "tcp://h:x", "tcp://h:65535", "http://h:1", ""} {
		if _, err := enginekv.OffsetEndpoint(bad, 1); err == nil {
			t.Errorf("OffsetEndpoint(%q, 1): want an error", bad)
		}
	}
}

// A hybrid model's pools have their own hashes: only the full-attention
// pool's blocks are announced, wherever vLLM puts it among its groups, and
// only as far as a prefix hit can end (vLLM's HybridKVCacheCoordinator
// needs every group to hit): a block the sliding-window pool holds too is
// an end, and the blocks before an end lead to it. A sliding-window
// eviction of an older block keeps the chain (it still leads to the end);
// one of the end withdraws the chain; the full-attention pool's eviction
// of the end withdraws what led only to it.
func TestMapperAnnouncesWhereAHybridHitCanEnd(t *testing.T) {
	const bs = 2
	m := enginekv.NewMapper(bs, 0)
	h := []enginekv.Hash{enginekv.IntHash(1), enginekv.IntHash(2)}
	toks := []uint32{1, 2, 3, 4}
	keys := prefix.BlockHashes(toks, bs)
	stored := func(group int, kind string, hs []enginekv.Hash, tk []uint32, parent bool) enginekv.Event {
		ev := enginekv.Event{Kind: enginekv.Stored, Hashes: hs, Tokens: tk, BlockSize: bs, Group: group, SpecKind: kind}
		if parent {
			ev.Parent, ev.HasParent = h[0], true
		}
		return ev
	}
	removed := func(group int, hs ...enginekv.Hash) enginekv.Event {
		return enginekv.Event{Kind: enginekv.Removed, Hashes: hs, Group: group}
	}
	sorted := func(k []uint64) []uint64 { k = slices.Clone(k); slices.Sort(k); return k }
	if s, _ := m.Apply(stored(0, "sliding_window", h, toks, false)); len(s) != 0 {
		t.Fatalf("a sliding-window group announced %v", s)
	}
	if s, _ := m.Apply(stored(1, "full_attention", h, toks, false)); !slices.Equal(sorted(s), sorted(keys)) {
		t.Fatalf("the full-attention group announced %v, want %v", s, keys)
	}
	if _, r := m.Apply(removed(0, h[0])); len(r) != 0 {
		t.Fatalf("the window's older block left and %v was withdrawn; the chain still ends at block 2", r)
	}
	if _, r := m.Apply(removed(0, h[1])); !slices.Equal(sorted(r), sorted(keys)) {
		t.Fatalf("the window's end left: withdrawn %v, want %v (no hit can end in the chain)", r, keys)
	}
	if s, _ := m.Apply(stored(0, "sliding_window", h[1:], toks[bs:], true)); !slices.Equal(sorted(s), sorted(keys)) {
		t.Fatalf("the end is back: announced %v, want %v", s, keys)
	}
	if _, r := m.Apply(removed(1, h[1])); !slices.Equal(sorted(r), sorted(keys)) {
		t.Fatalf("the full-attention pool evicted the end: withdrawn %v, want %v", r, keys)
	}
	// A mamba pool gates as well: its state at a block makes it an end.
	m2 := enginekv.NewMapper(bs, 0)
	m2.Apply(stored(1, "mamba", h[1:], toks[bs:], false))
	if s, _ := m2.Apply(stored(0, "full_attention", h, toks, false)); !slices.Equal(sorted(s), sorted(keys)) {
		t.Fatalf("a chain ending where the mamba state is: announced %v, want %v", s, keys)
	}
	// Engines that state no kind (one group): group 0 is announced.
	old := enginekv.NewMapper(bs, 0)
	if s, _ := old.Apply(stored(0, "", h, toks, false)); len(s) != 2 {
		t.Fatalf("group 0 without a kind announced %v", s)
	}
}

// TensorRT-LLM's variable sliding window: events name their pool's
// window_size; the largest window is the full-attention pool. A larger
// window seen later takes over and the smaller one's keys are withdrawn.
func TestMapperTracksTheLargestWindow(t *testing.T) {
	const bs = 2
	m := enginekv.NewMapper(bs, 0)
	ev := func(w int, hs ...uint64) enginekv.Event {
		var hashes []enginekv.Hash
		var toks []uint32
		for _, x := range hs {
			hashes = append(hashes, enginekv.IntHash(x))
			toks = append(toks, uint32(x), uint32(x))
		}
		return enginekv.Event{Kind: enginekv.Stored, Hashes: hashes, Tokens: toks, BlockSize: bs, Window: w}
	}
	small, _ := m.Apply(ev(512, 1))
	if len(small) != 1 {
		t.Fatalf("first window announced %v", small)
	}
	big, gone := m.Apply(ev(32768, 1))
	if len(big) != 1 || len(gone) != 1 || gone[0] != small[0] {
		t.Fatalf("a larger window: stored %v, removed %v (want the 512 window's %v withdrawn)", big, gone, small)
	}
	if s, _ := m.Apply(ev(512, 5)); len(s) != 0 {
		t.Fatalf("the sliding window announced %v", s)
	}
	if _, r := m.Apply(enginekv.Event{Kind: enginekv.Removed, Hashes: []enginekv.Hash{enginekv.IntHash(1)}, Window: 512}); len(r) != 0 {
		t.Fatalf("the sliding window's eviction removed %v", r)
	}
	if k, ok := m.Key(enginekv.IntHash(1)); !ok || k != big[0] {
		t.Fatalf("Key: %d %v", k, ok)
	}
}
