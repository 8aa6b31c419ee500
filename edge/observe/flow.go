package observe

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// FlowMetrics are flow control's series (edge/flow), by band and tenant
// (tenants beyond flow control's label bound share the label "other").
type FlowMetrics struct {
	Served    *prometheus.CounterVec
	Shed      *prometheus.CounterVec
	Wait      *prometheus.HistogramVec
	Queued    *prometheus.GaugeVec
	DrainRate *prometheus.GaugeVec
	Messages  *prometheus.CounterVec
}

// FlowShedReasons are the reasons of tether_edge_flow_shed_total.
var FlowShedReasons = []string{"queue_full", "wait_bound", "predicted_wait"}

func newFlowMetrics() FlowMetrics {
	return FlowMetrics{
		Served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_flow_served_total",
			Help: "Requests flow control let through to the engines (at once or after waiting at the edge), by band and tenant.",
		}, []string{"band", "tenant"}),
		Shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_flow_shed_total",
			Help: "Requests flow control refused (429, 529 on /v1/messages, with Retry-After) by band, tenant and reason: queue_full (the band's queue on this edge was at max_queued), " +
				"wait_bound (waited the band's max_wait), predicted_wait (the fleet's measured drain rate said it would wait longer than max_wait).",
		}, []string{"band", "tenant", "reason"}),
		Wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_edge_flow_wait_seconds",
			Help:    "Time served requests waited at the edge for the fleet to have room (0 for those let through at once), by band and tenant.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 40, 80, 160},
		}, []string{"band", "tenant"}),
		Queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tether_edge_flow_queued",
			Help: "Requests waiting at this edge for the fleet to have room, by band and tenant.",
		}, []string{"band", "tenant"}),
		DrainRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tether_edge_flow_drain_rate",
			Help: "Requests per second the fleet dispatches of a model, as this edge measures it (its own and the other edges' reported rates): what Retry-After is computed from.",
		}, []string{"model"}),
		Messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_flow_messages_total",
			Help: "Flow control states told to the other edges over NATS (sent), told by them (heard), or refused as malformed (invalid).",
		}, []string{"result"}),
	}
}

// registerFlow registers flow control's series.
func (m *Metrics) registerFlow(reg prometheus.Registerer) error {
	f := &m.Flow
	for _, c := range []prometheus.Collector{f.Served, f.Shed, f.Wait, f.Queued, f.DrainRate, f.Messages} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("edge: metrics: %w", err)
		}
	}
	for _, r := range []string{"sent", "heard", "invalid"} {
		f.Messages.WithLabelValues(r)
	}
	return nil
}
