package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
)

// fastPilot is autopilot with test timings: health every 100ms, promotion
// after 300ms of health, removal after 6s unreachable. The shipped defaults
// (1s, 10s, 10m) are exercised by the config tests and by every other test
// of the package, whose leaders run autopilot with them.
var fastPilot = AutopilotConfig{Voters: 3, Interval: 100 * time.Millisecond, StabilizationTime: 300 * time.Millisecond, DeadServerTimeout: 6 * time.Second}

// joinNode opens a new node that joins through via with the given suffrage.
func (tc *testCluster) joinNode(id, via string, s Suffrage, ap AutopilotConfig) *Node {
	tc.t.Helper()
	return tc.join(id, func(c *Config) { c.Join, c.Suffrage, c.Autopilot = []string{via}, s, ap })
}

// suffrages is the latest configuration as id → voter, seen from n.
func suffrages(n *Node) map[string]bool {
	out := map[string]bool{}
	for _, p := range n.Status().Peers {
		out[p.ID] = p.Voter
	}
	return out
}

func countVoters(m map[string]bool) int {
	v := 0
	for _, voter := range m {
		if voter {
			v++
		}
	}
	return v
}

// TestNonvotersAndAutopilot: non-voters join through any member, apply the
// log and give read-your-writes for their own proposals; a node asking to
// vote joins as a non-voter once the cluster has its Voters; the leader
// reports every member's health; when a voter dies, autopilot promotes a
// healthy non-voter (the one configured as a voter first), demotes the dead
// voter and removes it after DeadServerTimeout, keeping three voters. A
// dead non-voter changes nothing but is removed too.
func TestNonvotersAndAutopilot(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, func(_ int, c *Config) { c.Autopilot = fastPilot })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	nv1 := tc.joinNode("nv1", tc.follower().Addr(), SuffrageNonvoter, fastPilot)
	nv2 := tc.joinNode("nv2", tc.leader(10*time.Second).Addr(), SuffrageNonvoter, fastPilot)
	tc.joinNode("spare", nv1.Addr(), SuffrageVoter, fastPilot) // via a non-voter
	conf := suffrages(tc.leader(10 * time.Second))
	if len(conf) != 6 || countVoters(conf) != 3 || conf["nv1"] || conf["nv2"] || conf["spare"] {
		t.Fatalf("configuration after joins: %v; want n0-n2 voting, nv1, nv2, spare not", conf)
	}
	if st := nv1.Status(); st.Suffrage != string(SuffrageNonvoter) || st.Voter {
		t.Fatalf("nv1 status: suffrage %q voter %v", st.Suffrage, st.Voter)
	}

	// Read-your-writes on a non-voter: its own Bind is in its state when
	// Propose returns; the other non-voter applies it too.
	for i := range 20 {
		key := fmt.Sprintf("nv-%d", i)
		res, err := nv1.Propose(ctx, bindEv(key, "w1"))
		if err != nil || res.Status != fsm.StatusApplied {
			t.Fatalf("propose %s on a non-voter: %+v, %v", key, res, err)
		}
		if _, ok := nv1.State().Lookup(fsm.FleetContext, key); !ok {
			t.Fatalf("%s not in the non-voter's state when Propose returned", key)
		}
	}
	idx := nv1.State().Index()
	if err := nv2.WaitApplied(ctx, idx); err != nil {
		t.Fatal(err)
	}
	// The leader's commit nudge ends the log with a barrier, which never
	// reaches the state machine: the reported applied index still reaches
	// the log's end (the edge's freshness check compares them).
	waitFor(t, 10*time.Second, "nv1's applied index to reach the end of its log", func() bool {
		s := nv1.Status()
		return s.AppliedIndex >= max(s.CommitIndex, s.LastLogIndex)
	})

	// Health of every member on the leader.
	waitFor(t, 10*time.Second, "the leader to report six healthy members", func() bool {
		healthy := 0
		for _, p := range tc.leader(10 * time.Second).Status().Peers {
			if p.Health != nil && p.Health.Healthy && p.Health.Status == "alive" {
				healthy++
			}
		}
		return healthy == 6
	})

	// Kill a non-voter: the voters and the quorum are untouched, the
	// other non-voter keeps proposing; it is removed after
	// DeadServerTimeout like any dead member.
	nv2ID := nv2.ID()
	tc.stop(tc.index(nv2), true)
	if _, err := nv1.Propose(ctx, bindEv("after-nonvoter-kill", "w1")); err != nil {
		t.Fatal(err)
	}
	if c := suffrages(tc.leader(10 * time.Second)); countVoters(c) != 3 || c[nv2ID] {
		t.Fatalf("after killing a non-voter: %v", c)
	}

	// Kill a voter that is not the leader.
	leader := tc.leader(10 * time.Second)
	victim := -1
	for i := range 3 {
		if tc.node(i) != leader {
			victim = i
			break
		}
	}
	victimID := tc.node(victim).ID()
	tc.stop(victim, true)
	waitFor(t, 30*time.Second, "autopilot to replace "+victimID+" by spare and remove it", func() bool {
		l := tc.leader(10 * time.Second)
		c := suffrages(l)
		_, present := c[victimID]
		_, nv2Present := c[nv2ID]
		return !present && !nv2Present && c["spare"] && countVoters(c) == 3 && len(c) == 4
	})
	if _, err := nv1.Propose(ctx, bindEv("after-promotion", "w2")); err != nil {
		t.Fatal(err)
	}
	tc.sync(10 * time.Second)
	assertSameState(t, tc)
}
