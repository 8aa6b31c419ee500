package edge

import (
	"net/http"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
)

// An edge that restarts and gets traffic before it has heard the workers
// keeps a bound conversation on its instance (the log records it up) instead
// of detouring it as unhealthy. Here the restarted edge can never hear them
// (its NATS server has no workers), so only the log vouches for the
// instances; it serves sticky, records no overflow, and /readyz still says
// what it has not heard.
func TestRestartedEdgeTrustsTheLogForUnheardBoundInstances(t *testing.T) {
	ns, empty := natstest.Start(t, nil), natstest.Start(t, nil)
	for _, id := range []string{"ctx-0", "ctx-1"} {
		startWorker(t, id, workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext, nats: ns.ClientURL()})
	}
	startWorker(t, "gen-0", workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration, nats: ns.ClientURL()})
	ec := startEdges(t, 3, ns.ClientURL(), nil)
	ec.waitInstances(3)
	leader := ec.leader(10 * time.Second)
	restarted := (leader + 1) % 3
	c := httpClient(t)

	a := &agent{session: "unheard", system: longText("unheard-system", 24)}
	first := a.send(t, c, ec.edge(leader), "one", nil)
	waitFor(t, "the bindings on the edge to restart", 10*time.Second, func() bool {
		st := ec.edge(restarted).e.Node().State()
		_, ctxOK := st.Lookup(fsm.FleetContext, a.session)
		_, genOK := st.Lookup(fsm.FleetGeneration, a.session)
		return ctxOK && genOK
	})

	ec.kill(restarted)
	ec.edges[restarted].cfg.NATS.URLs = []string{empty.ClientURL()}
	ec.edges[restarted].cfg.Telemetry.StartupGrace = time.Hour
	if err := ec.start(restarted); err != nil {
		t.Fatal(err)
	}
	te := ec.edge(restarted)
	waitFor(t, "the restarted edge to catch up", 10*time.Second, func() bool {
		ok, _ := te.e.fresh.CaughtUpSinceStart()
		return ok
	})
	if _, ok := te.e.Fleet().Instance(first.ctxInst, time.Now()); ok {
		t.Fatalf("premise: the restarted edge heard %s", first.ctxInst)
	}

	second := a.send(t, c, te, "two", nil)
	if second.ctxInst != first.ctxInst || second.gen != first.gen {
		t.Fatalf("turn 2 via the restarted edge on %s/%s, want the bound %s/%s", second.ctxInst, second.gen, first.ctxInst, first.gen)
	}
	if ov := te.e.Node().State().Counters().Overflows; len(ov) != 0 {
		t.Fatalf("overflows recorded: %v", ov)
	}
	if r := do(t, c, http.MethodGet, te.url()+"/readyz", nil, nil); r.status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz of an edge that heard no instance: %d %s", r.status, r.body)
	}
}
