package sim

import (
	"testing"
	"time"

	"github.com/tether-project/tether/internal/prefix"
)

// A deep FIFO queue shows in the rank's figures: ten long prompts arriving
// at once are one prefilling and nine queued, though each admission
// releases (in virtual time) what is done by its own start, long after
// now. The load report, routing and flow control read these figures.
func TestStatsCountADeepQueue(t *testing.T) {
	r, err := NewVirtualRank(0, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	bs := prefix.DefaultBlockSize
	var last VirtualResult
	for i := range 10 {
		p := prompt(uint32(100+i), 4000)
		if last, err = r.Admit(0, VirtualRequest{Hashes: prefix.BlockHashes(p, bs), PromptTokens: len(p), OutputTokens: 2}); err != nil {
			t.Fatal(err)
		}
	}
	if s := r.Stats(0); s.ActiveRequests != 1 || s.QueuedRequests != 9 || s.ActivePromptTokens != 40000 {
		t.Fatalf("stats at 0: %+v, want 1 active and 9 queued", s)
	}
	// Halfway through the queue, half of it is done.
	mid := last.StartAt / 2
	if s := r.Stats(mid); s.ActiveRequests+s.QueuedRequests > 6 || s.QueuedRequests < 4 {
		t.Fatalf("stats halfway (%v): %+v", mid, s)
	}
	if s := r.Stats(last.DoneAt + time.Second); s.ActiveRequests+s.QueuedRequests != 0 {
		t.Fatalf("stats after the last: %+v", s)
	}
}

// The prefill still ahead counts a running prefill's rest, which the
// request counts do not show: one long prompt alone is "1 active, 0
// queued" throughout its prefill, yet a request behind it waits for all of
// what it has left. A prompt the cache holds adds only its uncached tail.
func TestStatsCountThePrefillLeft(t *testing.T) {
	r, err := NewVirtualRank(0, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	bs := prefix.DefaultBlockSize
	long := prompt(7, 40*bs)
	res, err := r.Admit(0, VirtualRequest{Hashes: prefix.BlockHashes(long, bs), PromptTokens: len(long), OutputTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	if s := r.Stats(0); s.PrefillTokens != len(long) || s.QueuedRequests != 0 {
		t.Fatalf("stats at admission: %+v, want the whole prompt (%d) ahead and nothing queued", s, len(long))
	}
	quarter := res.StartAt + (res.FirstTokenAt-res.StartAt)*3/4
	if s := r.Stats(quarter); s.PrefillTokens < len(long)/4-bs || s.PrefillTokens > len(long)/4+bs || s.ActiveRequests != 1 || s.QueuedRequests != 0 {
		t.Fatalf("stats three quarters through the prefill: %+v, want about %d tokens left, 1 active", s, len(long)/4)
	}
	if s := r.Stats(res.FirstTokenAt); s.PrefillTokens != 0 {
		t.Fatalf("stats at the first token: %+v, want no prefill left", s)
	}
	// The same prompt again plus 8 blocks, queued behind nothing: only the
	// 8 new blocks are prefill.
	more := append(append([]uint32(nil), long...), prompt(8, 8*bs)...)
	at := res.DoneAt
	if _, err := r.Admit(at, VirtualRequest{Hashes: prefix.BlockHashes(more, bs), PromptTokens: len(more), OutputTokens: 2}); err != nil {
		t.Fatal(err)
	}
	if s := r.Stats(at); s.PrefillTokens != 8*bs {
		t.Fatalf("stats for a cached prompt: %+v, want its %d uncached tokens", s, 8*bs)
	}
}
