// Package leader is the duties an edge runs while its cluster node is the
// ready Raft leader: the settings and cluster feature level the log should
// hold, the workers' instance states, the TTL sweep of idle bindings and
// the evictions of conversations a worker's scheduler dropped. Each round
// proposes at most one batch through the log. See DESIGN.md.
package leader

import (
	"context"
	"log/slog"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/telemetry"
)

// Edge is what the duties need of the edge they run on.
type Edge interface {
	// Node is the edge's cluster node (nil before it is open).
	Node() *cluster.Node
	// Fleet is the edge's view of the workers.
	Fleet() *fleetview.View
	// Now is the edge's clock.
	Now() time.Time
	// Propose commits one event through the log, recorded as the edge
	// records its proposals.
	Propose(ctx context.Context, ev fsm.Event) (fsm.Result, error)
	// ObserveProposal records one event of a batch the duties proposed.
	ObserveProposal(t fsm.EventType, res fsm.Result, err error, took time.Duration)
	// ConversationKey is the routing key of conversation conv in the model
	// instance serves, now (false: the instance's model is unknown).
	ConversationKey(instance, conv string) (string, bool)
}

// Config is the duties' settings, from the edge's configuration.
type Config struct {
	// NodeID names this edge in the tenure annotation.
	NodeID string
	// Interval between rounds (leader.interval).
	Interval time.Duration
	// SweepBatch bounds the TTL evictions proposed per round
	// (leader.sweep_batch).
	SweepBatch int
	// SessionTTL is how long a binding may stay idle (session_ttl).
	SessionTTL time.Duration
	// MaxBindings is the bound the log's settings should hold
	// (max_bindings).
	MaxBindings uint64
	// DownAfter is how long an instance may be silent before it is down
	// (telemetry.down_after).
	DownAfter time.Duration
	// ProposeTimeout bounds the tenure annotation (at least a second).
	ProposeTimeout time.Duration
	// Acted, when set, is told the events proposed by kind (ttl_evict,
	// kv_evict, instance_state, cluster_features, settings) once they
	// commit.
	Acted func(kind string, n int)
	// Logger logs the tenures and the proposals that failed.
	Logger *slog.Logger
}

// evictionQueue bounds the worker evictions waiting for the leader.
const evictionQueue = 4096

// Duties runs the leader's duties for one edge.
type Duties struct {
	edge      Edge
	cfg       Config
	log       *slog.Logger
	evictions chan eviction
}

// eviction is a conversation a worker's scheduler evicted.
type eviction struct {
	instance string
	fleet    fsm.Fleet
	conv     string
}

// New prepares the duties; Run runs them.
func New(e Edge, cfg Config) *Duties {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Acted == nil {
		cfg.Acted = func(string, int) {}
	}
	return &Duties{edge: e, cfg: cfg, log: log, evictions: make(chan eviction, evictionQueue)}
}

// QueueEvictions queues conversations a worker's scheduler evicted for the
// leader's next batch. Only the leader acts on them; an edge that does not
// lead drops them, and so does a leader that is behind (the bindings age
// out by TTL instead).
func (d *Duties) QueueEvictions(instance string, fleet fsm.Fleet, evs []telemetry.Eviction) {
	if n := d.edge.Node(); n == nil || !n.IsLeader() {
		return
	}
	for _, ev := range evs {
		select {
		case d.evictions <- eviction{instance: instance, fleet: fleet, conv: ev.ConversationID}:
		default:
			return
		}
	}
}

// Run runs the duties while the node is the ready leader
// (cluster.Node.LeaderChanges) and stops them when it is not, until ctx
// is done.
func (d *Duties) Run(ctx context.Context) {
	var t *tenure
	defer func() { t.stop() }()
	for {
		select {
		case <-ctx.Done():
			return
		case leader := <-d.edge.Node().LeaderChanges():
			if leader && t == nil {
				t = d.startTenure(ctx)
				d.log.Info("leader duties started")
			} else if !leader && t != nil {
				t.stop()
				t = nil
				d.log.Info("leader duties stopped")
			}
		}
	}
}

// tenure is one tenure's duty loop.
type tenure struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (d *Duties) startTenure(ctx context.Context) *tenure {
	ctx, cancel := context.WithCancel(ctx)
	t := &tenure{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		d.loop(ctx)
	}()
	return t
}

func (t *tenure) stop() {
	if t == nil {
		return
	}
	t.cancel()
	<-t.done
}

func (d *Duties) loop(ctx context.Context) {
	since := d.edge.Now()
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	// Evictions queued while this node was not leader are stale.
	for len(d.evictions) > 0 {
		<-d.evictions
	}
	d.markTenure(ctx)
	d.round(ctx, since)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.round(ctx, since)
		case ev := <-d.evictions:
			batch := []eviction{ev}
			for len(batch) < 512 && len(d.evictions) > 0 {
				batch = append(batch, <-d.evictions)
			}
			d.proposeKVEvictions(ctx, batch)
		}
	}
}

// markTenure commits an Annotation at the start of a leader's tenure.
// Raft opens a term with a no-op and the node's barrier, entries the state
// machine never sees; after this one, an idle log ends in an entry that
// every node applies, so "applied every entry it holds" (the edge's
// freshness) holds on an idle cluster as well as a busy one.
func (d *Duties) markTenure(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, max(d.cfg.ProposeTimeout, time.Second))
	defer cancel()
	if _, err := d.edge.Propose(pctx, fsm.Annotation{Source: "edge/" + d.cfg.NodeID, Text: "leader tenure start"}); err != nil {
		d.log.Debug("leader tenure annotation not committed", "err", err)
	}
}
