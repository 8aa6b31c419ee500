package cluster

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"

	"github.com/tether-project/tether/cluster/transport"
)

// pilot runs github.com/hashicorp/raft-autopilot on the leader: every
// Autopilot.Interval it asks each member for its status (over the
// authenticated forwarding protocol), judges health from last contact, log
// lag and term, promotes a stable non-voter when fewer than
// Autopilot.Voters voters are healthy, demotes a failed voter once the
// count is back above it, and removes a member unreachable for
// Autopilot.DeadServerTimeout. It is the only code that changes suffrage
// on its own; joins (membership.go) and operator commands are explicit.
// See DESIGN.md "Autopilot".
type pilot struct {
	n  *Node
	ap *autopilot.Autopilot

	mu sync.Mutex
	// lastSeen is when this leader last got a status answer from each
	// member, or first saw it in the configuration; since is when this
	// leadership's autopilot started.
	lastSeen map[raft.ServerID]time.Time
	suffrage map[raft.ServerID]Suffrage
	version  map[raft.ServerID]string
	since    time.Time

	state atomic.Pointer[autopilot.State]
	want  chan bool // latest leadership wins (setReady → run)
}

func newPilot(n *Node) *pilot {
	p := &pilot{n: n, want: make(chan bool, 1)}
	p.ap = autopilot.New(n.raft, p,
		autopilot.WithLogger(n.hlog.Named("autopilot")),
		autopilot.WithPromoter(&promoter{p: p}),
		autopilot.WithUpdateInterval(n.cfg.Autopilot.Interval),
		autopilot.WithReconcileInterval(n.cfg.Autopilot.Interval),
	)
	return p
}

// setLeader asks run to start or stop autopilot; it never blocks (it is
// called under the node's readyMu, and autopilot's start does a first
// round of status calls).
func (p *pilot) setLeader(v bool) {
	if p == nil {
		return
	}
	select {
	case <-p.want:
	default:
	}
	select {
	case p.want <- v:
	default:
	}
}

// run starts and stops autopilot as leadership comes and goes, until ctx
// ends; it returns once autopilot's goroutines have stopped.
func (p *pilot) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			<-p.stop()
			return
		case v := <-p.want:
			if v {
				p.start()
			} else {
				<-p.stop()
			}
		}
	}
}

// start runs autopilot for a new leadership; stop ends it (the returned
// channel closes once its goroutines exited).
func (p *pilot) start() {
	p.mu.Lock()
	p.lastSeen = map[raft.ServerID]time.Time{}
	p.suffrage = map[raft.ServerID]Suffrage{}
	p.version = map[raft.ServerID]string{}
	p.since = time.Now()
	p.mu.Unlock()
	p.state.Store(nil)
	p.ap.Start(p.n.ctx)
}

func (p *pilot) stop() <-chan struct{} {
	p.state.Store(nil)
	return p.ap.Stop()
}

// statusTimeout bounds one health round's status calls.
const statusTimeout = 2 * time.Second

// failAfter is how long without a status answer makes a member failed
// (unhealthy at once; removed only after DeadServerTimeout).
func (p *pilot) failAfter() time.Duration {
	a := p.n.cfg.Autopilot
	return a.LastContactThreshold + 2*max(a.Interval, statusTimeout)
}

// AutopilotConfig implements autopilot.ApplicationIntegration.
func (p *pilot) AutopilotConfig() *autopilot.Config {
	a := p.n.cfg.Autopilot
	return &autopilot.Config{
		CleanupDeadServers:      a.DeadServerTimeout > 0,
		LastContactThreshold:    a.LastContactThreshold,
		MaxTrailingLogs:         a.MaxTrailingLogs,
		MinQuorum:               uint(a.Voters),
		ServerStabilizationTime: a.StabilizationTime,
	}
}

// NotifyState keeps the latest state for Status.
func (p *pilot) NotifyState(s *autopilot.State) { p.state.Store(s) }

// KnownServers is the latest Raft configuration, each member alive unless
// it has not answered for failAfter. Without gossip, reachability from the
// leader is what "alive" means here.
func (p *pilot) KnownServers() map[raft.ServerID]*autopilot.Server {
	f := p.n.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[raft.ServerID]*autopilot.Server{}
	for _, s := range f.Configuration().Servers {
		srv := &autopilot.Server{
			ID: s.ID, Name: string(s.ID), Address: s.Address, NodeStatus: autopilot.NodeAlive,
			NodeType: autopilot.NodeVoter, Version: p.version[s.ID],
			Meta: map[string]string{"suffrage": string(p.suffrage[s.ID])},
		}
		if string(s.ID) == p.n.id {
			srv.IsLeader = true
			srv.Version = p.n.cfg.Version
			srv.Meta["suffrage"] = string(p.n.cfg.Suffrage)
		} else {
			seen, ok := p.lastSeen[s.ID]
			if !ok {
				// New to this leader (or just added): its grace starts now.
				seen = now
				p.lastSeen[s.ID] = now
			}
			if now.Sub(seen) > p.failAfter() {
				srv.NodeStatus = autopilot.NodeFailed
			}
		}
		out[s.ID] = srv
	}
	return out
}

// FetchServerStats asks every member of the configuration (not only those
// autopilot thinks alive: a failed member must be able to recover) for its
// status, in parallel. It allows statusTimeout, not the half interval
// autopilot's ctx gives: a busy member that answers late must not count as
// unreachable (unreachable long enough, it is removed).
func (p *pilot) FetchServerStats(context.Context, map[raft.ServerID]*autopilot.Server) map[raft.ServerID]*autopilot.ServerStats {
	ctx, cancel := context.WithTimeout(p.n.ctx, max(statusTimeout, p.n.cfg.Autopilot.Interval))
	defer cancel()
	out := map[raft.ServerID]*autopilot.ServerStats{}
	f := p.n.raft.GetConfiguration()
	if f.Error() != nil {
		return out
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == p.n.id {
			self := &autopilot.ServerStats{LastTerm: lastLogTerm(p.n.raft), LastIndex: p.n.raft.LastIndex()}
			mu.Lock()
			out[s.ID] = self
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := p.n.PeerStatus(ctx, string(s.Address))
			if err != nil || st.ID != string(s.ID) {
				return
			}
			contact := time.Duration(-1)
			if st.LastContactAgoMS >= 0 {
				contact = time.Duration(st.LastContactAgoMS * float64(time.Millisecond))
			}
			mu.Lock()
			out[s.ID] = &autopilot.ServerStats{LastContact: contact, LastTerm: st.LastLogTerm, LastIndex: st.LastLogIndex}
			mu.Unlock()
			p.mu.Lock()
			p.lastSeen[s.ID] = time.Now()
			p.suffrage[s.ID] = Suffrage(st.Suffrage)
			p.version[s.ID] = st.Version
			p.mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// RemoveFailedServer removes a member that stayed unreachable for
// DeadServerTimeout (FilterFailedServerRemovals decides which).
func (p *pilot) RemoveFailedServer(srv *autopilot.Server) {
	ctx, cancel := context.WithTimeout(p.n.ctx, 10*time.Second)
	defer cancel()
	p.n.log.Warn("cluster: autopilot removes a dead member", "id", srv.ID, "addr", srv.Address, "after", p.n.cfg.Autopilot.DeadServerTimeout)
	if err := p.n.leaderMembershipChange(ctx, transport.OpRemove, string(srv.ID), ""); err != nil {
		p.n.log.Warn("cluster: autopilot could not remove a dead member", "id", srv.ID, "err", err)
	}
}

// deadLongEnough reports whether id has not answered for DeadServerTimeout.
func (p *pilot) deadLongEnough(id raft.ServerID, now time.Time) bool {
	d := p.n.cfg.Autopilot.DeadServerTimeout
	if d <= 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	seen, ok := p.lastSeen[id]
	if !ok {
		seen = p.since
	}
	return now.Sub(seen) >= d
}

func lastLogTerm(r *raft.Raft) uint64 {
	t, _ := strconv.ParseUint(r.Stats()["last_log_term"], 10, 64)
	return t
}

// promoter is tether's autopilot.Promoter: a stable voter count.
type promoter struct{ p *pilot }

func (*promoter) GetServerExt(*autopilot.Config, *autopilot.ServerState) any { return nil }
func (*promoter) GetStateExt(*autopilot.Config, *autopilot.State) any        { return nil }

// GetNodeTypes: every member may vote (a non-voter can replace a voter).
func (*promoter) GetNodeTypes(_ *autopilot.Config, s *autopilot.State) map[raft.ServerID]autopilot.NodeType {
	types := make(map[raft.ServerID]autopilot.NodeType, len(s.Servers))
	for id := range s.Servers {
		types[id] = autopilot.NodeVoter
	}
	return types
}

func (*promoter) IsPotentialVoter(t autopilot.NodeType) bool { return t == autopilot.NodeVoter }

// FilterFailedServerRemovals keeps only members unreachable for
// DeadServerTimeout: a member is "failed" (unhealthy, replaceable) much
// sooner than it is removed.
func (pr *promoter) FilterFailedServerRemovals(_ *autopilot.Config, _ *autopilot.State, f *autopilot.FailedServers) *autopilot.FailedServers {
	now := time.Now()
	keep := func(in []*autopilot.Server) []*autopilot.Server {
		var out []*autopilot.Server
		for _, s := range in {
			if pr.p.deadLongEnough(s.ID, now) {
				out = append(out, s)
			}
		}
		return out
	}
	return &autopilot.FailedServers{
		StaleNonVoters:  f.StaleNonVoters,
		StaleVoters:     f.StaleVoters,
		FailedNonVoters: keep(f.FailedNonVoters),
		FailedVoters:    keep(f.FailedVoters),
	}
}

// CalculatePromotionsAndDemotions keeps Voters healthy voters: while fewer
// are healthy it promotes non-voters that have been healthy for the
// stabilization time (members configured as voters first, then by id);
// once enough are healthy it demotes voters beyond the count, failed ones
// first, then promoted non-voters. The leader is never demoted.
// raft-autopilot applies promotions and demotions in separate rounds, so a
// failed voter is replaced before it is demoted and the quorum never
// shrinks to the survivors alone.
func (pr *promoter) CalculatePromotionsAndDemotions(c *autopilot.Config, s *autopilot.State) autopilot.RaftChanges {
	var changes autopilot.RaftChanges
	want := pr.p.n.cfg.Autopilot.Voters
	now := time.Now()
	var voters, healthy, candidates []*autopilot.ServerState
	for _, srv := range s.Servers {
		switch {
		case srv.State.IsPotentialVoter():
			voters = append(voters, srv)
			if srv.Health.Healthy {
				healthy = append(healthy, srv)
			}
		case srv.State == autopilot.RaftNonVoter && srv.Health.IsStable(now, c.ServerStabilizationTime):
			candidates = append(candidates, srv)
		}
	}
	configuredVoterFirst := func(a, b *autopilot.ServerState) int {
		av, bv := a.Server.Meta["suffrage"] == string(SuffrageVoter), b.Server.Meta["suffrage"] == string(SuffrageVoter)
		if av != bv {
			if av {
				return -1
			}
			return 1
		}
		return cmpID(a, b)
	}
	if len(healthy) < want {
		slices.SortFunc(candidates, configuredVoterFirst)
		for _, srv := range candidates[:min(len(candidates), want-len(healthy))] {
			changes.Promotions = append(changes.Promotions, srv.Server.ID)
		}
		return changes
	}
	excess := len(voters) - want
	slices.SortFunc(voters, cmpID)
	for _, srv := range voters {
		if excess > 0 && !srv.Health.Healthy && srv.State != autopilot.RaftLeader {
			changes.Demotions = append(changes.Demotions, srv.Server.ID)
			excess--
		}
	}
	spare := len(healthy) - want
	for _, srv := range voters {
		if excess > 0 && spare > 0 && srv.Health.Healthy && srv.State != autopilot.RaftLeader &&
			srv.Server.Meta["suffrage"] == string(SuffrageNonvoter) {
			changes.Demotions = append(changes.Demotions, srv.Server.ID)
			excess--
			spare--
		}
	}
	return changes
}

func cmpID(a, b *autopilot.ServerState) int {
	switch {
	case a.Server.ID < b.Server.ID:
		return -1
	case a.Server.ID > b.Server.ID:
		return 1
	}
	return 0
}

// health is the autopilot's view of one member, for Status (leader only).
func (p *pilot) health(id raft.ServerID, leaderIndex uint64) *PeerHealth {
	if p == nil {
		return nil
	}
	s := p.state.Load()
	if s == nil {
		return nil
	}
	srv, ok := s.Servers[id]
	if !ok {
		return nil
	}
	h := &PeerHealth{
		Healthy:       srv.Health.Healthy,
		StableSince:   srv.Health.StableSince,
		LastContactMS: float64(srv.Stats.LastContact) / float64(time.Millisecond),
		LastTerm:      srv.Stats.LastTerm,
		LastIndex:     srv.Stats.LastIndex,
		Status:        string(srv.Server.NodeStatus),
		Suffrage:      srv.Server.Meta["suffrage"],
	}
	if leaderIndex > srv.Stats.LastIndex {
		h.Lag = leaderIndex - srv.Stats.LastIndex
	}
	return h
}
