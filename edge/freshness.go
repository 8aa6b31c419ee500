package edge

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tether-project/tether/cluster"
)

// freshness knows whether this edge's copy of the replicated state is
// current. Two decisions depend on it:
//
//   - /readyz stays false after a (re)start until the state has caught up
//     with a leader's, so a load balancer does not send traffic to an edge
//     that would read old bindings;
//   - degraded placement (the log cannot commit) is a guess that every edge
//     makes alike only if their states agree; an edge that lags (restarted,
//     or a follower that lost its leader before applying the last commits)
//     could place a key the log already bound elsewhere.
//
// A background poll asks the leader for its Status (state index) every
// freshnessPoll; while no leader is known it asks the peers for their log
// ends instead. Everything is in-memory and reset at start.
type freshness struct {
	e      *Edge
	window time.Duration // degraded placement: the longest silence from a leader

	mu          sync.Mutex
	leaderState uint64    // the state index a ready leader last reported (this node's own while it leads)
	leaderSeen  time.Time // when a ready leader last answered (or this node last was one)
	target      uint64    // a leader's state index this node must reach to count as caught up
	caughtUp    bool      // the state reached target once since start
	caughtUpAt  time.Time
	peersLog    uint64 // without a leader: the highest log index a reachable peer holds
	peersAt     time.Time
}

const (
	// freshnessPoll is how often the leader (or, without one, the peers)
	// is asked how far its log goes.
	freshnessPoll = 100 * time.Millisecond
	// freshnessCallTimeout bounds one status call: a peer that does not
	// answer within it counts as unreachable.
	freshnessCallTimeout = 500 * time.Millisecond
)

func newFreshness(e *Edge) *freshness {
	return &freshness{e: e, window: degradedWindow(e.cfg.Cluster)}
}

// degradedWindow is cluster.degraded_placement_window, or 5 election
// timeouts (raft's defaults when unset): long enough to bridge an
// election, short enough that a partitioned minority stops guessing while
// the majority goes on binding new keys.
func degradedWindow(cl ClusterConfig) time.Duration {
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

// run polls until the edge stops.
func (f *freshness) run() {
	defer f.e.wg.Done()
	t := time.NewTicker(freshnessPoll)
	defer t.Stop()
	for {
		f.poll()
		select {
		case <-f.e.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poll does one round: the leader's state index, or the peers' log ends.
func (f *freshness) poll() {
	n := f.e.node
	start := f.e.now()
	if n.IsLeader() {
		f.noteLeader(n.State().Index(), start)
		return
	}
	if _, addr := n.Leader(); addr != "" {
		ctx, cancel := context.WithTimeout(f.e.ctx, freshnessCallTimeout)
		ps, err := n.PeerStatus(ctx, addr)
		cancel()
		if err == nil && ps.IsLeader {
			f.noteLeader(ps.StateIndex, start)
			return
		}
	}
	f.pollPeers(n.Status())
}

// noteLeader records a ready leader's state index seen at (or after) at.
func (f *freshness) noteLeader(stateIndex uint64, at time.Time) {
	own := f.e.node.State().Index()
	f.e.ready.lag.observe(at, stateIndex, own)
	f.mu.Lock()
	defer f.mu.Unlock()
	// The latest report, not the highest: an operator's snapshot restore
	// moves the state index back.
	f.leaderState = stateIndex
	if at.After(f.leaderSeen) {
		f.leaderSeen = at
	}
	f.peersLog, f.peersAt = 0, time.Time{}
	if f.target == 0 {
		// Caught up = reached where a leader was at some poll; comparing
		// with the leader's latest index would chase a moving target on
		// a busy log (followers apply a commit a moment after it).
		f.target = max(stateIndex, 1)
	}
	f.checkCaughtUpLocked(own)
}

func (f *freshness) checkCaughtUpLocked(own uint64) {
	if !f.caughtUp && f.target > 0 && own >= f.target {
		f.caughtUp, f.caughtUpAt = true, f.e.now()
		f.e.log.Info("state caught up with the leader", "state_index", own, "leader_state_index", f.target)
	}
}

// pollPeers asks every other voter how far its log goes (without a leader,
// a peer holding entries this node lacks means this node's state may miss
// committed bindings).
func (f *freshness) pollPeers(s cluster.Status) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		high uint64
	)
	start := f.e.now()
	for _, p := range s.Peers {
		if p.ID == s.ID || p.Addr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(f.e.ctx, freshnessCallTimeout)
			ps, err := f.e.node.PeerStatus(ctx, p.Addr)
			cancel()
			if err == nil {
				mu.Lock()
				high = max(high, ps.LastLogIndex)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	f.mu.Lock()
	f.peersLog, f.peersAt = high, start
	f.mu.Unlock()
}

// caughtUpSinceStart reports whether the state reached a leader's once
// since this edge started, and otherwise why not (for /readyz).
func (f *freshness) caughtUpSinceStart() (bool, string) {
	own := f.e.node.State().Index()
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

// degradedAllowed reports whether this edge may place a new key without
// the log (degraded rendezvous), and otherwise why not. It may when its
// state is known to be current: it caught up with a leader since it
// started, heard from a leader within the window, has applied every log
// entry it holds (the last of them may have been committed by a leader
// that then died, before this node learned so), is not behind the
// leader's last reported state, and no reachable peer holds entries it
// lacks.
func (f *freshness) degradedAllowed(now time.Time) (bool, string) {
	s := f.e.node.Status()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checkCaughtUpLocked(s.StateIndex)
	switch {
	case !f.caughtUp:
		return false, "this edge has not caught up with a leader since it started"
	case now.Sub(f.leaderSeen) > f.window:
		return false, fmt.Sprintf("no contact with a leader for %s (more than cluster.degraded_placement_window %s)",
			now.Sub(f.leaderSeen).Round(time.Millisecond), f.window)
	case s.StateIndex < f.leaderState:
		return false, fmt.Sprintf("state index %d is behind the leader's %d", s.StateIndex, f.leaderState)
	case s.AppliedIndex < max(s.CommitIndex, s.LastLogIndex):
		return false, fmt.Sprintf("log entries up to %d are not applied yet (applied %d)", max(s.CommitIndex, s.LastLogIndex), s.AppliedIndex)
	case f.peersLog > s.AppliedIndex && now.Sub(f.peersAt) <= 3*freshnessPoll+freshnessCallTimeout:
		return false, fmt.Sprintf("a peer holds log entries up to %d, this edge applied %d", f.peersLog, s.AppliedIndex)
	}
	return true, ""
}
