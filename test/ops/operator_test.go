package ops

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/ops/audit"
	"github.com/tether-project/tether/ops/operator"
)

// Transfer-leader, remove-peer and add-voter through the admin API while
// agents keep talking to the edges: nothing fails beyond a client retry,
// no conversation changes context instance, each change has committed
// when the call returns, and the removed node, restarted on its old data,
// refuses to start and says why.
func TestMembershipChangesUnderLoad(t *testing.T) {
	f := startFleet(t, fleetOptions{})
	f.waitReady(30*time.Second, nil)
	c := f.operatorClient()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	tr := f.startTraffic(6)
	defer tr.halt()
	tr.waitTurns(t, 15)

	// transfer-leader to a named follower, then to any.
	old := f.leader()
	target := f.edges.Node((old.i + 1) % 3)
	res, err := c.TransferLeader(ctx, target.id)
	if err != nil {
		t.Fatal(err)
	}
	if res.Leader != target.id {
		t.Fatalf("transfer-leader %s: the cluster reports leader %q", target.id, res.Leader)
	}
	// list-peers right after the transfer: the new leader's view, each
	// member measured or plainly unknown (before: HEALTHY false with a blank
	// SUFFRAGE, the new leader not having heard from anyone yet).
	pl, err := c.ListPeers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pl.Leader != target.id || len(pl.Peers) != 3 {
		t.Fatalf("list-peers right after the transfer: %+v", pl)
	}
	for _, p := range pl.Peers {
		if h := p.Health; h != nil && h.Suffrage == "" {
			t.Errorf("list-peers right after the transfer: %s reported without a suffrage: %+v", p.ID, *h)
		}
	}
	tr.waitTurns(t, 10)
	res, err = c.TransferLeader(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if res.Leader == target.id || res.Leader == "" {
		t.Fatalf("transfer-leader to any voter: leader %q, want someone other than %s", res.Leader, target.id)
	}
	tr.waitTurns(t, 10)

	// remove-peer a follower; the change has committed when the call
	// returns: the leader's configuration no longer lists it.
	leader := f.leader()
	var victim *fleetEdge
	for _, s := range f.edges.Running() {
		if s != leader {
			victim = s
			break
		}
	}
	res, err = c.RemovePeer(ctx, victim.id)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := c.ClusterAt(ctx, leader.url()); err != nil || len(info.Peers) != 2 || hasPeer(info.Peers, victim.id) {
		t.Fatalf("right after remove-peer returned, the leader lists %+v (%v)", info.Peers, err)
	}
	// The removed node learns it, records its tombstone and halts; like
	// `tether edge` on a fatal error, the process then exits.
	waitFor(t, 10*time.Second, victim.id+" to halt", func() string {
		if err := victim.Node().FatalError(); !errors.Is(err, cluster.ErrRemoved) {
			return fmt.Sprintf("fatal error %v", err)
		}
		return ""
	})
	f.stopEdge(victim.i)
	tr.waitTurns(t, 15)

	// Restarted on its old data, the removed node refuses to start.
	_, err = f.edges.Start(victim.i)
	if !errors.Is(err, cluster.ErrRemoved) || !strings.Contains(err.Error(), "was removed from the cluster at index") ||
		!strings.Contains(err.Error(), "wipe DataDir") {
		t.Fatalf("restarting the removed %s: %v, want a refusal that explains the removal", victim.id, err)
	}
	if _, err := os.Stat(filepath.Join(victim.dataDir, "REMOVED")); err != nil {
		t.Fatalf("no tombstone in the removed node's data dir: %v", err)
	}
	// add-voter of the removed, stopped node is refused with the reason and
	// leaves the configuration alone (before: "committed", and a dead voter
	// one failure away from losing the quorum).
	if _, err := c.AddVoter(ctx, victim.id, victim.raftAddr); err == nil ||
		!strings.Contains(err.Error(), "no edge answers there") || !strings.Contains(err.Error(), "400") {
		t.Fatalf("add-voter of the removed %s: %v, want a 400 saying nothing answers there", victim.id, err)
	}
	if info, err := c.ClusterAt(ctx, f.leader().url()); err != nil || len(info.Peers) != 2 {
		t.Fatalf("after the refused add-voter the leader lists %+v (%v)", info.Peers, err)
	}

	// add-voter: a fresh edge (empty data dir, neither bootstrap nor join:
	// an edge added to the fleet) is added by the operator and catches up.
	i, _ := f.edges.Add("edge-4")
	fresh, err := f.edges.Start(i)
	if err != nil {
		t.Fatal(err)
	}
	res, err = c.AddVoter(ctx, fresh.id, fresh.raftAddr)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := c.ClusterAt(ctx, f.leader().url()); err != nil || len(info.Peers) != 3 || !hasPeer(info.Peers, fresh.id) {
		t.Fatalf("right after add-voter returned, the leader lists %+v (%v)", info.Peers, err)
	}
	tr.waitTurns(t, 15)
	tr.halt()

	if fails := tr.failures(); len(fails) > 0 {
		t.Fatalf("%d of %d requests failed after retries; first: %s", len(fails), tr.turns.Load(), fails[0])
	}
	for p, homes := range tr.homes {
		if len(homes) != 1 {
			t.Errorf("%s and its sub-agents moved between context instances: %v", p, homes)
		}
	}
	idx := f.quiesce()
	if st := fresh.state(); st.Index() != idx || st.Hash() != f.leader().state().Hash() {
		t.Fatalf("the added voter is at %d with another hash than the leader (at %d)", st.Index(), idx)
	}
	pl, err = c.ListPeers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d turns (%d retried once or more); peers now %+v, leader %s", tr.turns.Load(), tr.retried.Load(), pl.Peers, pl.Leader)
}

func hasPeer(ps []cluster.PeerStatus, id string) bool {
	for _, p := range ps {
		if p.ID == id {
			return true
		}
	}
	return false
}

// snapshot save → inspect offline → more traffic → restore through a list
// of edges whose first ones are followers: the cluster goes back to the
// saved state on every edge; an audit replay of a copy taken after the
// restore still reproduces the live hash; a damaged file never reaches the
// cluster.
func TestSnapshotSaveInspectRestore(t *testing.T) {
	f := startFleet(t, fleetOptions{})
	f.waitReady(30*time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	agentWorkload(t, f, 3, 1)
	idx := f.quiesce()
	saved := f.leader().state()
	savedHash := saved.Hash()

	path := filepath.Join(t.TempDir(), "cluster.snap")
	c := f.operatorClient()
	info, err := c.SaveSnapshot(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Index != idx || info.Hash != hex.EncodeToString(savedHash[:]) || info.Term == 0 {
		t.Fatalf("saved %+v; the cluster is at %d with hash %x", info, idx, savedHash)
	}
	rep, err := operator.InspectSnapshot(path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Index != idx || rep.Term != info.Term || rep.Summary.Hash != info.Hash ||
		rep.Summary.PerFleet["context"] != 3 || rep.Events["Link"] != 6 || rep.Events["Bind"] == 0 {
		t.Fatalf("inspect: %+v", rep)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), fmt.Sprintf("term:           %d", info.Term)) ||
		!strings.Contains(text.String(), "Link=6") {
		t.Fatalf("inspect text (%v):\n%s", err, text.String())
	}

	// The cluster moves on.
	for i := range 3 {
		if _, err := f.chat(i, fmt.Sprintf("late-%d", i), "", "after the snapshot"); err != nil {
			t.Fatal(err)
		}
	}
	f.quiesce()
	if _, ok := f.leader().state().Lookup(fsm.FleetContext, "late-0"); !ok {
		t.Fatal("setup: late-0 not bound")
	}

	// A damaged file is refused locally.
	bad := filepath.Join(t.TempDir(), "bad.snap")
	raw, _ := os.ReadFile(path)
	if err := os.WriteFile(bad, raw[:len(raw)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RestoreSnapshot(ctx, bad); err == nil || !strings.Contains(err.Error(), "not a usable snapshot") {
		t.Fatalf("restore of a truncated file: %v", err)
	}

	// Restore through followers first: they refuse (not the leader) and
	// the client moves on to the leader.
	var order []*fleetEdge
	leader := f.leader()
	for _, s := range f.edges.Running() {
		if s != leader {
			order = append(order, s)
		}
	}
	order = append(order, leader)
	res, err := f.operatorClient(order...).RestoreSnapshot(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if res.Edge != leader.url() {
		t.Fatalf("restore went through %s, want the leader %s", res.Edge, leader.url())
	}
	waitFor(t, 20*time.Second, "every edge to hold the restored state", func() string {
		for _, s := range f.edges.Running() {
			st := s.state()
			if _, late := st.Lookup(fsm.FleetContext, "late-0"); late {
				return s.id + " still binds late-0"
			}
			if _, ok := st.Lookup(fsm.FleetContext, "parent-0"); !ok {
				return s.id + " lost parent-0"
			}
		}
		return ""
	})

	// The cluster keeps serving after the restore, and an audit of a copy
	// (whose archive now holds pre-restore records past the restored
	// index) replays from a snapshot taken at or after the restore.
	for i := range 3 {
		if _, err := f.chat(i, fmt.Sprintf("after-restore-%d", i), "", "hello again"); err != nil {
			t.Fatal(err)
		}
	}
	now := f.quiesce()
	src := f.edges.Node(0)
	dst := filepath.Join(t.TempDir(), "copy")
	copyDir(t, src.dataDir, dst)
	d, err := audit.Open(dst, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	replay, err := d.Replay(ctx, audit.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if live := src.state(); replay.Index != now || replay.Hash != live.Hash() {
		t.Fatalf("replay after restore: index %d hash %x; %s at %d hash %x (start %s, notes %v)",
			replay.Index, replay.Hash, src.id, live.Index(), live.Hash(), replay.Start, replay.Notes)
	}
	if replay.Start.Snapshot == nil || !strings.Contains(strings.Join(replay.Notes, " "), "restored its state from a snapshot") {
		t.Fatalf("replay after restore should start from a snapshot and say why: start %s, notes %v", replay.Start, replay.Notes)
	}
}

// A node removed while it was down never hears of its removal from the
// leader (the leader tells only a reachable node). Restarted on its old
// data it must not campaign forever without a word: it asks the members it
// knows, learns from the leader's configuration that it was removed,
// writes its tombstone and halts with ErrRemoved (cluster's watchRemoval).
func TestNodeRemovedWhileDownRefusesToServe(t *testing.T) {
	f := startFleet(t, fleetOptions{})
	f.waitReady(30*time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader := f.leader()
	victim := f.edges.Node((leader.i + 1) % 3)
	if err := f.edges.Kill(victim.i); err != nil {
		t.Fatal(err)
	}
	if _, err := f.operatorClient().RemovePeer(ctx, victim.id); err != nil {
		t.Fatal(err)
	}
	restarted, err := f.edges.Start(victim.i)
	if errors.Is(err, cluster.ErrRemoved) {
		return // refused at start
	}
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the removed node to learn of its removal", func() string {
		if ferr := restarted.Node().FatalError(); !errors.Is(ferr, cluster.ErrRemoved) {
			st := restarted.Node().Status()
			return fmt.Sprintf("still %s, halted %q, config %+v", st.RaftState, st.Halted, st.Peers)
		}
		return ""
	})
}
