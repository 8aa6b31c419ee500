package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tether-project/tether/cluster/transport"
)

// TombstoneFile, in a data directory, marks a node removed from the
// cluster: it refuses to start on that directory again.
const TombstoneFile = "REMOVED"

const tombstoneFile = TombstoneFile

type tombstone struct {
	NodeID    string    `json:"node_id"`
	Index     uint64    `json:"index"`
	RemovedAt time.Time `json:"removed_at"`
}

// checkTombstone refuses to start a removed node.
func checkTombstone(dataDir, nodeID string) error {
	b, err := os.ReadFile(filepath.Join(dataDir, tombstoneFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cluster: read tombstone in %s: %w", dataDir, err)
	}
	var t tombstone
	if err := json.Unmarshal(b, &t); err != nil || t.NodeID == "" {
		return fmt.Errorf("%w: %s holds an unreadable removal tombstone; wipe DataDir or re-join as a new node", ErrRemoved, dataDir)
	}
	return fmt.Errorf("%w: node %s was removed from the cluster at index %d; wipe DataDir (%s) or re-join as a new node",
		ErrRemoved, t.NodeID, t.Index, dataDir)
}

func writeTombstone(dataDir, nodeID string, index uint64) error {
	b, _ := json.Marshal(tombstone{NodeID: nodeID, Index: index, RemovedAt: time.Now().UTC()})
	path := filepath.Join(dataDir, tombstoneFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// onRemoved runs when this node learns it was removed: from a committed
// configuration without it (FSM goroutine), or from the leader's notice.
func (n *Node) onRemoved(index uint64) {
	if err := writeTombstone(n.cfg.DataDir, n.id, index); err != nil {
		n.log.Error("cluster: write removal tombstone", "err", err)
	}
	n.fatal(fmt.Errorf("%w: node %s was removed at index %d", ErrRemoved, n.id, index))
	n.shutdownRaftAsync(0)
}

// onConfigurationDropped runs when the state machine applies a committed
// configuration without this node. That is its removal, unless a later
// configuration in its log adds it back: a node removed and then added
// again under the same id (a new member on a wiped data directory, say)
// replays its own old removal on the way. Raft takes configurations in when
// it appends them, before they are applied, so its latest configuration
// already shows the re-addition (when the log it receives holds both in one
// batch of entries, or a snapshot carries it). The check runs apart from
// the state machine's goroutine, which must not wait on raft.
func (n *Node) onConfigurationDropped(index uint64) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		// The state machine applies entries while raft.NewRaft restores
		// them, before Open has set n.raft.
		<-n.raftSet
		if n.raft == nil {
			n.onRemoved(index)
			return
		}
		f := n.raft.GetConfiguration()
		if f.Error() == nil {
			for _, s := range f.Configuration().Servers {
				if string(s.ID) == n.id {
					n.log.Info("cluster: a later configuration adds this node back; its removal is history", "removed_at", index)
					return
				}
			}
		}
		n.onRemoved(index)
	}()
}

// AddVoter adds (or re-addresses) a voter and waits for the configuration
// change to commit. On a follower the request goes to the leader.
func (n *Node) AddVoter(ctx context.Context, id, addr string) error {
	if id == "" || addr == "" {
		return fmt.Errorf("cluster: add voter: id and address are required (got %q, %q)", id, addr)
	}
	return n.membershipChange(ctx, transport.OpAddVoter, id, addr, false)
}

// RemoveServer removes a member and waits for the change to commit; the
// removed node is told (best effort) so it records its tombstone and stops.
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("cluster: remove server: id is required")
	}
	return n.membershipChange(ctx, transport.OpRemove, id, "", false)
}

// TransferLeadership hands leadership to toID ("" = any voter raft picks)
// and waits for the transfer.
func (n *Node) TransferLeadership(ctx context.Context, toID string) error {
	return n.membershipChange(ctx, transport.OpTransfer, toID, "", false)
}

// membershipChange runs op on the leader: locally when this node leads,
// else forwarded (once: forwarded=true stops a second hop).
func (n *Node) membershipChange(ctx context.Context, op transport.Op, id, addr string, forwarded bool) error {
	if err := n.usable(); err != nil {
		return err
	}
	if n.raft.State() == raft.Leader {
		return n.leaderMembershipChange(ctx, op, id, addr)
	}
	if forwarded {
		la, lid := n.raft.LeaderWithID()
		return &NotLeaderError{LeaderID: string(lid), LeaderAddr: string(la)}
	}
	// Wait briefly for a leader to be known, then forward to it.
	for {
		la, _ := n.raft.LeaderWithID()
		if la != "" {
			err := n.client.ChangeMembership(ctx, string(la), op, id, addr, true)
			if err == nil || !isRetryable(err) {
				return err
			}
		}
		wake := n.leaderWake()
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-wake:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("cluster: %s: no reachable leader: %w", op, ctx.Err())
		}
		t.Stop()
		if n.raft.State() == raft.Leader {
			return n.leaderMembershipChange(ctx, op, id, addr)
		}
	}
}

func (n *Node) leaderMembershipChange(ctx context.Context, op transport.Op, id, addr string) error {
	switch op {
	case transport.OpJoinVoter, transport.OpJoinNonvoter:
		return n.leaderJoin(ctx, id, addr, op == transport.OpJoinVoter)
	case transport.OpAddVoter:
		if n.serverAddr(id) == "" {
			if err := n.checkAddable(ctx, id, addr); err != nil {
				return err
			}
		}
		f := n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, 0)
		if err := waitFuture(ctx, f); err != nil {
			return fmt.Errorf("cluster: add voter %s at %s: %w", id, addr, mapMembershipError(err))
		}
		n.log.Info("cluster: voter added", "id", id, "addr", addr, "index", f.Index())
		return nil
	case transport.OpRemove:
		target := n.serverAddr(id)
		f := n.raft.RemoveServer(raft.ServerID(id), 0, 0)
		if err := waitFuture(ctx, f); err != nil {
			return fmt.Errorf("cluster: remove server %s: %w", id, mapMembershipError(err))
		}
		index := f.Index()
		n.log.Info("cluster: server removed", "id", id, "index", index)
		n.removedIDs.Store(id, index)
		if id == n.id {
			n.onRemoved(index)
			return nil
		}
		if target != "" {
			// A removed follower may never see the removal commit (the
			// leader stops replicating to it): tell it.
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				nctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
				defer cancel()
				if err := n.client.NotifyRemoved(nctx, target, id, index); err != nil {
					n.log.Info("cluster: could not notify removed node", "id", id, "addr", target, "err", err)
				}
			}()
		}
		return nil
	case transport.OpTransfer:
		var f raft.Future
		if id == "" {
			f = n.raft.LeadershipTransfer()
		} else {
			if id == n.id {
				return nil
			}
			target := n.serverAddr(id)
			if target == "" {
				return fmt.Errorf("cluster: transfer leadership: %q is not a member", id)
			}
			f = n.raft.LeadershipTransferToServer(raft.ServerID(id), raft.ServerAddress(target))
		}
		if err := waitFuture(ctx, f); err != nil {
			return fmt.Errorf("cluster: transfer leadership to %q: %w", id, mapMembershipError(err))
		}
		return nil
	}
	return transport.BadRequest("unknown membership op %d", op)
}

// checkAddable refuses to add a voter that could not vote: one that does not
// answer at addr as id (a dead voter brings the group one failure closer to
// losing its quorum, and raft would retry it forever), or one that halted,
// as a node removed from the cluster does (its data directory keeps a
// tombstone, so it never serves again).
func (n *Node) checkAddable(ctx context.Context, id, addr string) error {
	removed := ""
	if idx, ok := n.removedIDs.Load(id); ok {
		removed = fmt.Sprintf("; %s was removed from the cluster at index %d, and a removed node's data directory keeps a REMOVED tombstone that stops it for good: wipe that directory, start the edge empty with cluster.join (it joins by itself) or add it once it answers", id, idx)
	}
	sctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	st, err := n.PeerStatus(sctx, addr)
	switch {
	case err != nil:
		return transport.BadRequest("add voter %s at %s: no edge answers there (%v); start it first (with an empty data dir and neither bootstrap nor join, then add it; or with cluster.join, and it joins by itself)%s", id, addr, err, removed)
	case st.ID != id:
		return transport.BadRequest("add voter %s at %s: the edge answering there is %q, not %s", id, addr, st.ID, id)
	case st.Halted != "":
		return transport.BadRequest("add voter %s at %s: that edge has halted (%s)%s", id, addr, st.Halted, removed)
	}
	return nil
}

// leaderJoin adds a joining node: as a voter when it asks to vote and the
// configuration has fewer than Autopilot.Voters voters, else as a
// non-voter (autopilot promotes one if a voter fails). A member already
// present keeps its suffrage (a re-join after a restart on a wiped disk
// only re-addresses it).
func (n *Node) leaderJoin(ctx context.Context, id, addr string, wantsVote bool) error {
	if id == "" || addr == "" {
		return transport.BadRequest("join: id and address are required (got %q, %q)", id, addr)
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return mapMembershipError(err)
	}
	voters, present, presentVoter := 0, false, false
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters++
		}
		if string(s.ID) == id {
			present, presentVoter = true, s.Suffrage == raft.Voter
		}
	}
	var fut raft.IndexFuture
	voter := presentVoter || !present && wantsVote && voters < n.cfg.Autopilot.Voters
	if voter {
		fut = n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, 0)
	} else {
		fut = n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, 0)
	}
	if err := waitFuture(ctx, fut); err != nil {
		return fmt.Errorf("cluster: join %s at %s: %w", id, addr, mapMembershipError(err))
	}
	n.log.Info("cluster: member joined", "id", id, "addr", addr, "voter", voter, "asked_to_vote", wantsVote, "index", fut.Index())
	return nil
}

func mapMembershipError(err error) error {
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
		return retryable(fmt.Errorf("%w: %w", ErrNotLeader, err))
	}
	if errors.Is(err, raft.ErrRaftShutdown) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

// serverAddr is id's address in the latest configuration ("" if absent).
func (n *Node) serverAddr(id string) string {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return ""
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == id {
			return string(s.Address)
		}
	}
	return ""
}

// join asks the members in Config.Join, in turn, to add this node with its
// configured suffrage, until one succeeds or ctx ends. A refused handshake
// (wrong key) fails at once.
func (n *Node) join(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	var lastErr error
	for {
		for _, addr := range n.cfg.Join {
			if addr == n.addr {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			op := transport.OpJoinVoter
			if n.cfg.Suffrage == SuffrageNonvoter {
				op = transport.OpJoinNonvoter
			}
			err := n.client.ChangeMembership(cctx, addr, op, n.id, n.addr, false)
			cancel()
			if err == nil {
				n.log.Info("cluster: joined", "via", addr)
				return nil
			}
			if errors.Is(err, transport.ErrAuth) {
				return fmt.Errorf("cluster: join via %s: %w", addr, err)
			}
			lastErr = err
			n.log.Info("cluster: join attempt failed", "via", addr, "err", err)
		}
		if lastErr == nil {
			return fmt.Errorf("cluster: config Join: no address other than this node's own (%s)", n.addr)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("cluster: join via %v: %w (last error: %w)", n.cfg.Join, ctx.Err(), lastErr)
		}
		backoff = min(2*backoff, time.Second)
	}
}

// removalCheck is what asking the members about this node found.
type removalCheck int

const (
	removalUnknown  removalCheck = iota // no ready leader answered
	stillMember                         // the leader's configuration lists this node
	removedByLeader                     // it does not; the node has been told (tombstone, halt)
)

// watchRemoval catches a removal this node never heard of: removed while it
// was down, or while it was cut off from the leader (the leader's notice,
// op 6, reaches only a reachable node, and the leader stops replicating to
// it). Such a node would otherwise campaign forever, refused by pre-vote,
// without a word. It asks the members it knows, at start when it restarted
// on existing state (checkNow) and whenever it has known no leader for
// removalLeaderless election timeouts; when a ready leader's configuration
// lacks it — twice, removalConfirm election timeouts apart, so that an
// uncommitted removal the leader then loses does not count — it records
// the tombstone and halts like a node that saw its removal commit (the
// index is the leader's commit index, an upper bound on the removal's).
func (n *Node) watchRemoval(checkNow bool) {
	et := n.cfg.Raft.ElectionTimeout
	tick := time.NewTicker(et / 2)
	defer tick.Stop()
	var leaderlessSince time.Time
	due := time.Now()
	backoff := 200 * time.Millisecond
	for {
		if checkNow && !time.Now().Before(due) {
			switch n.checkMembership() {
			case removedByLeader:
				return
			case stillMember:
				checkNow, backoff = false, 200*time.Millisecond
				leaderlessSince = time.Time{}
			case removalUnknown:
				due = time.Now().Add(backoff)
				backoff = min(2*backoff, 5*time.Second)
			}
		}
		select {
		case <-n.ctx.Done():
			return
		case <-n.raftStopped:
			return
		case <-tick.C:
		}
		if addr, _ := n.raft.LeaderWithID(); addr != "" || n.raft.State() == raft.Leader {
			leaderlessSince = time.Time{}
			continue
		}
		switch {
		case leaderlessSince.IsZero():
			leaderlessSince = time.Now()
		case !checkNow && time.Since(leaderlessSince) >= removalLeaderless*et:
			checkNow, due = true, time.Now()
		}
	}
}

const (
	removalLeaderless = 5 // election timeouts without a leader before asking
	removalConfirm    = 2 // election timeouts between the two answers that prove a removal
)

// checkMembership asks the members of this node's configuration for their
// status until one is a ready leader.
func (n *Node) checkMembership() removalCheck {
	var members []string
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			if string(s.ID) != n.id {
				members = append(members, string(s.Address))
			}
		}
	}
	ask := func() (Status, bool) {
		for _, addr := range members {
			ctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
			st, err := n.PeerStatus(ctx, addr)
			cancel()
			if err == nil && st.IsLeader {
				return st, true
			}
		}
		return Status{}, false
	}
	lists := func(st Status) bool {
		for _, p := range st.Peers {
			if p.ID == n.id {
				return true
			}
		}
		return false
	}
	st, ok := ask()
	if !ok {
		return removalUnknown
	}
	if lists(st) {
		return stillMember
	}
	t := time.NewTimer(removalConfirm * n.cfg.Raft.ElectionTimeout)
	select {
	case <-t.C:
	case <-n.ctx.Done():
		t.Stop()
		return removalUnknown
	}
	again, ok := ask()
	if !ok {
		return removalUnknown
	}
	if lists(again) {
		return stillMember
	}
	n.log.Warn("cluster: the leader's configuration no longer lists this node", "leader", again.ID, "commit_index", again.CommitIndex)
	n.onRemoved(again.CommitIndex)
	return removedByLeader
}
