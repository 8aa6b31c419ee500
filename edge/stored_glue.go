package edge

import (
	"context"
	"strconv"
	"time"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/catalog"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
)

// storedEdge is the edge as its stored responses and conversations ask it
// (stored.Edge).
type storedEdge struct{ e *Edge }

func (s storedEdge) Fleet() *fleetview.View { return s.e.fleet }

// Unheard: the log records the instance, or the edge is in its startup
// gate (it may not have heard every instance yet).
func (s storedEdge) Unheard(instance string, now time.Time) bool {
	rec, inLog := s.e.node.State().Instance(instance)
	return (inLog && rec.Status != fsm.InstanceRemoved) || s.e.ready.InStartupGate(now)
}

// PlaceConversation places a new conversation as an unkeyed request on
// m's generation fleet (routeFleet with no key: the fleet's policy,
// unbound, nothing proposed).
func (s storedEdge) PlaceConversation(ctx context.Context, m *catalog.Model) (string, string, *api.Error) {
	e := s.e
	rq := &route.Request{Dialect: apireq.Responses, Model: m, ModelName: m.Name, Path: "/v1/conversations",
		RequestID: e.nodeID + "-" + strconv.FormatUint(e.reqSeq.Add(1), 10), Now: e.now()}
	h, aerr := e.router.Route(ctx, rq, fsm.FleetGeneration, nil)
	if aerr != nil {
		return "", "", aerr
	}
	return h.Instance, h.URL, nil
}
