// Package readiness judges whether an edge's copy of the replicated state
// can be trusted: Freshness polls the leader for its state index (caught up
// since start, in contact with a leader within the degraded window, not
// behind the leader's state of a window ago: what degraded placement and
// hard affinity ask), and Readiness answers /readyz (a leader known, a
// healthy instance per served fleet, caught up, not stalled, and at startup
// every instance the log records up heard or the grace over) and says when
// the state is stalled (halted, raft.db failing, or a leader's index not
// applied within maxStateLag) and when the edge is isolated (no leader
// known and no worker heard), which the admission layer refuses requests
// for. It reads the edge through Edge and proposes nothing.
package readiness

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/httpjson"
)

// Readiness is what /readyz answers. Always: a leader is known, the node
// has not halted, each fleet has a healthy instance, and the state is not
// stalled (below). After a (re)start also, once: the state caught up with
// a leader's (freshness), and the edge heard (telemetry or probe) every
// instance the log records up and num_instances per fleet — or
// telemetry.startup_grace passed. That once matters: a worker that
// restarts later must not take every edge out of the load balancer (only
// "a healthy instance per fleet" is checked then).
//
// Stalled: once caught up, an edge's state must keep following its
// leader's. It is stalled while a state index a leader reported more than
// maxStateLag ago is still not applied here, or while its writes to
// raft.db have failed for storageFailureGrace with no success since (a
// full or failing disk: a follower that cannot append what its leader
// sends freezes while its peers move on), or while the node is halted (it
// applies nothing more). A stalled edge is not ready and
// refuses routed requests (503 state_stalled, Retry-After: admission.go):
// every request may need a placement it would read stale or could not
// learn the outcome of. It serves again as soon as it has caught up.
type Readiness struct {
	edge    Edge
	fresh   *Freshness
	cfg     Config
	started time.Time

	mu        sync.Mutex
	heardDone bool // the startup instance gate passed (latched)
}

const (
	// maxStateLag: a state index a leader reported this long ago and not
	// yet applied here makes the edge stalled. A healthy follower applies
	// a commit within milliseconds, a loaded one within a few hundred;
	// an election (no leader reports meanwhile) takes about one second.
	maxStateLag = 5 * time.Second
	// storageFailureGrace: raft.db writes failing this long, with no
	// success since, make the edge stalled.
	storageFailureGrace = time.Second
	// maxLagSamples bounds the leader reports kept (one per freshness
	// poll that found this node behind: 100 ms apart).
	maxLagSamples = 1024
)

// stateLag remembers leader state indexes this node had not reached when
// they were reported, oldest first (increasing).
type stateLag struct {
	mu      sync.Mutex
	samples []lagSample
}

type lagSample struct {
	at    time.Time
	index uint64
}

// observe records a leader's state index seen at at, with own the node's
// index then.
func (l *stateLag) observe(at time.Time, leader, own uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// A leader reporting less than it did (an operator's snapshot restore
	// moved the state back): what it reported before is no longer ahead.
	for n := len(l.samples); n > 0 && l.samples[n-1].index > leader; n-- {
		l.samples = l.samples[:n-1]
	}
	l.dropReachedLocked(own)
	if leader <= own || len(l.samples) >= maxLagSamples {
		return
	}
	if n := len(l.samples); n == 0 || leader > l.samples[n-1].index {
		l.samples = append(l.samples, lagSample{at, leader})
	}
}

func (l *stateLag) dropReachedLocked(own uint64) {
	i := 0
	for i < len(l.samples) && l.samples[i].index <= own {
		i++
	}
	if i > 0 {
		l.samples = append(l.samples[:0], l.samples[i:]...)
	}
}

// behind is how long ago a leader reported the oldest state index this
// node has still not applied (own), and that index; 0 when caught up.
func (l *stateLag) behind(now time.Time, own uint64) (time.Duration, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropReachedLocked(own)
	if len(l.samples) == 0 {
		return 0, 0
	}
	return now.Sub(l.samples[0].at), l.samples[0].index
}

// Stalled reports why this edge's state has stopped following its
// leader's ("" when it has not).
func (r *Readiness) Stalled(now time.Time) string {
	n := r.edge.Node()
	if err := n.FatalError(); err != nil {
		return "state stalled: the node halted: " + err.Error()
	}
	if ok, _ := r.fresh.CaughtUpSinceStart(); !ok {
		return "" // still catching up after a (re)start: Check says so
	}
	if err, since := n.StorageError(); err != nil && now.Sub(since) >= storageFailureGrace {
		return fmt.Sprintf("state stalled: writes to the Raft log have failed for %s (%v)", now.Sub(since).Round(100*time.Millisecond), err)
	}
	own := n.State().Index()
	if d, idx := r.fresh.lag.behind(now, own); d > maxStateLag {
		return fmt.Sprintf("state stalled: a leader reported state index %d %s ago, this edge has applied %d (bound %s)",
			idx, d.Round(100*time.Millisecond), own, maxStateLag)
	}
	return ""
}

// Isolated reports why this edge is cut off ("" when it is not): it knows
// no cluster leader (it cannot reach a quorum of its peers, or an election
// is under way) and hears none of its workers (Fleet().Deaf: no load
// report, no successful probe lately). Either alone is a fault the edge
// serves through: an election its peers hold (the log never makes a soft
// request fail), a NATS outage (the workers are probed over HTTP). Both
// at once is an edge partitioned from everything but its clients, as far
// as it can tell: a request it routed would wait on a worker it cannot
// reach, so the admission layer refuses them (503 edge_isolated with
// Retry-After) until it hears a worker or a leader again.
func (r *Readiness) Isolated(now time.Time) string {
	if leader, _ := r.edge.Node().Leader(); leader != "" {
		return ""
	}
	silence, deaf := r.edge.Fleet().Deaf(now)
	if !deaf {
		return ""
	}
	return fmt.Sprintf("isolated: no cluster leader known and no worker heard for %s", silence.Round(10*time.Millisecond))
}

// Config is what the edge's configuration says of its readiness.
type Config struct {
	// StartupGrace is telemetry.startup_grace.
	StartupGrace time.Duration
	// ServedFleets are the fleets requests go to (one healthy instance
	// each is wanted).
	ServedFleets []fsm.Fleet
	// NumInstances is num_instances per fleet, summed over the models
	// (wanted healthy at startup).
	NumInstances [3]int
}

// New is the readiness of e from started on (the edge's start), judged with
// fresh.
func New(e Edge, fresh *Freshness, cfg Config, started time.Time) *Readiness {
	return &Readiness{edge: e, fresh: fresh, cfg: cfg, started: started}
}

// Check returns the reasons the edge is not ready (none: ready).
func (r *Readiness) Check(now time.Time) []string {
	n := r.edge.Node()
	var reasons []string
	if leader, _ := n.Leader(); leader == "" {
		reasons = append(reasons, "no cluster leader known")
	}
	if err := n.FatalError(); err != nil {
		reasons = append(reasons, err.Error())
	}
	caughtUp, why := r.fresh.CaughtUpSinceStart()
	if !caughtUp {
		reasons = append(reasons, why)
	}
	if why := r.Stalled(now); why != "" {
		reasons = append(reasons, why)
	}
	if why := r.Isolated(now); why != "" {
		reasons = append(reasons, why)
	}
	instances := r.edge.Fleet().Instances(now)
	healthy := map[fsm.Fleet]int{}
	for _, in := range instances {
		if in.Healthy {
			healthy[in.Fleet]++
		}
	}
	for _, f := range r.cfg.ServedFleets {
		if healthy[f] == 0 {
			reasons = append(reasons, fmt.Sprintf("no healthy %s instance", f))
		}
	}
	reasons = append(reasons, r.edge.ModelsUnready(now)...)
	if why := r.startupInstances(now, caughtUp, healthy); why != "" {
		reasons = append(reasons, why)
	}
	return reasons
}

// startupInstances is the startup gate on instances: "" once passed.
func (r *Readiness) startupInstances(now time.Time, caughtUp bool, healthy map[fsm.Fleet]int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.heardDone {
		return ""
	}
	if grace := r.cfg.StartupGrace; now.Sub(r.started) >= grace {
		r.heardDone = true
		return ""
	}
	if !caughtUp {
		// The log's instance records are only known once caught up.
		return "waiting to catch up before checking the instances the log records up"
	}
	var missing []string
	for _, rec := range r.edge.Node().State().Instances() {
		if rec.Status != fsm.InstanceUp {
			continue
		}
		if in, ok := r.edge.Fleet().Instance(rec.ID, now); !ok || in.LastSeen.IsZero() {
			missing = append(missing, rec.ID)
		}
	}
	var short []string
	for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
		if want := r.cfg.NumInstances[f]; healthy[f] < want {
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
	left := r.cfg.StartupGrace - now.Sub(r.started)
	return fmt.Sprintf("%s (at startup; telemetry.startup_grace ends in %s)", strings.Join(parts, "; "), left.Round(100*time.Millisecond))
}

// InStartupGate reports whether the startup instance gate is still open:
// the edge may not yet have heard every instance the log records up.
func (r *Readiness) InStartupGate(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.heardDone && now.Sub(r.started) < r.cfg.StartupGrace
}

// ServeHTTP answers /readyz: 200 {"status":"ready"} or 503 with the
// reasons.
func (r *Readiness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if reasons := r.Check(r.edge.Now()); len(reasons) > 0 {
		httpjson.Write(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "reasons": reasons})
		return
	}
	httpjson.Write(w, http.StatusOK, map[string]string{"status": "ready"})
}

// Edge is what readiness reads of the edge, when asked (the node exists
// once the edge started).
type Edge interface {
	// Node is the edge's cluster node.
	Node() *cluster.Node
	// Fleet is the edge's view of the workers.
	Fleet() *fleetview.View
	// Now is the edge's clock.
	Now() time.Time
	// ModelsUnready are the reasons a catalogue of several models is not
	// ready (none: ready, or one model).
	ModelsUnready(now time.Time) []string
}
