package edge

import (
	"github.com/nats-io/nats.go"
	"github.com/tether-project/tether/cluster"
)

// observeSource is the edge as its scrape-time series read it
// (observe.Source).
type observeSource struct{ e *Edge }

func (s observeSource) Node() *cluster.Node      { return s.e.node }
func (s observeSource) DataDir() string          { return s.e.cfg.Cluster.DataDir }
func (s observeSource) InflightBodyBytes() int64 { return s.e.bodies.InUse() }
func (s observeSource) RecorderQueued() int      { return s.e.recorder.Queued() }
func (s observeSource) PlacementsInFlight() int  { return s.e.placements.InFlight() }

// proposalsEdge is the edge as its proposals read it (proposals.Edge).
type proposalsEdge struct{ e *Edge }

func (p proposalsEdge) Node() *cluster.Node { return p.e.node }
func (p proposalsEdge) NATS() *nats.Conn    { return p.e.nats.conn }
