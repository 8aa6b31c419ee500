package edge

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tether-project/tether/fsm"
)

// readiness is what /readyz answers. Always: a leader is known, the node
// has not halted, and each fleet has a healthy instance. After a (re)start
// also, once: the state caught up with a leader's (freshness), and the
// edge heard (telemetry or probe) every instance the log records up and
// num_instances per fleet — or telemetry.startup_grace passed. That once
// matters: a worker that restarts later must not take every edge out of
// the load balancer (only "a healthy instance per fleet" is checked then).
type readiness struct {
	e       *Edge
	started time.Time

	mu        sync.Mutex
	heardDone bool // the startup instance gate passed (latched)
}

func newReadiness(e *Edge, started time.Time) *readiness {
	return &readiness{e: e, started: started}
}

// check returns the reasons the edge is not ready (none: ready).
func (r *readiness) check(now time.Time) []string {
	e := r.e
	var reasons []string
	if leader, _ := e.node.Leader(); leader == "" {
		reasons = append(reasons, "no cluster leader known")
	}
	if err := e.node.FatalError(); err != nil {
		reasons = append(reasons, err.Error())
	}
	caughtUp, why := e.fresh.caughtUpSinceStart()
	if !caughtUp {
		reasons = append(reasons, why)
	}
	instances := e.fleet.Instances(now)
	healthy := map[fsm.Fleet]int{}
	for _, in := range instances {
		if in.Healthy {
			healthy[in.Fleet]++
		}
	}
	for _, f := range e.cfg.servedFleets() {
		if healthy[f] == 0 {
			reasons = append(reasons, fmt.Sprintf("no healthy %s instance", f))
		}
	}
	reasons = append(reasons, e.modelsUnready(now)...)
	if why := r.startupInstances(now, caughtUp, healthy); why != "" {
		reasons = append(reasons, why)
	}
	return reasons
}

// startupInstances is the startup gate on instances: "" once passed.
func (r *readiness) startupInstances(now time.Time, caughtUp bool, healthy map[fsm.Fleet]int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.heardDone {
		return ""
	}
	e := r.e
	if grace := e.cfg.Telemetry.StartupGrace; now.Sub(r.started) >= grace {
		r.heardDone = true
		return ""
	}
	if !caughtUp {
		// The log's instance records are only known once caught up.
		return "waiting to catch up before checking the instances the log records up"
	}
	var missing []string
	for _, rec := range e.node.State().Instances() {
		if rec.Status != fsm.InstanceUp {
			continue
		}
		if in, ok := e.fleet.Instance(rec.ID, now); !ok || in.LastSeen.IsZero() {
			missing = append(missing, rec.ID)
		}
	}
	var short []string
	for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
		want := 0
		for _, m := range e.models {
			want += m.cfg.servers(f).NumInstances
		}
		if healthy[f] < want {
			short = append(short, fmt.Sprintf("%d of %d %s instances healthy (num_instances)", healthy[f], want, f))
		}
	}
	if len(missing) == 0 && len(short) == 0 {
		r.heardDone = true
		return ""
	}
	sort.Strings(missing)
	if len(missing) > 8 {
		missing = append(missing[:8], fmt.Sprintf("and %d more", len(missing)-8))
	}
	var parts []string
	if len(missing) > 0 {
		parts = append(parts, "not heard yet from instances the log records up: "+strings.Join(missing, ", "))
	}
	parts = append(parts, short...)
	left := e.cfg.Telemetry.StartupGrace - now.Sub(r.started)
	return fmt.Sprintf("%s (at startup; telemetry.startup_grace ends in %s)", strings.Join(parts, "; "), left.Round(100*time.Millisecond))
}

// inStartupGate reports whether the startup instance gate is still open:
// the edge may not yet have heard every instance the log records up.
func (r *readiness) inStartupGate(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.heardDone && now.Sub(r.started) < r.e.cfg.Telemetry.StartupGrace
}

// handleReady answers /readyz: 200 {"status":"ready"} or 503 with the
// reasons.
func (e *Edge) handleReady(w http.ResponseWriter, r *http.Request) {
	if reasons := e.ready.check(e.now()); len(reasons) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "reasons": reasons})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
