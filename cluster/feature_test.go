package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
)

// mixedVersionCluster is a genuine mixed-version cluster from one binary:
// n2 runs capped at feature level 1 (Config.FeatureLevel), as the release
// before level 2 would; n0 and n1 understand level 2. Leadership is moved
// off n2 so that the level-2 entry is proposed by an uncapped leader.
func mixedVersionCluster(t *testing.T) (tc *testCluster, capped *Node, full []*Node) {
	t.Helper()
	tc = newTestCluster(t, 3, func(i int, c *Config) {
		if i == 2 {
			c.FeatureLevel = 1
		}
	})
	capped = tc.node(2)
	full = []*Node{tc.node(0), tc.node(1)}
	for _, n := range full {
		if st := n.Status(); st.FeatureLevel != fsm.FeatureLevelMax {
			t.Fatalf("node %s reports feature level %d, want %d", n.ID(), st.FeatureLevel, fsm.FeatureLevelMax)
		}
	}
	if st := capped.Status(); st.FeatureLevel != 1 || capped.machineForTest().MaxFeatureLevel() != 1 {
		t.Fatalf("capped node reports feature level %d (machine %d), want 1", st.FeatureLevel, capped.machineForTest().MaxFeatureLevel())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if tc.leader(10*time.Second) == capped {
		if err := capped.TransferLeadership(ctx, "n0"); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "an uncapped leader", func() bool {
		l := tc.leader(10 * time.Second)
		return l != capped
	})
	return tc, capped, full
}

func waitFatal(t *testing.T, n *Node) error {
	t.Helper()
	select {
	case err := <-n.Fatal():
		return err
	case <-time.After(15 * time.Second):
		t.Fatalf("node %s did not halt", n.ID())
	}
	return nil
}

// A level-2 event committed while a level-1 node is a member (which the
// edge never does: it emits RankObserved only once the committed level is
// 2) halts that node with the upgrade message; the others apply it.
func TestLevel1NodeHaltsOnALevel2Event(t *testing.T) {
	t.Parallel()
	tc, capped, full := mixedVersionCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := full[0].Propose(ctx, bindEv("k", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	tc.sync(10 * time.Second) // every node, the capped one included, applied the bind
	if _, err := full[0].Propose(ctx, fsm.RankObserved{Fleet: fsm.FleetContext, Key: "k", Epoch: res.Binding.Epoch, Rank: 3}); err != nil {
		t.Fatal(err)
	}
	err = waitFatal(t, capped)
	var unknown *fsm.UnknownEventError
	if !errors.Is(err, ErrHalted) || !errors.As(err, &unknown) || unknown.Type != fsm.TypeRankObserved {
		t.Fatalf("capped node halted with %v, want ErrHalted wrapping *fsm.UnknownEventError for RankObserved", err)
	}
	for _, want := range []string{"RankObserved", "feature level 2", "understands feature level 1", "upgrade"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("halt message %q lacks %q", err, want)
		}
	}
	if _, ok := capped.State().Lookup(fsm.FleetContext, "k"); !ok {
		t.Fatal("the capped node lost the state before the level-2 entry")
	}
	if b, _ := capped.State().Lookup(fsm.FleetContext, "k"); b.HasRank {
		t.Fatal("the capped node applied the level-2 event")
	}
	for _, n := range full {
		waitFor(t, 10*time.Second, "node "+n.ID()+" to apply the rank", func() bool {
			b, ok := n.State().Lookup(fsm.FleetContext, "k")
			return ok && b.HasRank && b.Rank == 3
		})
	}
	// The level-2 nodes keep serving (two of three voters).
	if _, err := full[1].Propose(ctx, bindEv("after", "w1")); err != nil {
		t.Fatalf("uncapped nodes stopped serving: %v", err)
	}
	waitFor(t, 10*time.Second, "equal states on the level-2 nodes", func() bool {
		a, b := full[0].Status(), full[1].Status()
		return a.StateIndex == b.StateIndex && a.StateHash == b.StateHash
	})
}

// Committing cluster level 2 with a level-1 node present halts it too:
// from that entry on the others apply level-2 rules (unique epochs) it does
// not have.
func TestLevel1NodeHaltsWhenLevel2IsCommitted(t *testing.T) {
	t.Parallel()
	_, capped, full := mixedVersionCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := full[0].Propose(ctx, fsm.ClusterFeatures{Level: 2}); err != nil {
		t.Fatal(err)
	}
	err := waitFatal(t, capped)
	var fe *fsm.FeatureLevelError
	if !errors.As(err, &fe) || fe.Level != 2 || fe.NodeLevel != 1 || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("capped node halted with %v, want *fsm.FeatureLevelError (2 over 1) asking for an upgrade", err)
	}
	if capped.State().FeatureLevel() >= 2 {
		t.Fatal("the capped node applied level 2")
	}
	// The others run at level 2: a bind now gets a unique epoch.
	res, err := full[1].Propose(ctx, bindEv("k2", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	st := full[1].State()
	if st.FeatureLevel() != 2 || res.Binding.Epoch == st.EpochIndex(res.Binding.Epoch) || st.EpochIndex(res.Binding.Epoch) != st.Index() {
		t.Fatalf("level %d, epoch %d (index %d): not a level-2 epoch", st.FeatureLevel(), res.Binding.Epoch, st.EpochIndex(res.Binding.Epoch))
	}
	if s := full[0].Status(); s.ClusterFeatureLevel != 2 || s.FeatureLevel != fsm.FeatureLevelMax {
		t.Fatalf("status: cluster level %d, node level %d", s.ClusterFeatureLevel, s.FeatureLevel)
	}
}
