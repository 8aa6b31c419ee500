package edge

import (
	"context"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/leader"
	"github.com/tether-project/tether/fsm"
)

// newLeaderDuties prepares the leader's duties (edge/leader) over this
// edge; startBackground runs them. Their proposals count in
// tether_edge_leader_actions_total by kind.
func (e *Edge) newLeaderDuties() *leader.Duties {
	return leader.New(leaderEdge{e}, leader.Config{
		NodeID:         e.nodeID,
		Interval:       e.cfg.Leader.Interval,
		SweepBatch:     e.cfg.Leader.SweepBatch,
		SessionTTL:     e.cfg.SessionTTL,
		MaxBindings:    e.cfg.MaxBindings,
		DownAfter:      e.cfg.Telemetry.DownAfter,
		ProposeTimeout: e.cfg.Cluster.ProposeTimeout,
		Acted: func(kind string, n int) {
			e.metrics.LeaderActions.WithLabelValues(kind).Add(float64(n))
		},
		Logger: e.log,
	})
}

// leaderEdge is the edge as the leader's duties see it (leader.Edge). A
// separate type keeps these methods out of Edge's own API.
type leaderEdge struct{ e *Edge }

var _ leader.Edge = leaderEdge{}

func (l leaderEdge) Node() *cluster.Node    { return l.e.node }
func (l leaderEdge) Fleet() *fleetview.View { return l.e.fleet }
func (l leaderEdge) Now() time.Time         { return l.e.now() }

func (l leaderEdge) Propose(ctx context.Context, ev fsm.Event) (fsm.Result, error) {
	return l.e.proposer.Propose(ctx, ev)
}

func (l leaderEdge) ObserveProposal(t fsm.EventType, res fsm.Result, err error, took time.Duration) {
	l.e.proposer.Observe(t, res, err, took)
}

func (l leaderEdge) ConversationKey(instance, conv string) (string, bool) {
	m := l.e.catalogue.ModelOfInstance(instance, l.e.now())
	if m == nil {
		return "", false
	}
	return m.Key(conv), true
}
