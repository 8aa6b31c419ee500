package readiness

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tether-project/tether/edge/config"
)

// Freshness knows whether this edge's copy of the replicated state is
// current. Two decisions depend on it:
//
//   - /readyz stays false after a (re)start until the state has caught up
//     with a leader's, so a load balancer does not send traffic to an edge
//     that would read old bindings;
//   - a new key placed while this edge cannot know the committed placement
//     (no leader within the window, not caught up since start, or lagging
//     the leader's state by more than the window) is counted degraded, and
//     hard affinity is refused: such an edge could place a key the log
//     already bound elsewhere.
//
// A background poll asks the leader for its Status (state index) every
// freshnessPoll. Everything is in-memory and reset at start.
type Freshness struct {
	edge   Edge
	log    *slog.Logger
	window time.Duration // the longest silence from a leader, and the lag bound
	// lag is the leader reports this node had not reached when they came
	// (the stall rule's, Readiness.Stalled).
	lag stateLag

	mu          sync.Mutex
	leaderState uint64    // the state index a ready leader last reported (this node's own while it leads)
	leaderSeen  time.Time // when a ready leader last answered (or this node last was one)
	target      uint64    // a leader's state index this node must reach to count as caught up
	caughtUp    bool      // the state reached target once since start
	caughtUpAt  time.Time
	// seen are the leader's state indexes of recent polls, oldest first
	// (the lag bound: the state must have reached the one a window ago).
	seen []leaderSample
}

type leaderSample struct {
	index uint64
	at    time.Time
}

const (
	// freshnessPoll is how often the leader (or, without one, the peers)
	// is asked how far its log goes.
	freshnessPoll = 100 * time.Millisecond
	// freshnessCallTimeout bounds one status call: a peer that does not
	// answer within it counts as unreachable.
	freshnessCallTimeout = 500 * time.Millisecond
)

// NewFreshness judges e's state by the edge's cluster section (its
// degraded_placement_window).
func NewFreshness(e Edge, cl config.ClusterConfig, log *slog.Logger) *Freshness {
	return &Freshness{edge: e, log: log, window: degradedWindow(cl)}
}

// degradedWindow is cluster.degraded_placement_window, or 5 election
// timeouts (raft's defaults when unset): long enough to bridge an
// election, short enough that a partitioned minority stops guessing while
// the majority goes on binding new keys.
func degradedWindow(cl config.ClusterConfig) time.Duration {
	if cl.DegradedPlacementWindow > 0 {
		return cl.DegradedPlacementWindow
	}
	et := cl.Raft.ElectionTimeout
	if et <= 0 {
		et = cl.Raft.HeartbeatTimeout
	}
	if et <= 0 {
		et = time.Second // cluster.RaftTiming's default
	}
	return 5 * et
}

// Run polls until ctx is done.
func (f *Freshness) Run(ctx context.Context) {
	t := time.NewTicker(freshnessPoll)
	defer t.Stop()
	for {
		f.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poll does one round: the leader's state index.
func (f *Freshness) poll(ctx context.Context) {
	n := f.edge.Node()
	start := f.edge.Now()
	if n.IsLeader() {
		f.noteLeader(n.State().Index(), start)
		return
	}
	if _, addr := n.Leader(); addr != "" {
		cctx, cancel := context.WithTimeout(ctx, freshnessCallTimeout)
		ps, err := n.PeerStatus(cctx, addr)
		cancel()
		if err == nil && ps.IsLeader {
			f.noteLeader(ps.StateIndex, start)
		}
	}
}

// noteLeader records a ready leader's state index seen at (or after) at.
func (f *Freshness) noteLeader(stateIndex uint64, at time.Time) {
	own := f.edge.Node().State().Index()
	f.lag.observe(at, stateIndex, own)
	f.mu.Lock()
	defer f.mu.Unlock()
	// The latest report, not the highest: an operator's snapshot restore
	// moves the state index back.
	f.leaderState = stateIndex
	if at.After(f.leaderSeen) {
		f.leaderSeen = at
	}
	f.seen = append(f.seen, leaderSample{index: stateIndex, at: at})
	// Keep one sample older than the window (the one the lag is judged
	// against) and the newer ones.
	for len(f.seen) > 1 && at.Sub(f.seen[1].at) > f.window {
		f.seen = f.seen[1:]
	}
	if f.target == 0 {
		// Caught up = reached where a leader was at some poll; comparing
		// with the leader's latest index would chase a moving target on
		// a busy log (followers apply a commit a moment after it).
		f.target = max(stateIndex, 1)
	}
	f.checkCaughtUpLocked(own)
}

func (f *Freshness) checkCaughtUpLocked(own uint64) {
	if !f.caughtUp && f.target > 0 && own >= f.target {
		f.caughtUp, f.caughtUpAt = true, f.edge.Now()
		f.log.Info("state caught up with the leader", "state_index", own, "leader_state_index", f.target)
	}
}

// CaughtUpSinceStart reports whether the state reached a leader's once
// since this edge started, and otherwise why not (for /readyz).
func (f *Freshness) CaughtUpSinceStart() (bool, string) {
	own := f.edge.Node().State().Index()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checkCaughtUpLocked(own)
	if f.caughtUp {
		return true, ""
	}
	if f.target == 0 {
		return false, "no leader has answered since this edge started: its state may be behind the log"
	}
	return false, fmt.Sprintf("catching up with the leader: state index %d of %d", own, f.target)
}

// StateCurrent reports whether this edge can know the committed
// placement of a key from its own state, and otherwise why not: it caught
// up with a leader since it started, heard from a leader within the window,
// and its state has reached the leader's state index of a window ago. A
// state a few entries behind the leader's latest is the normal case of a
// follower under load (an entry commits before followers apply it) and
// counts as current; a leader's Bind older than the window that this edge
// has not applied does not.
func (f *Freshness) StateCurrent(now time.Time) (bool, string) {
	n := f.edge.Node()
	if n.IsLeader() {
		return true, "" // a ready leader has applied every committed entry
	}
	own := n.State().Index()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checkCaughtUpLocked(own)
	switch {
	case !f.caughtUp:
		return false, "this edge has not caught up with a leader since it started"
	case now.Sub(f.leaderSeen) > f.window:
		return false, fmt.Sprintf("no contact with a leader for %s (more than cluster.degraded_placement_window %s)",
			now.Sub(f.leaderSeen).Round(time.Millisecond), f.window)
	}
	if len(f.seen) > 0 && now.Sub(f.seen[0].at) > f.window && own < f.seen[0].index {
		return false, fmt.Sprintf("state index %d is behind the leader's %d of %s ago (more than cluster.degraded_placement_window %s)",
			own, f.seen[0].index, now.Sub(f.seen[0].at).Round(time.Millisecond), f.window)
	}
	return true, ""
}
