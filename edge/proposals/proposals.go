// Package proposals is what an edge writes to the affinity log beside its
// requests, none of it on a request's path: its own Bind proposals for new
// keys (Placements: dispatched at once, proposed with one id for every
// attempt, followed by this edge until the log answers; the placements the
// other edges tell over NATS, followed for a while), the recorder of the
// events a request does not wait for (overflows, parent links, rank
// observations, evidence, the Binds whose first attempt failed: queued
// with their proposal ids, batched, retried until the log commits them),
// the touch batches of the keys requests used, and the Proposer every
// proposal goes through (counted, and remembered when the log could not
// commit). Placements and Recorder are routing/decide's Placements and the
// recorder its Recorder adapts. See edge/DESIGN.md "New keys" and
// "Background proposals are idempotent".
package proposals

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/natspub"
	"github.com/tether-project/tether/edge/observe"
)

// Edge is what the proposals read of the edge (from its Start on).
type Edge interface {
	// Node is the edge's cluster node.
	Node() *cluster.Node
	// NATS is the edge's NATS connection (nil without NATS: nothing is
	// told to, or heard from, the other edges).
	NATS() *nats.Conn
	// Publisher sends the edge's own NATS messages off the request path
	// (nil without NATS).
	Publisher() *natspub.Publisher
}

// Config is what the proposals take from the edge's configuration.
type Config struct {
	// NodeID names this edge in its placements and their announcements.
	NodeID string
	// ProposeTimeout is cluster.propose_timeout: one attempt's deadline.
	ProposeTimeout time.Duration
	// TouchInterval is touch_interval: how often the used keys are touched.
	TouchInterval time.Duration
	Metrics       *observe.Metrics
	Logger        *slog.Logger
	// Now is the edge's clock.
	Now func() time.Time
}

// Proposals are an edge's proposals beside its requests.
type Proposals struct {
	Proposer   *Proposer
	Placements *Placements
	Recorder   *Recorder
	Touches    *Touches
}

// env is what the proposals share: the edge's lifetime, the edge, the
// settings, and each other.
type env struct {
	ctx        context.Context
	edge       Edge
	cfg        Config
	metrics    *observe.Metrics
	log        *slog.Logger
	proposer   *Proposer
	placements *Placements
	recorder   *Recorder
}

// New makes the proposals of edge; ctx is the edge's lifetime (a proposal
// in flight is given up when it ends). The recorder's and the touches'
// loops are Run by the edge.
func New(ctx context.Context, edge Edge, cfg Config) *Proposals {
	e := &env{ctx: ctx, edge: edge, cfg: cfg, metrics: cfg.Metrics, log: cfg.Logger}
	e.proposer = &Proposer{edge: edge, metrics: cfg.Metrics, now: cfg.Now}
	e.placements = newPlacements(e)
	e.recorder = newRecorder(e)
	return &Proposals{Proposer: e.proposer, Placements: e.placements, Recorder: e.recorder, Touches: newTouches(e)}
}
