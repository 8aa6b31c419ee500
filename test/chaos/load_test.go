package chaos

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestLoadAtShippedDefaults drives 3 `tether edge` processes (the shipped
// cluster.propose_timeout and Raft timing: the harness sets neither unless
// CHAOS_PROPOSE_TIMEOUT says so) and 4 workers with many concurrent
// clients and no fault. On a healthy cluster every request must be
// answered (with propose_timeout 50ms, 7–18 % of requests were refused
// with 503). Clients: CHAOS_LOAD_CLIENTS (100);
// duration: CHAOS_LOAD_SECONDS (20 with -long, else 6).
func TestLoadAtShippedDefaults(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process load: not in -short")
	}
	clients, seconds := 100, 6
	if longMode() {
		seconds = 20
	}
	if n, err := strconv.Atoi(os.Getenv("CHAOS_LOAD_CLIENTS")); err == nil && n > 0 {
		clients = n
	}
	if n, err := strconv.Atoi(os.Getenv("CHAOS_LOAD_SECONDS")); err == nil && n > 0 {
		seconds = n
	}
	// CHAOS_LOAD_KILL_LEADER=1: SIGKILL the leader halfway and restart it
	// (the "one leader kill" run); refusals are then expected and
	// only reported.
	killLeader := os.Getenv("CHAOS_LOAD_KILL_LEADER") == "1"
	v := newEnv(t)
	restarts := map[string][]time.Time{}
	ld := startLoad(v, fmt.Sprintf("load-%d", time.Now().UnixNano()%1e6), clients, clients)
	half := time.NewTimer(time.Duration(seconds) * time.Second / 2)
	<-half.C // the load's schedule, not a wait for an outcome
	if killLeader {
		var kill nemesis
		for _, n := range nemeses {
			if n.name == "kill-leader" {
				kill = n
			}
		}
		kill.run(t, v, func(id string) { restarts[id] = append(restarts[id], time.Now()) })
	}
	rest := time.NewTimer(time.Duration(seconds) * time.Second / 2)
	<-rest.C
	samples := ld.finish()
	v.converge(60 * time.Second)
	vd := v.checkRoutes(samples, restarts)
	ok := 0
	for _, s := range samples {
		if s.ok {
			ok++
		}
	}
	t.Logf("FIGURES load kill_leader=%v clients=%d seconds=%d propose_timeout=%q requests=%d attempts=%d succeeded=%d refused_503=%d failed=%d %s failures=%v refusals=%v",
		killLeader, clients, seconds, os.Getenv("CHAOS_PROPOSE_TIMEOUT"), len(samples), ld.sent.Load(), ok, ld.refused.Load(), ld.failed.Load(),
		vd.Verdict, failureReasons(samples), ld.refusals)
	// The bar: at least 99.9 % of attempts to live edges answered.
	// Asserted on the long run; the short one (make test, a loaded
	// machine) asserts that no request failed on every edge.
	if n := ld.refused.Load(); longMode() && !killLeader && n*1000 > ld.sent.Load() {
		t.Errorf("%d of %d attempts answered 503 on a healthy cluster (more than 0.1 %%)", n, ld.sent.Load())
	}
	if ld.failed.Load() != 0 {
		t.Errorf("%d requests failed on every edge", ld.failed.Load())
	}
	if vd.Wrong != 0 {
		t.Errorf("%d wrong answers", vd.Wrong)
	}
	if !killLeader {
		// Every degraded decision names its cause. No fault: every edge
		// knows the committed placement whenever it places and hears the
		// workers, so nothing is placed or served degraded; asserted on
		// the long run, as the 503 bar is: on a starved machine (the short
		// run beside other work) a proposal can outlast its timeout and an
		// election can start, and the edges then say so (log_down,
		// overflow_unrecorded, commit_timeout, state_not_current).
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, e := range v.edges {
			n, err := v.metricSum(ctx, e, "tether_edge_routing_decisions_total", `outcome="degraded"`)
			if err != nil {
				t.Fatal(err)
			}
			causes := v.degradedCausesOn(e)
			attributed := sumCauses(causes)
			t.Logf("FIGURES load degraded edge=%s decisions=%v by_cause=%v", e.id, n, causes)
			if n != attributed {
				t.Errorf("%s made %v degraded decisions, %v of them by cause", e.id, n, attributed)
			}
			if attributed != 0 && longMode() {
				t.Errorf("%s made %v degraded decisions without a fault (%v)", e.id, attributed, causes)
			}
		}
	}
	checkAppliedOnce(t, v, restarts)
}

// checkAppliedOnce: every event applied exactly once. The
// archive of an edge that ran throughout holds every committed entry; no
// proposal id may be applied twice, and every proposal an edge saw
// applied (its metrics, counted by edges that were not restarted, whose
// counters survive) is in it.
func checkAppliedOnce(t *testing.T, v *env, restarts map[string][]time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acked := 0
	var steady *edgeProc
	for _, e := range v.edges {
		if len(restarts[e.id]) > 0 {
			continue
		}
		steady = e
		n, err := v.proposalsApplied(ctx, e)
		if err != nil {
			t.Fatal(err)
		}
		acked += n
	}
	c := v.archiveApplied(steady)
	t.Logf("FIGURES applied archive_of=%s events=%d applied=%d duplicate=%d applied_twice=%d acked_applied_by_steady_edges=%d",
		steady.id, c.events, c.applied, c.duplicate, len(c.twice), acked)
	if len(c.twice) > 0 {
		t.Errorf("%d proposals applied more than once, e.g. %v", len(c.twice), c.twice[:min(5, len(c.twice))])
	}
	if c.applied < acked {
		t.Errorf("the archive of %s holds %d applied proposals, fewer than the %d the edges saw applied", steady.id, c.applied, acked)
	}
}
