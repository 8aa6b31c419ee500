package cluster

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tether-project/tether/cluster/faultnet"
)

// countingHandler counts log records whose message starts with prefix.
type countingHandler struct {
	prefix string
	n      *atomic.Int64
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestLeaderBarrierBacksOffDuringTransfer holds a leadership transfer in
// progress (its target cut off, so raft answers every Barrier at once with
// ErrLeadershipTransferInProgress) while the leader's barrier loop runs.
// The loop must back off and log the repeated failure once, not spin: a
// stopping tether dev printed 105,032 such lines in 0.5 s.
func TestLeaderBarrierBacksOffDuringTransfer(t *testing.T) {
	t.Parallel()
	fnet := faultnet.New(1)
	var lines atomic.Int64
	tc := newTestCluster(t, 3, func(i int, c *Config) {
		fnet.Register(c.NodeID, c.BindAddr)
		c.Dial = fnet.Dialer(c.NodeID)
		c.Logger = slog.New(countingHandler{prefix: "cluster: leader barrier failed", n: &lines})
	})
	leader := tc.leader(10 * time.Second)
	target := tc.follower()
	fnet.Partition(leader.ID(), target.ID())
	transfer := leader.raft.LeadershipTransferToServer(raft.ServerID(target.ID()), raft.ServerAddress(tc.cfgs[tc.index(target)].BindAddr))
	waitFor(t, 10*time.Second, "a leadership transfer in progress", func() bool {
		err := leader.raft.Barrier(time.Second).Error()
		return errors.Is(err, raft.ErrLeadershipTransferInProgress)
	})
	before := lines.Load()
	done := make(chan bool, 1)
	go func() { done <- leader.leaderBarrier(make(chan bool)) }()
	// Hold the transfer for a while (the provocation's length, not a
	// wait for an outcome), then let it finish.
	time.Sleep(time.Second)
	fnet.Heal()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the barrier loop did not end after the transfer finished")
	}
	_ = transfer.Error()
	if n := lines.Load() - before; n > 3 {
		t.Fatalf("%d barrier-failure log lines while a transfer was held for 1 s; want at most 3 (backoff, logged once per error)", n)
	}
}
