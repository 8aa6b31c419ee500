package cluster

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tether-project/tether/cluster/faultnet"
)

// barrierLog records the barrier loop's log: the failures it warns about
// and the backoff of every retry.
type barrierLog struct {
	mu       *sync.Mutex
	warned   *int
	backoffs *[]time.Duration
}

func (h barrierLog) Enabled(context.Context, slog.Level) bool { return true }
func (h barrierLog) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case strings.HasPrefix(r.Message, "cluster: leader barrier failed"):
		*h.warned++
	case r.Message == "cluster: leader barrier retry":
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "backoff" {
				*h.backoffs = append(*h.backoffs, a.Value.Duration())
			}
			return true
		})
	}
	return nil
}
func (h barrierLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h barrierLog) WithGroup(string) slog.Handler      { return h }

// TestLeaderBarrierBacksOffDuringTransfer holds a leadership transfer in
// progress (its target cut off, so raft answers every Barrier at once with
// ErrLeadershipTransferInProgress) while the leader's barrier loop runs.
// The loop must back off and log the repeated failure once, not spin: a
// stopping tether dev printed 105,032 such lines in 0.5 s. Judged by
// attempts, not by time: over seven retries the backoff doubles each time
// (to its maximum) and the failure is warned about once per distinct
// error.
func TestLeaderBarrierBacksOffDuringTransfer(t *testing.T) {
	t.Parallel()
	fnet := faultnet.New(1)
	var (
		mu       sync.Mutex
		warned   int
		backoffs []time.Duration
	)
	tc := newTestCluster(t, 3, func(i int, c *Config) {
		fnet.Register(c.NodeID, c.BindAddr)
		c.Dial = fnet.Dialer(c.NodeID)
		c.Logger = slog.New(barrierLog{mu: &mu, warned: &warned, backoffs: &backoffs})
	})
	leader := tc.leader(10 * time.Second)
	target := tc.follower()
	fnet.Partition(leader.ID(), target.ID())
	transfer := leader.raft.LeadershipTransferToServer(raft.ServerID(target.ID()), raft.ServerAddress(tc.cfgs[tc.index(target)].BindAddr))
	waitFor(t, 10*time.Second, "a leadership transfer in progress", func() bool {
		err := leader.raft.Barrier(time.Second).Error()
		return errors.Is(err, raft.ErrLeadershipTransferInProgress)
	})
	mu.Lock()
	warnedBefore, retriesBefore := warned, len(backoffs)
	mu.Unlock()
	done := make(chan bool, 1)
	var ended atomic.Bool
	go func() { done <- leader.leaderBarrier(make(chan bool)); ended.Store(true) }()
	// Seven retries, or fewer when raft gives the transfer up first (it
	// may, after an election timeout, on a slow machine).
	const retries = 7
	waitFor(t, 60*time.Second, "seven barrier retries during the held transfer, or the transfer given up", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(backoffs)-retriesBefore >= retries || ended.Load()
	})
	fnet.Heal()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the barrier loop did not end after the transfer finished")
	}
	_ = transfer.Error()
	mu.Lock()
	defer mu.Unlock()
	seen := backoffs[retriesBefore:min(len(backoffs), retriesBefore+retries)]
	if len(seen) < 2 {
		t.Fatalf("%d retries before the transfer ended: nothing to judge the backoff by", len(seen))
	}
	for i, b := range seen {
		if want := min(barrierBackoffMin<<i, barrierBackoffMax); b != want {
			t.Fatalf("retry %d waited %s, want %s (backoffs %v)", i+1, b, want, seen)
		}
	}
	if n := warned - warnedBefore; n < 1 || n > 3 {
		t.Fatalf("%d barrier-failure warnings over %d retries; want one per distinct error (1..3)", n, len(seen))
	}
}
