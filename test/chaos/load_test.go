package chaos

import (
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
// answered: 503s there were the D1 finding of issue 13 (7–18 % of requests
// refused with propose_timeout 50ms). Clients: CHAOS_LOAD_CLIENTS (100);
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
	v := newEnv(t)
	ld := startLoad(v, fmt.Sprintf("load-%d", time.Now().UnixNano()%1e6), clients, clients)
	hold := time.NewTimer(time.Duration(seconds) * time.Second)
	<-hold.C // the load's length (schedule), not a wait for an outcome
	samples := ld.finish()
	v.converge(60 * time.Second)
	vd := v.checkRoutes(samples, nil)
	ok := 0
	for _, s := range samples {
		if s.ok {
			ok++
		}
	}
	t.Logf("FIGURES load clients=%d seconds=%d propose_timeout=%q requests=%d attempts=%d succeeded=%d refused_503=%d failed=%d checked=%d wrong_instance=%d recorded_overflows=%d failures=%v refusals=%v",
		clients, seconds, os.Getenv("CHAOS_PROPOSE_TIMEOUT"), len(samples), ld.sent.Load(), ok, ld.refused.Load(), ld.failed.Load(),
		vd.checked, vd.wrong, vd.overflowed, failureReasons(samples), ld.refusals)
	// Issue 13's bar: at least 99.9 % of attempts to live edges answered.
	// Asserted on the long run; the short one (make test, a loaded
	// machine) asserts that no request failed on every edge.
	if n := ld.refused.Load(); longMode() && n*1000 > ld.sent.Load() {
		t.Errorf("%d of %d attempts answered 503 on a healthy cluster (more than 0.1 %%)", n, ld.sent.Load())
	}
	if ld.failed.Load() != 0 {
		t.Errorf("%d requests failed on every edge", ld.failed.Load())
	}
	if vd.wrong != 0 {
		t.Errorf("%d wrong-instance answers", vd.wrong)
	}
}
