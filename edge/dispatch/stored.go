package dispatch

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/edge/route"
)

// dispatchStored serves a request that continues a stored response on the
// instance holding it: an aggregated engine gets it as any request; a
// tether worker fleet serves it whole on that (generation) worker, which
// alone can expand previous_response_id into the prompt and holds the
// conversation's KV from the turn it produced. So does a vLLM split's
// decode server that stored the response: it computes the request itself
// (no handoff fields: a NixlConnector consumer computes locally what it is
// not handed), its own prefix cache holding the turn it decoded.
func (e *Dispatcher) dispatchStored(ctx context.Context, w http.ResponseWriter, rq *route.Request, span trace.Span) int {
	h := e.router.PinnedHop(rq)
	if rq.Refs.Prev != nil {
		span.SetAttributes(attribute.String("tether.stored_response", rq.Refs.Prev.Client))
	} else {
		span.SetAttributes(attribute.String("tether.conversation", rq.Refs.Conv.Client))
	}
	span.SetAttributes(observe.AttrInstance.String(h.Instance))
	if rq.Model.Cfg.EngineAggregated() {
		return e.engineExchange(ctx, w, rq, h, span)
	}
	if rq.Model.Cfg.PDEngine() != "" {
		for _, f := range disagg.VLLMOwnedFields {
			delete(rq.Top, f)
		}
		return e.engineExchange(ctx, w, rq, h, span)
	}
	return e.aggregated(ctx, w, rq, h, span)
}
