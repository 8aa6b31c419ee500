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
