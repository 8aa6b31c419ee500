package cluster

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tether-project/tether/fsm"
)

// Status is a node's view of itself and the cluster.
type Status struct {
	ID         string `json:"id"`
	Addr       string `json:"addr"`
	RaftState  string `json:"raft_state"` // Follower, Candidate, Leader, Shutdown
	IsLeader   bool   `json:"is_leader"`  // ready leader (barrier done)
	Leader     string `json:"leader"`
	LeaderAddr string `json:"leader_addr"`
	Term       uint64 `json:"term"`
	// AppliedIndex is the last Raft index this node's state machine
	// processed (commands and configuration changes), moved past log
	// entries that carry no state right after it (raft's barriers and
	// no-ops, which never reach the state machine: the leader's commit
	// nudge and a new leader's barrier end the log with one); CommitIndex the
	// highest index it knows committed; LastLogIndex its log's end.
	AppliedIndex uint64 `json:"applied_index"`
	CommitIndex  uint64 `json:"commit_index"`
	LastLogIndex uint64 `json:"last_log_index"`
	// StateIndex and StateHash describe the same fsm.State (the hash is
	// comparable across nodes at equal StateIndex).
	StateIndex          uint64       `json:"state_index"`
	StateHash           string       `json:"state_hash"`
	Bindings            int          `json:"bindings"`
	FeatureLevel        uint32       `json:"feature_level"`         // highest level this node supports
	ClusterFeatureLevel uint32       `json:"cluster_feature_level"` // committed cluster level
	Version             string       `json:"version"`
	Skipped             uint64       `json:"skipped"` // unknown optional events skipped
	Halted              string       `json:"halted,omitempty"`
	Peers               []PeerStatus `json:"peers"`
	LastContact         time.Time    `json:"last_contact"` // last leader contact (followers)
	// Suffrage is this node's configured suffrage (what it asks to join
	// as); Voter is whether the configuration has it voting now.
	Suffrage string `json:"suffrage"`
	Voter    bool   `json:"voter"`
	// LastLogTerm is the term of the last entry in this node's log;
	// LastContactAgoMS how long ago it heard from the leader (0 on the
	// leader, -1 never). The leader's autopilot judges health from these.
	LastLogTerm      uint64  `json:"last_log_term"`
	LastContactAgoMS float64 `json:"last_contact_ago_ms"`
}

// PeerStatus is one member of the latest configuration.
type PeerStatus struct {
	ID    string `json:"id"`
	Addr  string `json:"addr"`
	Voter bool   `json:"voter"`
	// Health is the leader's autopilot view of the member (absent on
	// followers, and on a leader before its first health round).
	Health *PeerHealth `json:"health,omitempty"`
}

// PeerHealth is what the leader's autopilot last measured of a member.
type PeerHealth struct {
	Healthy     bool      `json:"healthy"`
	StableSince time.Time `json:"stable_since"` // when Healthy last changed
	// LastContactMS: how long before the measurement the member last
	// heard from the leader (-1: never).
	LastContactMS float64 `json:"last_contact_ms"`
	LastTerm      uint64  `json:"last_term"`  // term of its last log entry
	LastIndex     uint64  `json:"last_index"` // its last log index
	Lag           uint64  `json:"lag"`        // entries behind the leader's last index
	Status        string  `json:"status"`     // alive, or failed (unreachable)
	Suffrage      string  `json:"suffrage"`   // what it is configured as
}

// Status reports the node's state. It does not block on the network.
func (n *Node) Status() Status {
	st := n.machine.State()
	h := st.Hash()
	la, lid := n.raft.LeaderWithID()
	s := Status{
		ID:                  n.id,
		Addr:                n.addr,
		RaftState:           n.raft.State().String(),
		IsLeader:            n.IsLeader(),
		Leader:              string(lid),
		LeaderAddr:          string(la),
		Term:                n.raft.CurrentTerm(),
		AppliedIndex:        n.appliedThroughStateless(),
		CommitIndex:         n.raft.CommitIndex(),
		LastLogIndex:        n.raft.LastIndex(),
		StateIndex:          st.Index(),
		StateHash:           hex.EncodeToString(h[:]),
		Bindings:            st.Len(),
		FeatureLevel:        n.cfg.FeatureLevel,
		ClusterFeatureLevel: st.FeatureLevel(),
		Version:             n.cfg.Version,
		Skipped:             n.machine.Skipped(),
		LastContact:         n.raft.LastContact(),
		Suffrage:            string(n.cfg.Suffrage),
		LastLogTerm:         lastLogTerm(n.raft),
		LastContactAgoMS:    -1,
	}
	switch {
	case n.raft.State() == raft.Leader:
		s.LastContactAgoMS = 0
	case !s.LastContact.IsZero():
		s.LastContactAgoMS = float64(time.Since(s.LastContact)) / float64(time.Millisecond)
	}
	if err := n.fatalError(); err != nil {
		s.Halted = err.Error()
	}
	if n.raft.State() != raft.Shutdown {
		if f := n.raft.GetConfiguration(); f.Error() == nil {
			for _, srv := range f.Configuration().Servers {
				p := PeerStatus{ID: string(srv.ID), Addr: string(srv.Address), Voter: srv.Suffrage == raft.Voter}
				if s.RaftState == raft.Leader.String() {
					p.Health = n.pilot.Load().health(srv.ID, s.LastLogIndex)
				}
				if p.ID == n.id {
					s.Voter = p.Voter
				}
				s.Peers = append(s.Peers, p)
			}
		}
	}
	return s
}

// maxStatelessScan bounds how many log entries past the applied index
// appliedThroughStateless reads.
const maxStatelessScan = 16

// appliedThroughStateless is the state machine's applied index, moved past
// the entries after it that carry no state (barriers, no-ops): a node whose
// log ends with such entries has nothing left to apply, and callers that
// compare the applied index with the log's end (the edge's freshness
// check) must see that.
func (n *Node) appliedThroughStateless() uint64 {
	applied := n.fsm.appliedIndex()
	end := min(n.raft.LastIndex(), applied+maxStatelessScan)
	for i := applied + 1; i <= end; i++ {
		var l raft.Log
		if err := n.store.GetLog(i, &l); err != nil || l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return i - 1
		}
	}
	return max(applied, end)
}

// PeerStatus asks the node at addr for its Status over the forwarding
// protocol (authenticated with this node's key).
func (n *Node) PeerStatus(ctx context.Context, addr string) (Status, error) {
	b, err := n.client.Status(ctx, addr)
	if err != nil {
		return Status{}, fmt.Errorf("cluster: status of %s: %w", addr, err)
	}
	var s Status
	if err := json.Unmarshal(b, &s); err != nil {
		return Status{}, fmt.Errorf("cluster: status of %s: decode: %w", addr, err)
	}
	return s, nil
}

// SnapshotMeta describes a snapshot written by WriteSnapshot.
type SnapshotMeta struct {
	Index    uint64 // state index (last applied command entry)
	Term     uint64 // its term
	Hash     string // hex fsm state hash
	Bindings int
	Size     int64 // bytes written
}

// Snapshot asks Raft for a snapshot now (and log compaction behind it).
func (n *Node) Snapshot(ctx context.Context) error {
	if err := n.usable(); err != nil {
		return err
	}
	if err := waitFuture(ctx, n.raft.Snapshot()); err != nil {
		return fmt.Errorf("cluster: snapshot: %w", err)
	}
	return nil
}

// WriteSnapshot writes the current state in fsm's snapshot format (for
// `tether operator snapshot save`). The state is immutable, so this does
// not block apply.
func (n *Node) WriteSnapshot(ctx context.Context, w io.Writer) (SnapshotMeta, error) {
	v := n.fsm.current()
	st := v.state
	cw := &countingWriter{w: w, ctx: ctx}
	bw := bufio.NewWriterSize(cw, 256<<10)
	if err := st.WriteSnapshot(bw); err != nil {
		return SnapshotMeta{}, fmt.Errorf("cluster: write snapshot: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return SnapshotMeta{}, fmt.Errorf("cluster: write snapshot: %w", err)
	}
	h := st.Hash()
	return SnapshotMeta{Index: st.Index(), Term: v.commandTerm, Hash: hex.EncodeToString(h[:]), Bindings: st.Len(), Size: cw.n}, nil
}

type countingWriter struct {
	w   io.Writer
	ctx context.Context
	n   int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	k, err := c.w.Write(p)
	c.n += int64(k)
	return k, err
}

// Restore replaces the cluster's state with a snapshot in fsm's format
// (raft user restore; leader only). The stream is spooled to DataDir and
// validated first: hashicorp/raft panics if a user restore fails half-way.
func (n *Node) Restore(ctx context.Context, r io.Reader) error {
	if err := n.usable(); err != nil {
		return err
	}
	if n.raft.State() != raft.Leader {
		la, lid := n.raft.LeaderWithID()
		return fmt.Errorf("cluster: restore: %w", &NotLeaderError{LeaderID: string(lid), LeaderAddr: string(la)})
	}
	f, err := os.CreateTemp(n.cfg.DataDir, "restore-*.snap")
	if err != nil {
		return fmt.Errorf("cluster: restore: spool: %w", err)
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	size, err := io.Copy(f, &ctxReader{r: r, ctx: ctx})
	if err != nil {
		return fmt.Errorf("cluster: restore: read snapshot: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("cluster: restore: %w", err)
	}
	st, err := fsm.ReadSnapshot(bufio.NewReaderSize(f, 256<<10))
	if err != nil {
		return fmt.Errorf("cluster: restore: invalid snapshot: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("cluster: restore: %w", err)
	}
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Index: st.Index(), Size: size}
	var timeout time.Duration
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
		if timeout <= 0 {
			return fmt.Errorf("cluster: restore: %w", context.DeadlineExceeded)
		}
	}
	err = n.raft.Restore(meta, f, timeout)
	// Raft aborted our in-flight entries (ErrAbortedByRestore): retry them.
	n.batcher.failAll(n.batcher.notLeaderError())
	if err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			return fmt.Errorf("cluster: restore: %w: %w", ErrNotLeader, err)
		}
		return fmt.Errorf("cluster: restore: %w", err)
	}
	return nil
}

type ctxReader struct {
	r   io.Reader
	ctx context.Context
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
