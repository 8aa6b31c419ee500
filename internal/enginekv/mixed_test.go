package enginekv_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/kvevents"
)

// u32 converts fixture tokens (tokList) to token ids.
func u32(l []any) []uint32 {
	out := make([]uint32, len(l))
	for i, v := range l {
		out[i] = uint32(v.(int))
	}
	return out
}

// TestSGLangStreamOfEveryLayoutSurvivesGarbage publishes, on a real ZeroMQ
// socket, a stream of SGLang KV events mixing every layout SGLang publishes
// (python/sglang/srt/disaggregation/kv_events.py and the recorder in
// python/sglang/srt/mem_cache/events.py: the 2025 five-field BlockStored,
// medium, cache_salt and session_id metadata, EAGLE bigram pages, component
// types, tagged maps), an event that does not decode, an event of an
// unknown type and a message that is not msgpack. The source skips and
// counts those three, applies everything else, and never resets: its keys
// are every block an edge can compute (a salted block's hash covers the
// salt: counted foreign), each chain as far as a hit can end (where the
// sliding-window and mamba components are too).
func TestSGLangStreamOfEveryLayoutSurvivesGarbage(t *testing.T) {
	const bs = 4
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var mu sync.Mutex
	undecodable := map[string]int{}
	src, err := enginekv.Start(enginekv.Config{Format: enginekv.FormatSGLang, Endpoints: []string{pub.Endpoint()},
		ReplayEndpoints: []string{pub.ReplayEndpoint()}, Ranks: 1, BlockSize: bs, Log: testLog(t),
		Undecodable: func(reason string) { mu.Lock(); undecodable[reason]++; mu.Unlock() }}, func(enginekv.RankKeys) {})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()

	chainA, chainB, chainC, chainD, chainF := tokList(0, 12), tokList(100, 4), tokList(200, 8), tokList(300, 4), tokList(400, 4)
	salt := omap{{"cache_salt", "tenant-a"}}
	batches := []any{
		// The 2025 layout: five fields, no rank.
		[]any{1.0, []any{
			[]any{"BlockStored", []any{int64(1), int64(2)}, nil, chainA[:8], bs, nil},
		}},
		// medium; a garbage event and one of an unknown type between good
		// ones; a block with session metadata; a salted one.
		[]any{2.0, []any{
			[]any{"BlockStored", []any{int64(3)}, int64(2), chainA[8:], bs, nil, "GPU"},
			[]any{"BlockStored", "not a list of hashes", nil, chainA, bs, nil, "GPU"},
			[]any{"BlockTeleported", []any{int64(9)}},
			[]any{"BlockStored", []any{int64(11)}, nil, chainB, bs, nil, "GPU", omap{{"session_id", "conv-1"}}},
			[]any{"BlockStored", []any{int64(12)}, nil, chainB, bs, nil, "GPU", salt},
		}, 0},
		// Component types (a hybrid model): a full chain, its swa and
		// mamba components at its end, a mamba state dropped and kept
		// again.
		[]any{3.0, []any{
			[]any{"BlockStored", []any{int64(21)}, nil, chainC[:4], bs, nil, "GPU", "full"},
			[]any{"BlockStored", []any{int64(22)}, int64(21), chainC[4:], bs, nil, "GPU", "full"},
			[]any{"BlockStored", []any{int64(22)}, nil, chainC[4:], bs, nil, "GPU", "swa"},
			[]any{"BlockStored", []any{int64(22)}, nil, chainC[4:], bs, nil, "GPU", "mamba"},
			[]any{"BlockRemoved", []any{int64(22)}, "GPU", "mamba"},
			[]any{"BlockStored", []any{int64(22)}, nil, chainC[4:], bs, nil, "GPU", "mamba"},
		}, 0},
		// An EAGLE model's bigram page.
		[]any{4.0, []any{
			[]any{"BlockStored", []any{int64(31)}, nil, bigrams(300, 4), bs, nil, "GPU"},
		}, 0},
		// Tagged maps.
		[]any{5.0, []any{
			omap{{"type", "BlockStored"}, {"block_hashes", []any{int64(41)}}, {"parent_block_hash", nil}, {"token_ids", chainF}, {"block_size", bs}, {"lora_id", nil}, {"medium", "GPU"}, {"session_id", "conv-2"}},
		}, 0},
	}
	for _, b := range batches {
		if err := pub.PublishRaw(mustMsgpack(t, b)); err != nil {
			t.Fatal(err)
		}
	}
	// A message that is not msgpack at all, then a removal that must apply
	// after it.
	if err := pub.PublishRaw([]byte{0xc1, 0xff, 0x00}); err != nil {
		t.Fatal(err)
	}
	// The hybrid model's other components where the other chains end
	// (their blocks are a hit only up to where every component is), and
	// a removal.
	var tails []any
	for _, h := range []int64{3, 31, 41} {
		for _, comp := range []string{"swa", "mamba"} {
			tails = append(tails, []any{"BlockStored", []any{h}, nil, chainA[:4], bs, nil, "GPU", comp})
		}
	}
	last := mustMsgpack(t, []any{6.0, append(tails, []any{"BlockRemoved", []any{int64(11)}, "GPU"}), 0})
	if err := pub.PublishRaw(last); err != nil {
		t.Fatal(err)
	}
	lastSeq := uint64(len(batches) + 1)

	want := slices.Concat(prefix.BlockHashes(u32(chainA), bs), prefix.BlockHashes(u32(chainC), bs),
		prefix.BlockHashes(u32(chainD), bs), prefix.BlockHashes(u32(chainF), bs))
	slices.Sort(want)
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := src.Status()[0]
		if st.HaveSeq && st.LastSeq == lastSeq {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream did not arrive whole: status %+v", st)
		}
		// The subscription may take hold after the first messages: a
		// heartbeat makes the source replay from 0.
		_ = pub.PublishRaw(mustMsgpack(t, []any{7.0, []any{}, 0}))
		lastSeq++
		time.Sleep(20 * time.Millisecond)
	}
	got := src.Keys()[0]
	slices.Sort(got)
	st := src.Status()[0]
	if !slices.Equal(got, want) {
		t.Errorf("keys = %x\nwant   %x (every block of chains A, C, D, F)", got, want)
	}
	if st.Resets != 0 {
		t.Errorf("the source reset %d times (%s): an undecodable event must not reset the rank", st.Resets, st.LastReset)
	}
	if st.Stats.Foreign != 1 {
		t.Errorf("foreign = %d, want the salted block", st.Stats.Foreign)
	}
	wantSkips := map[string]uint64{enginekv.SkipMalformedEvent: 1, enginekv.SkipUnknownEvent: 1, enginekv.SkipBatch: 1}
	mu.Lock()
	defer mu.Unlock()
	for r, n := range wantSkips {
		if st.Undecodable[r] != n || uint64(undecodable[r]) != n {
			t.Errorf("undecodable %s: status %d, reported %d, want %d", r, st.Undecodable[r], undecodable[r], n)
		}
	}
}
