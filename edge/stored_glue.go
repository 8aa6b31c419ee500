package edge

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/catalog"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/stored"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/routing/decide"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
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
	rq := &request{dialect: apireq.Responses, m: m, model: m.Name, path: "/v1/conversations",
		requestID: e.nodeID + "-" + strconv.FormatUint(e.reqSeq.Add(1), 10), now: e.now()}
	h, aerr := e.routeFleet(ctx, rq, fsm.FleetGeneration, nil)
	if aerr != nil {
		return "", "", aerr
	}
	return h.Instance, h.URL, nil
}

// Decision labels of a request routed by a stored response.
const (
	outcomeStored = "stored"
	policyStored  = "stored_response"
)

// pinned is the stored response or conversation rq names (nil none): the
// instance that holds it serves rq.
func (rq *request) pinned() *stored.Ref {
	if rq.refs.Prev != nil {
		return rq.refs.Prev
	}
	return rq.refs.Conv
}

// storedHop is the hop to the instance holding rq's stored response or
// conversation: no decision, no log, no retry elsewhere (no other instance
// holds it).
func (e *Edge) storedHop(rq *request) *hop {
	ref := rq.pinned()
	f := fsm.Fleet(ref.ID.Fleet)
	h := &hop{Hop: decide.Hop{Fleet: f, Key: rq.m.Key(rq.id.Key(f)), Instance: ref.ID.Instance, URL: ref.URL, Rank: ref.ID.Rank,
		Outcome: outcomeStored, Policy: policyStored}}
	e.metrics.Decisions.WithLabelValues(f.String(), policyStored, outcomeStored).Inc()
	return h
}

// dispatchStored serves a request that continues a stored response on the
// instance holding it: an aggregated engine gets it as any request; a
// tether worker fleet serves it whole on that (generation) worker, which
// alone can expand previous_response_id into the prompt and holds the
// conversation's KV from the turn it produced.
func (e *Edge) dispatchStored(ctx context.Context, w http.ResponseWriter, rq *request, span trace.Span) int {
	h := e.storedHop(rq)
	if rq.refs.Prev != nil {
		span.SetAttributes(attribute.String("tether.stored_response", rq.refs.Prev.Client))
	} else {
		span.SetAttributes(attribute.String("tether.conversation", rq.refs.Conv.Client))
	}
	span.SetAttributes(observe.AttrInstance.String(h.Instance))
	if rq.m.Cfg.Aggregated() {
		return e.engineExchange(ctx, w, rq, h, span)
	}
	return e.aggregated(ctx, w, rq, h, span)
}
